// DdpEngine's gradient layout over one flat buffer (rebuilt in arrival order), its comm hook
// bridge, and the small collectives of its state (broadcasts, the used map, join's rounds).
#include "ddp_state.h"

#if DDPRUN_TORCH_HAVE_CUDA
#include <c10/cuda/CUDAStream.h>
#endif

#include <cstring>
#include <utility>

#include "ddprun/worker/torch/collectives.h"

namespace ddprun::worker::libtorch {

void DdpEngine::State::broadcast_tensors(const std::vector<at::Tensor>& ts, int src) {
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

// Stream-ordered communicators: collectives follow the work queued on the current stream.
void DdpEngine::State::stream_prologue() {
#if DDPRUN_TORCH_HAVE_CUDA
  if (on_cuda && comm.stream_ordered()) {
    // The parameters' device's current stream, not the calling thread's current device's.
    comm.set_compute_stream(c10::cuda::getCurrentCUDAStream(device_index).stream());
    comm.comm_waits_for_compute();
  }
#endif
}

// The flat gradient buffer: the communicator's zero-copy memory where it has some (it lives as
// long as the communicator; `shared` says so), else zeros of our own.
at::Tensor DdpEngine::State::allocate_flat(int64_t total, bool& shared) {
  FusedStep* fs = on_cuda ? nullptr : comm.fused_step();
  void* mem = fs ? fs->alloc_shared(static_cast<size_t>(total) * dtype_size(dtype)) : nullptr;
  shared = mem != nullptr;
  return mem ? at::from_blob(mem, {total}, grad_options) : at::zeros({total}, grad_options);
}

// Lays the gradients out in `order`, rebinding param.grad() to the new views (contents kept).
void DdpEngine::State::build_layout(const std::vector<size_t>& order) {
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
  bool shared = flat_is_comm_memory;
  // A rebuild: same size, new order, same memory (no second allocation).
  at::Tensor fresh = flat.defined() ? flat : allocate_flat(total, shared);
  std::vector<at::Tensor> fresh_views(n);
  std::vector<GradView> gv;
  gv.reserve(n);
  auto* base = static_cast<char*>(fresh.data_ptr());
  for (size_t i : order) {
    // A plain tensor over the flat storage (not an autograd view): optimizers may detach_()
    // and zero_() it, and AccumulateGrad adds into it in place.
    fresh_views[i] = at::from_blob(
        base + offset[i] * static_cast<int64_t>(esize), params[i].sizes(), [keep = fresh](void*) {}, grad_options);
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
CommHook DdpEngine::State::core_hook() {
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
void DdpEngine::State::bind_view(size_t i, bool zero_if_undefined) {
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
void DdpEngine::State::stage(size_t i) {
  const at::Tensor& g = params[i].grad();
  if (g.defined()) views[i].copy_(g);
  else views[i].zero_();
}

// ... and the reduced bucket back into the gradients used on some rank (`used`; all when
// empty); a gradient that was undefined gets a tensor laid out like its parameter.
void DdpEngine::State::unstage(const std::vector<int32_t>& used) {
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
void DdpEngine::State::mark_unused_ready(size_t u) {
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
void DdpEngine::State::mark_all_in_bucket_order(bool skip_marked) {
  for (const auto& b : reducer->buckets())
    for (size_t k : b) {
      const size_t i = layout[k];
      if (skip_marked && marked[i]) continue;
      marked[i] = 1;
      reducer->mark_ready(k);
    }
}

// The all-reduced map of parameters used since the last synced backward (collective).
std::vector<int32_t> DdpEngine::State::reduce_used_map(std::vector<int32_t> used) {
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
double DdpEngine::State::join_allreduce(double value, at::ScalarType type, ReduceOp op) {
  at::NoGradGuard ng;
  at::Tensor t = at::full({1}, value, at::TensorOptions().dtype(type).device(params[0].device()));
  all_reduce(comm, t, op);
  return t.item<double>();
}

// PyTorch's _find_common_rank: the highest rank for which `candidate` holds.
int DdpEngine::State::common_rank(bool candidate) {
  const double r = join_allreduce(candidate ? comm.rank() : -1, at::kLong, ReduceOp::Max);
  if (r < 0) throw DdpError("DDP join: no rank qualified as the source of the model (internal error)");
  return static_cast<int>(r);
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

}  // namespace ddprun::worker::libtorch
