// DistributedSampler with PyTorch's semantics (torch.utils.data.DistributedSampler):
//  * the (optionally shuffled) index list of the dataset is padded by repeating its head
//    (drop_last = false) or truncated (drop_last = true) to a multiple of num_replicas;
//  * rank r takes indices[r], indices[r + R], indices[r + 2R], ... (disjoint shards);
//  * the shuffle is a permutation seeded by seed + epoch (set_epoch), identical on all ranks.
//    (Our permutation is a Fisher-Yates over SplitMix64, not torch.randperm's, so orders
//    differ from PyTorch's while the semantics match; SamplerOptions::permutation takes
//    another, e.g. LibTorch's for PyTorch's exact order.)
// Resume: batch(step, batch_size) addresses any batch of the epoch directly, so a run that
// restarts mid-epoch continues at the step it stopped.
// Not thread-safe; cheap to copy.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <vector>

#include "ddprun/worker/export.h"

namespace ddprun::worker {

struct SamplerOptions {
  size_t dataset_size = 0;
  int num_replicas = 1;
  int rank = 0;
  bool shuffle = true;
  uint64_t seed = 0;
  bool drop_last = false;
  // When set, the shuffle of an epoch is permutation(dataset_size, seed + epoch), a permutation
  // of [0, dataset_size), instead of ours. ddprun::worker::libtorch::pytorch_permutation gives
  // torch.randperm's, so the order equals torch.utils.data.DistributedSampler's.
  std::function<std::vector<size_t>(size_t, uint64_t)> permutation;
};

class DDPRUN_WORKER_API DistributedSampler {
 public:
  // Throws WorkerError when rank is outside [0, num_replicas) or the dataset is empty
  // (or smaller than num_replicas with drop_last).
  explicit DistributedSampler(SamplerOptions options);

  void set_epoch(uint64_t epoch);
  uint64_t epoch() const { return epoch_; }
  // Samples of this rank per epoch (PyTorch's num_samples) and over all ranks.
  size_t num_samples() const { return num_samples_; }
  size_t total_size() const { return num_samples_ * static_cast<size_t>(options_.num_replicas); }
  // This rank's indices for the current epoch.
  const std::vector<size_t>& indices() const { return indices_; }
  // Batches per epoch with the given batch size (the last one may be short unless drop_last_batch).
  size_t num_batches(size_t batch_size, bool drop_last_batch = false) const;
  // Indices of batch `step` (0-based) of the current epoch.
  std::vector<size_t> batch(size_t step, size_t batch_size) const;

 private:
  void rebuild();
  SamplerOptions options_;
  uint64_t epoch_ = 0;
  size_t num_samples_ = 0;
  std::vector<size_t> indices_;
};

}  // namespace ddprun::worker
