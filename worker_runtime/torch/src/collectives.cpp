// Tensor collectives (collectives.h): checks, a contiguous staging copy where needed, and the
// stream hand-off for stream-ordered (NCCL) communicators.
#include "ddprun/worker/torch/collectives.h"

#include <ATen/ATen.h>

#if DDPRUN_TORCH_HAVE_CUDA
#include <c10/cuda/CUDAStream.h>
#endif

#include <string>

#include "ddprun/worker/checks.h"

namespace ddprun::worker::libtorch {

namespace {

std::string shape_of(const at::Tensor& t) {
  std::string s = "[";
  for (int64_t d = 0; d < t.dim(); ++d) s += (d ? ", " : "") + std::to_string(t.size(d));
  return s + "] " + std::string(c10::toString(t.scalar_type())) + " on " + t.device().str();
}

DType dtype_of(const char* what, const at::Tensor& t) {
  switch (t.scalar_type()) {
    case at::kFloat: return DType::F32;
    case at::kDouble: return DType::F64;
    case at::kHalf: return DType::F16;
    case at::kBFloat16: return DType::BF16;
    case at::kInt: return DType::I32;
    case at::kLong: return DType::I64;
    default:
      throw WorkerError(std::string(what) + ": dtype " + c10::toString(t.scalar_type()) +
                        " is not supported; expected float, double, half, bfloat16, int32 or int64 "
                        "(convert with .to(torch::kFloat) or similar)");
  }
}

// The tensor's device against the communicator's kind: CPU with host communicators, CUDA
// with stream-ordered ones.
void check_tensor(const char* what, Communicator& comm, const at::Tensor& t, const char* role) {
  if (!t.defined()) throw WorkerError(std::string(what) + ": the " + role + " tensor is undefined");
  if (t.is_cuda() != comm.stream_ordered())
    throw WorkerError(std::string(what) + ": the " + role + " tensor is on " + t.device().str() + " but the " +
                      comm.backend() + " communicator works on " + (comm.stream_ordered() ? "CUDA" : "CPU") +
                      " tensors; move it with .to(...) or use the runtime of that device");
  if (t.is_sparse() || t.is_quantized())
    throw WorkerError(std::string(what) + ": the " + role + " tensor must be dense (got " + shape_of(t) + ")");
}

void check_alike(const char* what, const at::Tensor& a, const at::Tensor& b, const std::string& role_b) {
  if (a.scalar_type() != b.scalar_type() || a.device() != b.device())
    throw WorkerError(std::string(what) + ": " + role_b + " is " + shape_of(b) +
                      ", expected the input's dtype and device (" + shape_of(a) + ")");
}

// Collectives queued on a stream-ordered communicator follow the tensor's device's current
// stream, and that stream waits for them (no host wait).
struct StreamOrder {
  Communicator& comm;
  bool on = false;
  StreamOrder(Communicator& c, const at::Tensor& t) : comm(c), on(t.is_cuda() && c.stream_ordered()) {
#if DDPRUN_TORCH_HAVE_CUDA
    if (on) {
      comm.set_compute_stream(c10::cuda::getCurrentCUDAStream(t.device().index()).stream());
      comm.comm_waits_for_compute();
    }
#endif
  }
  void done() {
    if (on) comm.compute_waits_for_comm();
  }
};

// A contiguous tensor to hand to the communicator: `t` itself, or a copy written back by
// finish() (torch.distributed refuses non-contiguous tensors; a copy costs little here).
struct Contiguous {
  at::Tensor orig, work;
  explicit Contiguous(const at::Tensor& t) : orig(t), work(t.is_contiguous() ? t : t.contiguous()) {}
  void finish() {
    if (!work.is_same(orig)) orig.copy_(work);
  }
};

}  // namespace

void all_reduce(Communicator& comm, const at::Tensor& tensor, ReduceOp op) {
  constexpr const char* what = "all_reduce";
  check_tensor(what, comm, tensor, "input");
  const DType dt = dtype_of(what, tensor);
  if (tensor.numel() == 0) return;
  Contiguous c(tensor);
  StreamOrder s(comm, tensor);
  comm.allreduce(c.work.data_ptr(), static_cast<size_t>(c.work.numel()), dt, op);
  s.done();
  c.finish();
}

void broadcast(Communicator& comm, const at::Tensor& tensor, int src) {
  constexpr const char* what = "broadcast";
  check_tensor(what, comm, tensor, "input");
  if (src < 0 || src >= comm.size())
    throw WorkerError("broadcast: src " + std::to_string(src) + " is not a rank (world size " +
                      std::to_string(comm.size()) + ")");
  if (tensor.numel() == 0) return;
  Contiguous c(tensor);
  StreamOrder s(comm, tensor);
  comm.broadcast(c.work.data_ptr(), static_cast<size_t>(c.work.nbytes()), src);
  s.done();
  c.finish();
}

void all_gather_into_tensor(Communicator& comm, const at::Tensor& output, const at::Tensor& input) {
  constexpr const char* what = "all_gather_into_tensor";
  check_tensor(what, comm, input, "input");
  check_tensor(what, comm, output, "output");
  const DType dt = dtype_of(what, input);
  check_alike(what, input, output, "the output");
  if (output.numel() != input.numel() * comm.size())
    throw WorkerError("all_gather_into_tensor: the output has " + std::to_string(output.numel()) +
                      " elements, expected world size x input = " + std::to_string(comm.size()) + " x " +
                      std::to_string(input.numel()));
  if (input.numel() == 0) return;
  Contiguous out(output);
  const at::Tensor in = input.contiguous();
  StreamOrder s(comm, input);
  comm.allgather(in.data_ptr(), out.work.data_ptr(), static_cast<size_t>(in.numel()), dt);
  s.done();
  out.finish();
}

void all_gather(Communicator& comm, const std::vector<at::Tensor>& tensor_list, const at::Tensor& tensor) {
  constexpr const char* what = "all_gather";
  check_tensor(what, comm, tensor, "input");
  dtype_of(what, tensor);
  if (tensor_list.size() != static_cast<size_t>(comm.size()))
    throw WorkerError("all_gather: tensor_list has " + std::to_string(tensor_list.size()) +
                      " tensors, expected one per rank (" + std::to_string(comm.size()) + ")");
  for (size_t r = 0; r < tensor_list.size(); ++r) {
    const at::Tensor& t = tensor_list[r];
    const std::string role = "tensor_list[" + std::to_string(r) + "]";
    check_tensor(what, comm, t, role.c_str());
    check_alike(what, tensor, t, role);
    if (t.numel() != tensor.numel())
      throw WorkerError("all_gather: " + role + " is " + shape_of(t) + ", expected the input's " +
                        std::to_string(tensor.numel()) + " elements (" + shape_of(tensor) + ")");
  }
  at::Tensor flat = at::empty({tensor.numel() * comm.size()}, tensor.options());
  all_gather_into_tensor(comm, flat, tensor);
  for (size_t r = 0; r < tensor_list.size(); ++r)
    tensor_list[r].copy_(
        flat.narrow(0, static_cast<int64_t>(r) * tensor.numel(), tensor.numel()).view(tensor_list[r].sizes()));
}

void reduce_scatter_tensor(Communicator& comm, const at::Tensor& output, const at::Tensor& input, ReduceOp op) {
  constexpr const char* what = "reduce_scatter_tensor";
  check_tensor(what, comm, input, "input");
  check_tensor(what, comm, output, "output");
  const DType dt = dtype_of(what, input);
  check_alike(what, input, output, "the output");
  if (input.numel() != output.numel() * comm.size())
    throw WorkerError("reduce_scatter_tensor: the input has " + std::to_string(input.numel()) +
                      " elements, expected world size x output = " + std::to_string(comm.size()) + " x " +
                      std::to_string(output.numel()));
  if (output.numel() == 0) return;
  Contiguous out(output);
  const at::Tensor in = input.contiguous();
  StreamOrder s(comm, input);
  comm.reduce_scatter(in.data_ptr(), out.work.data_ptr(), static_cast<size_t>(out.work.numel()), dt, op);
  s.done();
  out.finish();
}

void barrier(Communicator& comm) { comm.barrier(); }

}  // namespace ddprun::worker::libtorch
