// The agent's decisions when the job spans nodes: the round decides, and a job-wide restart
// waits for the local group (overlap off, as the agent configures it for a remote round).
#include <catch2/catch.hpp>
#include <csignal>

#include "ddprun/launcher/agent_state.h"

using namespace ddprun::launcher;
using K = Action::Kind;
using N = CoordinatorNotice::Kind;

namespace {
AgentState coordinated(int nproc = 2) {
  AgentConfig c;
  c.nproc = nproc;
  c.overlap_restart = false;
  return AgentState(c);
}
bool has(const std::vector<Action>& v, K k) {
  for (const auto& a : v)
    if (a.kind == k) return true;
  return false;
}
const Action* find(const std::vector<Action>& v, K k) {
  for (const auto& a : v)
    if (a.kind == k) return &a;
  return nullptr;
}
}  // namespace

TEST_CASE("CoordinatedStartJoinsFirst", "[state]") {
  auto s = coordinated();
  auto a = s.start();
  REQUIRE(a.size() == 1);
  CHECK(a[0].kind == K::JoinRound);
  CHECK(s.phase() == AgentState::Phase::Joining);
  auto b = s.on_event(RoundReady{0});
  REQUIRE(find(b, K::StartAttempt));
  CHECK(s.phase() == AgentState::Phase::Running);
}

TEST_CASE("CoordinatedSuccessWaitsForTheJobVerdict", "[state]") {
  auto s = coordinated();
  s.start();
  s.on_event(RoundReady{0});
  CHECK(s.on_event(WorkerExited{0, WorkerStatus::exited(0)}).empty());
  auto a = s.on_event(WorkerExited{1, WorkerStatus::exited(0)});
  REQUIRE(find(a, K::ReportSuccess));
  CHECK(s.phase() == AgentState::Phase::Awaiting);
  auto d = s.on_event(CoordinatorNotice{N::JobDone, 0});
  REQUIRE(find(d, K::Finish));
  CHECK(find(d, K::Finish)->exit_code == 0);
}

TEST_CASE("CoordinatedLocalFailureIsReportedAndTheServerDecides", "[state]") {
  auto s = coordinated();
  s.start();
  s.on_event(RoundReady{0});
  auto a = s.on_event(WorkerExited{1, WorkerStatus::exited(3)});
  REQUIRE(find(a, K::ReportFailure));
  REQUIRE(find(a, K::SignalWorkers));
  CHECK(s.phase() == AgentState::Phase::Stopping);
  auto b = s.on_event(WorkerExited{0, WorkerStatus::killed_by(SIGTERM)});
  CHECK(s.phase() == AgentState::Phase::Awaiting);
  CHECK_FALSE(has(b, K::StartAttempt));
  auto c = s.on_event(CoordinatorNotice{N::Restart, 1});
  REQUIRE(find(c, K::JoinRound));
  CHECK(find(c, K::JoinRound)->attempt == 1);
  auto d = s.on_event(RoundReady{1});
  REQUIRE(find(d, K::StartAttempt));
  CHECK(s.attempt() == 1);
}

TEST_CASE("CoordinatedRestartWhileRunningStopsThenJoins", "[state]") {
  auto s = coordinated();
  s.start();
  s.on_event(RoundReady{0});
  auto a = s.on_event(CoordinatorNotice{N::Restart, 1});
  REQUIRE(find(a, K::SignalWorkers));
  CHECK(find(a, K::SignalWorkers)->signo == SIGTERM);
  CHECK(s.phase() == AgentState::Phase::Stopping);
  s.on_event(WorkerExited{0, WorkerStatus::killed_by(SIGTERM)});
  auto b = s.on_event(WorkerExited{1, WorkerStatus::killed_by(SIGTERM)});
  REQUIRE(find(b, K::JoinRound));
  CHECK(find(b, K::JoinRound)->attempt == 1);
}

TEST_CASE("CoordinatedRestartAfterLocalSuccessRejoins", "[state]") {
  auto s = coordinated(1);
  s.start();
  s.on_event(RoundReady{0});
  s.on_event(WorkerExited{0, WorkerStatus::exited(0)});
  auto a = s.on_event(CoordinatorNotice{N::Restart, 1});  // another node failed
  REQUIRE(find(a, K::JoinRound));
}

TEST_CASE("CoordinatedJobFailedEndsWithTheLocalFailureCode", "[state]") {
  auto s = coordinated(1);
  s.start();
  s.on_event(RoundReady{0});
  s.on_event(WorkerExited{0, WorkerStatus::exited(5)});
  auto a = s.on_event(CoordinatorNotice{N::JobFailed, 0});
  REQUIRE(find(a, K::Finish));
  CHECK(find(a, K::Finish)->exit_code == 5);
}

TEST_CASE("CoordinatedJobFailedWhileRunningStopsTheGroupFirst", "[state]") {
  auto s = coordinated(1);
  s.start();
  s.on_event(RoundReady{0});
  auto a = s.on_event(CoordinatorNotice{N::JobFailed, 0});
  REQUIRE(find(a, K::SignalWorkers));
  CHECK_FALSE(has(a, K::Finish));
  auto b = s.on_event(WorkerExited{0, WorkerStatus::killed_by(SIGTERM)});
  REQUIRE(find(b, K::Finish));
  CHECK(find(b, K::Finish)->exit_code == 1);
}

TEST_CASE("CoordinatedSignalWhileJoiningFinishes", "[state]") {
  auto s = coordinated();
  s.start();
  auto a = s.on_event(SignalReceived{SIGINT});
  REQUIRE(find(a, K::Finish));
  CHECK(find(a, K::Finish)->exit_code == 128 + SIGINT);
}

TEST_CASE("CoordinatedFailureNeverOverlaps", "[state]") {
  auto s = coordinated(2);
  s.start();
  s.on_event(RoundReady{0});
  auto a = s.on_event(WorkerExited{1, WorkerStatus::exited(3)});
  CHECK_FALSE(has(a, K::RetireWorkers));
  CHECK_FALSE(has(a, K::StartAttempt));
  CHECK(has(a, K::ArmTimer));
  CHECK(s.phase() == AgentState::Phase::Stopping);
  auto r = s.on_event(CoordinatorNotice{N::Restart, 1});
  CHECK_FALSE(has(r, K::RetireWorkers));
  auto j = s.on_event(WorkerExited{0, WorkerStatus::killed_by(SIGTERM)});
  CHECK_FALSE(has(j, K::RetireWorkers));
  REQUIRE(find(j, K::JoinRound));
  CHECK(find(j, K::JoinRound)->attempt == 1);
}
