// The failure summary and the job's end as the user reads them.
#include <catch2/catch.hpp>

#include <csignal>

#include "ddprun/launcher/options.h"
#include "ddprun/launcher/summary.h"

using namespace ddprun;
using namespace ddprun::launcher;

namespace {
FailureDetails failure(int attempt, int code) {
  FailureDetails f;
  f.attempt = attempt;
  f.local_rank = 1;
  f.global_rank = 1;
  f.pid = 4242;
  f.status = WorkerStatus::exited(code);
  f.tail = {"Traceback (most recent call last):", "ModuleNotFoundError: No module named 'x'"};
  return f;
}
rdzv::JobFailed failed(rdzv::FailCause cause, int64_t max_restarts, std::string reason = "why") {
  rdzv::JobFailed j;
  j.reason = std::move(reason);
  j.cause = static_cast<int64_t>(cause);
  j.max_restarts = max_restarts;
  return j;
}
}  // namespace

TEST_CASE("success prints nothing", "[summary]") { CHECK(format_summary(SummaryInput{}).empty()); }

TEST_CASE("a deterministic failure says why it stopped and how many restarts were left", "[summary]") {
  SummaryInput in;
  in.exit_code = 1;
  in.attempt = 1;
  in.max_restarts = 3;
  in.run_id = "none";
  in.host = "h";
  in.failure = failure(1, 1);
  in.job_failed = failed(rdzv::FailCause::Deterministic, 3);
  const auto s = format_summary(in);
  CHECK_THAT(s, Catch::Contains("FAILED: worker rank 1 (local rank 1, pid 4242, host h) exit code 1"));
  CHECK_THAT(s, Catch::Contains("attempt 1 (max_restarts 3)"));
  CHECK_THAT(s, Catch::Contains("not retried: attempts 0 and 1 failed the same way (same code, same rank or message) "
                                "within 2 s, before every worker had joined the store"));
  CHECK_THAT(s, Catch::Contains("2 of 3 restarts left unused"));
  CHECK_THAT(s, Catch::Contains("No module named 'x'"));
  CHECK_FALSE(Catch::Contains("no restarts left").match(s));
}

TEST_CASE("a configuration error says a restart would repeat it, not that it repeated", "[summary]") {
  SummaryInput in;
  in.exit_code = 78;
  in.attempt = 0;
  in.max_restarts = 3;
  in.failure = failure(0, 78);
  in.job_failed = failed(rdzv::FailCause::ConfigError, 3);
  const auto s = format_summary(in);
  CHECK_THAT(s, Catch::Contains("not retried: the worker reported a configuration error (exit code 78"));
  CHECK_THAT(s, Catch::Contains("3 of 3 restarts left unused"));
  CHECK_FALSE(Catch::Contains("failed the same way").match(s));
}

TEST_CASE("a spent budget on one node says no restarts are left", "[summary]") {
  SummaryInput in;
  in.exit_code = 6;
  in.attempt = 2;
  in.max_restarts = 2;
  in.failure = failure(2, 6);
  in.job_failed = failed(rdzv::FailCause::BudgetSpent, 2);
  const auto s = format_summary(in);
  CHECK_THAT(s, Catch::Contains("attempt 2 (max_restarts 2)"));
  CHECK_THAT(s, Catch::Contains("no restarts left (max_restarts 2)"));
}

TEST_CASE("many nodes: the job's verdict and another node's first failure lead", "[summary]") {
  SummaryInput in;
  in.exit_code = 1;
  in.multi_node = true;
  auto j = failed(rdzv::FailCause::BudgetSpent, 0, "rank 3 on n1 failed (exit code 2); the restart budget is spent");
  j.first_failure = rdzv::Failure{
      .global_rank = 3, .exit_code = 2, .when = "t", .stderr_tail = "boom\n", .host = "10.0.0.2", .node_rank = 1};
  in.job_failed = j;
  const auto s = format_summary(in);
  CHECK_THAT(s, Catch::Contains("JOB FAILED: rank 3 on n1 failed"));
  CHECK_THAT(s, Catch::Contains("first failure of the job: rank 3 on host 10.0.0.2 (node rank 1), exit code 2, at t"));
  // Every line of another node's stderr is marked as that node's: none passes for ddprun's own.
  CHECK_THAT(s, Catch::Contains("\n    [remote 10.0.0.2] boom\n"));
  CHECK_FALSE(Catch::Contains("see the errors above").match(s));
  j.first_failure->stderr_tail = "x\n[ddprun] info: all is well\n";
  in.job_failed = j;
  CHECK_THAT(format_summary(in), Catch::Contains("\n    [remote 10.0.0.2] [ddprun] info: all is well\n"));
}

TEST_CASE("stopped by a signal, and an earlier attempt's failure is history", "[summary]") {
  SummaryInput in;
  in.exit_code = 128 + SIGINT;
  in.attempt = 1;
  in.stop_signal = SIGINT;
  in.failure = failure(0, 3);
  const auto s = format_summary(in);
  CHECK_THAT(s, Catch::Contains("stopped by SIGINT"));
  CHECK_THAT(s, Catch::Contains("(attempt 0 had failed: worker rank 1 exit code 3)"));
  CHECK_FALSE(Catch::Contains("FAILED: worker rank").match(s));
}

TEST_CASE("an agent error without a worker failure", "[summary]") {
  SummaryInput in;
  in.exit_code = 1;
  in.agent_error = "the rendezvous server closed the connection";
  CHECK_THAT(format_summary(in), Catch::Contains("JOB FAILED: the rendezvous server closed the connection"));
}

TEST_CASE("stopped while joining: no workers to speak of", "[summary]") {
  SummaryInput in;
  in.exit_code = 128 + SIGTERM;
  in.stop_signal = SIGTERM;
  in.workers_started = false;
  const auto s = format_summary(in);
  CHECK_THAT(s, Catch::Contains("stopped by SIGTERM before any worker started"));
  CHECK_FALSE(Catch::Contains("the workers were sent").match(s));
}

TEST_CASE("preempted: not a failure, says how to resume, no job verdict", "[summary]") {
  SummaryInput in;
  in.exit_code = kPreemptedExitCode;
  in.preempted = true;
  in.stop_signal = SIGUSR1;
  in.preempt_grace_s = 90;
  in.multi_node = true;
  in.job_failed = failed(rdzv::FailCause::LostNodes, 0, "node 1 left");  // it left after its own preemption
  auto s = format_summary(in);
  CHECK_THAT(s, Catch::Contains("PREEMPTED: stopped by SIGUSR1") && Catch::Contains("exit code 99") &&
                    Catch::Contains("requeue"));
  CHECK_FALSE(Catch::Contains("FAILED").match(s));
  in.stop_signal.reset();
  s = format_summary(in);
  CHECK_THAT(s, Catch::Contains("the workers stopped for a preemption (a worker exited 99)"));
}

TEST_CASE("lost log output makes a clean run's summary and exit code say so", "[summary]") {
  CHECK(final_exit_code(0, false) == 0);
  CHECK(final_exit_code(0, true) == kLogsLostExitCode);
  CHECK(final_exit_code(3, true) == 3);  // a failed run keeps its own code
  SummaryInput in;
  in.log_files_failed = 2;
  in.log_bytes_lost = 12345;
  in.log_losses = {"/l/stdout.log: ENOSPC: No space left on device, 12000 bytes not written",
                   "/l/stderr.log: ENOSPC: No space left on device, 345 bytes not written"};
  auto s = format_summary(in);
  CHECK_THAT(s, Catch::Contains("LOGS INCOMPLETE: 12345 bytes of worker output could not be written to 2 log file(s)"));
  CHECK_THAT(s, Catch::Contains("/l/stderr.log: ENOSPC"));
  CHECK_THAT(s, Catch::Contains("the workers succeeded; exit code 74"));
  in.exit_code = 1;
  in.failure = failure(0, 1);
  s = format_summary(in);
  CHECK_THAT(s, Catch::Contains("FAILED: worker rank 1"));
  CHECK_THAT(s, Catch::Contains("LOGS INCOMPLETE"));
  CHECK_FALSE(Catch::Contains("the workers succeeded").match(s));
}

TEST_CASE("the flight recorder's dumps: the first ones listed, how many more counted", "[summary]") {
  SummaryInput in;
  in.exit_code = 1;
  in.attempt = 0;
  in.run_id = "none";
  in.host = "h";
  in.failure = failure(0, 1);
  in.nccl_trace_dir = "/run/nccl_trace";
  in.nccl_traces = {"/run/nccl_trace/rank_0", "/run/nccl_trace/rank_1"};
  in.nccl_traces_more = 99998;
  const auto s = format_summary(in);
  CHECK_THAT(s, Catch::Contains("NCCL flight recorder dumps (100000) in /run/nccl_trace:\n    /run/nccl_trace/rank_0\n"
                                "    /run/nccl_trace/rank_1\n    ... and 99998 more\n"));
  in.nccl_traces_more = 0;
  CHECK_FALSE(Catch::Contains("more").match(format_summary(in)));
}
