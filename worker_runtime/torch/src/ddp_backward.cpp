// DdpEngine's autograd side: a parameter's AccumulateGrad post-hook, the end-of-backward
// callback, and a joined rank's shadow of a backward.
#include <torch/csrc/autograd/engine.h>

#include <algorithm>
#include <string>
#include <vector>

#include "ddp_state.h"

namespace ddprun::worker::libtorch {

namespace {

std::string join_names(const std::vector<std::string>& names, const std::vector<size_t>& idx, size_t max = 10) {
  std::string s;
  for (size_t k = 0; k < idx.size() && k < max; ++k) s += (k ? ", '" : "'") + names[idx[k]] + "'";
  if (idx.size() > max) s += " and " + std::to_string(idx.size() - max) + " more";
  return s;
}

}  // namespace

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
  if (static_first) s.reduce_static_first();
  s.check_all_marked();
  s.reducer_open = false;
  s.reducer->finalize();
  // join(divide_by_initial_world_size = false): the average over the ranks still training.
  if (s.join_active && !s.join_divide_initial && !s.has_hook() && s.join_training > 0 &&
      s.join_training < s.comm.size() && s.distributed())
    s.flat.mul_(static_cast<double>(s.comm.size()) / s.join_training);
  s.finish_used(static_first);
  if (s.opt.rebuild_buckets && s.rebuilds == 0 && s.distributed()) s.rebuild_pending = true;
}

// The first static-graph backward: what got no gradient here is unused from now on; every
// bucket is reduced now, in launch order.
void DdpEngine::State::reduce_static_first() {
  State& s = *this;
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

// Every parameter must have been marked ready by the end of a synced backward.
void DdpEngine::State::check_all_marked() {
  State& s = *this;
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
}

// After the reduction: a gradient unused on every rank is left alone, the others get the
// reduced values.
void DdpEngine::State::finish_used(bool static_first) {
  State& s = *this;
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

}  // namespace ddprun::worker::libtorch
