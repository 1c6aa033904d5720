// DdpEngine: autograd hooks -> the core Reducer over a flat gradient buffer. Here: construction,
// the forward's side (pre_forward, post_forward's graph walk), comm hooks and join(); the
// backward's side in ddp_backward.cpp, the layout and collectives in ddp_state.cpp.
#include "ddprun/worker/torch/ddp.h"

#include <ATen/ATen.h>
#include <torch/csrc/autograd/function.h>
#include <torch/csrc/autograd/grad_mode.h>
#include <torch/csrc/autograd/utils/lambda_post_hook.h>
#include <torch/csrc/autograd/variable.h>

#include <algorithm>
#include <numeric>
#include <unordered_set>

#include "ddp_state.h"
#include "ddprun/worker/torch/collectives.h"

namespace ddprun::worker::libtorch {

namespace {

DType to_dtype(at::ScalarType t, const std::string& name) {
  switch (t) {
    case at::kFloat: return DType::F32;
    case at::kDouble: return DType::F64;
    case at::kHalf: return DType::F16;
    case at::kBFloat16: return DType::BF16;
    default:
      throw DdpError("DDP: parameter '" + name + "' has dtype " + std::string(c10::toString(t)) +
                     "; gradients must be float, double, half or bfloat16");
  }
}

}  // namespace

// The parameters that require grad (with their names) and the buffers, in module order.
void DdpEngine::State::collect_parameters(const ::torch::nn::Module& module) {
  State& s = *this;
  for (const auto& item : module.named_parameters(/*recurse=*/true)) {
    if (!item.value().requires_grad()) continue;
    s.names.push_back(item.key());
    s.params.push_back(item.value());
  }
  for (const auto& item : module.named_buffers(/*recurse=*/true)) s.buffers.push_back(item.value());
  if (s.params.empty()) throw DdpError("DDP: the module has no parameter that requires grad");
}

// One dtype and device for all parameters, one the build and the communicator can reduce.
void DdpEngine::State::check_parameters() {
  State& s = *this;
  s.dtype = to_dtype(s.params[0].scalar_type(), s.names[0]);
  const auto device = s.params[0].device();
  for (size_t i = 0; i < s.params.size(); ++i) {
    if (s.params[i].scalar_type() != s.params[0].scalar_type() || s.params[i].device() != device)
      throw DdpError("DDP: parameter '" + s.names[i] + "' is " + std::string(c10::toString(s.params[i].scalar_type())) +
                     " on " + s.params[i].device().str() + " but '" + s.names[0] + "' is " +
                     std::string(c10::toString(s.params[0].scalar_type())) + " on " + device.str() +
                     "; all parameters must share one dtype and device (convert the module first)");
    if (s.params[i].is_sparse()) throw DdpError("DDP: parameter '" + s.names[i] + "' is sparse (unsupported)");
  }
  s.on_cuda = device.is_cuda();
  s.device_index = device.index();
#if !DDPRUN_TORCH_HAVE_CUDA
  if (s.on_cuda)
    throw DdpError("DDP: the module is on " + device.str() +
                   " but this build of ddprun_worker_torch has no CUDA support (LibTorch or the core without CUDA)");
#endif
  if (s.on_cuda != s.comm.stream_ordered())
    throw DdpError(std::string("DDP: parameters on ") + device.str() + " but the communicator is " + s.comm.backend() +
                   (s.on_cuda ? "; CUDA parameters need the NCCL communicator" : "; CPU parameters need a host one"));
  s.grad_options = s.params[0].options().requires_grad(false);
}

// A post-hook on every parameter's AccumulateGrad node: the gradient is ready.
void DdpEngine::State::install_grad_hooks() {
  State& s = *this;
  for (size_t i = 0; i < s.params.size(); ++i) {
    auto acc = ::torch::autograd::impl::grad_accumulator(s.params[i]);
    if (!acc) throw DdpError("DDP: parameter '" + s.names[i] + "' has no gradient accumulator (not a leaf?)");
    auto hook = std::make_unique<::torch::autograd::utils::LambdaPostHook>(
        [st = this, i](const ::torch::autograd::variable_list& outputs, const ::torch::autograd::variable_list&) {
          st->on_grad_ready(i);
          return outputs;
        });
    s.hook_keys.push_back(acc->add_post_hook(std::move(hook)));
    s.accs.push_back(std::move(acc));
  }
}

DdpEngine::DdpEngine(std::shared_ptr<::torch::nn::Module> module, Communicator& comm, DdpOptions options)
    : module_(std::move(module)), s_(std::make_unique<State>(comm, options)) {
  if (!module_) throw DdpError("DDP: null module");
  if (options.root < 0 || options.root >= comm.size())
    throw DdpError("DDP: root rank " + std::to_string(options.root) + " not in [0, " + std::to_string(comm.size()) +
                   ")");
  State& s = *s_;
  s.collect_parameters(*module_);
  s.check_parameters();
  if (options.check_same_model) s.check_same_model(describe_model(*module_));

  // Everyone starts from root's parameters and buffers (collective).
  {
    std::vector<at::Tensor> all(s.params);
    all.insert(all.end(), s.buffers.begin(), s.buffers.end());
    s.broadcast_tensors(all);
  }

  // Registration order = module order; the Reducer buckets it in reverse (backward) order.
  std::vector<size_t> order(s.params.size());
  std::iota(order.begin(), order.end(), size_t{0});
  s.build_layout(order);
  s.index_layout();
  s.marked.assign(s.params.size(), 0);
  s.used.assign(s.params.size(), 0);
  s.attach_at_end.assign(s.params.size(), 0);
  s.hook_count.assign(s.params.size(), 0);
  s.install_grad_hooks();
}

DdpEngine::~DdpEngine() {
  if (!s_) return;
  for (size_t i = 0; i < s_->accs.size(); ++i) s_->accs[i]->del_post_hook(s_->hook_keys[i]);
  // Gradients in our own flat buffer stay valid (their deleters keep it alive); gradients in
  // the communicator's shared memory would dangle once it is destroyed: give them their own.
  if (s_->flat_is_comm_memory) {
    at::NoGradGuard ng;
    for (size_t i = 0; i < s_->params.size(); ++i) {
      at::Tensor& g = s_->params[i].mutable_grad();
      if (g.defined() && g.data_ptr() == s_->views[i].data_ptr()) g = g.clone();
    }
  }
}

const std::vector<std::string>& DdpEngine::parameter_names() const { return s_->names; }

std::vector<std::vector<std::string>> DdpEngine::bucket_names() const {
  std::vector<std::vector<std::string>> out;
  for (const auto& b : s_->reducer->buckets()) {
    out.emplace_back();
    for (size_t k : b) out.back().push_back(s_->names[s_->layout[k]]);
  }
  return out;
}

size_t DdpEngine::rebuilds() const { return s_->rebuilds; }
size_t DdpEngine::buckets_launched_early() const { return s_->reducer->buckets_launched_early(); }

bool DdpEngine::gradient_is_bucket_view(size_t i) const {
  if (i >= s_->params.size())
    throw DdpError("DDP gradient_is_bucket_view: no parameter " + std::to_string(i) + " (the module has " +
                   std::to_string(s_->params.size()) + ")");
  const at::Tensor& g = s_->params[i].grad();
  return g.defined() && g.data_ptr() == s_->views[i].data_ptr();
}

void DdpEngine::zero_grad() {
  at::NoGradGuard ng;
  if (!s_->opt.gradient_as_bucket_view) {  // gradients of their own: zeroed in place
    for (auto& p : s_->params)
      if (p.grad().defined()) p.mutable_grad().zero_();
    return;
  }
  s_->flat.zero_();
  for (size_t i = 0; i < s_->params.size(); ++i) s_->params[i].mutable_grad() = s_->views[i];
}

void DdpEngine::sync_buffers() { s_->broadcast_tensors(s_->buffers); }

void DdpEngine::register_comm_hook(GradBucketHook hook) {
  if (!hook) throw DdpError("DDP register_comm_hook: the hook is empty");
  if (s_->has_hook()) throw DdpError("DDP register_comm_hook: a hook is registered already; it can be registered once");
  if (s_->forwards > 0)
    throw DdpError("DDP register_comm_hook: called after the first forward; register the hook right after wrapping "
                   "the model, on every rank");
  s_->bucket_hook = std::move(hook);
  if (s_->reducer) s_->reducer->set_comm_hook(s_->core_hook());
}

void DdpEngine::register_comm_hook(TensorCommHook hook) {
  if (!hook) throw DdpError("DDP register_comm_hook: the hook is empty");
  if (s_->has_hook()) throw DdpError("DDP register_comm_hook: a hook is registered already; it can be registered once");
  if (s_->forwards > 0)
    throw DdpError("DDP register_comm_hook: called after the first forward; register the hook right after wrapping "
                   "the model, on every rank");
  s_->comm_hook = std::move(hook);
  if (s_->reducer) s_->reducer->set_comm_hook(s_->core_hook());
}

void allreduce_hook(Communicator& comm, at::Tensor& bucket) {
  bucket.div_(comm.size());
  all_reduce(comm, bucket, ReduceOp::Sum);
}

namespace {
void compress_hook(Communicator& comm, at::Tensor& bucket, at::ScalarType type) {
  at::Tensor compressed = bucket.to(type).div_(comm.size());
  all_reduce(comm, compressed, ReduceOp::Sum);
  bucket.copy_(compressed);
}
}  // namespace

void fp16_compress_hook(Communicator& comm, at::Tensor& bucket) { compress_hook(comm, bucket, at::kHalf); }
void bf16_compress_hook(Communicator& comm, at::Tensor& bucket) { compress_hook(comm, bucket, at::kBFloat16); }

void DdpEngine::pre_forward() {
  State& s = *s_;
  ++s.forwards;
  if (s.failed)
    throw DdpError("DDP: a previous backward failed (see its error); the ranks are out of step, restart the job");
  if (s.armed) {
    // Armed by a forward whose backward never ran (e.g. an evaluation pass with grad mode
    // on). Nothing was launched yet (unused parameters are marked on the first hook), so
    // re-arming is safe.
    if (s.hooks_fired != 0)
      throw DdpError("DDP: forward called before the previous backward completed (it failed, or is still running "
                     "in another thread); run one backward per training forward, from one thread");
    s.armed = false;
  }
  // Under join(): this rank still trains (the joined ranks count the ranks that do).
  if (s.join_active) s.join_training = static_cast<int>(s.join_allreduce(1, at::kFloat, ReduceOp::Sum));
  s.rebuild_if_pending();
  if (s.opt.broadcast_buffers && s.require_forward_param_sync && !s.buffers.empty())
    s.broadcast_tensors(s.buffers, s.join_active ? s.common_rank(true) : s.opt.root);
  // Under join(): whether the backward of this forward synchronises (joined ranks shadow it).
  if (s.join_active) s.join_allreduce(sync_ && at::GradMode::is_enabled() ? 1 : 0, at::kFloat, ReduceOp::Sum);
}

void DdpEngine::post_forward(const std::vector<at::Tensor>& outputs) {
  State& s = *s_;
  const bool grad_on = at::GradMode::is_enabled();
  s.require_forward_param_sync = grad_on && sync_;
  if (!(grad_on && sync_)) return;
  s.stream_prologue();  // the Reducer's collectives follow the current stream
  if (!s.reducer_open) s.reducer->prepare_for_backward();
  s.reducer_open = true;
  s.armed = true;
  s.hooks_fired = 0;
  std::fill(s.marked.begin(), s.marked.end(), 0);
  std::fill(s.attach_at_end.begin(), s.attach_at_end.end(), 0);
  s.unused.clear();
  if (s.opt.static_graph) {
    // The first iteration's unused parameters, found at its end; no graph walk.
    if (s.static_first_done) {
      s.unused = s.static_unused;
      s.hooks_left = s.hook_count;
    }
    return;
  }
  if (!s.opt.find_unused_parameters) return;
  // Every node reachable from the outputs; a parameter whose AccumulateGrad is not among
  // them gets no gradient in this backward.
  std::unordered_set<const Node*> seen;
  std::vector<Node*> stack;
  for (const auto& out : outputs) {
    if (!out.defined() || !out.requires_grad()) continue;
    auto edge = ::torch::autograd::impl::gradient_edge(out);
    if (edge.function && seen.insert(edge.function.get()).second) stack.push_back(edge.function.get());
  }
  while (!stack.empty()) {
    Node* n = stack.back();
    stack.pop_back();
    for (const auto& e : n->next_edges())
      if (e.function && seen.insert(e.function.get()).second) stack.push_back(e.function.get());
  }
  for (size_t i = 0; i < s.params.size(); ++i)
    if (!seen.count(s.accs[i].get())) s.unused.push_back(i);
}

void DdpEngine::join_begin(bool divide_by_initial_world_size) {
  State& s = *s_;
  if (s.join_active) throw DdpError("DDP join: a join guard is active already (guards do not nest)");
  s.join_active = true;
  s.join_divide_initial = divide_by_initial_world_size;
  s.join_training = s.comm.size();
}

void DdpEngine::join_abandon() { s_->join_active = false; }

void DdpEngine::join_end() {
  State& s = *s_;
  if (s.failed)
    throw DdpError("DDP join: a previous backward failed (see its error); the ranks are out of step, restart the job");
  bool last_to_join = true;
  // One round per forward of the ranks still training (see DdpEngine::pre_forward).
  for (;;) {
    const double training = s.join_allreduce(0, at::kFloat, ReduceOp::Sum);
    if (training == 0) break;
    last_to_join = false;
    s.rebuild_if_pending();
    if (s.opt.broadcast_buffers && s.require_forward_param_sync && !s.buffers.empty())
      s.broadcast_tensors(s.buffers, s.common_rank(false));
    const bool sync_backward = s.join_allreduce(0, at::kFloat, ReduceOp::Sum) != 0;
    s.require_forward_param_sync = sync_backward;
    if (sync_backward) s.shadow_backward();
  }
  s.join_active = false;
  // Everyone ends with the model of (the highest of) the ranks that joined last.
  const int src = s.common_rank(last_to_join);
  std::vector<at::Tensor> all(s.params);
  if (s.opt.broadcast_buffers) all.insert(all.end(), s.buffers.begin(), s.buffers.end());
  s.broadcast_tensors(all, src);
}

}  // namespace ddprun::worker::libtorch
