// PowerSGD gradient compression (torch.distributed.algorithms.ddp_comm_hooks.powerSGD_hook)
// for the LibTorch DDP wrapper:
//
//   auto state = std::make_shared<ddprun::worker::libtorch::PowerSGDState>();
//   state->matrix_approximation_rank = 2;
//   state->start_powerSGD_iter = 10;
//   ddp.register_comm_hook([state](ddprun::worker::Communicator& c, ddprun::worker::libtorch::GradBucket& b) {
//     ddprun::worker::libtorch::powerSGD_hook(*state, c, b);
//   });
//
// The semantics and arithmetic of PyTorch's powerSGD_hook (not the batched variant):
//  * For the first start_powerSGD_iter iterations (counted at each iteration's last bucket)
//    a bucket is averaged as allreduce_hook does (divide, then sum).
//  * Then, per bucket: with use_error_feedback the error of the last compression is added to
//    the bucket first. Each gradient is seen as a matrix (its first dimension by the rest);
//    it is compressed when (rows + cols) x rank x min_compression_rate < rows x cols (rank =
//    min(rows, cols, matrix_approximation_rank)), else (biases, small layers) it is averaged
//    uncompressed with the others in one all-reduce. For the compressed ones, P = M Q, P summed
//    over ranks and orthogonalised (Gram-Schmidt up to rank 2, QR above), Q = M^T P summed
//    and divided by the world size, and M is replaced by P Q^T. Q starts from standard normal
//    values drawn by LibTorch's CPU generator seeded, as PyTorch does, with the next value of a
//    Mersenne Twister seeded with random_seed (numpy's RandomState(random_seed).randint(10^9)),
//    so every rank, and PyTorch's hook with the same seed, draws the same Q; with warm_start the
//    last Q of each bucket is reused (orthogonalised again) instead.
//  * Matrices of equal shape are handled in order of first appearance of their shape, as
//    PyTorch's hook groups them (which decides the random values each Q gets).
// PyTorch requires start_powerSGD_iter > 1 with use_error_feedback or warm_start (buckets are
// rebuilt after the first iteration); so does check() (a ConfigError).
// The state is per wrapper and not thread-safe (the hook runs on one thread at a time).
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <map>
#include <random>

#include "ddprun/worker/communicator.h"
#include "ddprun/worker/torch/ddp.h"
#include "ddprun/worker/torch/export.h"

namespace ddprun::worker::libtorch {

struct PowerSGDState {
  int64_t matrix_approximation_rank = 1;
  int64_t start_powerSGD_iter = 1000;
  double min_compression_rate = 2;
  bool use_error_feedback = true;
  bool warm_start = true;
  double orthogonalization_epsilon = 0;
  uint32_t random_seed = 0;

  // Filled by the hook.
  int64_t iter = 0;  // iterations seen (incremented at each iteration's last bucket)
  std::map<size_t, at::Tensor> error_dict, p_memory_dict, q_memory_dict;  // by bucket index
  int64_t total_numel_before_compression = 0, total_numel_after_compression = 0;

  // Throws ConfigError for settings PyTorch refuses.
  DDPRUN_WORKER_TORCH_API void check() const;
  // PyTorch's compression_stats(): the rate, and the element counts before and after.
  double compression_rate() const {
    return total_numel_after_compression > 0 ? static_cast<double>(total_numel_before_compression) /
                                                   static_cast<double>(total_numel_after_compression)
                                             : 0.0;
  }

  // The seed generator (numpy's legacy RandomState: MT19937 seeded with random_seed).
  std::mt19937 rng{};
  bool rng_seeded = false;
};

DDPRUN_WORKER_TORCH_API void powerSGD_hook(PowerSGDState& state, Communicator& comm, GradBucket& bucket);

}  // namespace ddprun::worker::libtorch
