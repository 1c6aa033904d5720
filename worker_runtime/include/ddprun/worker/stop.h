// Stopping together for a preemption or a time limit.
//
// A scheduler that wants its machines back warns first: Slurm sends SIGUSR1 with
// `#SBATCH --signal=USR1@SECONDS` or `scancel --signal=USR1`, and SIGTERM on preemption, on
// scancel and at the time limit (SIGKILL follows after its GraceTime/KillWait); ddprun forwards
// its preemption signals to every worker as well. The signal reaches the ranks at different
// moments, or only some of them, so a rank only notes it (stop_requested()) and the ranks agree
// at a step boundary (agree_stop(): one 4-byte all-reduce, MAX of the ranks' flags): every rank
// leaves the training loop after the same step, the checkpoint is of that step, and every rank
// exits with kExitPreempted, which ddprun reads as "stopped for a preemption": no failure, no
// restart, and ddprun itself exits with the same code so the batch script can requeue the job.
//
//   ddprun::worker::install_stop_handlers();        // SIGUSR1 and SIGTERM only set the flag
//   auto rt = ddprun::worker::init();
//   for (...) {
//     train_step();
//     if (rt->agree_stop()) {
//       save_checkpoint(step);
//       ddprun::worker::announce_preemption(checkpoint_path);  // ddprun: a preemption, saved there
//       return ddprun::worker::kExitPreempted;
//     }
//   }
//
// Opt-in: without install_stop_handlers() the signals keep their default action (they end the
// process), as a program that never calls agree_stop() needs. With it, SIGTERM no longer ends a
// rank that is blocked in a long computation or a collective with a hung peer: ddprun's SIGKILL
// after --shutdown_timeout does (a dead peer fails the collective at once, as before).
#pragma once

#include <csignal>
#include <string>
#include <vector>

#include "ddprun/worker/checks.h"
#include "ddprun/worker/communicator.h"
#include "ddprun/worker/export.h"

namespace ddprun::worker {

// Replaces the disposition of each of `signals` with a handler that records the first signal
// (async-signal-safe: one lock-free atomic store) and returns (SA_RESTART: interrupted system
// calls resume). Idempotent; the flag is not cleared. Throws WorkerError for a signal that
// cannot be caught (SIGKILL, SIGSTOP) or when sigaction fails. Call it before starting threads
// that should not see the handler run on them (any thread may; only the flag changes).
DDPRUN_WORKER_API void install_stop_handlers(const std::vector<int>& signals = {SIGUSR1, SIGTERM});

// This process was asked to stop: a handled signal arrived, or request_stop() was called.
// Lock-free; safe in a signal handler.
DDPRUN_WORKER_API bool stop_requested() noexcept;
// The first handled signal that arrived; 0 when none (or when only request_stop() asked).
DDPRUN_WORKER_API int stop_signal() noexcept;
// Sets the flag from the program itself (its own time budget, a file appearing, ...).
// Async-signal-safe.
DDPRUN_WORKER_API void request_stop() noexcept;

// Collective (call it at the same point on every rank, like any collective of `comm`): true on
// every rank when any rank's flag was set before that rank called it, false on every rank
// otherwise. So all ranks stop after the same step. Any communicator (Communicator::
// allreduce_max_host): on NCCL it is a 4-byte device all-reduce that the host waits for, so
// call it every few steps there rather than every step if the loop runs ahead of the GPU. A
// failure of the collective throws CommError, as any collective does.
DDPRUN_WORKER_API bool agree_stop(Communicator& comm);

// Tells ddprun that this process stops for a preemption: writes the file ddprun names in
// DDPRUN_PREEMPT_FILE ("preempted", then "checkpoint <checkpoint>" unless it is empty). ddprun
// then reads the exit code kExitPreempted as a preemption even on a node that no preemption
// signal reached (without the file, that code is a preemption only after such a signal), and
// its summary says what was saved. Returns false without ddprun (no variable) or when the file
// cannot be written.
DDPRUN_WORKER_API bool announce_preemption(const std::string& checkpoint = {});

}  // namespace ddprun::worker
