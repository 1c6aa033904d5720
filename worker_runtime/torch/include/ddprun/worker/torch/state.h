// A LibTorch module's and optimizer's state in a ddprun Checkpoint, named by module path, so
// that a killed-and-resumed run continues bit for bit.
//
// Sections (raw little-endian bytes of the contiguous CPU tensor; sizes are checked on load):
//   <prefix>param/<path>            each parameter         e.g. model/param/conv1.weight
//   <prefix>buffer/<path>           each buffer            e.g. model/buffer/bn1.running_mean
//   <prefix>optim/<path>/<field>    optimizer state of the parameter at <path>:
//       SGD:  momentum_buffer
//       Adam / AdamW: step (i64), exp_avg, exp_avg_sq, max_exp_avg_sq (amsgrad only)
//   <prefix>optim/torch_archive     any other optimizer (RMSprop, Adagrad, LBFGS, one of the
//                                   program's own that overrides save/load): its
//                                   torch::optim::Optimizer::save archive, with
//   <prefix>optim/torch_archive_type  its C++ type name, checked on load
// A parameter without optimizer state (no step taken for it yet) has no optim sections, and
// loading leaves it without state. For SGD, Adam and AdamW the hyperparameters (learning
// rate, ...) are the program's: they are not saved; an archive restores its param groups'
// options too, as Python's load_state_dict does. Loading another optimizer's state, or saving
// one whose save() writes nothing, is a DdpError naming the types.
// Loading needs the same module structure (a missing or mis-sized section is a WorkerError
// naming it) and must happen before the optimizer's first step after construction.
#pragma once

#include <torch/nn/module.h>
#include <torch/optim/optimizer.h>

#include <string>

#include "ddprun/worker/checkpoint.h"
#include "ddprun/worker/torch/export.h"

namespace ddprun::worker::libtorch {

DDPRUN_WORKER_TORCH_API void save_module(const ::torch::nn::Module& module, Checkpoint& ckpt,
                                         const std::string& prefix = "model/");
DDPRUN_WORKER_TORCH_API void load_module(::torch::nn::Module& module, const Checkpoint& ckpt,
                                         const std::string& prefix = "model/");

// `module`: the module whose parameters the optimizer updates (gives the names).
DDPRUN_WORKER_TORCH_API void save_optimizer(const ::torch::optim::Optimizer& opt, const ::torch::nn::Module& module,
                                            Checkpoint& ckpt, const std::string& prefix = "model/");
DDPRUN_WORKER_TORCH_API void load_optimizer(::torch::optim::Optimizer& opt, const ::torch::nn::Module& module,
                                            const Checkpoint& ckpt, const std::string& prefix = "model/");

// What state_checksum covers. Under DDP the parameters are equal on every rank after each
// step, but buffers need not be: batch norm's running statistics are broadcast from the root
// at the start of each forward (broadcast_buffers) and then updated from each rank's own batch,
// so after the last forward they differ per rank, as in Python DDP. Compare ranks with
// Parameters; compare a run with itself (a resumed run, a repeat) with the default.
enum class StateParts { ParametersAndBuffers, Parameters };

// FNV-1a over the parameters' (and buffers') bytes in module order (bit-identity checks).
DDPRUN_WORKER_TORCH_API uint64_t state_checksum(const ::torch::nn::Module& module,
                                                StateParts parts = StateParts::ParametersAndBuffers);

}  // namespace ddprun::worker::libtorch
