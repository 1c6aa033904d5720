// The agent's decisions with the round's notices fed in by hand: stopping, signals, timers,
// and the overlapped restart (a local policy). Whether a failure is restarted is the round's
// decision (tests/rendezvous/round_state_test.cpp, coordinator_test.cpp).
#include <catch2/catch.hpp>

#include <csignal>

#include "ddprun/launcher/agent_state.h"
#include "ddprun/launcher/options.h"

using namespace ddprun::launcher;
using Kind = Action::Kind;
using Phase = AgentState::Phase;
using N = CoordinatorNotice::Kind;

namespace {

// overlap: AgentConfig::overlap_restart (the tests of the stop-then-restart path turn it off).
AgentConfig config(int nproc, bool overlap = true) {
  return AgentConfig{.nproc = nproc, .shutdown_timeout_s = 30, .kill_wait_s = 5, .overlap_restart = overlap};
}

WorkerExited exit_of(int rank, int code) { return {rank, WorkerStatus::exited(code)}; }
// A worker that announced its preemption (DDPRUN_PREEMPT_FILE) before exiting 99.
WorkerExited stopped_for_preemption(int rank) {
  return {.local_rank = rank, .status = WorkerStatus::exited(kPreemptedExitCode), .announced_preemption = true};
}
WorkerExited killed(int rank, int signo) { return {rank, WorkerStatus::killed_by(signo)}; }
// An exit as the agent reports it: with the attempt the worker belonged to.
WorkerExited exit_in(int attempt, int rank, WorkerStatus st) {
  return {.local_rank = rank, .status = st, .attempt = attempt};
}

Action report(int attempt, int rank, WorkerStatus st) {
  return {.kind = Kind::ReportFailure, .attempt = attempt, .local_rank = rank, .status = st};
}
Action signal_all(int signo) { return {.kind = Kind::SignalWorkers, .signo = signo}; }
Action retire(int attempt, double grace) { return {.kind = Kind::RetireWorkers, .attempt = attempt, .seconds = grace}; }
Action start_attempt(int attempt) { return {.kind = Kind::StartAttempt, .attempt = attempt}; }
Action join(int attempt) { return {.kind = Kind::JoinRound, .attempt = attempt}; }
Action success(int attempt) { return {.kind = Kind::ReportSuccess, .attempt = attempt}; }
Action arm(double s) { return {.kind = Kind::ArmTimer, .seconds = s}; }
Action disarm() { return {.kind = Kind::DisarmTimer}; }
Action finish(int code) { return {.kind = Kind::Finish, .exit_code = code}; }
using Actions = std::vector<Action>;

// Joined and running attempt 0.
AgentState running(AgentConfig c) {
  AgentState s(c);
  REQUIRE(s.start() == Actions{join(0)});
  REQUIRE(s.on_event(RoundReady{0}) == Actions{start_attempt(0)});
  return s;
}

}  // namespace

TEST_CASE("all workers succeed: report, then finish 0 on the job's verdict", "[state]") {
  auto s = running(config(2));
  CHECK(s.on_event(exit_of(0, 0)).empty());
  CHECK(s.on_event(exit_of(1, 0)) == Actions{success(0)});
  CHECK(s.phase() == Phase::Awaiting);
  CHECK(s.on_event(CoordinatorNotice{N::JobDone, 0}) == Actions{finish(0)});
  CHECK(s.exit_code() == 0);
}

TEST_CASE("a failure stops the group, is reported, and the job's end finishes with its code", "[state]") {
  auto s = running(config(2));
  CHECK(s.on_event(exit_of(1, 3)) == Actions{report(0, 1, WorkerStatus::exited(3)), signal_all(SIGTERM), arm(30)});
  CHECK(s.phase() == Phase::Stopping);
  CHECK(s.on_event(killed(0, SIGTERM)) == Actions{disarm()});
  CHECK(s.phase() == Phase::Awaiting);
  CHECK(s.on_event(CoordinatorNotice{N::JobFailed, 0}) == Actions{finish(3)});
  CHECK(s.last_failure()->local_rank == 1);
}

TEST_CASE("killed by a signal: 128 + signal", "[state]") {
  auto s = running(config(1));
  s.on_event(killed(0, SIGKILL));
  CHECK(s.on_event(CoordinatorNotice{N::JobFailed, 0}) == Actions{finish(128 + SIGKILL)});
}

TEST_CASE("grace expires: SIGKILL, then give up after the kill wait", "[state]") {
  auto s = running(config(2, false));
  s.on_event(exit_of(0, 1));
  CHECK(s.on_event(TimerExpired{}) == Actions{signal_all(SIGKILL), arm(5)});
  CHECK(s.phase() == Phase::Killing);
  CHECK(s.on_event(TimerExpired{}) == Actions{{.kind = Kind::AbandonWorkers}});
  CHECK(s.phase() == Phase::Awaiting);
}

TEST_CASE("overlap off: a restart notice while stopping waits for the group, then joins", "[state]") {
  auto s = running(config(3, false));
  s.on_event(exit_in(0, 1, WorkerStatus::exited(7)));
  CHECK(s.on_event(CoordinatorNotice{N::Restart, 1}).empty());
  CHECK(s.on_event(exit_in(0, 0, WorkerStatus::killed_by(SIGTERM))).empty());
  CHECK(s.on_event(exit_in(0, 2, WorkerStatus::killed_by(SIGTERM))) == Actions{disarm(), join(1)});
  CHECK(s.on_event(RoundReady{1}) == Actions{start_attempt(1)});
  CHECK(s.attempt() == 1);
}

TEST_CASE("restart then success", "[state]") {
  auto s = running(config(1));
  s.on_event(exit_of(0, 2));
  CHECK(s.on_event(CoordinatorNotice{N::Restart, 1}) == Actions{join(1)});
  s.on_event(RoundReady{1});
  CHECK(s.on_event(exit_of(0, 0)) == Actions{success(1)});
  CHECK(s.on_event(CoordinatorNotice{N::JobDone, 0}) == Actions{finish(0)});
}

TEST_CASE("a signal is forwarded and ends the run with 128 + signal", "[state]") {
  auto s = running(config(2));
  CHECK(s.on_event(SignalReceived{SIGTERM}) == Actions{signal_all(SIGTERM), arm(30)});
  s.on_event(killed(0, SIGTERM));
  CHECK(s.on_event(killed(1, SIGTERM)) == Actions{disarm(), finish(128 + SIGTERM)});
  CHECK(s.stop_signal() == SIGTERM);
}

TEST_CASE("a second signal skips the grace period", "[state]") {
  auto s = running(config(2));
  s.on_event(SignalReceived{SIGINT});
  CHECK(s.on_event(SignalReceived{SIGINT}) == Actions{signal_all(SIGKILL), arm(5)});
  CHECK(s.phase() == Phase::Killing);
}

TEST_CASE("a signal during a failure's stop cancels the restart, overlap or not", "[state]") {
  auto s = running(config(2, GENERATE(false, true)));
  s.on_event(exit_of(1, 1));
  CHECK(s.on_event(SignalReceived{SIGTERM}) == Actions{signal_all(SIGTERM)});
  CHECK(s.on_event(CoordinatorNotice{N::Restart, 1}).empty());  // no retire, no join
  CHECK(s.on_event(killed(0, SIGTERM)) == Actions{disarm(), finish(128 + SIGTERM)});
}

TEST_CASE("stale timer and unknown ranks are ignored", "[state]") {
  auto s = running(config(1));
  CHECK(s.on_event(TimerExpired{}).empty());
  CHECK(s.on_event(exit_of(5, 1)).empty());
  CHECK(s.on_event(RoundReady{3}).empty());  // not joining
}

TEST_CASE("a signal while joining or awaiting finishes at once", "[state]") {
  AgentState s(config(1));
  s.start();
  CHECK(s.on_event(SignalReceived{SIGINT}) == Actions{finish(128 + SIGINT)});
}

TEST_CASE("overlap on: the restart notice retires the survivors and joins the next round at once", "[state]") {
  auto s = running(config(3));
  CHECK(s.on_event(exit_in(0, 1, WorkerStatus::exited(7))) ==
        Actions{report(0, 1, WorkerStatus::exited(7)), signal_all(SIGTERM), arm(30)});
  CHECK(s.on_event(CoordinatorNotice{N::Restart, 1}) == Actions{disarm(), retire(0, 30), join(1)});
  CHECK(s.phase() == Phase::Joining);
  // The retired ranks 0 and 2 end while joining or later: no event of any attempt.
  CHECK(s.on_event(exit_in(0, 0, WorkerStatus::killed_by(SIGTERM))).empty());
  CHECK(s.on_event(RoundReady{1}) == Actions{start_attempt(1)});
  CHECK(s.on_event(exit_in(0, 2, WorkerStatus::exited(1))).empty());
  CHECK(s.alive() == std::set<int>{0, 1, 2});
  CHECK(s.last_failure()->attempt == 0);
  CHECK(s.on_event(exit_in(1, 0, WorkerStatus::exited(0))).empty());
  CHECK(s.on_event(exit_in(1, 1, WorkerStatus::exited(0))).empty());
  CHECK(s.on_event(exit_in(0, 2, WorkerStatus::exited(0))).empty());  // late, still ignored
  CHECK(s.on_event(exit_in(1, 2, WorkerStatus::exited(0))) == Actions{success(1)});
}

TEST_CASE("overlap on: a restart notice while running (another node failed) retires the group", "[state]") {
  auto s = running(config(2));
  CHECK(s.on_event(CoordinatorNotice{N::Restart, 1}) == Actions{signal_all(SIGTERM), retire(0, 30), join(1)});
}

TEST_CASE("overlap on: nobody left to retire joins as before", "[state]") {
  auto s = running(config(1));
  CHECK(s.on_event(exit_in(0, 0, WorkerStatus::killed_by(SIGKILL))) ==
        Actions{report(0, 0, WorkerStatus::killed_by(SIGKILL)), signal_all(SIGTERM)});
  CHECK(s.phase() == Phase::Awaiting);
  CHECK(s.on_event(CoordinatorNotice{N::Restart, 1}) == Actions{join(1)});
}

TEST_CASE("overlap on: a signal while an old group retires stops the new attempt and finishes", "[state]") {
  auto s = running(config(2));
  s.on_event(exit_in(0, 1, WorkerStatus::exited(2)));
  s.on_event(CoordinatorNotice{N::Restart, 1});
  s.on_event(RoundReady{1});
  CHECK(s.on_event(SignalReceived{SIGINT}) == Actions{signal_all(SIGINT), arm(30)});
  CHECK(s.stop_signal() == SIGINT);
  CHECK(s.on_event(exit_in(0, 0, WorkerStatus::killed_by(SIGKILL))).empty());  // the retired one
  CHECK(s.on_event(exit_in(1, 0, WorkerStatus::killed_by(SIGINT))).empty());
  CHECK(s.on_event(exit_in(1, 1, WorkerStatus::exited(1))) == Actions{disarm(), finish(128 + SIGINT)});
}

TEST_CASE("overlap on: the job failing while the group stops means no retire, stop and finish", "[state]") {
  auto s = running(config(2));
  s.on_event(exit_of(1, 6));
  CHECK(s.on_event(CoordinatorNotice{N::JobFailed, 0}).empty());
  CHECK(s.on_event(killed(0, SIGTERM)) == Actions{disarm(), finish(6)});
}

// ---- Preemption (Slurm's --signal=USR1@T, scancel --signal=USR1; a worker's exit 99) ----

namespace {
AgentConfig preempt_config(int nproc, bool overlap = true) {
  AgentConfig c = config(nproc, overlap);
  c.preempt_grace_s = 90;
  return c;
}
SignalReceived preempt(int signo = SIGUSR1) { return {.signo = signo, .preempt = true}; }
}  // namespace

TEST_CASE("preemption signal: forwarded, the grace, then finish 99 with nothing reported", "[state]") {
  auto s = running(preempt_config(2));
  CHECK(s.on_event(preempt()) == Actions{signal_all(SIGUSR1), arm(90)});
  CHECK(s.phase() == Phase::Preempting);
  CHECK(s.preempted());
  // Their exits, whatever the status (a program that dies of SIGUSR1 included), are no failure.
  CHECK(s.on_event(exit_of(0, kPreemptedExitCode)).empty());
  CHECK(s.on_event(killed(1, SIGUSR1)) == Actions{disarm(), finish(kPreemptedExitCode)});
  CHECK_FALSE(s.last_failure());
  CHECK(s.exit_code() == kPreemptedExitCode);
}

TEST_CASE("preemption grace over: the ordinary stop, SIGTERM then SIGKILL, still 99", "[state]") {
  auto s = running(preempt_config(2));
  s.on_event(preempt());
  CHECK(s.on_event(TimerExpired{}) == Actions{signal_all(SIGTERM), arm(30)});
  CHECK(s.phase() == Phase::Stopping);
  CHECK(s.on_event(TimerExpired{}) == Actions{signal_all(SIGKILL), arm(5)});
  CHECK(s.on_event(killed(0, SIGKILL)).empty());
  CHECK(s.on_event(killed(1, SIGKILL)) == Actions{disarm(), finish(kPreemptedExitCode)});
}

TEST_CASE("a repeated preemption signal changes nothing; a stop signal ends the grace", "[state]") {
  auto s = running(preempt_config(1));
  s.on_event(preempt());
  CHECK(s.on_event(preempt()).empty());  // Slurm signals the agent and the workers; srun may relay again
  CHECK(s.phase() == Phase::Preempting);
  // The time limit's SIGTERM while they still write their checkpoint: forwarded, the shutdown grace.
  CHECK(s.on_event(SignalReceived{SIGTERM}) == Actions{signal_all(SIGTERM), arm(30)});
  CHECK(s.phase() == Phase::Stopping);
  CHECK(s.on_event(SignalReceived{SIGINT}) == Actions{signal_all(SIGKILL), arm(5)});  // impatient
  CHECK(s.on_event(killed(0, SIGKILL)) == Actions{disarm(), finish(kPreemptedExitCode)});
}

TEST_CASE(
    "a worker announcing a preemption and exiting 99 is a preemption: no report, the others get the grace unsignalled",
    "[state]") {
  auto s = running(preempt_config(3));
  CHECK(s.on_event(stopped_for_preemption(1)) == Actions{arm(90)});
  CHECK(s.phase() == Phase::Preempting);
  CHECK(s.on_event(stopped_for_preemption(0)).empty());
  CHECK(s.on_event(stopped_for_preemption(2)) == Actions{disarm(), finish(kPreemptedExitCode)});
  CHECK_FALSE(s.last_failure());
}

TEST_CASE("one worker, announcing a preemption and exiting 99: finish at once", "[state]") {
  auto s = running(preempt_config(1));
  CHECK(s.on_event(stopped_for_preemption(0)) == Actions{finish(kPreemptedExitCode)});
}

TEST_CASE("preempting: notices neither restart nor end the group early", "[state]") {
  auto s = running(preempt_config(2));
  s.on_event(preempt());
  // Another node finished its preemption first and left: the round restarts or fails the job.
  CHECK(s.on_event(CoordinatorNotice{N::Restart, 1}).empty());
  CHECK(s.on_event(CoordinatorNotice{N::JobFailed, 0}).empty());
  CHECK(s.on_event(exit_of(0, kPreemptedExitCode)).empty());
  CHECK(s.on_event(exit_of(1, kPreemptedExitCode)) == Actions{disarm(), finish(kPreemptedExitCode)});
}

TEST_CASE("a notice stops the group and its workers announce a preemption: preempted, not failed", "[state]") {
  auto s = running(preempt_config(2));
  // This node's agent got no signal (yet); another node left after its preemption.
  CHECK(s.on_event(CoordinatorNotice{N::JobFailed, 0}) == Actions{signal_all(SIGTERM), arm(30)});
  CHECK(s.on_event(stopped_for_preemption(0)).empty());
  CHECK(s.on_event(stopped_for_preemption(1)) == Actions{disarm(), finish(kPreemptedExitCode)});
}

TEST_CASE("exit 99 with no preemption signal and no announcement is an ordinary failure", "[state]") {
  auto s = running(preempt_config(2));
  const auto out = s.on_event(exit_of(1, kPreemptedExitCode));
  REQUIRE_FALSE(out.empty());
  CHECK(out.front().kind == Action::Kind::ReportFailure);
  CHECK_FALSE(s.preempted());
  CHECK(s.last_failure());
  // After a preemption signal, the same exit is the workers' answer to it.
  auto t = running(preempt_config(2));
  t.on_event(preempt());
  CHECK(t.on_event(exit_of(0, kPreemptedExitCode)).empty());
  CHECK(t.on_event(exit_of(1, kPreemptedExitCode)) == Actions{disarm(), finish(kPreemptedExitCode)});
}

TEST_CASE("a restart notice stops the group and its workers answer 99: the restart goes on", "[state]") {
  // A scale-up (or another node's failure) in a multi-node job: the workers stop at a step
  // boundary on SIGTERM, with a checkpoint, and exit 99; the next attempt resumes from it.
  auto s = running(preempt_config(2, false));
  CHECK(s.on_event(CoordinatorNotice{N::Restart, 1}) == Actions{signal_all(SIGTERM), arm(30)});
  CHECK(s.on_event(exit_of(0, kPreemptedExitCode)).empty());
  CHECK(s.on_event(exit_of(1, kPreemptedExitCode)) == Actions{disarm(), join(1)});
  CHECK_FALSE(s.preempted());
}

TEST_CASE("SIGTERM (a stop signal) whose workers announce a preemption: the job exits 99", "[state]") {
  auto s = running(preempt_config(2));
  CHECK(s.on_event(SignalReceived{SIGTERM}) == Actions{signal_all(SIGTERM), arm(30)});
  CHECK(s.on_event(stopped_for_preemption(0)).empty());
  CHECK(s.on_event(stopped_for_preemption(1)) == Actions{disarm(), finish(kPreemptedExitCode)});
  CHECK(s.stop_signal() == SIGTERM);
}

TEST_CASE("a failed attempt's 99 exits do not hide its failure", "[state]") {
  auto s = running(preempt_config(2, false));
  s.on_event(exit_of(1, 3));
  CHECK(s.on_event(exit_of(0, kPreemptedExitCode)) == Actions{disarm()});
  CHECK_FALSE(s.preempted());
  CHECK(s.phase() == Phase::Awaiting);
  CHECK(s.on_event(CoordinatorNotice{N::Restart, 1}) == Actions{join(1)});
}

TEST_CASE("a preemption signal while a failed group stops cancels the restart", "[state]") {
  auto s = running(preempt_config(2));
  s.on_event(exit_of(1, 3));
  CHECK(s.on_event(preempt()) == Actions{signal_all(SIGUSR1)});  // the shutdown grace runs on
  CHECK(s.on_event(CoordinatorNotice{N::Restart, 1}).empty());   // no overlapped restart
  CHECK(s.on_event(killed(0, SIGTERM)) == Actions{disarm(), finish(kPreemptedExitCode)});
}

TEST_CASE("a preemption signal while joining or awaiting finishes 99 at once", "[state]") {
  AgentState joining(preempt_config(1));
  joining.start();
  CHECK(joining.on_event(preempt()) == Actions{finish(kPreemptedExitCode)});
  auto awaiting = running(preempt_config(1));
  awaiting.on_event(exit_of(0, 0));
  REQUIRE(awaiting.phase() == Phase::Awaiting);
  CHECK(awaiting.on_event(preempt()) == Actions{finish(kPreemptedExitCode)});
}

namespace {
AgentConfig barrier_config(int nproc, double barrier_s) {
  auto c = config(nproc);
  c.exit_barrier_timeout_s = barrier_s;
  return c;
}
Action stop_stragglers(int first_done, double s) {
  return {.kind = Kind::StopStragglers, .local_rank = first_done, .seconds = s};
}
}  // namespace

TEST_CASE("exit barrier: the first exit 0 arms it; stragglers are stopped and the agent finishes 124", "[state]") {
  auto s = running(barrier_config(3, 10));
  CHECK(s.on_event(exit_of(1, 0)) == Actions{arm(10)});
  CHECK(s.on_event(exit_of(0, 0)).empty());  // armed once, from the first
  CHECK(s.on_event(TimerExpired{}) == Actions{stop_stragglers(1, 10), signal_all(SIGTERM), arm(30)});
  CHECK(s.phase() == Phase::Stopping);
  CHECK(s.alive() == std::set<int>{2});
  // The straggler's end under SIGTERM is no failure to report, and nothing restarts.
  CHECK(s.on_event(killed(2, SIGTERM)) == Actions{disarm(), finish(kExitBarrierTimeoutExitCode)});
  CHECK(s.exit_code() == 124);
}

TEST_CASE("exit barrier: a straggler ignoring SIGTERM gets SIGKILL after the grace", "[state]") {
  auto s = running(barrier_config(2, 1));
  s.on_event(exit_of(0, 0));
  s.on_event(TimerExpired{});
  CHECK(s.on_event(TimerExpired{}) == Actions{signal_all(SIGKILL), arm(5)});
  CHECK(s.on_event(killed(1, SIGKILL)) == Actions{disarm(), finish(124)});
}

TEST_CASE("exit barrier: everyone finishing in time disarms it; off by default", "[state]") {
  auto s = running(barrier_config(2, 10));
  CHECK(s.on_event(exit_of(0, 0)) == Actions{arm(10)});
  CHECK(s.on_event(exit_of(1, 0)) == Actions{disarm(), success(0)});
  CHECK(s.on_event(TimerExpired{}).empty());  // a late expiry changes nothing
  CHECK(s.on_event(CoordinatorNotice{N::JobDone, 0}) == Actions{finish(0)});

  auto off = running(config(2));
  CHECK(off.on_event(exit_of(0, 0)).empty());
  CHECK(off.on_event(TimerExpired{}).empty());
  CHECK(off.phase() == Phase::Running);
}

TEST_CASE("exit barrier: a failure while it waits is an ordinary failure", "[state]") {
  auto s = running(barrier_config(3, 10));
  s.on_event(exit_of(0, 0));
  CHECK(s.on_event(exit_of(1, 7)) == Actions{report(0, 1, WorkerStatus::exited(7)), signal_all(SIGTERM), arm(30)});
  CHECK(s.on_event(killed(2, SIGTERM)) == Actions{disarm()});
  CHECK(s.phase() == Phase::Awaiting);
  CHECK(s.on_event(CoordinatorNotice{N::JobFailed, 0}) == Actions{finish(7)});
}
