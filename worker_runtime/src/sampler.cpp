#include "ddprun/worker/sampler.h"

#include <algorithm>
#include <numeric>

#include "ddprun/worker/checks.h"
#include "ddprun/worker/hash.h"

namespace ddprun::worker {

DistributedSampler::DistributedSampler(SamplerOptions options) : options_(options) {
  if (options_.num_replicas < 1 || options_.rank < 0 || options_.rank >= options_.num_replicas)
    throw WorkerError("DistributedSampler: rank " + std::to_string(options_.rank) + " not in [0, " +
                      std::to_string(options_.num_replicas) + ")");
  if (options_.dataset_size == 0) throw WorkerError("DistributedSampler: empty dataset");
  const size_t n = options_.dataset_size, r = static_cast<size_t>(options_.num_replicas);
  if (options_.drop_last && n % r != 0) {
    if (n < r) throw WorkerError("DistributedSampler: dataset smaller than num_replicas with drop_last");
    num_samples_ = (n - r + r - 1) / r;  // ceil((n - r) / r), as PyTorch
  } else {
    num_samples_ = (n + r - 1) / r;
  }
  rebuild();
}

void DistributedSampler::set_epoch(uint64_t epoch) {
  if (epoch == epoch_ && !indices_.empty()) return;
  epoch_ = epoch;
  rebuild();
}

void DistributedSampler::rebuild() {
  const size_t n = options_.dataset_size;
  std::vector<size_t> all(n);
  std::iota(all.begin(), all.end(), size_t{0});
  if (options_.shuffle && options_.permutation) {
    all = options_.permutation(n, options_.seed + epoch_);
    std::vector<bool> seen(n, false);
    bool ok = all.size() == n;
    for (size_t i = 0; ok && i < n; ++i) {
      ok = all[i] < n && !seen[all[i]];
      if (ok) seen[all[i]] = true;
    }
    if (!ok)
      throw WorkerError("DistributedSampler: SamplerOptions::permutation did not return a permutation of [0, " +
                        std::to_string(n) + ")");
  } else if (options_.shuffle) {
    Rng rng{splitmix64(options_.seed + epoch_)};
    for (size_t i = n; i > 1; --i) std::swap(all[i - 1], all[rng.below(i)]);
  }
  const size_t total = total_size();
  if (!options_.drop_last) {
    // Pad by repeating the head (several times if the padding exceeds the dataset).
    for (size_t i = 0; all.size() < total; ++i) all.push_back(all[i % n]);
  } else {
    all.resize(total);
  }
  indices_.clear();
  indices_.reserve(num_samples_);
  for (size_t i = static_cast<size_t>(options_.rank); i < total; i += static_cast<size_t>(options_.num_replicas))
    indices_.push_back(all[i]);
}

size_t DistributedSampler::num_batches(size_t batch_size, bool drop_last_batch) const {
  DDPRUN_ENFORCE(batch_size > 0, "batch_size must be positive");
  return drop_last_batch ? num_samples_ / batch_size : (num_samples_ + batch_size - 1) / batch_size;
}

std::vector<size_t> DistributedSampler::batch(size_t step, size_t batch_size) const {
  DDPRUN_ENFORCE(batch_size > 0, "batch_size must be positive");
  const size_t begin = std::min(step * batch_size, indices_.size());
  const size_t end = std::min(begin + batch_size, indices_.size());
  return {indices_.begin() + static_cast<std::ptrdiff_t>(begin), indices_.begin() + static_cast<std::ptrdiff_t>(end)};
}

}  // namespace ddprun::worker
