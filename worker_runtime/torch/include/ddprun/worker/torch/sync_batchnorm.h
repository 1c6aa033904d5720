// torch.nn.SyncBatchNorm for LibTorch: batch normalisation whose batch statistics are those of
// every rank's batch together.
//
//   struct NetImpl : torch::nn::Module {
//     ddprun::worker::libtorch::SyncBatchNorm bn{register_module("bn", SyncBatchNorm(16))};
//     ...
//   };
//   auto rt = ddprun::worker::init();
//   auto bn_comm = ddprun::worker::make_gloo_communicator(*rt->store(), rt->rank(), rt->world_size(),
//                                                         {.key_prefix = "myapp/syncbn/"});
//   ddprun::worker::libtorch::convert_sync_batchnorm(*net, *bn_comm);  // binds every SyncBatchNorm
//   DistributedDataParallel ddp(net, rt->comm());
//
// In training mode with a communicator of more than one rank, forward all-gathers each rank's
// per-channel mean, biased variance and element count, merges them into the statistics of
// the whole global batch (normalising with them and updating the running statistics with the
// unbiased variance of the global batch, as PyTorch does), and backward all-reduces the two
// per-channel sums the input gradient needs (sum of dy, sum of dy * (x - mean)); the weight and
// bias gradients stay local (DDP averages them). Everywhere else (evaluation, no communicator,
// one rank) it is plain batch normalisation (at::batch_norm), like torch::nn::BatchNorm2d. Any
// input of 2 or more dimensions (N, C, ...). Parameters and buffers are named as
// torch::nn::BatchNorm's (weight, bias, running_mean, running_var, num_batches_tracked), so a
// checkpoint of either loads into the other.
//
// Its communicator: backward's all-reduce runs on the autograd thread while the DDP wrapper
// reduces gradient buckets on its own communication thread; on one communicator the two
// would interleave differently on different ranks. Give it a communicator of its own (above:
// a second Gloo communicator over the runtime's store under another key prefix). Every rank
// must run the same forwards and backwards (the collectives must match).
//
// Differences from PyTorch: C++ cannot swap a module under its owner's typed member, so
// convert_sync_batchnorm() does not replace torch::nn::BatchNorm layers (it refuses a module
// that has any, naming them): declare the layers as SyncBatchNorm, which is plain batch norm
// until convert_sync_batchnorm() binds it. The statistics are merged in double precision
// (PyTorch's CUDA kernels merge in float), so results agree to rounding, not bit for bit.
#pragma once

#include <torch/nn/module.h>
#include <torch/nn/options/batchnorm.h>
#include <torch/nn/pimpl.h>

#include <cstddef>
#include <cstdint>

#include "ddprun/worker/communicator.h"
#include "ddprun/worker/torch/export.h"

namespace ddprun::worker::libtorch {

class DDPRUN_WORKER_TORCH_API SyncBatchNormImpl : public ::torch::nn::Module {
 public:
  explicit SyncBatchNormImpl(int64_t num_features) : SyncBatchNormImpl(::torch::nn::BatchNormOptions(num_features)) {}
  explicit SyncBatchNormImpl(const ::torch::nn::BatchNormOptions& options);

  at::Tensor forward(const at::Tensor& input);
  void reset_running_stats();
  // The communicator whose ranks share batch statistics (nullptr: plain batch norm). Not owned.
  void set_communicator(Communicator* comm) { comm_ = comm; }
  Communicator* communicator() const { return comm_; }

  ::torch::nn::BatchNormOptions options;
  at::Tensor weight, bias;  // undefined without options.affine()
  at::Tensor running_mean, running_var, num_batches_tracked;  // undefined without track_running_stats

 private:
  Communicator* comm_ = nullptr;
};
TORCH_MODULE(SyncBatchNorm);

// PyTorch's SyncBatchNorm.convert_sync_batchnorm, for C++ models: binds every SyncBatchNorm in
// `module` (itself included, recursively) to `comm` and returns how many. A
// torch::nn::BatchNorm1d/2d/3d among them is a DdpError naming each (see above).
DDPRUN_WORKER_TORCH_API size_t convert_sync_batchnorm(::torch::nn::Module& module, Communicator& comm);

}  // namespace ddprun::worker::libtorch
