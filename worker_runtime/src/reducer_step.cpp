// The fused step: the optimizer's elementwise update of each bucket run right after its
// all-reduce, on the reduced gradients (Reducer::finalize_and_step).
#include "reducer_impl.h"

namespace ddprun::worker {

void detail::ReducerImpl::set_step_arrays(const float* grad_base, std::vector<float*> arrays) {
  DDPRUN_ENFORCE(dtype_ == DType::F32, "set_step_arrays: fp32 gradients only");
  DDPRUN_ENFORCE(options_.average, "set_step_arrays: the fused step averages; ReducerOptions::average must stay true");
  DDPRUN_ENFORCE(!comm_.stream_ordered(), "set_step_arrays: host communicators only (the step runs on the host)");
  DDPRUN_ENFORCE(!in_backward_, "set_step_arrays: not between prepare_for_backward() and finalize()");
  DDPRUN_ENFORCE(!arrays.empty() && arrays.size() <= ElementwiseStep::kMaxArrays,
                 "set_step_arrays: 1 to " + std::to_string(ElementwiseStep::kMaxArrays) + " arrays");
  const auto base = reinterpret_cast<uintptr_t>(grad_base);
  for (const auto& g : grads_) {
    const auto p = reinterpret_cast<uintptr_t>(g.ptr);
    DDPRUN_ENFORCE(p >= base && (p - base) % sizeof(float) == 0,
                   "set_step_arrays: every gradient must lie in the flat buffer at grad_base");
  }
  step_grad_base_ = grad_base;
  step_arrays_ = std::move(arrays);
  if (solo()) return resolve_progress();  // nothing to communicate: finalize_and_step steps locally
  // Fuse only where every rank can: a bucket fused on one rank and all-reduced on another
  // would pair different collectives. Likewise for joining a fused bucket with the previous
  // one into one collective (they are adjacent in memory): fused buckets all run after
  // backward, so one collective over the joined range saves two barriers per join. Votes:
  // 1 per fusable bucket, then 1 per bucket adjacent to the previous one, summed over ranks.
  const size_t nb = buckets_.size();
  std::vector<float> votes(2 * nb + 1, 0.f);
  votes[2 * nb] = fused_ && fused_->splits_step() ? 1.f : 0.f;
  float* at[ElementwiseStep::kMaxArrays];
  auto begin_of = [&](size_t b) { return static_cast<const unsigned char*>(buckets_[b].base); };
  auto end_of = [&](size_t b) { return begin_of(b) + buckets_[b].count * sizeof(float); };
  for (size_t b = 0; b < nb; ++b) {
    const Bucket& bk = buckets_[b];
    if (!bk.base) continue;  // staged: the communicator never sees the real gradient
    arrays_at(bk.base, at);
    votes[b] = fused_ && !options_.comm_hook &&
                       fused_->fuses_step(static_cast<const float*>(bk.base), bk.count, at, step_arrays_.size())
                   ? 1.f
                   : 0.f;
    // Adjacent to the previous bucket: a chain of such buckets always tiles one range (each
    // one extends the range at the end where its predecessor lies).
    if (b > 0 && buckets_[b - 1].base && (end_of(b) == begin_of(b - 1) || end_of(b - 1) == begin_of(b)))
      votes[nb + b] = 1.f;
  }
  comm_.allreduce(votes.data(), votes.size(), DType::F32, ReduceOp::Sum);
  const auto all = static_cast<float>(comm_.size());
  split_ = votes[2 * nb] == all;
  for (size_t b = 0; b < nb; ++b) buckets_[b].fused = votes[b] == all;
  for (size_t b = 0; b < nb; ++b)
    buckets_[b].joins_previous = b > 0 && buckets_[b].fused && buckets_[b - 1].fused && votes[nb + b] == all;
  resolve_progress();
  // An unfused bucket is stepped by every rank over all of it (step_locally): in one-copy
  // memory that is every rank writing the same bytes. The memory and the vote are the same on
  // every rank, so every rank throws alike.
  for (size_t b = 0; b < nb; ++b) {
    if (buckets_[b].fused) continue;
    for (size_t i : buckets_[b].members) {
      arrays_at(grads_[i].ptr, at);
      for (size_t j = 0; j < step_arrays_.size(); ++j)
        if (fused_ && fused_->is_single_copy(at[j], grads_[i].count * sizeof(float)))
          throw WorkerError("set_step_arrays: step array " + std::to_string(j) + " of " + param_label(i) +
                            " lies in alloc_shared_single() memory, but its bucket cannot be fused (its gradient is "
                            "not in alloc_shared() memory, or not contiguous with its bucket), so every rank would "
                            "step it in place at once. Expected the gradients in one alloc_shared() buffer, or the "
                            "arrays in alloc_shared() / private memory");
    }
  }
}

void detail::ReducerImpl::arrays_at(const void* g, float** out) const {
  const size_t k = (reinterpret_cast<uintptr_t>(g) - reinterpret_cast<uintptr_t>(step_grad_base_)) / sizeof(float);
  for (size_t j = 0; j < step_arrays_.size(); ++j) out[j] = step_arrays_[j] + k;
}

void detail::ReducerImpl::step_locally(const Bucket& bk, const ElementwiseStep& step) const {
  float* at[ElementwiseStep::kMaxArrays];
  for (size_t i : bk.members) {  // member by member: a staged bucket's members are scattered
    arrays_at(grads_[i].ptr, at);
    step.apply(at, static_cast<const float*>(grads_[i].ptr), grads_[i].count);
  }
}

bool detail::ReducerImpl::finalize_and_step(const ElementwiseStep& step) {
  DDPRUN_ENFORCE(!step_arrays_.empty(), "finalize_and_step: call set_step_arrays() first");
  DDPRUN_ENFORCE(step.num_arrays() == step_arrays_.size(),
                 "finalize_and_step: the step updates " + std::to_string(step.num_arrays()) + " arrays, " +
                     std::to_string(step_arrays_.size()) + " were registered");
  fused_last_ = 0;
  fused_calls_last_ = 0;
  begin_finalize("finalize_and_step()");
  if (!sync_) return false;  // accumulating (no_sync): no step until the synchronised micro-batch
  if (!solo()) launch_rest_and_wait(true);
  // The communication thread is idle now: this thread may issue the fused collectives, in
  // bucket order like every other rank. Every rank is past backward once all are here.
  const auto t_finish = std::chrono::steady_clock::now();
  double fused_ms = 0;  // in allreduce_step / finish_step
  auto timed = [&fused_ms](auto&& f) {
    const auto t0 = std::chrono::steady_clock::now();
    f();
    fused_ms += std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  };
  float* at[ElementwiseStep::kMaxArrays];
  std::vector<float*> seg_grads, seg_arrays;  // split: every fused bucket in one finish_step
  std::vector<size_t> seg_counts;
  for (size_t b = 0; b < buckets_.size(); ++b) {
    if (!buckets_[b].fused) {
      step_locally(buckets_[b], step);
      continue;
    }
    if (split_) {
      auto* g = static_cast<float*>(buckets_[b].base);
      seg_grads.push_back(g);
      seg_counts.push_back(buckets_[b].count);
      arrays_at(g, at);
      seg_arrays.insert(seg_arrays.end(), at, at + step_arrays_.size());
      ++fused_last_;
      continue;
    }
    // This bucket and the following ones that join it: one contiguous range.
    auto* lo = static_cast<float*>(buckets_[b].base);
    float* hi = lo + buckets_[b].count;
    ++fused_last_;
    while (b + 1 < buckets_.size() && buckets_[b + 1].joins_previous) {
      const Bucket& next = buckets_[++b];
      auto* p = static_cast<float*>(next.base);
      lo = std::min(lo, p);
      hi = std::max(hi, p + next.count);
      ++fused_last_;
    }
    arrays_at(lo, at);
    timed([&] { fused_->allreduce_step(lo, static_cast<size_t>(hi - lo), step, at); });
    ++fused_calls_last_;
  }
  if (!seg_grads.empty()) {
    timed([&] { fused_->finish_step(seg_grads.size(), seg_grads.data(), seg_counts.data(), step, seg_arrays.data()); });
    ++fused_calls_last_;
  }
  stats_.finish_ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t_finish).count();
  if (!solo()) record_pass(fused_ms);
  return true;
}

}  // namespace ddprun::worker
