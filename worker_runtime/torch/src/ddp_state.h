// DdpEngine's state (ddp.cpp): what the engine, its autograd hooks (ddp_backward.cpp), its
// gradient layout and collectives (ddp_state.cpp) and the model check (ddp_model_check.cpp) share.
// Private to the library.
#pragma once

#include <ATen/ATen.h>
#include <torch/csrc/autograd/function.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "ddprun/worker/reducer.h"
#include "ddprun/worker/torch/ddp.h"

namespace ddprun::worker::libtorch {

using ::torch::autograd::Node;

// One line per parameter (that requires grad) and buffer: what must be alike on every rank.
std::vector<std::string> describe_model(const ::torch::nn::Module& module);

struct DdpEngine::State {
  State(Communicator& c, DdpOptions o) : comm(c), opt(o) {}
  Communicator& comm;
  DdpOptions opt;
  std::vector<std::string> names;
  std::vector<at::Tensor> params;
  std::vector<at::Tensor> buffers;
  std::vector<std::shared_ptr<Node>> accs;  // keeps each AccumulateGrad node (and our hook) alive
  std::vector<uintptr_t> hook_keys;
  at::TensorOptions grad_options;
  DType dtype = DType::F32;
  bool on_cuda = false;
  c10::DeviceIndex device_index = -1;  // the parameters' CUDA device

  // Layout: the Reducer's registration order; gradients lie in the flat buffer in this order
  // (so every bucket is one contiguous range, reduced in place).
  std::vector<size_t> layout;
  at::Tensor flat;
  bool flat_is_comm_memory = false;  // from FusedStep::alloc_shared (the communicator owns it)
  std::vector<at::Tensor> views;     // by parameter index: its gradient's place in `flat`
  std::unique_ptr<Reducer> reducer;
  TensorCommHook comm_hook;    // register_comm_hook
  GradBucketHook bucket_hook;  // register_comm_hook with the bucket's gradients
  bool has_hook() const { return comm_hook || bucket_hook; }
  size_t forwards = 0;  // pre_forward calls (a hook must come before the first)

  // Per synced backward.
  bool armed = false;  // post_forward armed the reducer; the end callback disarms
  // The core Reducer's pass is open (prepare_for_backward() without finalize() yet). A forward
  // whose backward never ran leaves it open and clean; the next training forward reuses it
  // (the Reducer refuses a second prepare_for_backward() on an open pass).
  bool reducer_open = false;
  bool callback_queued = false;
  size_t hooks_fired = 0;
  std::vector<uint8_t> marked;
  std::vector<size_t> unused;          // found by the graph walk, marked on the first hook
  std::vector<uint8_t> used;           // gradient seen since the last synced backward (no_sync included)
  std::vector<uint8_t> attach_at_end;  // locally unused, grad undefined: attach if used elsewhere
  bool failed = false;

  std::vector<size_t> arrival;  // first synced backward only
  bool rebuild_pending = false;
  size_t rebuilds = 0;
  bool require_forward_param_sync = true;

  // static_graph: the first synced backward counts each parameter's hooks (and reduces at its
  // end); later ones mark a parameter ready when its count is reached.
  bool static_first_done = false;
  std::vector<int32_t> hook_count;    // per parameter, from the first synced backward
  std::vector<int32_t> hooks_left;    // per parameter, this backward
  std::vector<size_t> static_unused;  // locally unused in the first synced backward
  std::vector<int32_t> static_used;   // used on some rank in it (the all-reduced map)
  bool static_first_pass() const { return opt.static_graph && !static_first_done; }
  // Whether this synced backward all-reduces the map of used parameters.
  bool reduces_used_map() const { return opt.static_graph ? !static_first_done : opt.find_unused_parameters; }

  // join(): inside a guard; the number of ranks still training as of the last forward.
  bool join_active = false;
  std::vector<int32_t> last_used_map;  // the last all-reduced used map (what a joined rank adds)
  bool join_divide_initial = true;
  int join_training = 0;

  bool distributed() const { return comm.size() > 1 || opt.force_collective; }

  // Construction (ddp.cpp): the parameters and buffers, their checks, the autograd hooks.
  void collect_parameters(const ::torch::nn::Module& module);
  void check_parameters();
  void install_grad_hooks();

  // The autograd hooks: a parameter's AccumulateGrad post-hook, and the end-of-backward
  // callback the first of them queues.
  void on_grad_ready(size_t index);
  void on_backward_end();
  void reduce_static_first();
  void check_all_marked();
  void finish_used(bool static_first);

  // Collective: bytes of every tensor become root's. Packs into one message.
  void broadcast_tensors(const std::vector<at::Tensor>& ts) { broadcast_tensors(ts, opt.root); }
  void broadcast_tensors(const std::vector<at::Tensor>& ts, int src);

  // Every rank's describe_model() lines, gathered (collective; the same two all-gathers on
  // every rank, whatever its model). Throws ConfigError naming the first difference.
  void check_same_model(const std::vector<std::string>& mine);

  // Stream-ordered communicators: collectives follow the work queued on the current stream.
  void stream_prologue();
  void stream_epilogue() {
    if (on_cuda && comm.stream_ordered()) comm.compute_waits_for_comm();
  }

  // Lays the gradients out in `order`, rebinding param.grad() to the new views (contents kept).
  void build_layout(const std::vector<size_t>& order);
  at::Tensor allocate_flat(int64_t total, bool& shared);

  // The core Reducer's hook: the bucket as a flat tensor over its memory, to the user's hook
  // (with views of it for each gradient, for a GradBucketHook).
  CommHook core_hook();

  // param.grad() becomes its view (copying a gradient autograd put elsewhere, e.g. after
  // zero_grad(set_to_none=true)).
  void bind_view(size_t i, bool zero_if_undefined);

  // gradient_as_bucket_view = false: gradient i into its place in the bucket (zeros when it has
  // none), before the bucket is reduced.
  void stage(size_t i);
  // ... and the reduced bucket back into the gradients used on some rank (`used`; all when
  // empty); a gradient that was undefined gets a tensor laid out like its parameter.
  void unstage(const std::vector<int32_t>& used);
  // A parameter that took no part counts as ready: zeros, or what no_sync accumulated.
  void mark_unused_ready(size_t u);
  // Every bucket, in launch order (the first static-graph backward, and a joined rank's
  // shadow of a backward).
  void mark_all_in_bucket_order(bool skip_marked);
  // The all-reduced map of parameters used since the last synced backward (collective).
  std::vector<int32_t> reduce_used_map(std::vector<int32_t> used);
  // Small collectives of join(): a one-element all-reduce on the parameters' device.
  double join_allreduce(double value, at::ScalarType type, ReduceOp op);
  // PyTorch's _find_common_rank: the highest rank for which `candidate` holds.
  int common_rank(bool candidate);
  void rebuild_if_pending();
  void shadow_backward();

  size_t reducer_index(size_t i) const { return pos_in_layout[i]; }
  std::vector<size_t> pos_in_layout;
  void index_layout() {
    pos_in_layout.assign(params.size(), 0);
    for (size_t k = 0; k < layout.size(); ++k) pos_in_layout[layout[k]] = k;
  }
};

}  // namespace ddprun::worker::libtorch
