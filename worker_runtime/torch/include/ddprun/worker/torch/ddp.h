// Data parallelism for LibTorch modules: PyTorch's DistributedDataParallel for C++ programs.
//
//   auto rt = ddprun::worker::init();
//   Net net;                                                   // a TORCH_MODULE holder
//   ddprun::worker::libtorch::DistributedDataParallel ddp(net, rt->comm());
//   torch::optim::SGD opt(net->parameters(), torch::optim::SGDOptions(0.1).momentum(0.9));
//   for (...) {
//     opt.zero_grad();
//     auto loss = torch::cross_entropy_loss(ddp(x), y);        // ddp(x) runs net->forward(x)
//     loss.backward();     // gradients averaged over ranks when backward returns
//     opt.step();
//   }
//
// What the wrapper does (the semantics of torch.nn.parallel.DistributedDataParallel):
//  * Construction (collective): every parameter and buffer becomes rank root's (broadcast).
//    Each parameter's gradient gets a place in one flat buffer, which the core Reducer
//    all-reduces bucket by bucket (~25 MiB, a small first bucket); with
//    DdpOptions::gradient_as_bucket_view (default) param.grad() is a view of it, otherwise
//    gradients are copied in and out.
//  * Forward through ddp(...): buffers (batch-norm statistics) are broadcast from root first
//    (broadcast_buffers), then the module runs; when grad mode is on and sync is on, the
//    reducer is armed for the backward of the returned outputs.
//  * Backward: a post-hook on each parameter's AccumulateGrad node marks its gradient ready;
//    a bucket's all-reduce starts as soon as its last gradient is ready and overlaps the rest
//    of backward. An end-of-backward callback waits for every bucket, so param.grad() holds
//    the average over ranks when loss.backward() returns. After the first synced backward the
//    buckets are rebuilt in the order gradients actually arrived (rank 0's order on all ranks).
//  * Unused parameters: with find_unused_parameters, the autograd graph is walked from the
//    forward's outputs; parameters not reached are reduced as zeros (a parameter unused on
//    every rank keeps its gradient untouched, so an optimizer skips it as PyTorch's does).
//    Without it, a parameter that gets no gradient is a DdpError naming it by module path
//    ("head.aux.weight"), thrown from backward(); the peers then fail with CommError.
//  * no_sync(): backward accumulates gradients locally; the next synced backward reduces the
//    sum. Forward without grad mode (evaluation) arms nothing.
//  * static_graph (DdpOptions) and join() (uneven inputs): see there.
//  * Devices: CPU tensors go through host communicators (Gloo, shared memory). CUDA tensors
//    need a stream-ordered communicator (NCCL): collectives run on its side stream after an
//    event on the current CUDA stream of the parameters' device (as of the forward), and that
//    stream waits for them at the end of backward, without blocking the host (only built when
//    both LibTorch and the core have CUDA). Run forward and backward on one stream.
//  * World size 1: no communication unless DdpOptions::force_collective (which buckets and
//    all-reduces anyway, as PyTorch's DDP does; on the CPU it needs a real communicator, see
//    RuntimeOptions::real_communicator_at_world_size_1).
//
// Contracts: all parameters that require grad share one dtype (f32, f64, f16 or bf16) and one
// device; the module's structure is fixed after wrapping; the same sequence of forward /
// backward / no_sync happens on every rank (collectives must match). Not thread-safe: one
// training thread per wrapper. The module and the communicator must outlive the wrapper.
// Errors: DdpError (a ddprun::worker::WorkerError) for misuse, CommError from a collective,
// ConfigError (exit code kExitConfig; ddprun spends no restart on it) when the ranks' models
// differ (DdpOptions::check_same_model).
#pragma once

#include <torch/nn/module.h>
#include <torch/nn/pimpl.h>

#include <cstddef>
#include <exception>
#include <functional>
#include <memory>
#include <string>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

#include "ddprun/worker/checks.h"
#include "ddprun/worker/communicator.h"
#include "ddprun/worker/torch/export.h"

namespace ddprun::worker::libtorch {

class DDPRUN_WORKER_TORCH_API DdpError : public WorkerError {
 public:
  using WorkerError::WorkerError;
};

// PyTorch's DDP communication hook (register_comm_hook), for LibTorch: replaces a bucket's
// all-reduce. `bucket` is the bucket's gradients as one flat tensor (their dtype and device),
// written in place: afterwards it must hold the bucket's gradients averaged over ranks. Called
// on every rank for every bucket in the same order (for host communicators possibly on the
// wrapper's communication thread); use the tensor collectives of collectives.h inside it.
using TensorCommHook = std::function<void(Communicator& comm, at::Tensor& bucket)>;
// The built-in hooks of torch.distributed.algorithms.ddp_comm_hooks.default_hooks, with the
// same arithmetic: allreduce_hook (divide by the world size, then a sum), fp16_compress_hook
// and bf16_compress_hook (cast to half / bfloat16, divide by the world size in that type, sum
// in it, cast back into the bucket: half the bytes on the wire, at the cost of precision).
DDPRUN_WORKER_TORCH_API void allreduce_hook(Communicator& comm, at::Tensor& bucket);
// A bucket as PyTorch's dist.GradBucket shows it, for hooks that treat each gradient on its
// own (PowerSGD): buffer() is the flat bucket, written in place; gradients are views of it,
// one per parameter in the bucket's order (the order backward makes them ready), shaped like
// the parameters; index() counts buckets in launch order, is_last() marks the last one.
struct GradBucket {
  at::Tensor buffer;
  std::vector<at::Tensor> gradients;
  size_t index = 0;
  bool is_last = false;
};
using GradBucketHook = std::function<void(Communicator& comm, GradBucket& bucket)>;
DDPRUN_WORKER_TORCH_API void fp16_compress_hook(Communicator& comm, at::Tensor& bucket);
DDPRUN_WORKER_TORCH_API void bf16_compress_hook(Communicator& comm, at::Tensor& bucket);

struct DdpOptions {
  size_t bucket_cap_bytes = 25u << 20;
  size_t first_bucket_cap_bytes = 1u << 20;
  bool find_unused_parameters = false;
  bool broadcast_buffers = true;
  // Rebuild the buckets from the arrival order of the first synced backward (PyTorch does).
  bool rebuild_buckets = true;
  int root = 0;  // the rank whose parameters and buffers everyone starts from
  // World size 1: still bucket and all-reduce (measures the DDP machinery, as PyTorch does).
  bool force_collective = false;
  // At construction, before anything is broadcast, the ranks compare every parameter's and
  // buffer's name, shape and dtype (two small all-gathers): a model that differs across ranks
  // is a ConfigError on every rank naming the first difference and each rank's version of it.
  bool check_same_model = true;
  // PyTorch's gradient_as_bucket_view. true (the default here; Python's default is False):
  // param.grad() is a view into the flat bucket memory, so the all-reduce writes the averaged
  // gradients in place and no gradient is stored twice. false: gradients stay tensors of their
  // own; each is copied into its bucket when ready and the averaged bucket copied back when
  // backward ends (a gradient that was undefined gets a new tensor), as Python DDP does. Same
  // values either way (tests libtorch.python_ddp, libtorch.bucket_view_off); false costs a
  // second copy of the gradients and two copies per step, and keeps param.grad() free of
  // aliasing (gradient_is_bucket_view() says which).
  bool gradient_as_bucket_view = true;
  // PyTorch's static_graph: the promise that every training iteration runs the same graph (the
  // same parameters used, each the same number of times). The first synced backward reduces
  // every bucket at its end (no overlap) and records which parameters got gradients; from
  // then on, without any graph walk, the parameters unused in it count as ready at the start of
  // each backward, and a parameter unused on every rank in it keeps its gradient untouched (as
  // with find_unused_parameters, which static_graph does not need and ignores). A graph that
  // changes later is a DdpError naming the parameter. Buckets are rebuilt once, after the
  // first iteration.
  bool static_graph = false;
};

// The engine behind DistributedDataParallel<M>, independent of the module's forward
// signature. Use it directly when the forward is not module->forward(...):
//   ddp.pre_forward(); auto out = custom(...); ddp.post_forward({out});
class DDPRUN_WORKER_TORCH_API DdpEngine {
 public:
  DdpEngine(std::shared_ptr<::torch::nn::Module> module, Communicator& comm, DdpOptions options = {});
  ~DdpEngine();
  DdpEngine(const DdpEngine&) = delete;
  DdpEngine& operator=(const DdpEngine&) = delete;

  // Before the module's forward: finishes a bucket rebuild, broadcasts buffers. Collective.
  void pre_forward();
  // After the module's forward, with every tensor output the loss may depend on (the unused-
  // parameter search starts there). Arms the reducer when grad mode and sync are on.
  void post_forward(const std::vector<at::Tensor>& outputs);

  // Gradient accumulation (PyTorch's no_sync()): while a guard lives, backward does not
  // communicate.
  class NoSyncGuard {
   public:
    explicit NoSyncGuard(DdpEngine& e) : e_(e), prev_(e.sync_) { e_.sync_ = false; }
    ~NoSyncGuard() { e_.sync_ = prev_; }
    NoSyncGuard(const NoSyncGuard&) = delete;
    NoSyncGuard& operator=(const NoSyncGuard&) = delete;

   private:
    DdpEngine& e_;
    bool prev_;
  };
  [[nodiscard]] NoSyncGuard no_sync() { return NoSyncGuard(*this); }
  bool sync() const { return sync_; }

  // Uneven inputs (PyTorch's `with ddp.join():`). Every rank runs its training loop inside a
  // guard; a rank whose data ran out leaves the scope and, in the guard's destructor, shadows
  // the collectives of the ranks still training (one loop per forward of theirs: the count of
  // ranks still training, the buffer broadcast, whether backward synchronises, then the
  // all-reduce of every bucket with zero gradients, and of the map of used parameters where it
  // is reduced: this rank contributes the last map it reduced, as PyTorch's joined rank does,
  // so a parameter used since its last step counts as used) until every rank has left. Inside a guard each forward
  // first all-reduces 1 (the count of ranks still training) and 1 or 0 (whether its backward synchronises), and buffers
  // come from the highest rank still training. divide_by_initial_world_size = true (PyTorch's default): gradients are
  // still divided by the world size, so a joined rank's zeros pull the average toward zero; false: divided by the
  // number of ranks still training in that iteration (at more than 2 ranks not bit for bit PyTorch's order of
  // operations: the bucket's average is scaled by world size / ranks training). With a comm hook the hook divides as it
  // does. When all have left, parameters (and buffers with broadcast_buffers) are broadcast from the highest rank among
  // those that left last, so every rank ends with the same model. enable = false: the guard does nothing. The
  // destructor communicates and may throw (CommError); leaving the scope by an exception skips the shadowing (as Python
  // does). Gradients of the joined rank are left as they were. Ranks should run at least one synced step before
  // leaving. Not nested.
  class JoinGuard {
   public:
    JoinGuard(DdpEngine& e, bool divide_by_initial_world_size, bool enable)
        : e_(e), enable_(enable), exceptions_(std::uncaught_exceptions()) {
      if (enable_) e_.join_begin(divide_by_initial_world_size);
    }
    ~JoinGuard() noexcept(false) {
      if (!enable_) return;
      if (std::uncaught_exceptions() > exceptions_) {
        e_.join_abandon();
        return;
      }
      e_.join_end();
    }
    JoinGuard(const JoinGuard&) = delete;
    JoinGuard& operator=(const JoinGuard&) = delete;

   private:
    DdpEngine& e_;
    bool enable_;
    int exceptions_;
  };
  [[nodiscard]] JoinGuard join(bool divide_by_initial_world_size = true, bool enable = true) {
    return JoinGuard(*this, divide_by_initial_world_size, enable);
  }

  // Zeroes every gradient in place, keeping them views of the flat buffer (one memset; the
  // optimizer's zero_grad(true) also works but costs a copy per parameter in backward and
  // makes unused parameters' gradients undefined, which optimizers skip).
  void zero_grad();
  // Broadcasts the buffers from root now (collective); forward does it when enabled.
  void sync_buffers();
  // PyTorch's register_comm_hook (see TensorCommHook): once, before the first forward, the
  // same hook on every rank; a second call or a call after a forward is a DdpError.
  void register_comm_hook(TensorCommHook hook);
  // The same with the bucket's gradients too (see GradBucket; e.g. powersgd.h's hook).
  void register_comm_hook(GradBucketHook hook);

  ::torch::nn::Module& module() { return *module_; }
  const std::vector<std::string>& parameter_names() const;
  // Bucket plan in launch order, as parameter names (for logging and tests).
  std::vector<std::vector<std::string>> bucket_names() const;
  size_t rebuilds() const;  // 0 or 1: whether the arrival-order rebuild happened
  // Buckets whose all-reduce started during the last synced backward, before its end
  // (overlap evidence; 0 with one rank unless force_collective).
  size_t buckets_launched_early() const;
  // Whether parameter i's (parameter_names() order) gradient is now a view into the bucket
  // memory (always false with gradient_as_bucket_view = false).
  bool gradient_is_bucket_view(size_t i) const;

 private:
  void join_begin(bool divide_by_initial_world_size);
  void join_end();
  void join_abandon();
  struct State;
  std::shared_ptr<::torch::nn::Module> module_;
  std::unique_ptr<State> s_;
  bool sync_ = true;
};

namespace detail {
inline void collect(std::vector<at::Tensor>& out, const at::Tensor& t) { out.push_back(t); }
inline void collect(std::vector<at::Tensor>& out, const std::vector<at::Tensor>& v) {
  out.insert(out.end(), v.begin(), v.end());
}
template <class... T>
void collect(std::vector<at::Tensor>& out, const std::tuple<T...>& t) {
  std::apply([&](const auto&... e) { (collect(out, e), ...); }, t);
}
template <class A, class B>
void collect(std::vector<at::Tensor>& out, const std::pair<A, B>& p) {
  collect(out, p.first);
  collect(out, p.second);
}
// Whether M is a ModuleHolder (it has ptr()): a C++17 detection, as the header is used from
// C++17 LibTorch projects.
template <class T, class = void>
struct is_module_holder : std::false_type {};
template <class T>
struct is_module_holder<T, std::void_t<decltype(std::declval<const T&>().ptr())>> : std::true_type {};
}  // namespace detail

// The wrapper. M: a module holder (TORCH_MODULE(Net) -> Net) or std::shared_ptr<NetImpl>.
// operator()/forward(args...) = pre_forward, (*module)->forward(args...), post_forward(the
// tensors of the result: a Tensor, a vector of them, or tuples/pairs of those).
template <class M>
class DistributedDataParallel : public DdpEngine {
 public:
  DistributedDataParallel(M module, Communicator& comm, DdpOptions options = {})
      : DdpEngine(as_shared(module), comm, options), m_(std::move(module)) {}

  template <class... Args>
  auto forward(Args&&... args) {
    pre_forward();
    auto out = m_->forward(std::forward<Args>(args)...);
    std::vector<at::Tensor> tensors;
    detail::collect(tensors, out);
    post_forward(tensors);
    return out;
  }
  template <class... Args>
  auto operator()(Args&&... args) {
    return forward(std::forward<Args>(args)...);
  }
  M& wrapped() { return m_; }

 private:
  static std::shared_ptr<::torch::nn::Module> as_shared(const M& m) {
    if constexpr (detail::is_module_holder<M>::value) return m.ptr();  // a ModuleHolder
    else return m;                                                     // a shared_ptr to the module
  }
  M m_;
};

}  // namespace ddprun::worker::libtorch
