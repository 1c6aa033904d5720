// What the agent tells the user at the end, and what a job's failure notice means, as pure
// functions of what happened (unit-tested; agent.cpp only prints them).
#pragma once

#include <chrono>
#include <cstdint>
#include <deque>
#include <optional>
#include <string>
#include <vector>
#include <sys/types.h>

#include "ddprun/launcher/agent_state.h"
#include "ddprun/rdzv/agent_protocol.h"

namespace ddprun::launcher {

// The first failing worker of an attempt on this node.
struct FailureDetails {
  int attempt = 0;
  int local_rank = 0;
  int global_rank = 0;
  pid_t pid = -1;
  WorkerStatus status;
  std::chrono::system_clock::time_point when;
  double after_s = 0;            // since the worker started
  std::deque<std::string> tail;  // its last stderr lines
  std::string error_file;
  std::optional<std::string> error_file_content;
  // --hang_timeout: the worker did not exit, it stopped making progress (status is
  // kHangExitCode). The hang's description (hang.h's format_hang_message), where every local
  // rank's stack went, and the stuck ranks' stacks as dumped.
  std::string hang;
  std::string stacks_dir;
  std::string hang_stacks;
};

struct SummaryInput {
  int exit_code = 0;
  int attempt = 0;  // the last attempt
  int max_restarts = 0;
  std::string run_id;
  std::string host;  // this machine's name
  double shutdown_timeout_s = 30;
  std::optional<int> stop_signal;
  // Stopped for a preemption (agent_state.h): the exit code is kPreemptedExitCode, not a failure.
  bool preempted = false;
  double preempt_grace_s = 90;
  // A worker of this node said it saved a checkpoint before stopping ("r0: <what>").
  std::optional<std::string> preempt_checkpoint;
  std::optional<FailureDetails> failure;  // this node's latest
  // The job's end as the coordinator said it (none: it did not fail, or it never answered).
  std::optional<rdzv::JobFailed> job_failed;
  bool multi_node = false;      // whether to print the job-wide verdict (one node: it is ours)
  std::string agent_error;      // an error of the agent itself (coordinator gone, ...)
  std::string interpreter;      // Python workers' interpreter (entrypoint.h), for missing_module_hint
  bool workers_started = true;  // false: stopped before any worker ran (connecting, joining)
  // --exit_barrier_timeout stopped these workers ("r0 exited 0 and 5 s later ... still
  // running: r1 (local rank 1, pid 42)"); empty when it did not.
  std::string stragglers;
  // Log files whose writes failed (LogWriteFailures::summary_lines()), with the totals.
  std::vector<std::string> log_losses;
  size_t log_files_failed = 0;
  uint64_t log_bytes_lost = 0;
  std::string log_console_note = "the console got every line";  // LogWriteFailures::console_note()
  // --nccl_flight_recorder: the directory PyTorch's dumps go to, and the files found there
  // (the first few; the workers can fill the directory: how many more).
  std::string nccl_trace_dir;
  std::vector<std::string> nccl_traces;
  size_t nccl_traces_more = 0;
};

// The exit code of the run: `run_code` (the state machine's), except that a clean run whose
// log files lost output ends with kLogsLostExitCode.
int final_exit_code(int run_code, bool logs_lost);

// The failure summary (the last lines on stderr), or "" when the job succeeded and every log
// write did. `in.exit_code` is the run's own code (before final_exit_code()).
std::string format_summary(const SummaryInput& in);

// "rank 3 on host h (node rank 1), exit code 1, at <time>" + its stderr tail: the job's first
// failure as another node saw it (a JOB_FAILED notice).
std::string describe_first_failure(const rdzv::Failure& f);

// "2026-12-01 14:30:00 UTC".
std::string wall_time(std::chrono::system_clock::time_point t);

}  // namespace ddprun::launcher
