// PyTorch's shuffle order for the core DistributedSampler:
//
//   dw::SamplerOptions o{.dataset_size = n, .num_replicas = world, .rank = rank, .seed = 0};
//   o.permutation = ddprun::worker::libtorch::pytorch_permutation;
//   dw::DistributedSampler sampler(o);   // sampler.set_epoch(e): the indices of
//                                        // torch.utils.data.DistributedSampler(..., seed=0) after
//                                        // set_epoch(e), in the same order
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "ddprun/worker/torch/export.h"

namespace ddprun::worker::libtorch {

// torch.randperm(n, generator=torch.Generator().manual_seed(seed)).tolist(), from LibTorch's own
// CPU generator and randperm (the same library as Python's torch, so the same order).
DDPRUN_WORKER_TORCH_API std::vector<size_t> pytorch_permutation(size_t n, uint64_t seed);

}  // namespace ddprun::worker::libtorch
