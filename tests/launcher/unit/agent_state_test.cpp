#include <catch2/catch.hpp>

#include <csignal>

#include "ddprun/launcher/agent_state.h"

using namespace ddprun::launcher;
using Kind = Action::Kind;
using Phase = AgentState::Phase;

namespace {

// overlap: AgentConfig::overlap_restart (the tests of the stop-then-restart path turn it off).
AgentConfig config(int nproc, int max_restarts, bool overlap = true) {
  return AgentConfig{.nproc = nproc,
                     .max_restarts = max_restarts,
                     .shutdown_timeout_s = 30,
                     .kill_wait_s = 5,
                     .overlap_restart = overlap};
}

std::vector<Kind> kinds(const std::vector<Action>& actions) {
  std::vector<Kind> out;
  for (const auto& a : actions) out.push_back(a.kind);
  return out;
}

WorkerExited exit_of(int rank, int code) { return {rank, WorkerStatus::exited(code)}; }
WorkerExited killed(int rank, int signo) { return {rank, WorkerStatus::killed_by(signo)}; }
// An exit as the agent reports it: with the attempt the worker belonged to.
WorkerExited exit_in(int attempt, int rank, WorkerStatus st, bool progressed = true) {
  return {.local_rank = rank, .status = st, .attempt_progressed = progressed, .attempt = attempt};
}

Action report(int attempt, int rank, WorkerStatus st, bool will_restart) {
  return {.kind = Kind::ReportFailure, .attempt = attempt, .local_rank = rank, .status = st, .will_restart = will_restart};
}
Action signal_all(int signo) { return {.kind = Kind::SignalWorkers, .signo = signo}; }
Action retire(int attempt, double grace) { return {.kind = Kind::RetireWorkers, .attempt = attempt, .seconds = grace}; }
Action start_attempt(int attempt) { return {.kind = Kind::StartAttempt, .attempt = attempt}; }
Action arm(double s) { return {.kind = Kind::ArmTimer, .seconds = s}; }
Action disarm() { return {.kind = Kind::DisarmTimer}; }
Action finish(int code) { return {.kind = Kind::Finish, .exit_code = code}; }
using Actions = std::vector<Action>;

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

TEST_CASE("overlap off: restarts wait for the group; new attempt while budget remains, then give up", "[state]") {
  AgentState s(config(2, 1, false));
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

TEST_CASE("overlap off: a signal during a failure's stop cancels the restart", "[state]") {
  AgentState s(config(2, 3, false));
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

// ---- overlapped restart (AgentConfig::overlap_restart) ----

TEST_CASE("overlap on: a restartable failure retires the survivors and starts the next attempt at once", "[state]") {
  AgentState s(config(3, 1));
  REQUIRE(s.start() == Actions{start_attempt(0)});
  auto a = s.on_event(exit_in(0, 1, WorkerStatus::exited(7)));
  CHECK(a == Actions{report(0, 1, WorkerStatus::exited(7), true), signal_all(SIGTERM), retire(0, 30), start_attempt(1)});
  CHECK(s.phase() == Phase::Running);
  CHECK(s.attempt() == 1);
  CHECK(s.alive() == std::set<int>{0, 1, 2});
  // The retired ranks 0 and 2 end (one dies of the SIGTERM, one exits non-zero): no event of
  // attempt 1, not a failure, no success.
  CHECK(s.on_event(exit_in(0, 0, WorkerStatus::killed_by(SIGTERM))).empty());
  CHECK(s.on_event(exit_in(0, 2, WorkerStatus::exited(1))).empty());
  CHECK(s.alive() == std::set<int>{0, 1, 2});
  CHECK(s.last_failure()->attempt == 0);
  CHECK(s.on_event(exit_in(1, 0, WorkerStatus::exited(0))).empty());
  CHECK(s.on_event(exit_in(1, 1, WorkerStatus::exited(0))).empty());
  // A late exit of the old attempt, after the new one is nearly done, is still ignored.
  CHECK(s.on_event(exit_in(0, 2, WorkerStatus::exited(0))).empty());
  CHECK(s.on_event(exit_in(1, 2, WorkerStatus::exited(0))) == Actions{finish(0)});
  CHECK(s.exit_code() == 0);
}

TEST_CASE("overlap off: the same failure stops the whole group before the next attempt", "[state]") {
  AgentState s(config(3, 1, false));
  s.start();
  auto a = s.on_event(exit_in(0, 1, WorkerStatus::exited(7)));
  CHECK(a == Actions{report(0, 1, WorkerStatus::exited(7), true), signal_all(SIGTERM), arm(30)});
  CHECK(s.phase() == Phase::Stopping);
  CHECK(s.attempt() == 0);
  CHECK(s.on_event(exit_in(0, 0, WorkerStatus::killed_by(SIGTERM))).empty());
  CHECK(s.on_event(exit_in(0, 2, WorkerStatus::killed_by(SIGTERM))) == Actions{disarm(), start_attempt(1)});
  CHECK(s.attempt() == 1);
}

TEST_CASE("overlap on: nobody left to retire starts the next attempt as before", "[state]") {
  AgentState s(config(1, 2));
  s.start();
  CHECK(s.on_event(exit_in(0, 0, WorkerStatus::killed_by(SIGKILL))) ==
        Actions{report(0, 0, WorkerStatus::killed_by(SIGKILL), true), signal_all(SIGTERM), start_attempt(1)});
}

TEST_CASE("overlap on: a signal while an old group retires stops the new attempt and finishes", "[state]") {
  AgentState s(config(2, 3));
  s.start();
  s.on_event(exit_in(0, 1, WorkerStatus::exited(2)));  // rank 0 of attempt 0 retires
  REQUIRE(s.attempt() == 1);
  CHECK(s.on_event(SignalReceived{SIGINT}) == Actions{signal_all(SIGINT), arm(30)});
  CHECK(s.phase() == Phase::Stopping);
  CHECK(s.stop_signal() == SIGINT);
  // The retired worker ends now: it neither stops attempt 1 nor counts as one of its exits.
  CHECK(s.on_event(exit_in(0, 0, WorkerStatus::killed_by(SIGKILL))).empty());
  CHECK(s.alive() == std::set<int>{0, 1});
  CHECK(s.on_event(exit_in(1, 0, WorkerStatus::killed_by(SIGINT))).empty());
  CHECK(s.on_event(exit_in(1, 1, WorkerStatus::exited(1))) == Actions{disarm(), finish(128 + SIGINT)});
  CHECK(s.attempt() == 1);  // no further restart
}

TEST_CASE("overlap on: a second signal while an old group retires skips the grace of the new attempt", "[state]") {
  AgentState s(config(2, 3));
  s.start();
  s.on_event(exit_in(0, 0, WorkerStatus::exited(2)));
  s.on_event(SignalReceived{SIGTERM});
  CHECK(s.on_event(SignalReceived{SIGTERM}) == Actions{signal_all(SIGKILL), arm(5)});
  CHECK(s.phase() == Phase::Killing);
  CHECK(s.on_event(TimerExpired{}) == Actions{{.kind = Kind::AbandonWorkers}, finish(128 + SIGTERM)});
}

TEST_CASE("overlap on: the restart budget spent means no overlap, stop and finish", "[state]") {
  AgentState s(config(2, 1));
  s.start();
  CHECK(s.on_event(exit_in(0, 1, WorkerStatus::exited(5))) ==
        Actions{report(0, 1, WorkerStatus::exited(5), true), signal_all(SIGTERM), retire(0, 30), start_attempt(1)});
  // The old rank 1 failing again is the old attempt's business.
  CHECK(s.on_event(exit_in(0, 0, WorkerStatus::exited(9))).empty());
  // Attempt 1 fails: no restarts left, so the group is stopped and waited for.
  CHECK(s.on_event(exit_in(1, 0, WorkerStatus::exited(6))) ==
        Actions{report(1, 0, WorkerStatus::exited(6), false), signal_all(SIGTERM), arm(30)});
  CHECK(s.phase() == Phase::Stopping);
  CHECK(s.on_event(exit_in(1, 1, WorkerStatus::killed_by(SIGTERM))) == Actions{disarm(), finish(6)});
  CHECK(s.last_failure()->attempt == 1);
  CHECK_FALSE(s.deterministic_failure());
}

TEST_CASE("overlap on: max_restarts 0 never retires", "[state]") {
  AgentState s(config(2, 0));
  s.start();
  CHECK(s.on_event(exit_in(0, 0, WorkerStatus::exited(3))) ==
        Actions{report(0, 0, WorkerStatus::exited(3), false), signal_all(SIGTERM), arm(30)});
  CHECK(s.on_event(TimerExpired{}) == Actions{signal_all(SIGKILL), arm(5)});
  CHECK(s.on_event(exit_in(0, 1, WorkerStatus::killed_by(SIGKILL))) == Actions{disarm(), finish(3)});
}

TEST_CASE("overlap on: two failures in a row before progress are not retried", "[state]") {
  AgentState s(config(2, 5));
  s.start();
  CHECK(s.on_event(exit_in(0, 1, WorkerStatus::exited(1), /*progressed=*/false)) ==
        Actions{report(0, 1, WorkerStatus::exited(1), true), signal_all(SIGTERM), retire(0, 30), start_attempt(1)});
  // A retired worker's exit carries no progress information for attempt 1.
  CHECK(s.on_event(exit_in(0, 0, WorkerStatus::exited(1), false)).empty());
  CHECK(s.on_event(exit_in(1, 0, WorkerStatus::exited(1), false)) ==
        Actions{report(1, 0, WorkerStatus::exited(1), false), signal_all(SIGTERM), arm(30)});
  CHECK(s.deterministic_failure());
  CHECK(s.on_event(exit_in(1, 1, WorkerStatus::killed_by(SIGTERM))) == Actions{disarm(), finish(1)});
  CHECK(s.attempt() == 1);
}

TEST_CASE("overlap on: a failure after progress resets the deterministic-failure rule", "[state]") {
  AgentState s(config(2, 5));
  s.start();
  s.on_event(exit_in(0, 1, WorkerStatus::exited(1), false));
  CHECK(s.on_event(exit_in(1, 1, WorkerStatus::exited(1), true)) ==
        Actions{report(1, 1, WorkerStatus::exited(1), true), signal_all(SIGTERM), retire(1, 30), start_attempt(2)});
  CHECK(s.on_event(exit_in(2, 0, WorkerStatus::exited(1), false)) ==
        Actions{report(2, 0, WorkerStatus::exited(1), true), signal_all(SIGTERM), retire(2, 30), start_attempt(3)});
  CHECK_FALSE(s.deterministic_failure());
  // Retired workers of two earlier attempts end late: ignored.
  CHECK(s.on_event(exit_in(1, 0, WorkerStatus::killed_by(SIGKILL))).empty());
  CHECK(s.on_event(exit_in(2, 1, WorkerStatus::killed_by(SIGKILL))).empty());
  CHECK(s.alive() == std::set<int>{0, 1});
  CHECK(s.attempt() == 3);
}
