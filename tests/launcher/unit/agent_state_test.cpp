#include <catch2/catch.hpp>

#include <csignal>

#include "ddprun/launcher/agent_state.h"

using namespace ddprun::launcher;
using Kind = Action::Kind;
using Phase = AgentState::Phase;

namespace {

AgentConfig config(int nproc, int max_restarts) {
  return AgentConfig{.nproc = nproc, .max_restarts = max_restarts, .shutdown_timeout_s = 30, .kill_wait_s = 5};
}

std::vector<Kind> kinds(const std::vector<Action>& actions) {
  std::vector<Kind> out;
  for (const auto& a : actions) out.push_back(a.kind);
  return out;
}

WorkerExited exit_of(int rank, int code) { return {rank, WorkerStatus::exited(code)}; }
WorkerExited killed(int rank, int signo) { return {rank, WorkerStatus::killed_by(signo)}; }

}  // namespace

TEST_CASE("all workers succeed: finish 0", "[state]") {
  AgentState s(config(2, 0));
  auto a = s.start();
  REQUIRE(kinds(a) == std::vector{Kind::StartAttempt});
  CHECK(a[0].attempt == 0);
  CHECK(s.on_event(exit_of(0, 0)).empty());
  auto done = s.on_event(exit_of(1, 0));
  REQUIRE(kinds(done) == std::vector{Kind::Finish});
  CHECK(done[0].exit_code == 0);
  CHECK(s.phase() == Phase::Done);
  CHECK(s.on_event(exit_of(1, 0)).empty());
}

TEST_CASE("a failure stops the group and finishes with its code", "[state]") {
  AgentState s(config(3, 0));
  s.start();
  auto a = s.on_event(exit_of(1, 3));
  REQUIRE(kinds(a) == std::vector{Kind::ReportFailure, Kind::SignalWorkers, Kind::ArmTimer});
  CHECK(a[0].local_rank == 1);
  CHECK_FALSE(a[0].will_restart);
  CHECK(a[1].signo == SIGTERM);
  CHECK(a[2].seconds == 30);
  CHECK(s.phase() == Phase::Stopping);
  // The others die of the SIGTERM: not failures of their own.
  CHECK(s.on_event(killed(0, SIGTERM)).empty());
  auto done = s.on_event(killed(2, SIGTERM));
  REQUIRE(kinds(done) == std::vector{Kind::DisarmTimer, Kind::Finish});
  CHECK(done[1].exit_code == 3);
  REQUIRE(s.last_failure());
  CHECK(s.last_failure()->local_rank == 1);
}

TEST_CASE("killed by a signal: 128 + signal", "[state]") {
  AgentState s(config(1, 0));
  s.start();
  auto a = s.on_event(killed(0, SIGKILL));
  REQUIRE(kinds(a) == std::vector{Kind::ReportFailure, Kind::SignalWorkers, Kind::Finish});
  CHECK(a.back().exit_code == 128 + SIGKILL);
  CHECK(WorkerStatus::killed_by(SIGSEGV).describe() == "signal SIGSEGV (11)");
  CHECK(WorkerStatus::exited(3).describe() == "exit code 3");
}

TEST_CASE("grace expires: SIGKILL, then give up after the kill wait", "[state]") {
  AgentState s(config(2, 0));
  s.start();
  s.on_event(exit_of(0, 1));
  auto k = s.on_event(TimerExpired{});
  REQUIRE(kinds(k) == std::vector{Kind::SignalWorkers, Kind::ArmTimer});
  CHECK(k[0].signo == SIGKILL);
  CHECK(k[1].seconds == 5);
  CHECK(s.phase() == Phase::Killing);
  auto g = s.on_event(TimerExpired{});
  REQUIRE(kinds(g) == std::vector{Kind::AbandonWorkers, Kind::Finish});
  CHECK(g[1].exit_code == 1);
}

TEST_CASE("restarts: new attempt while budget remains, then give up", "[state]") {
  AgentState s(config(2, 1));
  s.start();
  auto a = s.on_event(exit_of(1, 7));
  REQUIRE(kinds(a) == std::vector{Kind::ReportFailure, Kind::SignalWorkers, Kind::ArmTimer});
  CHECK(a[0].will_restart);
  auto r = s.on_event(killed(0, SIGTERM));
  REQUIRE(kinds(r) == std::vector{Kind::DisarmTimer, Kind::StartAttempt});
  CHECK(r[1].attempt == 1);
  CHECK(s.attempt() == 1);
  CHECK(s.phase() == Phase::Running);
  CHECK(s.alive() == std::set<int>{0, 1});
  // Exits from the old attempt cannot arrive twice; a second failure ends the run.
  auto b = s.on_event(exit_of(0, 9));
  CHECK_FALSE(b[0].will_restart);
  auto done = s.on_event(exit_of(1, 0));
  REQUIRE(kinds(done) == std::vector{Kind::DisarmTimer, Kind::Finish});
  CHECK(done[1].exit_code == 9);
  CHECK(s.last_failure()->attempt == 1);
}

TEST_CASE("restart then success", "[state]") {
  AgentState s(config(1, 2));
  s.start();
  auto a = s.on_event(exit_of(0, 1));
  REQUIRE(kinds(a) == std::vector{Kind::ReportFailure, Kind::SignalWorkers, Kind::StartAttempt});
  auto done = s.on_event(exit_of(0, 0));
  REQUIRE(kinds(done) == std::vector{Kind::Finish});
  CHECK(done[0].exit_code == 0);
}

TEST_CASE("a signal is forwarded and ends the run with 128 + signal", "[state]") {
  AgentState s(config(2, 5));
  s.start();
  auto a = s.on_event(SignalReceived{SIGTERM});
  REQUIRE(kinds(a) == std::vector{Kind::SignalWorkers, Kind::ArmTimer});
  CHECK(a[0].signo == SIGTERM);
  // Workers exiting non-zero now are not failures and do not restart.
  CHECK(s.on_event(exit_of(0, 1)).empty());
  auto done = s.on_event(killed(1, SIGTERM));
  REQUIRE(kinds(done) == std::vector{Kind::DisarmTimer, Kind::Finish});
  CHECK(done[1].exit_code == 128 + SIGTERM);
  CHECK_FALSE(s.last_failure());
  CHECK(s.stop_signal() == SIGTERM);
}

TEST_CASE("a second signal skips the grace period", "[state]") {
  AgentState s(config(1, 0));
  s.start();
  s.on_event(SignalReceived{SIGINT});
  auto a = s.on_event(SignalReceived{SIGINT});
  REQUIRE(kinds(a) == std::vector{Kind::SignalWorkers, Kind::ArmTimer});
  CHECK(a[0].signo == SIGKILL);
  CHECK(s.phase() == Phase::Killing);
}

TEST_CASE("a signal during a failure's stop cancels the restart", "[state]") {
  AgentState s(config(2, 3));
  s.start();
  s.on_event(exit_of(0, 1));
  auto a = s.on_event(SignalReceived{SIGHUP});
  REQUIRE(kinds(a) == std::vector{Kind::SignalWorkers});
  CHECK(a[0].signo == SIGHUP);
  auto done = s.on_event(exit_of(1, 0));
  REQUIRE(kinds(done) == std::vector{Kind::DisarmTimer, Kind::Finish});
  CHECK(done[1].exit_code == 128 + SIGHUP);
}

TEST_CASE("stale timer and unknown ranks are ignored", "[state]") {
  AgentState s(config(2, 0));
  CHECK(s.on_event(TimerExpired{}).empty());  // idle
  s.start();
  CHECK(s.on_event(TimerExpired{}).empty());  // running: nothing armed
  CHECK(s.on_event(exit_of(7, 1)).empty());
  CHECK(s.phase() == Phase::Running);
}
