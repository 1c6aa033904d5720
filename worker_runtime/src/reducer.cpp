#include "reducer_impl.h"

#include "ddprun/worker/progress.h"

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <cstring>
#include <ctime>
#include <deque>
#include <exception>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <utility>

#include <sched.h>

#include "ddprun/worker/checks.h"
#include "progress_page.h"
#include "stream_timing.h"

namespace ddprun::worker {
namespace {

double thread_cpu_ms() {
  timespec ts{};
  ::clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) * 1e3 + static_cast<double>(ts.tv_nsec) * 1e-6;
}

// CPUs this process may run on (its affinity mask, e.g. taskset); a large number if unknown.
int usable_cpus() {
  cpu_set_t set;
  CPU_ZERO(&set);
  if (::sched_getaffinity(0, sizeof set, &set) != 0) return 1 << 20;
  return CPU_COUNT(&set);
}

}  // namespace

std::vector<std::vector<size_t>> plan_buckets(const std::vector<size_t>& param_bytes, size_t first_bucket_cap_bytes,
                                              size_t bucket_cap_bytes) {
  std::vector<std::vector<size_t>> plan;
  std::vector<size_t> cur;
  size_t cur_bytes = 0;
  for (size_t k = param_bytes.size(); k-- > 0;) {
    cur.push_back(k);
    cur_bytes += param_bytes[k];
    const size_t cap = plan.empty() ? first_bucket_cap_bytes : bucket_cap_bytes;
    if (cur_bytes >= cap) {
      plan.push_back(std::move(cur));
      cur.clear();
      cur_bytes = 0;
    }
  }
  if (!cur.empty()) plan.push_back(std::move(cur));
  return plan;
}

detail::ReducerImpl::ReducerImpl(Communicator& comm, std::vector<GradView> grads, DType dtype, ReducerOptions options)
    : comm_(comm),
      fused_(comm.fused_step()),
      timing_(comm.stream_ordered() ? dynamic_cast<detail::StreamTiming*>(&comm) : nullptr),
      grads_(std::move(grads)),
      dtype_(dtype),
      options_(options) {
  const size_t es = dtype_size(dtype_);
  std::vector<size_t> bytes;
  bytes.reserve(grads_.size());
  for (const auto& g : grads_) bytes.push_back(g.count * es);
  plan_ = plan_buckets(bytes, options_.first_bucket_cap_bytes, options_.bucket_cap_bytes);
  buckets_.resize(plan_.size());
  bucket_of_.assign(grads_.size(), 0);
  for (size_t b = 0; b < plan_.size(); ++b) {
    Bucket& bk = buckets_[b];
    bk.members = plan_[b];
    for (size_t i : bk.members) {
      bucket_of_[i] = b;
      bk.count += grads_[i].count;
    }
    // In place when the members tile one contiguous range.
    std::vector<size_t> by_addr = bk.members;
    std::sort(by_addr.begin(), by_addr.end(), [&](size_t a, size_t c) { return grads_[a].ptr < grads_[c].ptr; });
    bool contiguous = true;
    for (size_t j = 1; j < by_addr.size(); ++j) {
      const auto* prev_end =
          static_cast<unsigned char*>(grads_[by_addr[j - 1]].ptr) + grads_[by_addr[j - 1]].count * es;
      if (prev_end != grads_[by_addr[j]].ptr) contiguous = false;
    }
    if (contiguous) {
      bk.base = grads_[by_addr.front()].ptr;
    } else {
      if (comm_.stream_ordered())
        throw WorkerError("Reducer: gradients of a bucket must be contiguous in device memory; "
                          "allocate them in one flat buffer in registration order");
      bk.staging.resize(bk.count * es);
    }
  }
  ready_.assign(grads_.size(), 0);
  contributed_.assign(grads_.size(), 0);
  // The thread starts at the first launch that needs it (Auto may settle on Inline).
  const bool few_cpus = usable_cpus() < 2 * comm_.size();
  want_inline_ = options_.progress == ReducerOptions::Progress::Inline ||
                 (options_.progress == ReducerOptions::Progress::Auto && fused_ && fused_->splits_step() && few_cpus);
  resolve_progress();
}

void detail::ReducerImpl::resolve_progress() {
  // Auto keeps Inline only where every bucket's collective can progress without blocking
  // (all fused on a splitting communicator); otherwise a thread overlaps them. What that
  // depends on changes only in set_step_arrays(), which calls this again.
  inline_ = want_inline_ && !comm_.stream_ordered() &&
            (options_.progress == ReducerOptions::Progress::Inline ||
             std::all_of(buckets_.begin(), buckets_.end(), [&](const Bucket& b) { return b.fused && split_; }));
}

void detail::ReducerImpl::misuse(const std::string& op, const std::string& what) const {
  throw WorkerError("Reducer misuse on rank " + std::to_string(comm_.rank()) + " in " + op + ": " + what);
}

std::string detail::ReducerImpl::param_label(size_t index) const {
  std::string s = "parameter " + std::to_string(index);
  if (options_.param_name) s += " (" + options_.param_name(index) + ")";
  return s;
}

void detail::ReducerImpl::check_mark(const char* op, size_t index) const {
  const std::string call = std::string(op) + "(" + std::to_string(index) + ")";
  if (index >= grads_.size())
    misuse(call, "index out of range: expected a parameter index below " + std::to_string(grads_.size()) +
                     " (registration order)");
  if (!in_backward_)
    misuse(call, "called outside a backward pass for " + param_label(index) +
                     ": expected prepare_for_backward() before each backward pass (without it this rank would "
                     "skip synchronisation and silently diverge from its peers)");
  if (ready_[index])
    misuse(call, param_label(index) + " was already marked ready in backward pass " + std::to_string(pass_) +
                     ": expected each gradient to be marked exactly once per pass, after its last contribution");
}

void detail::ReducerImpl::count_ready(size_t index) {
  ready_[index] = 1;
  ++n_ready_;
}

detail::ReducerImpl::~ReducerImpl() {
  if (thread_.joinable()) {
    {
      std::lock_guard<std::mutex> lk(mu_);
      stop_ = true;
    }
    cv_.notify_all();
    thread_.join();
  }
}

void detail::ReducerImpl::prepare_for_backward() {
  if (in_backward_)
    misuse("prepare_for_backward()", "called again while backward pass " + std::to_string(pass_) +
                                         " is still open: expected finalize() (or finalize_and_step()) after "
                                         "each backward pass before the next prepare_for_backward()");
  ++pass_;
  std::fill(ready_.begin(), ready_.end(), 0);
  n_ready_ = 0;
  for (auto& bk : buckets_) {
    bk.pending = bk.members.size();
    bk.launched = false;
    bk.early = false;
  }
  next_to_launch_ = 0;
  launched_early_ = 0;
  launched_ = 0;
  in_backward_ = true;
  for (auto& bk : buckets_) bk.started = false;
  if (timing_ && sync_ && !solo()) timing_->timing_begin_pass();
  std::lock_guard<std::mutex> lk(mu_);
  completed_ = 0;
  comm_ms_ = 0;
  comm_cpu_ms_ = 0;
}

void detail::ReducerImpl::mark_ready(size_t index) {
  check_mark("mark_ready", index);
  count_ready(index);
  contributed_[index] = 1;
  if (!sync_ || solo()) return;
  Bucket& bk = buckets_[bucket_of_[index]];
  --bk.pending;
  if (!options_.overlap) return;
  // Launch in bucket order so every rank issues the same sequence of collectives. A fused
  // bucket starts its reduction now where the step splits (reduce_for_step writes no
  // parameter); otherwise it waits for finalize_and_step(): its step writes parameters that
  // this or another rank may still read in backward. Ranks agree on which buckets are fused
  // and on splitting, so the sequence stays the same everywhere.
  while (next_to_launch_ < buckets_.size() && buckets_[next_to_launch_].pending == 0) {
    const size_t b = next_to_launch_++;
    if (buckets_[b].fused && !split_) continue;
    launch(b);
    if (!finalizing_) {  // not when finalize() marks the unused ones (find_unused_parameters)
      ++launched_early_;
      buckets_[b].early = true;
    }
  }
  // A layer boundary: move the queued collectives on as far as they go without waiting.
  if (inline_ && !finalizing_) progress_inline(false);
}

void detail::ReducerImpl::mark_unused(size_t index) {
  check_mark("mark_unused", index);
  if (!contributed_[index]) {
    if (comm_.stream_ordered())
      misuse("mark_unused(" + std::to_string(index) + ")",
             "the gradient of " + param_label(index) +
                 " is in device memory: expected the program to zero it on the device and call mark_ready()");
    std::memset(grads_[index].ptr, 0, grads_[index].count * dtype_size(dtype_));
  }
  // Counted like mark_ready (also launching the buckets it completes), minus the contribution.
  const unsigned char had = contributed_[index];
  mark_ready(index);
  contributed_[index] = had;
}

void detail::ReducerImpl::begin_finalize(const char* op) {
  if (!in_backward_)
    misuse(op, "called without prepare_for_backward() for this pass: expected prepare_for_backward() before "
               "backward, mark_ready() once per gradient during it, then one " +
                   std::string(op));
  if (n_ready_ < grads_.size()) {
    std::vector<size_t> missing;
    for (size_t i = 0; i < grads_.size(); ++i)
      if (!ready_[i]) missing.push_back(i);
    if (options_.find_unused_parameters) {
      finalizing_ = true;  // what these launch does not count as launched during backward
      for (size_t i : missing) mark_unused(i);
      finalizing_ = false;
    } else {
      std::string list;
      for (size_t k = 0; k < missing.size() && k < 16; ++k) list += (k ? ", " : "") + param_label(missing[k]);
      if (missing.size() > 16) list += ", ... (" + std::to_string(missing.size() - 16) + " more)";
      in_backward_ = false;
      misuse(op, std::to_string(missing.size()) + " of " + std::to_string(grads_.size()) +
                     " gradients were never marked ready in backward pass " + std::to_string(pass_) + ": " + list +
                     ". Expected mark_ready() for every parameter; if these did not take part in this step, call "
                     "mark_unused() for them or set ReducerOptions::find_unused_parameters");
    }
  }
  in_backward_ = false;
  if (sync_) std::fill(contributed_.begin(), contributed_.end(), 0);
}

void detail::ReducerImpl::launch(size_t b) {
  Bucket& bk = buckets_[b];
  bk.launched = true;
  ++launched_;
  if (comm_.stream_ordered()) {
    if (options_.comm_hook) {  // the hook orders its own device work (see CommHook)
      options_.comm_hook(comm_, CommBucket{bk.base, bk.count, dtype_, b, options_.average});
      return;
    }
    comm_.comm_waits_for_compute();
    comm_.allreduce(bk.base, bk.count, dtype_, options_.average ? ReduceOp::Avg : ReduceOp::Sum);
    return;
  }
  if (inline_) {  // progress_inline() runs it, on this thread
    inline_queue_.push_back(b);
    return;
  }
  if (!thread_.joinable()) thread_ = std::thread([this] { comm_thread_main(); });
  {
    std::lock_guard<std::mutex> lk(mu_);
    queue_.push_back(b);
  }
  cv_.notify_all();
}

template <class F>
void detail::ReducerImpl::run_timed(size_t b, F&& f) {
  std::exception_ptr err;
  const auto t0 = std::chrono::steady_clock::now();
  const double c0 = thread_cpu_ms();
  try {
    f();
  } catch (const CommError&) {
    err = std::current_exception();
  } catch (const std::exception& e) {
    err = std::make_exception_ptr(
        CommError(std::string("all-reduce of bucket ") + std::to_string(b) + " failed: " + e.what()));
  }
  const double cpu = thread_cpu_ms() - c0;
  const double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  std::lock_guard<std::mutex> lk(mu_);
  if (err && !error_) error_ = err;
  comm_ms_ += ms;
  comm_cpu_ms_ += cpu;
}

void detail::ReducerImpl::progress_inline(bool block) {
  while (!inline_queue_.empty()) {
    const size_t b = inline_queue_.front();
    Bucket& bk = buckets_[b];
    bool done = true;
    if (!error_) {  // after a failure, drain without communicating (finalize rethrows it)
      const bool startable = bk.fused && split_;
      if (!startable && !block) return;  // a blocking collective waits for finalize()
      run_timed(b, [&] {
        if (!startable) return reduce_bucket(bk);
        if (!bk.started) {
          bk.started = true;
          fused_->start_reduce_for_step(static_cast<float*>(bk.base), bk.count);
        }
        done = fused_->test_reduce_for_step(block);
      });
      if (error_) done = true;
    }
    if (!done) return;
    inline_queue_.pop_front();
    bk.done_early = in_backward_;
    std::lock_guard<std::mutex> lk(mu_);
    ++completed_;
  }
}

void detail::ReducerImpl::reduce_bucket(Bucket& bk) {
  const size_t es = dtype_size(dtype_);
  if (bk.fused && split_) {
    fused_->reduce_for_step(static_cast<float*>(bk.base), bk.count);
    return;
  }
  auto reduce = [&](void* data) {
    if (options_.comm_hook)
      options_.comm_hook(comm_, CommBucket{data, bk.count, dtype_, static_cast<size_t>(&bk - buckets_.data()),
                                           options_.average});
    else comm_.allreduce(data, bk.count, dtype_, options_.average ? ReduceOp::Avg : ReduceOp::Sum);
  };
  if (bk.base) {
    reduce(bk.base);
    return;
  }
  size_t off = 0;
  for (size_t i : bk.members) {
    std::memcpy(bk.staging.data() + off, grads_[i].ptr, grads_[i].count * es);
    off += grads_[i].count * es;
  }
  reduce(bk.staging.data());
  off = 0;
  for (size_t i : bk.members) {
    std::memcpy(grads_[i].ptr, bk.staging.data() + off, grads_[i].count * es);
    off += grads_[i].count * es;
  }
}

void detail::ReducerImpl::comm_thread_main() {
  for (;;) {
    size_t b = 0;
    {
      std::unique_lock<std::mutex> lk(mu_);
      cv_.wait(lk, [&] { return stop_ || !queue_.empty(); });
      if (stop_) return;
      b = queue_.front();
      queue_.pop_front();
      if (error_) {  // after a failure, drain without communicating
        ++completed_;
        cv_.notify_all();
        continue;
      }
    }
    run_timed(b, [&] { reduce_bucket(buckets_[b]); });
    {
      std::lock_guard<std::mutex> lk(mu_);
      // Done before the training thread reached finalize(): reduced during backward.
      buckets_[b].done_early = !finalize_started_;
      ++completed_;
    }
    cv_.notify_all();
  }
}

void detail::ReducerImpl::launch_rest_and_wait(bool skip_fused) {
  // In bucket order, the same on every rank (fused buckets skipped in mark_ready come here).
  const auto t0 = std::chrono::steady_clock::now();  // from here on, communication is exposed
  const size_t es = dtype_size(dtype_);
  stats_ = OverlapStats{};
  stats_.inline_progress = inline_;
  if (!comm_.stream_ordered()) {
    std::lock_guard<std::mutex> lk(mu_);
    finalize_started_ = true;  // collectives the thread finishes from now on were exposed
  }
  for (const auto& bk : buckets_) {
    stats_.buckets += 1;
    stats_.bytes += bk.count * es;
    if (bk.early) {
      stats_.buckets_early += 1;
      stats_.bytes_early += bk.count * es;
    }
  }
  if (timing_) timing_->timing_mark_backward_end();
  for (size_t b = 0; b < buckets_.size(); ++b)
    if (!buckets_[b].launched && !(skip_fused && buckets_[b].fused && !split_)) launch(b);
  next_to_launch_ = buckets_.size();
  if (comm_.stream_ordered()) {
    if (timing_) timing_->timing_end_pass();
    comm_.compute_waits_for_comm();
    return;
  }
  if (inline_) progress_inline(true);
  std::unique_lock<std::mutex> lk(mu_);
  cv_.wait(lk, [&] { return completed_ == launched_; });
  stats_.exposed_ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  stats_.comm_ms = comm_ms_;
  stats_.comm_cpu_ms = comm_cpu_ms_;
  for (auto& bk : buckets_) {
    if (bk.launched && bk.done_early) {
      stats_.buckets_done_early += 1;
      stats_.bytes_done_early += bk.count * es;
    }
    bk.done_early = false;
  }
  finalize_started_ = false;
  if (error_) {
    auto e = error_;
    error_ = nullptr;
    std::rethrow_exception(e);
  }
}

void detail::ReducerImpl::finalize() {
  begin_finalize("finalize()");
  if (sync_ && split_ && std::any_of(buckets_.begin(), buckets_.end(), [](const Bucket& b) { return b.fused; }))
    misuse("finalize()", "set_step_arrays() made buckets reduce for the fused step during backward: expected "
                         "finalize_and_step() to end a synchronised pass");
  if (!sync_ || solo()) return;
  launch_rest_and_wait(false);
  record_pass(0);
}

// The step boundary is the end of a synchronised pass: from one to the next, the step holds
// everything the loop does (forward, backward, accumulation passes, the optimizer), and its
// collectives all ran in between. The first pass only starts the clock. A stream-ordered
// communicator (NCCL) only queues its collectives here: their device time comes from its
// timing events (detail::StreamTiming), a step or two later (the totals are what count); one
// without them reports nothing rather than a share of 0.
void detail::ReducerImpl::record_pass(double fused_ms) {
  if (comm_.stream_ordered() && !timing_) return;
  const auto now = std::chrono::steady_clock::now();
  if (have_sync_end_) {
    auto ns = [](double ms) { return static_cast<uint64_t>(std::max(0.0, ms) * 1e6); };
    double comm = 0, exposed = 0;
    if (timing_) {
      timing_->timing_take(comm, exposed);
    } else {
      comm = stats_.comm_ms + fused_ms;
      // Inline progress: the training thread ran every collective itself, nothing was hidden.
      exposed = stats_.inline_progress ? comm : std::min(stats_.exposed_ms, stats_.comm_ms) + fused_ms;
    }
    const auto step = std::chrono::duration_cast<std::chrono::nanoseconds>(now - last_sync_end_).count();
    record_step_stats(static_cast<uint64_t>(std::max<int64_t>(step, 0)), ns(comm), ns(exposed));
  }
  last_sync_end_ = now;
  have_sync_end_ = true;
}

// ---- Reducer: the public face of ReducerImpl --------------------------------------------

Reducer::Reducer(Communicator& comm, std::vector<GradView> grads, DType dtype, ReducerOptions options)
    : impl_(std::make_unique<detail::ReducerImpl>(comm, std::move(grads), dtype, std::move(options))) {}
Reducer::~Reducer() = default;
// A pass begins: this rank has entered a step (progress.h). Ticking here rather than at the
// end of the pass puts a rank that stops before a step behind the ranks that entered it and
// wait in its collective, so --hang_timeout names the rank that stopped.
void Reducer::prepare_for_backward() {
  ::ddprun::worker::progress();  // the free function (progress.h), not Reducer::progress()
  impl_->prepare_for_backward();
}
void Reducer::mark_ready(size_t index) { impl_->mark_ready(index); }
void Reducer::mark_unused(size_t index) { impl_->mark_unused(index); }
void Reducer::finalize() { impl_->finalize(); }
void Reducer::set_step_arrays(const float* grad_base, std::vector<float*> arrays) {
  impl_->set_step_arrays(grad_base, std::move(arrays));
}
bool Reducer::finalize_and_step(const ElementwiseStep& step) { return impl_->finalize_and_step(step); }
void Reducer::set_sync(bool sync) { impl_->sync_ = sync; }
void Reducer::set_comm_hook(CommHook hook) {
  if (impl_->in_backward_)
    throw WorkerError(
        "Reducer::set_comm_hook: called inside a pass (after prepare_for_backward()); set it between passes");
  impl_->options_.comm_hook = std::move(hook);
}
bool Reducer::sync() const { return impl_->sync_; }
const std::vector<std::vector<size_t>>& Reducer::buckets() const { return impl_->plan_; }
size_t Reducer::buckets_launched_early() const { return impl_->launched_early_; }
const Reducer::OverlapStats& Reducer::overlap() const { return impl_->stats_; }
ReducerOptions::Progress Reducer::progress() const {
  return impl_->inline_ ? ReducerOptions::Progress::Inline : ReducerOptions::Progress::Thread;
}
size_t Reducer::buckets_fused() const { return impl_->fused_last_; }
size_t Reducer::fused_collectives() const { return impl_->fused_calls_last_; }

}  // namespace ddprun::worker
