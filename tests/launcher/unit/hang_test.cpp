// The hang watch's decision (hang.h) over counters and times, its messages, and what a hang
// does in the agent's state machine.
#include <catch2/catch.hpp>
#include <prometheus/text_serializer.h>

#include <csignal>
#include <sstream>

#include "ddprun/launcher/agent_metrics.h"
#include "ddprun/launcher/agent_state.h"
#include "ddprun/launcher/hang.h"
#include "ddprun/launcher/options.h"
#include "ddprun/launcher/summary.h"

using namespace ddprun::launcher;
using Ticks = std::vector<std::optional<uint64_t>>;

TEST_CASE("a job that never ticks is said once, and never judged", "[hang]") {
  HangWatch w(10);
  w.start_attempt(0, 2);
  CHECK(w.observe(5, Ticks{0, 0}).kind == HangVerdict::Kind::None);
  CHECK(w.observe(10, Ticks{0, 0}).kind == HangVerdict::Kind::NeverTicked);
  CHECK(w.observe(30, Ticks{0, 0}).kind == HangVerdict::Kind::None);  // said once
  w.start_attempt(40, 2);
  CHECK(w.observe(100, Ticks{0, 0}).kind == HangVerdict::Kind::None);  // once per watch, not per attempt
  CHECK_FALSE(w.ever_ticked());
}

TEST_CASE("ranks that keep ticking never hang", "[hang]") {
  HangWatch w(3);
  w.start_attempt(0, 2);
  for (uint64_t t = 1; t < 20; ++t)
    CHECK(w.observe(static_cast<double>(t), Ticks{t, t}).kind == HangVerdict::Kind::None);
  CHECK(w.attempt_ticking());
}

TEST_CASE("the rank behind is stuck; the one ahead waits for it", "[hang]") {
  HangWatch w(10);
  w.start_attempt(0, 2);
  CHECK(w.observe(1, Ticks{1, 1}).kind == HangVerdict::Kind::None);  // first tick: clocks start
  CHECK(w.observe(2, Ticks{6, 5}).kind == HangVerdict::Kind::None);
  CHECK(w.observe(11.9, Ticks{6, 5}).kind == HangVerdict::Kind::None);  // 9.9 s still
  const HangVerdict v = w.observe(12, Ticks{6, 5});
  REQUIRE(v.kind == HangVerdict::Kind::Hung);
  CHECK(v.stuck() == std::vector<int>{1});
  REQUIRE(v.ranks.size() == 2);
  CHECK(v.ranks[0].stalled);
  CHECK_FALSE(v.ranks[0].stuck);
  CHECK(v.ranks[1].ticks == 5);
  CHECK(v.ranks[1].stalled_s == Approx(10));
  // One verdict per attempt.
  CHECK(w.observe(50, Ticks{6, 5}).kind == HangVerdict::Kind::None);
  // The next attempt is judged afresh.
  w.start_attempt(60, 2);
  CHECK(w.observe(65, Ticks{1, 1}).kind == HangVerdict::Kind::None);
  CHECK(w.observe(74, Ticks{2, 2}).kind == HangVerdict::Kind::None);
}

TEST_CASE("a rank that stops while the others move on is stuck alone", "[hang]") {
  HangWatch w(5);
  w.start_attempt(0, 3);
  w.observe(1, Ticks{1, 1, 1});
  for (uint64_t t = 2; t <= 5; ++t)
    CHECK(w.observe(static_cast<double>(t), Ticks{t, 1, t}).kind == HangVerdict::Kind::None);
  const HangVerdict v = w.observe(6, Ticks{6, 1, 6});  // rank 1 still for 5 s
  REQUIRE(v.kind == HangVerdict::Kind::Hung);
  CHECK(v.stuck() == std::vector<int>{1});
  CHECK_FALSE(v.ranks[0].stalled);
}

TEST_CASE("every rank stuck at the same tick: all are named", "[hang]") {
  HangWatch w(5);
  w.start_attempt(0, 2);
  w.observe(1, Ticks{3, 3});
  const HangVerdict v = w.observe(6, Ticks{3, 3});
  REQUIRE(v.kind == HangVerdict::Kind::Hung);
  CHECK(v.stuck() == (std::vector<int>{0, 1}));
  const std::string m = format_hang_message(v, {{0, 10, "12:00:01"}, {1, 11, "12:00:01"}}, 5);
  CHECK(m.find("r0 (local rank 0, pid 10) made no progress for 5 s (since 12:00:01, at tick 3)") != std::string::npos);
  CHECK(m.find("r1 (local rank 1, pid 11)") != std::string::npos);
  CHECK(m.find("every local rank is stuck at the same tick") != std::string::npos);
}

TEST_CASE("a rank slow to start is not stuck before anyone ticked, nor for the time before the first tick", "[hang]") {
  HangWatch w(5);
  w.start_attempt(0, 2);
  CHECK(w.observe(4, Ticks{0, 0}).kind == HangVerdict::Kind::None);
  CHECK(w.observe(8, Ticks{1, 0}).kind == HangVerdict::Kind::None);  // rank 1's clock starts at 8
  CHECK(w.observe(12, Ticks{2, 0}).kind == HangVerdict::Kind::None);
  const HangVerdict v = w.observe(13, Ticks{3, 0});
  REQUIRE(v.kind == HangVerdict::Kind::Hung);
  CHECK(v.stuck() == std::vector<int>{1});
}

TEST_CASE("a rank that is not running (exited) is not judged", "[hang]") {
  HangWatch w(5);
  w.start_attempt(0, 2);
  w.observe(1, Ticks{1, 1});
  CHECK(w.observe(3, Ticks{2, std::nullopt}).kind == HangVerdict::Kind::None);
  CHECK(w.observe(7, Ticks{3, std::nullopt}).kind == HangVerdict::Kind::None);
  CHECK(w.observe(11, Ticks{4, std::nullopt}).kind == HangVerdict::Kind::None);
}

TEST_CASE("the hang message names the stuck rank, since when, and what the others do", "[hang]") {
  HangVerdict v;
  v.kind = HangVerdict::Kind::Hung;
  v.ranks = {{.local_rank = 0, .ticks = 6, .last_move_s = 2, .stalled_s = 30.4, .stalled = true, .stuck = false},
             {.local_rank = 1, .ticks = 5, .last_move_s = 2, .stalled_s = 31.7, .stalled = true, .stuck = true},
             {.local_rank = 2, .ticks = 9, .last_move_s = 33, .stalled_s = 0.25, .stalled = false, .stuck = false}};
  const std::string m = format_hang_message(v, {{4, 100, "a"}, {5, 101, "16:58:02 UTC"}, {6, 102, "c"}}, 30);
  CHECK(m == "hang: r5 (local rank 1, pid 101) made no progress for 31 s (since 16:58:02 UTC, at tick 5) "
             "(--hang_timeout=30); the others: r4 at tick 6, stalled 30 s too (ahead: waiting for the stuck ranks?), "
             "r6 at tick 9, moving (last tick 0.2 s ago)");
}

TEST_CASE("the never-ticked message says how to tick", "[hang]") {
  const std::string m = format_never_ticked_message(30);
  CHECK(m.find("--hang_timeout=30") != std::string::npos);
  CHECK(m.find("ddprun.progress()") != std::string::npos);
  CHECK(m.find("libddprun_worker") != std::string::npos);
}

TEST_CASE("a hang is a failure of the running attempt with its own cause", "[hang][state]") {
  AgentState s(AgentConfig{.nproc = 2, .shutdown_timeout_s = 7});
  s.start();
  s.on_event(RoundReady{0});
  const auto out = s.on_event(WorkerHung{.local_rank = 1, .attempt = 0});
  REQUIRE(out.size() == 3);
  CHECK(out[0].kind == Action::Kind::ReportFailure);
  CHECK(out[0].hung);
  CHECK(out[0].local_rank == 1);
  CHECK(out[0].status == WorkerStatus::exited(kHangExitCode));
  CHECK(out[1] == Action{.kind = Action::Kind::SignalWorkers, .signo = SIGTERM});
  CHECK(out[2] == Action{.kind = Action::Kind::ArmTimer, .seconds = 7});
  CHECK(s.phase() == AgentState::Phase::Stopping);
  REQUIRE(s.last_failure());
  CHECK(s.last_failure()->hung);
  // A second verdict, or one of an old attempt, changes nothing.
  CHECK(s.on_event(WorkerHung{.local_rank = 0, .attempt = 0}).empty());
  // The hung workers end on SIGTERM; the group stopped, the round decides.
  s.on_event(WorkerExited{.local_rank = 0, .status = WorkerStatus::killed_by(SIGTERM)});
  s.on_event(WorkerExited{.local_rank = 1, .status = WorkerStatus::killed_by(SIGTERM)});
  CHECK(s.phase() == AgentState::Phase::Awaiting);
  const auto end = s.on_event(CoordinatorNotice{CoordinatorNotice::Kind::JobFailed, 0});
  REQUIRE_FALSE(end.empty());
  CHECK(end.back() == Action{.kind = Action::Kind::Finish, .exit_code = kHangExitCode});
}

TEST_CASE("a hang verdict for a worker that already exited is ignored", "[hang][state]") {
  AgentState s(AgentConfig{.nproc = 2});
  s.start();
  s.on_event(RoundReady{0});
  s.on_event(WorkerExited{.local_rank = 1, .status = WorkerStatus::exited(0)});
  CHECK(s.on_event(WorkerHung{.local_rank = 1, .attempt = 0}).empty());
  CHECK(s.on_event(WorkerHung{.local_rank = 0, .attempt = 3}).empty());
  CHECK(s.phase() == AgentState::Phase::Running);
}

TEST_CASE("the summary of a hang says so, with the stacks and where they are", "[hang][summary]") {
  SummaryInput in;
  in.exit_code = kHangExitCode;
  in.run_id = "job";
  in.host = "h";
  FailureDetails f;
  f.global_rank = 1;
  f.local_rank = 1;
  f.pid = 42;
  f.status = WorkerStatus::exited(kHangExitCode);
  f.hang = "hang: r1 (local rank 1, pid 42) made no progress for 31 s";
  f.stacks_dir = "/logs/run/stacks/hang_attempt_0";
  f.hang_stacks = "r1 (local rank 1, pid 42), py-spy:\n  sleep (x.py:7)\n";
  in.failure = f;
  const std::string s = format_summary(in);
  CHECK(s.find("FAILED: worker rank 1 (local rank 1, pid 42, host h) hung") != std::string::npos);
  CHECK(s.find("made no progress for 31 s") != std::string::npos);
  CHECK(s.find("every local rank's stack: /logs/run/stacks/hang_attempt_0") != std::string::npos);
  CHECK(s.find("      sleep (x.py:7)") != std::string::npos);
}

TEST_CASE("the summary points to the NCCL flight recorder's dumps", "[hang][summary]") {
  SummaryInput in;
  in.exit_code = 1;
  in.nccl_trace_dir = "/logs/run/nccl_trace";
  CHECK(format_summary(in).find("NCCL flight recorder: no dump in /logs/run/nccl_trace") != std::string::npos);
  in.nccl_traces = {"/logs/run/nccl_trace/rank_0"};
  const std::string s = format_summary(in);
  CHECK(s.find("NCCL flight recorder dumps (1) in /logs/run/nccl_trace") != std::string::npos);
  CHECK(s.find("    /logs/run/nccl_trace/rank_0") != std::string::npos);
}

namespace {
ParseOutcome parse_flags(std::vector<std::string> args, const EnvMap& env = {}) {
  args.insert(args.begin(), "ddprun");
  args.push_back("x");
  return parse_command_line(args, env, SystemInfo{.cpu_count = 8, .gpu_count = 0});
}
}  // namespace

TEST_CASE("--hang_timeout: off by default, seconds >= 1, from PET_ too; --nccl_flight_recorder", "[hang][options]") {
  auto get = [](std::vector<std::string> args, const EnvMap& env = {}) {
    auto r = parse_flags(std::move(args), env);
    INFO(r.message);
    REQUIRE(r.options);
    return r.options->faults;
  };
  CHECK(get({}).hang_timeout_s == 0);
  CHECK_FALSE(get({}).nccl_flight_recorder);
  CHECK(get({"--hang_timeout=30"}).hang_timeout_s == 30);
  CHECK(get({"--hang-timeout", "2.5"}).hang_timeout_s == 2.5);
  CHECK(get({"--hang_timeout=0"}).hang_timeout_s == 0);
  CHECK(get({}, {{"PET_HANG_TIMEOUT", "9"}}).hang_timeout_s == 9);
  CHECK(get({"--nccl-flight-recorder"}).nccl_flight_recorder);
  for (const std::string bad : {"--hang_timeout=abc", "--hang_timeout=-3", "--hang_timeout=0.5"}) {
    INFO(bad);
    const auto r = parse_flags({bad});
    CHECK_FALSE(r.options);
    CHECK(r.exit_code == kUsageExitCode);
    CHECK_THAT(r.message, Catch::Contains("--hang_timeout") && Catch::Contains("seconds"));
  }
}

TEST_CASE("a hang is counted among the workers' failures by cause", "[hang][metrics]") {
  AgentSnapshot s;
  s.failures_by_cause["hang"] = 2;
  std::ostringstream out;
  prometheus::TextSerializer().Serialize(out, agent_metric_families(s));
  const std::string t = out.str();
  CHECK(t.find("\nddprun_worker_failures_total{cause=\"hang\"} 2\n") != std::string::npos);
  CHECK(t.find("\nddprun_worker_failures_total{cause=\"exit_code\"} 0\n") != std::string::npos);
}
