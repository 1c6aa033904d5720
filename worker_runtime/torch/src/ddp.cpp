// DdpEngine: autograd hooks -> the core Reducer over a flat gradient buffer.
// The only translation unit of the library that sees autograd internals.
#include "ddprun/worker/torch/ddp.h"

#include <ATen/ATen.h>
#include <torch/csrc/autograd/engine.h>
#include <torch/csrc/autograd/function.h>
#include <torch/csrc/autograd/grad_mode.h>
#include <torch/csrc/autograd/utils/lambda_post_hook.h>
#include <torch/csrc/autograd/variable.h>

#if DDPRUN_TORCH_HAVE_CUDA
#include <c10/cuda/CUDAStream.h>
#endif

#include <algorithm>
#include <cstring>
#include <numeric>
#include <unordered_map>
#include <unordered_set>

#include "ddprun/worker/reducer.h"
#include "ddprun/worker/torch/collectives.h"

namespace ddprun::worker::libtorch {

namespace {

using ::torch::autograd::Node;

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

std::string join_names(const std::vector<std::string>& names, const std::vector<size_t>& idx, size_t max = 10) {
  std::string s;
  for (size_t k = 0; k < idx.size() && k < max; ++k) s += (k ? ", '" : "'") + names[idx[k]] + "'";
  if (idx.size() > max) s += " and " + std::to_string(idx.size() - max) + " more";
  return s;
}

// One line per parameter (that requires grad) and buffer: what must be alike on every rank.
std::vector<std::string> describe_model(const ::torch::nn::Module& module) {
  std::vector<std::string> out;
  auto shape = [](const at::Tensor& t) {
    std::string s = "[";
    for (int64_t d = 0; d < t.dim(); ++d) s += (d ? ", " : "") + std::to_string(t.size(d));
    return s + "] " + std::string(c10::toString(t.scalar_type()));
  };
  for (const auto& item : module.named_parameters(true))
    if (item.value().requires_grad()) out.push_back("parameter '" + item.key() + "' " + shape(item.value()));
  for (const auto& item : module.named_buffers(true)) out.push_back("buffer '" + item.key() + "' " + shape(item.value()));
  return out;
}

std::vector<std::string> split_lines(const std::string& s) {
  std::vector<std::string> out;
  size_t start = 0;
  while (start < s.size()) {
    size_t end = s.find('\n', start);
    if (end == std::string::npos) end = s.size();
    out.push_back(s.substr(start, end - start));
    start = end + 1;
  }
  return out;
}

// "ranks 0, 2: parameter 'fc.weight' [10, 32] Float; rank 1: parameter 'fc.weight' [10, 33] Float"
std::string describe_difference(const std::vector<std::vector<std::string>>& per_rank) {
  size_t longest = 0;
  for (const auto& r : per_rank) longest = std::max(longest, r.size());
  for (size_t i = 0; i < longest; ++i) {
    std::vector<std::pair<std::string, std::vector<int>>> groups;  // entry -> ranks, in rank order
    for (size_t r = 0; r < per_rank.size(); ++r) {
      const std::string entry = i < per_rank[r].size() ? per_rank[r][i] : "nothing (its model ends here)";
      auto it = std::find_if(groups.begin(), groups.end(), [&](const auto& g) { return g.first == entry; });
      if (it == groups.end()) groups.push_back({entry, {static_cast<int>(r)}});
      else it->second.push_back(static_cast<int>(r));
    }
    if (groups.size() == 1) continue;
    std::string msg = "entry " + std::to_string(i + 1) + " of the model (parameters, then buffers) differs: ";
    for (size_t g = 0; g < groups.size() && g < 4; ++g) {
      const auto& ranks = groups[g].second;
      msg += (g ? "; " : "") + std::string(ranks.size() > 1 ? "ranks " : "rank ");
      for (size_t k = 0; k < ranks.size() && k < 8; ++k) msg += (k ? ", " : "") + std::to_string(ranks[k]);
      if (ranks.size() > 8) msg += " and " + std::to_string(ranks.size() - 8) + " more";
      msg += ": " + groups[g].first;
    }
    if (groups.size() > 4) msg += "; and " + std::to_string(groups.size() - 4) + " more versions";
    return msg;
  }
  return "";
}

}  // namespace

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
  std::vector<at::Tensor> views;  // by parameter index: its gradient's place in `flat`
  std::unique_ptr<Reducer> reducer;
  TensorCommHook comm_hook;  // register_comm_hook
  GradBucketHook bucket_hook;  // register_comm_hook with the bucket's gradients
  bool has_hook() const { return comm_hook || bucket_hook; }
  size_t forwards = 0;       // pre_forward calls (a hook must come before the first)

  // Per synced backward.
  bool armed = false;           // post_forward armed the reducer; the end callback disarms
  // The core Reducer's pass is open (prepare_for_backward() without finalize() yet). A forward
  // whose backward never ran leaves it open and clean; the next training forward reuses it
  // (the Reducer refuses a second prepare_for_backward() on an open pass).
  bool reducer_open = false;
  bool callback_queued = false;
  size_t hooks_fired = 0;
  std::vector<uint8_t> marked;
  std::vector<size_t> unused;   // found by the graph walk, marked on the first hook
  std::vector<uint8_t> used;    // gradient seen since the last synced backward (no_sync included)
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
  bool reduces_used_map() const {
    return opt.static_graph ? !static_first_done : opt.find_unused_parameters;
  }

  // join(): inside a guard; the number of ranks still training as of the last forward.
  bool join_active = false;
  std::vector<int32_t> last_used_map;  // the last all-reduced used map (what a joined rank adds)
  bool join_divide_initial = true;
  int join_training = 0;

  bool distributed() const { return comm.size() > 1 || opt.force_collective; }

  // The autograd hooks: a parameter's AccumulateGrad post-hook, and the end-of-backward
  // callback the first of them queues.
  void on_grad_ready(size_t index);
  void on_backward_end();

  // Collective: bytes of every tensor become root's. Packs into one message.
  void broadcast_tensors(const std::vector<at::Tensor>& ts) { broadcast_tensors(ts, opt.root); }
  void broadcast_tensors(const std::vector<at::Tensor>& ts, int src) {
    if (ts.empty() || comm.size() == 1) return;
    at::NoGradGuard ng;
    std::vector<at::Tensor> bytes;
    bytes.reserve(ts.size());
    for (const auto& t : ts) bytes.push_back(t.contiguous().reshape({-1}).view(at::kByte));
    at::Tensor packed = at::cat(bytes);
    stream_prologue();
    comm.broadcast(packed.data_ptr(), static_cast<size_t>(packed.numel()), src);
    stream_epilogue();
    int64_t off = 0;
    for (size_t i = 0; i < ts.size(); ++i) {
      const int64_t nb = bytes[i].numel();
      ts[i].copy_(packed.narrow(0, off, nb).view(ts[i].scalar_type()).view(ts[i].sizes()));
      off += nb;
    }
  }

  // Every rank's describe_model() lines, gathered (collective; the same two all-gathers on
  // every rank, whatever its model). Throws ConfigError naming the first difference.
  void check_same_model(const std::vector<std::string>& mine) {
    if (comm.size() == 1) return;
    at::NoGradGuard ng;
    std::string text;
    for (const auto& line : mine) text += line + "\n";
    const auto n = static_cast<size_t>(comm.size());
    const at::TensorOptions i64 = at::TensorOptions().dtype(at::kLong).device(params[0].device());
    at::Tensor len = at::full({1}, static_cast<int64_t>(text.size()), i64);
    at::Tensor lens = at::empty({static_cast<int64_t>(n)}, i64);
    stream_prologue();
    comm.allgather(len.data_ptr(), lens.data_ptr(), 1, DType::I64);
    stream_epilogue();
    at::Tensor lens_cpu = lens.to(at::kCPU);
    const int64_t* l = lens_cpu.data_ptr<int64_t>();
    int64_t longest = 0;
    bool alike = true;
    for (size_t r = 0; r < n; ++r) longest = std::max(longest, l[r]);
    // The text itself, padded to whole 8-byte words of the longest one.
    const int64_t words = (longest + 7) / 8;
    if (words == 0) return;
    at::Tensor mine_words = at::zeros({words}, at::TensorOptions().dtype(at::kLong));
    std::memcpy(mine_words.data_ptr(), text.data(), text.size());
    at::Tensor in = mine_words.to(params[0].device());
    at::Tensor all = at::empty({static_cast<int64_t>(n) * words}, i64);
    stream_prologue();
    comm.allgather(in.data_ptr(), all.data_ptr(), static_cast<size_t>(words), DType::I64);
    stream_epilogue();
    at::Tensor all_cpu = all.to(at::kCPU);
    const char* bytes = static_cast<const char*>(all_cpu.data_ptr());
    std::vector<std::vector<std::string>> per_rank(n);
    for (size_t r = 0; r < n; ++r) {
      std::string t(bytes + r * static_cast<size_t>(words) * 8, static_cast<size_t>(l[r]));
      alike = alike && t == text;
      per_rank[r] = split_lines(t);
    }
    if (alike) return;
    throw ConfigError("DDP: the ranks built different models (rank " + std::to_string(comm.rank()) + " checked): " +
                      describe_difference(per_rank) +
                      ". Build the same model on every rank (same constructor arguments and flags)");
  }

  // Stream-ordered communicators: collectives follow the work queued on the current stream.
  void stream_prologue() {
#if DDPRUN_TORCH_HAVE_CUDA
    if (on_cuda && comm.stream_ordered()) {
      // The parameters' device's current stream, not the calling thread's current device's.
      comm.set_compute_stream(c10::cuda::getCurrentCUDAStream(device_index).stream());
      comm.comm_waits_for_compute();
    }
#endif
  }
  void stream_epilogue() {
    if (on_cuda && comm.stream_ordered()) comm.compute_waits_for_comm();
  }

  // Lays the gradients out in `order`, rebinding param.grad() to the new views (contents kept).
  void build_layout(const std::vector<size_t>& order) {
    at::NoGradGuard ng;
    const size_t n = params.size();
    std::vector<int64_t> offset(n);
    int64_t total = 0;
    for (size_t i : order) {
      offset[i] = total;
      total += params[i].numel();
    }
    const size_t esize = dtype_size(dtype);
    // The gradients' current values (they may live in the buffer about to be reordered).
    std::vector<at::Tensor> saved(n);
    if (opt.gradient_as_bucket_view)
      for (size_t i = 0; i < n; ++i)
        if (params[i].grad().defined()) saved[i] = params[i].grad().clone();
    at::Tensor fresh;
    bool shared = flat_is_comm_memory;
    if (flat.defined()) {
      fresh = flat;  // a rebuild: same size, new order, same memory (no second allocation)
    } else {
      FusedStep* fs = on_cuda ? nullptr : comm.fused_step();
      void* mem = fs ? fs->alloc_shared(static_cast<size_t>(total) * esize) : nullptr;
      shared = mem != nullptr;
      if (mem)  // the communicator's zero-copy memory; lives as long as the communicator
        fresh = at::from_blob(mem, {total}, grad_options);
      else
        fresh = at::zeros({total}, grad_options);
    }
    std::vector<at::Tensor> fresh_views(n);
    std::vector<GradView> gv;
    gv.reserve(n);
    auto* base = static_cast<char*>(fresh.data_ptr());
    for (size_t i : order) {
      // A plain tensor over the flat storage (not an autograd view): optimizers may detach_()
      // and zero_() it, and AccumulateGrad adds into it in place.
      fresh_views[i] = at::from_blob(base + offset[i] * static_cast<int64_t>(esize), params[i].sizes(),
                                     [keep = fresh](void*) {}, grad_options);
      gv.push_back(GradView{fresh_views[i].data_ptr(), static_cast<size_t>(params[i].numel())});
    }
    for (size_t i = 0; i < n; ++i) {
      at::Tensor& g = params[i].mutable_grad();
      if (saved[i].defined()) fresh_views[i].copy_(saved[i]);
      if (opt.gradient_as_bucket_view && (g.defined() || views.empty())) g = fresh_views[i];
    }
    reducer.reset();
    flat_is_comm_memory = shared;
    ReducerOptions ro;
    ro.bucket_cap_bytes = opt.bucket_cap_bytes;
    ro.first_bucket_cap_bytes = opt.first_bucket_cap_bytes;
    ro.force_collective = opt.force_collective;
    ro.comm_hook = core_hook();
    reducer = std::make_unique<Reducer>(comm, std::move(gv), dtype, ro);
    reducer_open = false;
    layout = order;
    flat = fresh;
    views = std::move(fresh_views);
  }

  // The core Reducer's hook: the bucket as a flat tensor over its memory, to the user's hook
  // (with views of it for each gradient, for a GradBucketHook).
  CommHook core_hook() {
    if (!has_hook()) return {};
    return [this](Communicator& c, const CommBucket& b) {
      at::Tensor t = at::from_blob(b.data, {static_cast<int64_t>(b.count)}, grad_options);
      if (bucket_hook) {
        const auto& plan = reducer->buckets();
        GradBucket gb{t, {}, b.index, b.index + 1 == plan.size()};
        const auto esize = static_cast<int64_t>(dtype_size(dtype));
        for (size_t k : plan[b.index]) {
          const size_t i = layout[k];
          const int64_t off = (static_cast<const char*>(views[i].data_ptr()) - static_cast<const char*>(b.data)) / esize;
          if (off < 0 || off + params[i].numel() > static_cast<int64_t>(b.count))
            throw DdpError("DDP comm hook: gradient '" + names[i] + "' lies outside its bucket (internal error)");
          gb.gradients.push_back(t.narrow(0, off, params[i].numel()).view(params[i].sizes()));
        }
        bucket_hook(c, gb);
        if (gb.buffer.data_ptr() != b.data)
          throw DdpError("DDP comm hook: the hook replaced the bucket's buffer instead of writing into it; write the "
                         "result in place (buffer.copy_(result))");
        return;
      }
      comm_hook(c, t);
      if (t.data_ptr() != b.data)
        throw DdpError("DDP comm hook: the hook replaced the bucket tensor instead of writing into it; write the "
                       "result in place (bucket.copy_(result))");
    };
  }

  // param.grad() becomes its view (copying a gradient autograd put elsewhere, e.g. after
  // zero_grad(set_to_none=true)).
  void bind_view(size_t i, bool zero_if_undefined) {
    at::Tensor& g = params[i].mutable_grad();
    if (!g.defined()) {
      if (zero_if_undefined) views[i].zero_();
      return;
    }
    if (g.data_ptr() != views[i].data_ptr()) {
      views[i].copy_(g);
      g = views[i];
    }
  }

  // gradient_as_bucket_view = false: gradient i into its place in the bucket (zeros when it has
  // none), before the bucket is reduced.
  void stage(size_t i) {
    const at::Tensor& g = params[i].grad();
    if (g.defined()) views[i].copy_(g);
    else views[i].zero_();
  }
  // ... and the reduced bucket back into the gradients used on some rank (`used`; all when
  // empty); a gradient that was undefined gets a tensor laid out like its parameter.
  void unstage(const std::vector<int32_t>& used) {
    for (size_t i = 0; i < params.size(); ++i) {
      if (!used.empty() && used[i] == 0) continue;  // unused on every rank: left untouched
      at::Tensor& g = params[i].mutable_grad();
      if (g.defined()) {
        g.copy_(views[i]);
      } else if (params[i].is_non_overlapping_and_dense()) {
        g = at::empty_strided(params[i].sizes(), params[i].strides(), grad_options);
        g.copy_(views[i]);
      } else {
        g = views[i].clone(at::MemoryFormat::Contiguous);
      }
    }
  }
  // A parameter that took no part counts as ready: zeros, or what no_sync accumulated.
  void mark_unused_ready(size_t u) {
    if (opt.gradient_as_bucket_view) {
      if (!params[u].grad().defined()) attach_at_end[u] = 1;
      bind_view(u, true);
    } else {
      stage(u);
    }
    marked[u] = 1;
    reducer->mark_ready(reducer_index(u));
  }
  // Every bucket, in launch order (the first static-graph backward, and a joined rank's
  // shadow of a backward).
  void mark_all_in_bucket_order(bool skip_marked) {
    for (const auto& b : reducer->buckets())
      for (size_t k : b) {
        const size_t i = layout[k];
        if (skip_marked && marked[i]) continue;
        marked[i] = 1;
        reducer->mark_ready(k);
      }
  }
  // The all-reduced map of parameters used since the last synced backward (collective).
  std::vector<int32_t> reduce_used_map(std::vector<int32_t> used) {
    if (distributed() && comm.size() > 1) {
      at::Tensor t = at::from_blob(used.data(), {static_cast<int64_t>(used.size())}, at::kInt).clone();
      if (on_cuda) t = t.to(params[0].device());
      stream_prologue();
      comm.allreduce(t.data_ptr(), used.size(), DType::I32, ReduceOp::Sum);
      stream_epilogue();
      t = t.cpu();
      std::memcpy(used.data(), t.data_ptr<int32_t>(), used.size() * sizeof(int32_t));
    }
    return used;
  }
  // Small collectives of join(): a one-element all-reduce on the parameters' device.
  double join_allreduce(double value, at::ScalarType type, ReduceOp op) {
    at::NoGradGuard ng;
    at::Tensor t = at::full({1}, value, at::TensorOptions().dtype(type).device(params[0].device()));
    all_reduce(comm, t, op);
    return t.item<double>();
  }
  // PyTorch's _find_common_rank: the highest rank for which `candidate` holds.
  int common_rank(bool candidate) {
    const double r = join_allreduce(candidate ? comm.rank() : -1, at::kLong, ReduceOp::Max);
    if (r < 0) throw DdpError("DDP join: no rank qualified as the source of the model (internal error)");
    return static_cast<int>(r);
  }
  void rebuild_if_pending();
  void shadow_backward();

  size_t reducer_index(size_t i) const { return pos_in_layout[i]; }
  std::vector<size_t> pos_in_layout;
  void index_layout() {
    pos_in_layout.assign(params.size(), 0);
    for (size_t k = 0; k < layout.size(); ++k) pos_in_layout[layout[k]] = k;
  }
};

DdpEngine::DdpEngine(std::shared_ptr<::torch::nn::Module> module, Communicator& comm, DdpOptions options)
    : module_(std::move(module)), s_(std::make_unique<State>(comm, options)) {
  if (!module_) throw DdpError("DDP: null module");
  if (options.root < 0 || options.root >= comm.size())
    throw DdpError("DDP: root rank " + std::to_string(options.root) + " not in [0, " + std::to_string(comm.size()) +
                   ")");
  State& s = *s_;
  for (const auto& item : module_->named_parameters(/*recurse=*/true)) {
    if (!item.value().requires_grad()) continue;
    s.names.push_back(item.key());
    s.params.push_back(item.value());
  }
  for (const auto& item : module_->named_buffers(/*recurse=*/true)) s.buffers.push_back(item.value());
  if (s.params.empty()) throw DdpError("DDP: the module has no parameter that requires grad");

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
  if (s.on_cuda != comm.stream_ordered())
    throw DdpError(std::string("DDP: parameters on ") + device.str() + " but the communicator is " + comm.backend() +
                   (s.on_cuda ? "; CUDA parameters need the NCCL communicator" : "; CPU parameters need a host one"));
  s.grad_options = s.params[0].options().requires_grad(false);

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

  for (size_t i = 0; i < s.params.size(); ++i) {
    auto acc = ::torch::autograd::impl::grad_accumulator(s.params[i]);
    if (!acc) throw DdpError("DDP: parameter '" + s.names[i] + "' has no gradient accumulator (not a leaf?)");
    auto hook = std::make_unique<::torch::autograd::utils::LambdaPostHook>(
        [st = s_.get(), i](const ::torch::autograd::variable_list& outputs, const ::torch::autograd::variable_list&) {
          st->on_grad_ready(i);
          return outputs;
        });
    s.hook_keys.push_back(acc->add_post_hook(std::move(hook)));
    s.accs.push_back(std::move(acc));
  }
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

void DdpEngine::State::rebuild_if_pending() {
  State& s = *this;
  if (!s.rebuild_pending) return;
  {
    s.rebuild_pending = false;
    // Arrival order of the first synced backward; never-arrived (unused) parameters last.
    std::vector<int64_t> arrival(s.params.size());
    std::vector<uint8_t> seen(s.params.size(), 0);
    size_t k = 0;
    for (size_t i : s.arrival)
      if (!seen[i]) seen[i] = 1, arrival[k++] = static_cast<int64_t>(i);
    for (size_t i = s.params.size(); i-- > 0;)
      if (!seen[i]) arrival[k++] = static_cast<int64_t>(i);
    s.arrival.clear();
    // Every rank must bucket alike: rank root's order wins (collective).
    if (s.comm.size() > 1) {
      at::Tensor t = at::from_blob(arrival.data(), {static_cast<int64_t>(arrival.size())}, at::kLong).clone();
      if (s.on_cuda) t = t.to(s.params[0].device());
      s.broadcast_tensors({t});
      t = t.cpu();
      std::memcpy(arrival.data(), t.data_ptr<int64_t>(), arrival.size() * sizeof(int64_t));
    }
    // The Reducer buckets its registration order reversed: register reversed arrival.
    std::vector<size_t> order(arrival.rbegin(), arrival.rend());
    for (size_t i : order)
      if (i >= s.params.size()) throw DdpError("DDP: corrupt bucket order from rank root");
    s.build_layout(order);
    s.index_layout();
    ++s.rebuilds;
  }
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

void DdpEngine::State::on_grad_ready(size_t i) {
  State& s = *this;
  at::NoGradGuard ng;
  if (s.opt.gradient_as_bucket_view) s.bind_view(i, false);
  s.used[i] = 1;
  if (!s.armed) return;  // no_sync, or a forward not through the wrapper: accumulate locally
  const bool first = s.hooks_fired++ == 0;
  if (first) {
    // End-of-backward callback: runs once the engine finished this graph task.
    ::torch::autograd::Engine::get_default_engine().queue_callback([this] { on_backward_end(); });
    s.callback_queued = true;
  }
  if (s.static_first_pass()) {  // count only; every bucket is reduced at the end
    ++s.hook_count[i];
    if (s.opt.rebuild_buckets && s.distributed() && s.hook_count[i] == 1) s.arrival.push_back(i);
    return;
  }
  if (first) {
    // Unused parameters count as ready (zeros, or what no_sync accumulated) from the start.
    for (size_t u : s.unused) s.mark_unused_ready(u);
  }
  if (s.opt.static_graph) {
    if (s.hooks_left[i] == 0) {
      s.failed = true;
      throw DdpError("DDP static_graph: parameter '" + s.names[i] + "' got " +
                     (s.hook_count[i] == 0 ? std::string("a gradient in this iteration but none in the first")
                                           : "more gradients in this iteration than in the first (" +
                                                 std::to_string(s.hook_count[i]) + ")") +
                     ": the graph changed, which static_graph does not allow. Use the same graph in every "
                     "iteration, or set static_graph = false (with find_unused_parameters for parameters unused "
                     "on some steps)");
    }
    if (--s.hooks_left[i] != 0) return;
  } else if (s.marked[i]) {
    s.failed = true;
    throw DdpError("DDP: parameter '" + s.names[i] +
                   "' got a gradient twice in one backward (or was found unused but still reached): pass every "
                   "forward output the loss depends on to DDP, and run one backward per forward");
  }
  s.marked[i] = 1;
  if (s.opt.rebuild_buckets && s.rebuilds == 0 && !s.rebuild_pending && s.distributed()) s.arrival.push_back(i);
  if (!s.opt.gradient_as_bucket_view) s.stage(i);
  s.reducer->mark_ready(s.reducer_index(i));
}

void DdpEngine::State::on_backward_end() {
  State& s = *this;
  s.callback_queued = false;
  if (!s.armed) return;
  s.armed = false;
  at::NoGradGuard ng;
  const bool static_first = s.static_first_pass();
  if (static_first) {
    // The first static-graph backward: what got no gradient here is unused from now on; every
    // bucket is reduced now, in launch order.
    s.static_unused.clear();
    for (size_t i = 0; i < s.params.size(); ++i)
      if (s.hook_count[i] == 0) s.static_unused.push_back(i);
    for (const auto& b : s.reducer->buckets())
      for (size_t k : b) {
        const size_t i = s.layout[k];
        if (s.hook_count[i] == 0) {
          s.mark_unused_ready(i);
          continue;
        }
        s.marked[i] = 1;
        if (!s.opt.gradient_as_bucket_view) s.stage(i);
        s.reducer->mark_ready(k);
      }
  }
  std::vector<size_t> missing;
  for (size_t i = 0; i < s.params.size(); ++i)
    if (!s.marked[i]) missing.push_back(i);
  if (!missing.empty()) {
    s.failed = true;
    if (s.opt.static_graph)
      throw DdpError("DDP static_graph: parameter" + std::string(missing.size() > 1 ? "s " : " ") +
                     join_names(s.names, missing) +
                     " got fewer gradients in this iteration than in the first: the graph changed, which "
                     "static_graph does not allow. Use the same graph in every iteration, or set static_graph = false "
                     "(with find_unused_parameters for parameters unused on some steps)");
    throw DdpError("DDP: parameter" + std::string(missing.size() > 1 ? "s " : " ") + join_names(s.names, missing) +
                   " received no gradient in this backward pass, so the ranks cannot reduce in step. If the model "
                   "leaves parameters unused on some steps, set DdpOptions::find_unused_parameters = true; otherwise "
                   "make sure the loss depends on every parameter through the outputs of the DDP forward");
  }
  s.reducer_open = false;
  s.reducer->finalize();
  // join(divide_by_initial_world_size = false): the average over the ranks still training.
  if (s.join_active && !s.join_divide_initial && !s.has_hook() && s.join_training > 0 &&
      s.join_training < s.comm.size() && s.distributed())
    s.flat.mul_(static_cast<double>(s.comm.size()) / s.join_training);
  // Used anywhere? A parameter unused on every rank keeps its gradient untouched (undefined
  // stays undefined) so the optimizer skips it, as with PyTorch's DDP. static_graph decides
  // that once, in its first iteration.
  std::vector<int32_t> used;
  if (s.reduces_used_map()) {
    used = s.reduce_used_map(std::vector<int32_t>(s.used.begin(), s.used.end()));
    s.last_used_map = used;
  }
  if (static_first) {
    s.static_used = used;
    s.static_first_done = true;
  } else if (s.opt.static_graph) {
    used = s.static_used;
  }
  if (s.opt.gradient_as_bucket_view) {
    if (!used.empty())
      for (size_t i = 0; i < s.params.size(); ++i)
        if (s.attach_at_end[i] && used[i] > 0) s.params[i].mutable_grad() = s.views[i];
  } else {
    s.unstage(used);
  }
  std::fill(s.used.begin(), s.used.end(), 0);
  if (s.opt.rebuild_buckets && s.rebuilds == 0 && s.distributed()) s.rebuild_pending = true;
}

// A joined rank's stand-in for a synced backward of the ranks still training: the same
// collectives (every bucket, then the map of used parameters where they reduce it), with zero
// gradients; this rank's own gradients are restored afterwards.
void DdpEngine::State::shadow_backward() {
  State& s = *this;
  at::NoGradGuard ng;
  at::Tensor saved = s.flat.clone();
  s.stream_prologue();
  if (!s.reducer_open) s.reducer->prepare_for_backward();
  s.reducer_open = true;
  s.armed = false;
  s.flat.zero_();
  std::fill(s.marked.begin(), s.marked.end(), 0);
  s.mark_all_in_bucket_order(false);
  s.reducer_open = false;
  s.reducer->finalize();
  if (s.reduces_used_map()) {
    // PyTorch's joined rank all-reduces its reducer's used map in place, round after round: it
    // contributes the last reduced map it holds (its own last synchronised step's at first,
    // then the previous round's result), so a parameter counts as used in a round when it was
    // used since this rank's last step. Bit for bit the same gradients need the same.
    if (s.last_used_map.size() != s.params.size()) s.last_used_map.assign(s.params.size(), 0);
    const auto used = s.reduce_used_map(s.last_used_map);
    s.last_used_map = used;
    if (s.opt.static_graph && !s.static_first_done) {
      s.static_used = used;
      s.static_unused.clear();
      s.static_first_done = true;
    }
  }
  s.flat.copy_(saved);
  if (s.opt.rebuild_buckets && s.rebuilds == 0 && s.distributed()) s.rebuild_pending = true;
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
