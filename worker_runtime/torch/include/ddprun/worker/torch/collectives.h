// Collectives on torch::Tensor, with torch.distributed's names and semantics, over a
// ddprun::worker::Communicator (rt->comm()):
//
//   namespace dist = ddprun::worker::libtorch;
//   dist::all_reduce(comm, t);                          // torch.distributed.all_reduce(t)
//   dist::all_reduce(comm, t, ddprun::worker::ReduceOp::Max);
//   dist::broadcast(comm, t, /*src=*/0);                 // torch.distributed.broadcast(t, 0)
//   std::vector<torch::Tensor> parts(world, torch::empty_like(t)) ... dist::all_gather(comm, parts, t);
//   dist::all_gather_into_tensor(comm, out, t);          // out: world x t along dim 0
//   dist::reduce_scatter_tensor(comm, out, in);          // in: world x out along dim 0
//   dist::barrier(comm);
//
// Every call is collective (every rank, same order, same shapes and dtypes) and synchronous
// on the host for host communicators. Outputs are written in place, as torch.distributed
// does. Tensors: float, double, half, bfloat16, int32, int64 (other dtypes: WorkerError naming
// it); any layout (a non-contiguous tensor goes through a contiguous copy, written back); CPU
// tensors with host communicators (Gloo, shared memory), CUDA tensors with the NCCL one, on
// the tensor's device's current stream (the call returns once the work is queued; later work
// on that stream sees the result, as with torch.distributed's default async_op=False).
// Reduce ops: Sum, Avg, Max (torch's SUM, AVG, MAX); half and bfloat16 sums accumulate in
// float on the CPU (see communicator.h). Errors: WorkerError for misuse, on every rank alike
// where the misuse is (shapes, dtypes, devices; a tensor list of the wrong length);
// CommError from the transport.
#pragma once

#include <ATen/core/Tensor.h>

#include <vector>

#include "ddprun/worker/communicator.h"
#include "ddprun/worker/torch/export.h"

namespace ddprun::worker::libtorch {

// In place: every rank's tensor becomes the reduction over ranks.
DDPRUN_WORKER_TORCH_API void all_reduce(Communicator& comm, const at::Tensor& tensor, ReduceOp op = ReduceOp::Sum);
// In place: every rank's tensor becomes rank src's.
DDPRUN_WORKER_TORCH_API void broadcast(Communicator& comm, const at::Tensor& tensor, int src);
// tensor_list[r] becomes rank r's tensor; the list has one tensor per rank, each with the
// input's shape, dtype and device.
DDPRUN_WORKER_TORCH_API void all_gather(Communicator& comm, const std::vector<at::Tensor>& tensor_list,
                                        const at::Tensor& tensor);
// output (world_size * input.numel() elements, same dtype and device) becomes the ranks'
// inputs concatenated in rank order.
DDPRUN_WORKER_TORCH_API void all_gather_into_tensor(Communicator& comm, const at::Tensor& output,
                                                    const at::Tensor& input);
// input (world_size * output.numel() elements) is reduced over ranks; rank r keeps block r.
DDPRUN_WORKER_TORCH_API void reduce_scatter_tensor(Communicator& comm, const at::Tensor& output,
                                                   const at::Tensor& input, ReduceOp op = ReduceOp::Sum);
DDPRUN_WORKER_TORCH_API void barrier(Communicator& comm);

}  // namespace ddprun::worker::libtorch
