// `train`'s fault injection and preemption exit (train_common.h): --fail-at-step, --hang-at-step,
// --wait-for-signal-at-step, and the exit code that tells ddprun "preempted". Shared by the CPU
// (train.cpp) and GPU (train_gpu.cu) paths.
#include <signal.h>
#include <time.h>
#include <unistd.h>

#include <chrono>
#include <cinttypes>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <thread>

#include "ddprun/worker/checkpoint.h"
#include "ddprun/worker/checks.h"
#include "ddprun/worker/env.h"
#include "ddprun/worker/error_file.h"
#include "ddprun/worker/runtime.h"
#include "ddprun/worker/stop.h"
#include "train_common.h"

namespace dw = ddprun::worker;

namespace train {

// --hang-at-step: the rank stops making progress (no step, no tick) and sleeps until it is
// killed; a hang watch's stack dump shows this frame.
[[noreturn]] __attribute__((noinline)) void injected_hang(const dw::WorkerEnv& env, int64_t step) {
  std::fprintf(stderr, "[train] rank %d attempt %d: injected hang before step %" PRId64 "\n", env.rank,
               env.restart_count, step);
  std::fflush(stderr);
  while (true) ::sleep(3600);
}

void maybe_inject_fault(const Options& o, const dw::WorkerEnv& env, int64_t step) {
  if (env.rank != o.fail_rank) return;
  if (o.hang_at_step == step && env.restart_count == (o.fail_attempt >= 0 ? o.fail_attempt : 0))
    injected_hang(env, step);
  for (size_t i = 0; i < o.fail_at_step.size(); ++i) {
    const int attempt = o.fail_attempt >= 0 ? o.fail_attempt : static_cast<int>(i);
    if (o.fail_at_step[i] != step || env.restart_count != attempt) continue;
    std::fprintf(stderr, "[train] rank %d attempt %d: injected fault (%s) before step %" PRId64 "\n", env.rank,
                 env.restart_count, o.fail_mode.c_str(), step);
    std::fflush(stderr);
    if (o.fail_mode == "exit") {
      dw::write_error_file(env.error_file, "injected failure before step " + std::to_string(step),
                           "train --fail-at-step " + std::to_string(step));
      std::_Exit(dw::kExitError);
    }
    ::kill(::getpid(), SIGKILL);
  }
}

// --wait-for-signal-at-step (tests): the chosen rank(s) block before the agreement of that step
// until a stop signal arrived, so a test signals "mid-run" at a known step without racing the
// run's end. The handler's flag is polled: the process has other threads (Gloo, the
// communication thread), and a signal the main thread blocks is delivered to one of them, so
// a sigsuspend in the main thread could miss it and wait for the next one.
void maybe_wait_for_signal(const Options& o, const dw::WorkerEnv& env, int64_t step) {
  if (o.wait_for_signal_at_step < 0 || step != o.wait_for_signal_at_step) return;
  if (o.wait_rank >= 0 && env.rank != o.wait_rank) return;
  std::printf("[train] rank %d: waiting for a stop signal after step %" PRId64 "\n", env.rank, step);
  std::fflush(stdout);
  while (!dw::stop_requested()) std::this_thread::sleep_for(std::chrono::milliseconds(2));
}

int finish_preempted(const Options& o, int rank, int64_t step) {
  // Every rank stopped after the same step (agree_stop) and rank 0 wrote that step's checkpoint.
  dw::announce_preemption(
      o.checkpoint_dir.empty() ? std::string() : dw::checkpoint_path(o.checkpoint_dir, static_cast<uint64_t>(step)));
  if (rank == 0) {
    if (!o.checkpoint_dir.empty())
      std::printf("[train] checkpoint of step %" PRId64 " written to %s; exit %d (preempted): rerun to resume\n", step,
                  dw::checkpoint_path(o.checkpoint_dir, static_cast<uint64_t>(step)).c_str(), dw::kExitPreempted);
    else std::printf("[train] no --checkpoint-dir: nothing saved; exit %d (preempted)\n", dw::kExitPreempted);
  }
  std::fflush(stdout);
  return dw::kExitPreempted;
}

}  // namespace train
