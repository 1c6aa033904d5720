#include "ddprun/launcher/summary.h"

#include <ctime>
#include <iomanip>
#include <sstream>

#include "ddprun/launcher/error_file.h"
#include "ddprun/launcher/options.h"
#include "ddprun/launcher/output.h"
#include "ddprun/launcher/signal_names.h"
#include "ddprun/rdzv/round_state.h"

namespace ddprun::launcher {

std::string wall_time(std::chrono::system_clock::time_point t) {
  std::time_t tt = std::chrono::system_clock::to_time_t(t);
  std::tm tm{};
  ::gmtime_r(&tt, &tm);
  char buf[64];
  std::strftime(buf, sizeof buf, "%Y-%m-%d %H:%M:%S UTC", &tm);
  return buf;
}

std::string describe_first_failure(const rdzv::Failure& f) {
  std::ostringstream t;
  t << "rank " << f.global_rank << " on host " << f.host << " (node rank " << f.node_rank << "), "
    << (f.signal.empty() ? "exit code " + std::to_string(f.exit_code) : "signal " + f.signal);
  if (!f.when.empty()) t << ", at " << f.when;
  if (!f.stderr_tail.empty()) {
    // Another node's text: every line marked as such, so none can pass for ddprun's own.
    t << "\n[ddprun]   last lines of its stderr, as its node reported them:";
    std::istringstream lines(f.stderr_tail);
    for (std::string line; std::getline(lines, line);) t << "\n    [remote " << f.host << "] " << line;
  }
  return t.str();
}

int final_exit_code(int run_code, bool logs_lost) { return run_code == 0 && logs_lost ? kLogsLostExitCode : run_code; }

namespace {
void log_loss_lines(const SummaryInput& in, std::ostringstream& s) {
  if (in.log_files_failed == 0) return;
  s << "[ddprun] LOGS INCOMPLETE: " << in.log_bytes_lost << " bytes of worker output could not be written to "
    << in.log_files_failed << " log file(s) (" << in.log_console_note << "):\n";
  for (const auto& line : in.log_losses) s << "[ddprun]   " << line << "\n";
}
}  // namespace

namespace {

// A preemption's lines: not a failure, requeue.
void preempted_lines(const SummaryInput& in, std::ostringstream& s) {
  // Another node's end (it left after its own preemption) is no news here: not a failure.
  s << "[ddprun] PREEMPTED: ";
  if (in.stop_signal && !in.workers_started)
    s << "stopped by " << signal_name(*in.stop_signal) << " before any worker started";
  else if (in.stop_signal)
    s << "stopped by " << signal_name(*in.stop_signal) << " (sent on to the workers; " << in.preempt_grace_s
      << " s to stop after a preemption signal)";
  else s << "the workers stopped for a preemption (a worker exited " << kPreemptedExitCode << ")";
  s << "; exit code " << in.exit_code << "\n";
  s << "[ddprun]   not a failure and no restart spent: requeue the job (e.g. scontrol requeue $SLURM_JOB_ID)";
  if (in.preempt_checkpoint)
    s << " to resume from the checkpoint its workers saved (" << *in.preempt_checkpoint << ")\n";
  else
    s << "; no worker of this node said it saved a checkpoint (DDPRUN_PREEMPT_FILE), so a rerun resumes only from "
         "what the workers saved themselves\n";
}

// The failing worker of this attempt (or what else ended the run), with its stderr tail and
// error file.
void failure_lines(const SummaryInput& in, std::ostringstream& s) {
  // A failure of an earlier attempt that was restarted is history, not the cause.
  const bool job_verdict = in.job_failed.has_value() && in.multi_node;
  if (in.failure && in.failure->attempt == in.attempt) {
    const auto& f = *in.failure;
    s << "[ddprun] FAILED: worker rank " << f.global_rank << " (local rank " << f.local_rank << ", pid " << f.pid
      << ", host " << in.host << ") " << (f.hang.empty() ? f.status.describe() : std::string("hung")) << "\n";
    if (!f.hang.empty()) {
      s << "[ddprun]   " << f.hang << "\n";
      if (!f.stacks_dir.empty()) s << "[ddprun]   every local rank's stack: " << f.stacks_dir << "\n";
      if (!f.hang_stacks.empty()) {
        s << "[ddprun]   the stuck ranks' stacks:\n";
        std::istringstream lines(f.hang_stacks);
        for (std::string line; std::getline(lines, line);) s << "    " << line << "\n";
      }
    }
    s << "[ddprun]   at " << wall_time(f.when) << ", " << std::fixed << std::setprecision(3) << f.after_s
      << " s after it started; attempt " << f.attempt << " (max_restarts " << in.max_restarts << "), run id "
      << in.run_id << ", exit code " << in.exit_code << "\n";
    if (f.tail.empty()) {
      s << "[ddprun]   (no stderr output)\n";
    } else {
      s << "[ddprun]   last " << f.tail.size() << " lines of its stderr:\n";
      for (const auto& line : f.tail) s << "    " << line << "\n";
    }
    if (auto hint = missing_module_hint(f.tail, in.interpreter); !hint.empty()) s << "[ddprun]   " << hint << "\n";
    if (f.error_file_content) {
      s << "[ddprun]   error file " << f.error_file << ":\n";
      s << format_error_file(parse_error_file(*f.error_file_content)) << "\n";
    }
  } else if (!in.stragglers.empty() && in.exit_code == kExitBarrierTimeoutExitCode) {
    s << "[ddprun] EXIT BARRIER TIMEOUT: " << in.stragglers << "; they were stopped; exit code " << in.exit_code
      << "\n";
  } else if (!in.stop_signal && !job_verdict && in.agent_error.empty()) {
    s << "[ddprun] FAILED: exit code " << in.exit_code << " (see the errors above)\n";
  } else if (in.failure) {
    s << "[ddprun]   (attempt " << in.failure->attempt << " had failed: worker rank " << in.failure->global_rank << " "
      << in.failure->status.describe() << ")\n";
  }
}

// "; K of N restarts left unused (...)" when the job ended with restarts left, else "".
std::string unused_restarts(const SummaryInput& in) {
  const int64_t left = in.max_restarts - in.attempt;
  if (left <= 0) return "";
  return "; " + std::to_string(left) + " of " + std::to_string(in.max_restarts) +
         " restarts left unused (--retry_deterministic spends them)";
}

// Why no restart followed, in the round's words when it is not the budget (which the attempt
// line already shows).
void no_restart_lines(const SummaryInput& in, std::ostringstream& s) {
  if (in.job_failed && !in.stop_signal) {
    // Why no restart followed, in the round's words when it is not the budget (which the
    // attempt line above already shows).
    switch (in.job_failed->fail_cause()) {
      case rdzv::FailCause::Deterministic:
        s << "[ddprun]   not retried: attempts " << in.attempt - 1 << " and " << in.attempt
          << " failed the same way (same code, same rank or message) within "
          << rdzv::RoundState::kQuickFailure.count() / 1000
          << " s, before every worker had joined the store: deterministic (an import error or a bad path?)";
        s << unused_restarts(in) << "\n";
        break;
      case rdzv::FailCause::ConfigError:
        s << "[ddprun]   not retried: the worker reported a configuration error (exit code 78, ConfigError in its "
             "error file), which a restart would repeat"
          << unused_restarts(in) << "\n";
        break;
      case rdzv::FailCause::BudgetSpent:
        if (!in.multi_node) s << "[ddprun]   no restarts left (max_restarts " << in.max_restarts << ")\n";
        break;
      default:
        if (!in.multi_node && !in.job_failed->reason.empty()) s << "[ddprun]   " << in.job_failed->reason << "\n";
        break;
    }
  }
}

}  // namespace

std::string format_summary(const SummaryInput& in) {
  const std::string bar(72, '=');
  if (in.exit_code == 0) {
    if (in.log_files_failed == 0) return "";
    std::ostringstream s;
    s << "[ddprun] " << bar << "\n";
    log_loss_lines(in, s);
    s << "[ddprun] the workers succeeded; exit code " << kLogsLostExitCode << " (logs incomplete)\n";
    s << "[ddprun] " << bar << "\n";
    return s.str();
  }
  std::ostringstream s;
  s << "[ddprun] " << bar << "\n";
  if (!in.agent_error.empty()) s << "[ddprun] JOB FAILED: " << in.agent_error << "\n";
  if (in.preempted) {
    preempted_lines(in, s);
    s << "[ddprun] " << bar << "\n";
    return s.str();
  }
  if (in.job_failed && in.multi_node) {
    s << "[ddprun] JOB FAILED: " << in.job_failed->reason << "\n";
    if (in.job_failed->first_failure && !in.job_failed->first_failure->host.empty())
      s << "[ddprun]   first failure of the job: " << describe_first_failure(*in.job_failed->first_failure) << "\n";
  }
  if (in.stop_signal && !in.workers_started) {
    s << "[ddprun] stopped by " << signal_name(*in.stop_signal) << " before any worker started; exit code "
      << in.exit_code << "\n";
  } else if (in.stop_signal) {
    s << "[ddprun] stopped by " << signal_name(*in.stop_signal) << ": the workers were sent "
      << signal_name(*in.stop_signal) << " (SIGKILL after " << in.shutdown_timeout_s << " s); exit code "
      << in.exit_code << "\n";
  }
  failure_lines(in, s);
  no_restart_lines(in, s);
  if (!in.nccl_trace_dir.empty()) {
    if (in.nccl_traces.empty()) s << "[ddprun]   NCCL flight recorder: no dump in " << in.nccl_trace_dir << "\n";
    else
      s << "[ddprun]   NCCL flight recorder dumps (" << in.nccl_traces.size() + in.nccl_traces_more << ") in "
        << in.nccl_trace_dir << ":\n";
    for (const auto& f : in.nccl_traces) s << "    " << f << "\n";
    if (in.nccl_traces_more) s << "    ... and " << in.nccl_traces_more << " more\n";
  }
  log_loss_lines(in, s);
  s << "[ddprun] " << bar << "\n";
  return s.str();
}

}  // namespace ddprun::launcher
