// ReducerImpl: the reducer's buckets, their all-reduce on a communication thread and the
// fused optimizer step (private to reducer.cpp and reducer_step.cpp).
#pragma once

#include "ddprun/worker/reducer.h"

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

namespace detail {

// Everything the Reducer is: the bucket plan, the pass state, the communication thread.
// Reducer's public members forward here one to one.
class ReducerImpl {
 public:
  using OverlapStats = Reducer::OverlapStats;
  ReducerImpl(Communicator& comm, std::vector<GradView> grads, DType dtype, ReducerOptions options);
  ~ReducerImpl();
  ReducerImpl(const ReducerImpl&) = delete;
  ReducerImpl& operator=(const ReducerImpl&) = delete;

  void prepare_for_backward();
  void mark_ready(size_t index);
  void mark_unused(size_t index);
  void finalize();
  void set_step_arrays(const float* grad_base, std::vector<float*> arrays);
  bool finalize_and_step(const ElementwiseStep& step);

  struct Bucket {
    std::vector<size_t> members;
    size_t pending = 0;
    bool launched = false;
    bool early = false;  // launched during backward (from mark_ready/mark_unused)
    void* base = nullptr;   // in-place range, or nullptr when staged
    size_t count = 0;
    std::vector<unsigned char> staging;
    bool fused = false;  // averaged and stepped by allreduce_step in finalize_and_step()
    bool joins_previous = false;  // fused, and in the same allreduce_step as the bucket before
    bool started = false;  // inline progress: its start_reduce_for_step() was issued
    bool done_early = false;  // its collective finished before finalize() (under mu_)
  };
  void launch(size_t b);
  void reduce_bucket(Bucket& bk);  // host path, on the communication thread
  void comm_thread_main();
  // Inline progress: runs the queued collectives in order on this thread; without `block`
  // only as far as they complete without waiting for a peer.
  void progress_inline(bool block);
  // Times one collective (wall and thread CPU) into comm_ms_ / comm_cpu_ms_; CommError
  // and other failures go to error_ (rethrown by finalize); under mu_ for the thread.
  template <class F>
  void run_timed(size_t b, F&& f);
  // finalize()'s work, once per pass: launches every bucket not launched yet (but not the
  // fused ones when skip_fused) and waits for them.
  void launch_rest_and_wait(bool skip_fused);
  // The step arrays at the element of gradient pointer `g`.
  void arrays_at(const void* g, float** out) const;
  void step_locally(const Bucket& bk, const ElementwiseStep& step) const;
  // Misuse: throws WorkerError "Reducer misuse on rank R in <op>: <what>".
  [[noreturn]] void misuse(const std::string& op, const std::string& what) const;
  std::string param_label(size_t index) const;
  void check_mark(const char* op, size_t index) const;
  void count_ready(size_t index);
  // finalize()'s entry check: a pass is open; every gradient marked (or, with
  // find_unused_parameters, the rest marked unused).
  void begin_finalize(const char* op);
  // Sets inline_ (Progress::Auto resolved) from the options and which buckets are fused.
  void resolve_progress();
  // Nothing to communicate: one rank and no forced collective.
  bool solo() const { return comm_.size() == 1 && !options_.force_collective; }
  // A synchronised pass that communicated ended: adds the step since the previous one's end to
  // the progress page's statistics (progress_page.h), with this pass's collective time (stats_,
  // plus `fused_ms` in the fused step's collectives, all of it after backward).
  void record_pass(double fused_ms);

  Communicator& comm_;
  FusedStep* fused_;  // comm_.fused_step()
  detail::StreamTiming* timing_;  // a stream-ordered communicator's device timing, if it has one
  std::vector<GradView> grads_;
  DType dtype_;
  ReducerOptions options_;
  std::vector<std::vector<size_t>> plan_;
  std::vector<Bucket> buckets_;
  std::vector<size_t> bucket_of_;
  size_t next_to_launch_ = 0;  // buckets launch strictly in order on every rank
  size_t launched_early_ = 0;
  size_t launched_ = 0;  // buckets handed to the communication thread this pass
  size_t fused_last_ = 0;
  size_t fused_calls_last_ = 0;
  const float* step_grad_base_ = nullptr;
  std::vector<float*> step_arrays_;
  bool sync_ = true;
  bool in_backward_ = false;
  bool finalizing_ = false;  // finalize() marking unused gradients (find_unused_parameters)
  bool split_ = false;  // fused buckets reduce during backward (FusedStep::splits_step)
  OverlapStats stats_;
  double comm_ms_ = 0;  // communication thread's time this pass (under mu_)
  double comm_cpu_ms_ = 0;  // its CPU time (under mu_)
  bool inline_ = false;  // Progress::Inline in effect (resolved from Auto; resolve_progress())
  // Inline progress: buckets launched, in order, not finished yet (training thread only; apart
  // from queue_, which a communication thread started in an earlier pass may still watch).
  std::deque<size_t> inline_queue_;
  bool want_inline_ = false;  // Inline asked for, or Auto with few CPUs on a splitting communicator
  bool finalize_started_ = false;  // under mu_: the training thread is in finalize()
  uint64_t pass_ = 0;                       // prepare_for_backward() calls, for messages
  std::chrono::steady_clock::time_point last_sync_end_{};  // record_pass(): the previous one
  bool have_sync_end_ = false;
  std::vector<unsigned char> ready_;        // per gradient, this pass
  std::vector<unsigned char> contributed_;  // per gradient, since the last synchronised pass
  size_t n_ready_ = 0;

  // Host communication thread.
  std::thread thread_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<size_t> queue_;
  size_t completed_ = 0;
  std::exception_ptr error_;
  bool stop_ = false;
};

}  // namespace detail

}  // namespace ddprun::worker
