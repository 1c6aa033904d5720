#include <catch2/catch.hpp>

#include <algorithm>
#include <cstdio>
#include <functional>

#include "ddprun/rdzv/fixed_port_stores.h"
#include "ddprun/rdzv/round_state.h"
#include "ddprun/rdzv/validate.h"

using namespace ddprun::rdzv;
using namespace std::chrono_literals;

namespace {

struct FakeStores : WorkerStores {
  uint16_t next_port = 40000;
  std::map<std::pair<std::string, int64_t>, uint16_t> open_stores;
  bool progress = true;
  bool fixed = false;  // what the last open() was asked for
  uint16_t open(const std::string& run, int64_t round, bool fixed_port) override {
    fixed = fixed_port;
    return open_stores[{run, round}] = fixed_port ? 29500 : next_port++;
  }
  void close(const std::string& run, int64_t round) override { open_stores.erase({run, round}); }
  bool progressed(const std::string&, int64_t, int64_t) override { return progress; }
};

struct Harness {
  FakeStores stores;
  RoundState state{stores};
  Clock::time_point now = Clock::time_point{} + 1000s;
  std::vector<Outbound> out;

  Message join_msg(const std::string& host, int64_t nproc = 2, int64_t min = 2, int64_t max = 2, int64_t restarts = 3) {
    Message m;
    m.type = MsgType::Join;
    m.set("run_id", "job").set("node_id", host + "_1").set("host", host).set("local_world_size", nproc);
    m.set("min_nodes", min).set("max_nodes", max).set("max_restarts", restarts);
    m.set("last_call_ms", 3000).set("join_timeout_ms", 60000).set("heartbeat_timeout_ms", 5000);
    return m;
  }
  void send(ConnId c, const Message& m) {
    out.clear();
    state.on_message(c, m, now, out);
  }
  void join(ConnId c, const std::string& host, int64_t nproc = 2, int64_t min = 2, int64_t max = 2) {
    send(c, join_msg(host, nproc, min, max));
  }
  void fail(ConnId c, int64_t round) {
    Message m;
    m.type = MsgType::Failure;
    m.set("round", round).set("global_rank", 3).set("exit_code", 1);
    send(c, m);
  }
  void tick(std::chrono::milliseconds dt) {
    now += dt;
    out.clear();
    state.on_tick(now, out);
  }
  const Outbound* to(ConnId c, MsgType t) const {
    for (const auto& o : out)
      if (o.conn == c && o.msg.type == t) return &o;
    return nullptr;
  }
  void heartbeat_all(std::initializer_list<ConnId> cs) {
    for (ConnId c : cs) {
      Message m;
      m.type = MsgType::Heartbeat;
      out.clear();
      state.on_message(c, m, now, out);
    }
  }
};

}  // namespace

TEST_CASE("RoundCompletesWhenMaxNodesJoined", "[rdzv]") {
  Harness h;
  h.join(1, "a", 2);
  CHECK(h.out.empty());
  h.join(2, "b", 3);
  REQUIRE(h.out.size() == 2);
  auto* r1 = h.to(1, MsgType::Round);
  auto* r2 = h.to(2, MsgType::Round);
  REQUIRE(r1);
  REQUIRE(r2);
  CHECK(r1->msg.get_int("node_rank") == 0);
  CHECK(r2->msg.get_int("node_rank") == 1);
  CHECK(r2->msg.get_int("base_rank") == 2);  // heterogeneous: 2 + 3 workers
  CHECK(r1->msg.get_int("world_size") == 5);
  CHECK(r1->msg.get_int("restart_count") == 0);
  CHECK(r1->msg.get_int("store_port") == r2->msg.get_int("store_port"));
}

TEST_CASE("RoundClosesAtLastCallAfterMinJoined", "[rdzv]") {
  Harness h;
  h.join(1, "a", 1, 1, 3);
  CHECK(h.out.empty());
  h.tick(2999ms);
  CHECK(h.out.empty());
  h.join(2, "b", 1, 1, 3);
  CHECK(h.out.empty());
  h.tick(2ms);
  REQUIRE(h.to(1, MsgType::Round));
  CHECK(h.to(2, MsgType::Round)->msg.get_int("nnodes") == 2);
}

TEST_CASE("JoinTimeoutNamesHowManyCame", "[rdzv]") {
  Harness h;
  h.join(1, "hostA", 1, 3, 3);
  h.heartbeat_all({1});
  for (int i = 0; i < 60; ++i) {
    h.tick(1000ms);
    if (!h.out.empty()) break;
    h.heartbeat_all({1});
  }
  auto* e = h.to(1, MsgType::Error);
  REQUIRE(e);
  CHECK_THAT(e->msg.get("message"), Catch::Contains("1 of at least 3 nodes joined job job (hostA)"));
  CHECK(e->close_after);
}

TEST_CASE("EndpointHostGetsRankZeroAndRanksAreStable", "[rdzv]") {
  Harness h;
  auto m = h.join_msg("b");
  h.send(1, m);
  auto m2 = h.join_msg("head");
  m2.set("prefer_rank0", "1");
  h.send(2, m2);
  CHECK(h.to(2, MsgType::Round)->msg.get_int("node_rank") == 0);
  CHECK(h.to(1, MsgType::Round)->msg.get_int("node_rank") == 1);
  // A failure: both rejoin (in the other order); ranks stay.
  h.fail(1, 0);
  REQUIRE(h.to(1, MsgType::Restart));
  REQUIRE(h.to(2, MsgType::Restart));
  h.send(1, m);
  h.send(2, m2);
  CHECK(h.to(2, MsgType::Round)->msg.get_int("node_rank") == 0);
  CHECK(h.to(1, MsgType::Round)->msg.get_int("node_rank") == 1);
  CHECK(h.to(1, MsgType::Round)->msg.get_int("restart_count") == 1);
  CHECK(h.to(1, MsgType::Round)->msg.get_int("round") == 1);
}

TEST_CASE("OneRestartBudgetForTheWholeJob", "[rdzv]") {
  Harness h;
  auto a = h.join_msg("a", 1, 2, 2, /*restarts=*/1), b = h.join_msg("b", 1, 2, 2, 1);
  h.send(1, a);
  h.send(2, b);
  h.fail(2, 0);
  CHECK(h.to(1, MsgType::Restart)->msg.get_int("restart_count") == 1);
  h.send(1, a);
  h.send(2, b);
  REQUIRE(h.to(1, MsgType::Round));
  h.fail(1, 1);  // the other node fails this time: same budget
  auto* f = h.to(2, MsgType::JobFailed);
  REQUIRE(f);
  CHECK_THAT(f->msg.get("reason"), Catch::Contains("restart budget (max_restarts=1) is spent"));
  CHECK(f->msg.get("first_failure.host") == "b");  // the job's first failure is reported
}

TEST_CASE("StaleFailureOfAnOldRoundIsIgnored", "[rdzv]") {
  Harness h;
  h.join(1, "a");
  h.join(2, "b");
  h.fail(1, 0);
  h.fail(2, 0);  // same round, already restarting: no second restart spent
  CHECK(h.out.empty());
  h.join(1, "a");
  h.join(2, "b");
  CHECK(h.to(1, MsgType::Round)->msg.get_int("restart_count") == 1);
}

TEST_CASE("FailureRepeatingBeforeProgressEndsTheJob", "[rdzv]") {
  Harness h;
  h.stores.progress = false;
  h.join(1, "a");
  h.join(2, "b");
  h.fail(1, 0);
  REQUIRE(h.to(1, MsgType::Restart));
  h.join(1, "a");
  h.join(2, "b");
  h.fail(1, 1);
  auto* f = h.to(2, MsgType::JobFailed);
  REQUIRE(f);
  CHECK_THAT(f->msg.get("reason"), Catch::Contains("deterministic failure"));
}

TEST_CASE("OnlyAQuickFailureRepeatingTheSameWayIsDeterministic", "[rdzv]") {
  // Attempt 0 fails as given by `first`, attempt 1 as `second`: which ends the job unretried?
  struct Way {
    int64_t rank, code, runtime_ms;
  };
  auto second_failure_ends_job = [](Way first, Way second, bool retry = false) {
    Harness h;
    h.stores.progress = false;  // the workers never all joined their store
    auto a = h.join_msg("a"), b = h.join_msg("b");
    if (retry) a.set("retry_deterministic", "1"), b.set("retry_deterministic", "1");
    int64_t round = 0;
    for (Way w : {first, second}) {
      h.send(1, a);
      h.send(2, b);
      Message m;
      m.type = MsgType::Failure;
      m.set("round", round++).set("global_rank", w.rank).set("exit_code", w.code).set("runtime_ms", w.runtime_ms);
      h.send(1, m);
    }
    const auto* f = h.to(2, MsgType::JobFailed);
    if (f) CHECK_THAT(f->msg.get("reason"), Catch::Contains("deterministic failure"));
    return f != nullptr;
  };
  CHECK(second_failure_ends_job({3, 1, 300}, {3, 1, 400}));          // an import error, twice
  CHECK_FALSE(second_failure_ends_job({3, 1, 3000}, {3, 1, 3000}));  // ran 3 s: transient, retried
  CHECK_FALSE(second_failure_ends_job({3, 1, 300}, {2, 1, 300}));    // another rank
  CHECK_FALSE(second_failure_ends_job({3, 1, 300}, {3, 2, 300}));    // another way
  CHECK_FALSE(second_failure_ends_job({3, 1, 3000}, {3, 1, 300}));   // the first was not quick
  CHECK_FALSE(second_failure_ends_job({3, 1, 300}, {3, 1, 300}, /*retry=*/true));  // asked to retry
  CHECK(second_failure_ends_job({3, 1, -1}, {3, 1, -1}));            // an older agent says no runtime
}

TEST_CASE("AConfigErrorEndsTheJobAtOnceWithRestartsLeftUnlessAskedToRetry", "[rdzv]") {
  // The workers ran and joined their store (progress): only the worker's word makes it final.
  auto first_failure_ends_job = [](bool config_error, bool retry) {
    Harness h;
    auto a = h.join_msg("a"), b = h.join_msg("b");
    if (retry) a.set("retry_deterministic", "1"), b.set("retry_deterministic", "1");
    h.send(1, a);
    h.send(2, b);
    Message m;
    m.type = MsgType::Failure;
    m.set("round", 0).set("global_rank", 1).set("exit_code", 78).set("runtime_ms", 5000);
    if (config_error) m.set("config_error", "1");
    h.out.clear();
    h.send(1, m);
    const auto* f = h.to(2, MsgType::JobFailed);
    if (f) {
      CHECK_THAT(f->msg.get("reason"), Catch::Contains("configuration error that a restart cannot fix"));
      CHECK_THAT(f->msg.get("reason"), Catch::Contains("3 of 3 restarts are left"));
      CHECK(from_message<JobFailed>(f->msg).fail_cause() == FailCause::ConfigError);
    } else {
      CHECK(h.to(2, MsgType::Restart));
    }
    return f != nullptr;
  };
  CHECK(first_failure_ends_job(true, false));
  CHECK_FALSE(first_failure_ends_job(false, false));  // exit code 78 alone: an ordinary failure
  CHECK_FALSE(first_failure_ends_job(true, true));    // --retry_deterministic
}

TEST_CASE("EveryRankFailingAlikeIsDeterministicWhicheverIsReportedFirst", "[rdzv]") {
  auto ends = [](const std::string& tail0, const std::string& tail1) {
    Harness h;
    h.stores.progress = false;
    int64_t round = 0;
    for (const auto& [rank, tail] : {std::pair<int64_t, std::string>{0, tail0}, {1, tail1}}) {
      h.join(1, "a");
      h.join(2, "b");
      Message m;
      m.type = MsgType::Failure;
      m.set("round", round++).set("global_rank", rank).set("exit_code", 1).set("runtime_ms", 200);
      m.set("stderr_tail", tail);
      h.send(1, m);
    }
    return h.to(2, MsgType::JobFailed) != nullptr;
  };
  CHECK(ends("Traceback\nModuleNotFoundError: No module named 'x'\n", "ModuleNotFoundError: No module named 'x'\n"));
  CHECK_FALSE(ends("RuntimeError: peer 3 gone\n", "RuntimeError: peer 0 gone\n"));
  CHECK_FALSE(ends("", ""));  // nothing said: different ranks are different failures
}

TEST_CASE("LostNodeLeadsToANewRoundWhenMinRemains", "[rdzv]") {
  Harness h;
  h.join(1, "a", 1, 2, 3);
  h.join(2, "b", 1, 2, 3);
  h.join(3, "c", 1, 2, 3);
  REQUIRE(h.to(3, MsgType::Round));
  h.out.clear();
  h.state.on_disconnect(2, h.now, h.out);
  REQUIRE(h.to(1, MsgType::Restart));
  CHECK_THAT(h.to(1, MsgType::Restart)->msg.get("reason"), Catch::Contains("lost node b_1 (host b)"));
  h.join(1, "a", 1, 2, 3);
  CHECK(h.out.empty());  // c not back yet
  h.join(3, "c", 1, 2, 3);
  auto* r = h.to(3, MsgType::Round);
  REQUIRE(r);  // completes at once: every survivor is back, no last call
  CHECK(r->msg.get_int("nnodes") == 2);
  CHECK(r->msg.get_int("node_rank") == 1);  // c keeps its order after a
}

TEST_CASE("LostNodeBelowMinEndsTheJobNamingIt", "[rdzv]") {
  Harness h;
  h.join(1, "a");
  h.join(2, "b");
  h.out.clear();
  h.state.on_disconnect(2, h.now, h.out);
  auto* f = h.to(1, MsgType::JobFailed);
  REQUIRE(f);
  CHECK_THAT(f->msg.get("reason"), Catch::Contains("lost node b_1 (host b)"));
  CHECK_THAT(f->msg.get("reason"), Catch::Contains("fewer than the minimum of 2"));
}

TEST_CASE("MissedHeartbeatsDropANode", "[rdzv]") {
  Harness h;
  h.join(1, "a", 1, 1, 2);
  h.join(2, "b", 1, 1, 2);
  REQUIRE(h.to(1, MsgType::Round));
  for (int i = 0; i < 4; ++i) {
    h.tick(1000ms);
    h.heartbeat_all({1});  // b stays silent (its link is down)
  }
  h.tick(1500ms);
  auto* e = h.to(2, MsgType::Error);
  REQUIRE(e);
  CHECK(e->close_after);
  REQUIRE(h.to(1, MsgType::Restart));
  CHECK_THAT(h.to(1, MsgType::Restart)->msg.get("reason"), Catch::Contains("heartbeat timeout"));
}

// The server ticks every 200 ms; it was stopped for 1.9 s, less than half the heartbeat
// timeout, after the agents' last heartbeats had aged 3.2 s (they send one every timeout/5, but
// the one due just before the stop sat in the socket). However the stall is cut and in whatever
// order the queued heartbeats are read, nobody is dropped for the server's own stall.
TEST_CASE("AServerStallOfAnyLengthIsForgivenByTheTickPeriodWhateverTheReadOrder", "[rdzv]") {
  for (bool read_before_tick : {false, true}) {
    Harness h;
    h.state.set_tick_period(200ms);
    h.join(1, "a", 1, 2, 2);
    h.join(2, "b", 1, 2, 2);
    REQUIRE(h.to(1, MsgType::Round));
    for (int i = 0; i < 16; ++i) h.tick(200ms);  // 3.2 s of ticks, no heartbeat read
    CHECK(h.out.empty());
    h.now += 1900ms;  // the stop; then the two agents' queued heartbeats and the late tick
    if (read_before_tick) h.heartbeat_all({1});
    h.out.clear();
    h.state.on_tick(h.now, h.out);
    CHECK(h.out.empty());
    CHECK(h.state.last_stall() == 1700ms);
    h.heartbeat_all({1, 2});
    h.tick(200ms);
    CHECK(h.out.empty());
    CHECK(h.state.last_stall() == Clock::duration::zero());
  }
}

// One clock for heartbeats and deadlines: a stall during the rendezvous does not time it out.
TEST_CASE("AServerStallMovesTheJoinDeadlineByTheStall", "[rdzv]") {
  Harness h;
  h.state.set_tick_period(200ms);
  h.join(1, "a", 1, 2, 2);  // join timeout 60 s
  for (int i = 0; i < 250; ++i) {
    h.heartbeat_all({1});
    h.tick(200ms);  // 50 s of the 60
  }
  h.now += 20000ms;  // stopped for 20 s
  h.out.clear();
  h.state.on_tick(h.now, h.out);
  CHECK(h.out.empty());
  h.heartbeat_all({1});
  for (int i = 0; i < 45; ++i) {  // 9 s more: 59 s of the server's own time
    h.heartbeat_all({1});
    h.tick(200ms);
    REQUIRE(h.out.empty());
  }
  for (int i = 0; i < 10 && h.out.empty(); ++i) {
    h.heartbeat_all({1});
    h.tick(200ms);
  }
  REQUIRE(h.to(1, MsgType::Error));
  CHECK_THAT(h.to(1, MsgType::Error)->msg.get("message"), Catch::Contains("rendezvous timed out"));
}

// A server that ticks late all the time (a loaded host) forgives only the lateness: an agent
// that really went silent is still dropped.
TEST_CASE("AServerThatTicksLateStillDropsASilentAgent", "[rdzv]") {
  Harness h;
  h.state.set_tick_period(200ms);
  h.join(1, "a", 1, 1, 2);
  h.join(2, "b", 1, 1, 2);
  REQUIRE(h.to(1, MsgType::Round));
  int ticks = 0;
  while (ticks < 100 && !h.to(1, MsgType::Restart)) {
    h.heartbeat_all({1});
    h.tick(350ms);  // 150 ms late each time
    ++ticks;
  }
  REQUIRE(h.to(1, MsgType::Restart));
  // 5 s of the server's on-time progress, 200 ms a tick: about 25 ticks (every whole gap
  // counted: 15; every gap forgiven: never).
  CHECK(ticks >= 24);
  CHECK(ticks <= 27);
}

TEST_CASE("AStalledServerBlamesNoAgentForTheHeartbeatsItDidNotRead", "[rdzv]") {
  Harness h;
  h.join(1, "a", 1, 1, 2);
  h.join(2, "b", 1, 1, 2);
  REQUIRE(h.to(1, MsgType::Round));
  h.tick(200ms);
  CHECK(h.state.last_stall() == Clock::duration::zero());
  // 42 s without a tick: the server itself was held (heartbeat timeout 5 s). Nobody is dropped,
  // and the stall is there to report, once.
  h.tick(42000ms);
  CHECK(h.out.empty());
  CHECK(h.state.last_stall() == std::chrono::milliseconds(42000));
  h.heartbeat_all({1, 2});  // what queued meanwhile is read now
  CHECK(h.out.empty());
  h.tick(200ms);
  CHECK(h.out.empty());
  CHECK(h.state.last_stall() == Clock::duration::zero());
  // A node that really went silent is still dropped, one heartbeat timeout later.
  int ticks = 0;
  while (ticks < 10 && !h.to(1, MsgType::Restart)) {
    h.heartbeat_all({1});
    h.tick(1000ms);
    ++ticks;
  }
  CHECK(ticks == 5);
  REQUIRE(h.to(1, MsgType::Restart));
  CHECK_THAT(h.to(1, MsgType::Restart)->msg.get("reason"), Catch::Contains("heartbeat timeout"));
}

TEST_CASE("ADroppedAgentIsToldOnceNotOncePerHeartbeatQueuedBehindTheDrop", "[rdzv]") {
  Harness h;
  h.join(1, "a", 1, 1, 2);
  h.join(2, "b", 1, 1, 2);
  for (int i = 0; i < 10 && !h.to(2, MsgType::Error); ++i) {
    h.heartbeat_all({1});
    h.tick(1000ms);
  }
  auto* e = h.to(2, MsgType::Error);
  REQUIRE(e);
  CHECK_THAT(e->msg.get("message"), Catch::Contains("no heartbeat"));
  for (int i = 0; i < 20; ++i) {
    h.heartbeat_all({2});
    CHECK(h.out.empty());  // not "HEARTBEAT before JOIN", twenty times
  }
  h.out.clear();
  h.state.on_disconnect(2, h.now, h.out);
  // A connection that never joined still hears why it is refused.
  h.heartbeat_all({7});
  REQUIRE(h.to(7, MsgType::Error));
  CHECK_THAT(h.to(7, MsgType::Error)->msg.get("message"), Catch::Contains("HEARTBEAT before JOIN"));
}

TEST_CASE("NewNodeWhileRunningScalesUpWithoutSpendingTheBudget", "[rdzv]") {
  Harness h;
  h.join(1, "a", 1, 1, 3);
  h.join(2, "b", 1, 1, 3);
  h.tick(3000ms);
  REQUIRE(h.to(1, MsgType::Round));
  h.join(3, "c", 1, 1, 3);
  auto* rs = h.to(1, MsgType::Restart);
  REQUIRE(rs);
  CHECK(rs->msg.get_int("restart_count") == 0);
  h.join(1, "a", 1, 1, 3);
  h.join(2, "b", 1, 1, 3);
  auto* r = h.to(3, MsgType::Round);
  REQUIRE(r);  // all three: max reached
  CHECK(r->msg.get_int("nnodes") == 3);
  CHECK(r->msg.get_int("node_rank") == 2);
  CHECK(r->msg.get_int("restart_count") == 0);
}

TEST_CASE("JobDoneWhenEveryNodeSucceeded", "[rdzv]") {
  Harness h;
  h.join(1, "a");
  h.join(2, "b");
  Message s;
  s.type = MsgType::Succeeded;
  s.set("round", 0);
  h.send(1, s);
  CHECK(h.out.empty());
  h.send(2, s);
  REQUIRE(h.to(1, MsgType::JobDone));
  REQUIRE(h.to(2, MsgType::JobDone));
  CHECK(h.stores.open_stores.empty());
}

TEST_CASE("StaticNodeRanksAreHonouredAndConflictsRefused", "[rdzv]") {
  Harness h;
  auto m1 = h.join_msg("x");
  m1.set("node_rank", 1);
  auto m0 = h.join_msg("y");
  m0.set("node_rank", 0);
  h.send(1, m1);
  auto dup = h.join_msg("z");
  dup.set("node_rank", 1);
  h.send(3, dup);
  REQUIRE(h.to(3, MsgType::Error));
  CHECK_THAT(h.to(3, MsgType::Error)->msg.get("message"), Catch::Contains("already taken by x_1"));
  h.send(2, m0);
  CHECK(h.to(1, MsgType::Round)->msg.get_int("node_rank") == 1);
  CHECK(h.to(2, MsgType::Round)->msg.get_int("node_rank") == 0);
}

TEST_CASE("NnodesMismatchIsRefused", "[rdzv]") {
  Harness h;
  h.join(1, "a", 1, 2, 2);
  h.join(2, "b", 1, 1, 4);
  REQUIRE(h.to(2, MsgType::Error));
  CHECK_THAT(h.to(2, MsgType::Error)->msg.get("message"),
             Catch::Contains("--nnodes: the job runs with 2:2 nodes, this agent asked for 1:4"));
}

TEST_CASE("MaxRestartsMismatchIsRefusedNamingBothValues", "[rdzv]") {
  Harness h;
  h.send(1, h.join_msg("a", 1, 2, 2, /*restarts=*/3));
  h.send(2, h.join_msg("b", 1, 2, 2, /*restarts=*/1));
  REQUIRE(h.to(2, MsgType::Error));
  CHECK(h.to(2, MsgType::Error)->close_after);
  CHECK_THAT(h.to(2, MsgType::Error)->msg.get("message"),
             Catch::Contains("--max_restarts: the job runs with 3, this agent asked for 1"));
  h.send(3, h.join_msg("c", 1, 2, 2, 3));  // the job itself goes on
  CHECK(h.to(1, MsgType::Round));
  CHECK(h.to(3, MsgType::Round));
}

TEST_CASE("FixedStorePortOpensEveryRoundOnTheServersPort", "[rdzv]") {
  Harness h;
  auto j = from_message<Join>(h.join_msg("a", 1, 1, 1));
  j.fixed_store_port = true;
  h.send(1, to_message(j));
  REQUIRE(h.to(1, MsgType::Round));
  CHECK(h.stores.fixed);
  CHECK(from_message<Round>(h.to(1, MsgType::Round)->msg).store_port == 29500);
}

TEST_CASE("TypedMessagesRoundTripEveryField", "[rdzv]") {
  Join j{.run_id = "r", .node_id = "n", .host = "h", .local_world_size = 3, .min_nodes = 2, .max_nodes = 4,
         .max_restarts = 5, .last_call_ms = 6, .join_timeout_ms = 7, .heartbeat_timeout_ms = 8,
         .fixed_store_port = true, .node_rank = 1, .prefer_rank0 = true};
  auto back = from_message<Join>(to_message(j));
  CHECK(back.run_id == "r");
  CHECK(back.local_world_size == 3);
  CHECK(back.max_nodes == 4);
  CHECK(back.heartbeat_timeout_ms == 8);
  CHECK(back.fixed_store_port);
  CHECK(back.node_rank == 1);
  CHECK(back.prefer_rank0);
  CHECK(from_message<Join>(to_message(Join{})).node_rank == -1);  // absent fields keep defaults
  JobFailed f{.reason = "x", .cause = static_cast<int64_t>(FailCause::Deterministic), .max_restarts = 3,
              .first_failure = Failure{.global_rank = 7, .signal = "SIGKILL", .stderr_tail = "a\nb", .host = "h2"}};
  auto m = to_message(f);
  CHECK(m.get("first_failure.global_rank") == "7");  // the wire names old peers read
  auto fb = from_message<JobFailed>(m);
  CHECK(fb.fail_cause() == FailCause::Deterministic);
  REQUIRE(fb.first_failure);
  CHECK(fb.first_failure->signal == "SIGKILL");
  CHECK(fb.first_failure->stderr_tail == "a\nb");
  CHECK(fb.first_failure->host == "h2");
  CHECK_FALSE(from_message<JobFailed>(to_message(JobFailed{})).first_failure);
}

TEST_CASE("AgentProtocolFramesRoundTrip", "[rdzv]") {
  Message m;
  m.type = MsgType::Round;
  m.set("a", "1").set("hosts", std::string("x\0y", 3));
  std::string wire;
  encode_message(m, wire);
  encode_message(m, wire);
  Message back;
  auto r = parse_message({reinterpret_cast<const uint8_t*>(wire.data()), wire.size()}, back);
  REQUIRE(r.status == ddprun::wire::ParseStatus::Ok);
  CHECK(r.consumed == wire.size() / 2);
  CHECK(back.fields == m.fields);
  for (size_t n = 0; n < wire.size() / 2; ++n) {
    auto p = parse_message({reinterpret_cast<const uint8_t*>(wire.data()), n}, back);
    CHECK(p.status == ddprun::wire::ParseStatus::NeedMore);
  }
  std::string bad = wire.substr(0, wire.size() / 2);
  bad[4] = 99;
  CHECK(parse_message({reinterpret_cast<const uint8_t*>(bad.data()), bad.size()}, back).status ==
        ddprun::wire::ParseStatus::Bad);
}

namespace {
// The main keyspace as a counter map, recording its resets.
struct CountingKeyspace : MainKeyspace {
  std::map<std::string, int64_t> keys;
  int resets = 0;
  void reset() override {
    keys.clear();
    ++resets;
  }
  std::optional<int64_t> integer(const std::string& key) override {
    auto it = keys.find(key);
    return it == keys.end() ? std::nullopt : std::optional<int64_t>(it->second);
  }
  uint16_t port() const override { return 29500; }
};
}  // namespace

TEST_CASE("FixedPortStoresEmptyTheMainKeyspaceEachRoundAndCountJoinedWorkers", "[rdzv][fixed_port]") {
  CountingKeyspace ks;
  FixedPortStores stores(ks);
  ks.keys["left over"] = 7;
  CHECK(stores.open("job", 0) == 29500);
  CHECK(ks.keys.empty());
  CHECK(stores.progressed("job", 0, 2) == std::optional<bool>(false));
  ks.keys[kWorkerJoinKey] = 1;
  CHECK(stores.progressed("job", 0, 2) == std::optional<bool>(false));
  ks.keys[kWorkerJoinKey] = 2;
  CHECK(stores.progressed("job", 0, 2) == std::optional<bool>(true));
  // Not one of its rounds: the caller looks elsewhere.
  CHECK_FALSE(stores.progressed("job", 1, 2).has_value());
  CHECK_FALSE(stores.close("job", 1));
  CHECK(ks.resets == 1);
  // Closing empties it too: a retiring worker cannot leave keys for the next round.
  CHECK(stores.close("job", 0));
  CHECK(ks.resets == 2);
  CHECK_FALSE(stores.progressed("job", 0, 2).has_value());
}

TEST_CASE("AllWorkersJoinedWhenTheCounterReachesTheWorldSize", "[rdzv][fixed_port]") {
  CHECK_FALSE(all_workers_joined(std::nullopt, 1));
  CHECK(all_workers_joined(std::nullopt, 0));
  CHECK_FALSE(all_workers_joined(3, 4));
  CHECK(all_workers_joined(4, 4));
}

// ---- a standing server restarted: the agents' re-joins rebuild the running round ----
namespace {
struct ReopenStores : FakeStores {
  std::vector<uint16_t> reopened;
  uint16_t reopen(const std::string& run, int64_t round, bool fixed_port, uint16_t port) override {
    reopened.push_back(port);
    open_stores[{run, round}] = port;
    (void)fixed_port;
    return port;
  }
};
// A JOIN of job "job" from `host` (2 workers, 3 restarts, 3 s last call, 60 s join timeout).
Join job_join(const std::string& host, int64_t min_nodes, int64_t max_nodes) {
  Join j;
  j.run_id = "job";
  j.node_id = host + "_1";
  j.host = host;
  j.local_world_size = 2;
  j.min_nodes = min_nodes;
  j.max_nodes = max_nodes;
  j.max_restarts = 3;
  j.last_call_ms = 3000;
  j.join_timeout_ms = 60000;
  return j;
}
Message resume_msg(const std::string& host, int64_t rank, int64_t nnodes, int64_t round, int64_t restarts_done,
                   bool succeeded = false, int64_t min = 2) {
  Join j = job_join(host, min, nnodes);
  j.resume_round = round;
  j.resume_restart_count = restarts_done;
  j.resume_node_rank = rank;
  j.resume_nnodes = nnodes;
  j.resume_store_port = 41000;
  j.resume_succeeded = succeeded;
  return to_message(j);
}
}  // namespace

TEST_CASE("ResumeRebuildsTheRunningRoundWithoutARoundOrARestart", "[round][resume]") {
  ReopenStores stores;
  RoundState state{stores};
  std::vector<Outbound> out;
  const auto now = Clock::time_point{} + 1000s;
  // Rank 1 is back first, and had succeeded already.
  state.on_message(2, resume_msg("h2", 1, 2, 5, 1, /*succeeded=*/true), now, out);
  CHECK(out.empty());
  CHECK(stores.reopened.empty());  // not whole yet
  state.on_message(1, resume_msg("h1", 0, 2, 5, 1), now, out);
  CHECK(out.empty());  // no ROUND: the workers keep running
  REQUIRE(stores.reopened == std::vector<uint16_t>{41000});
  CHECK(state.participants("job") == std::vector<ConnId>{1, 2});  // by node rank
  // The round goes on as before: node 0's success ends the job (node 1's counted already).
  state.on_message(1, to_message(Succeeded{.round = 5}), now, out);
  REQUIRE(out.size() == 2);
  const auto done = from_message<JobDone>(out[0].msg);
  CHECK(out[0].msg.type == MsgType::JobDone);
  CHECK(done.round == 5);
  CHECK(done.restart_count == 1);  // nothing spent for the server's restart
}

TEST_CASE("ResumeFailureAfterTheRebuildSpendsBudgetFromTheResumedCount", "[round][resume]") {
  ReopenStores stores;
  RoundState state{stores};
  std::vector<Outbound> out;
  const auto now = Clock::time_point{} + 1000s;
  state.on_message(1, resume_msg("h1", 0, 2, 3, 2), now, out);
  state.on_message(2, resume_msg("h2", 1, 2, 3, 2), now, out);
  out.clear();
  state.on_message(2, to_message(Failure{.round = 3, .global_rank = 2, .exit_code = 1}), now, out);
  REQUIRE_FALSE(out.empty());
  CHECK(out[0].msg.type == MsgType::Restart);
  CHECK(from_message<Restart>(out[0].msg).restart_count == 3);
}

TEST_CASE("ResumeThatNeverBecomesWholeRestartsWithoutBudgetOrFails", "[round][resume]") {
  for (const int64_t min : {1, 3}) {
    ReopenStores stores;
    RoundState state{stores};
    std::vector<Outbound> out;
    auto now = Clock::time_point{} + 1000s;
    state.on_message(1, resume_msg("h1", 0, 3, 4, 1, false, min), now, out);
    state.on_message(2, resume_msg("h2", 1, 3, 4, 1, false, min), now, out);
    REQUIRE(out.empty());
    // Heartbeats keep them alive; rank 2 never comes back.
    for (int i = 0; i < 61; ++i) {
      now += 1s;
      for (ConnId c : {ConnId{1}, ConnId{2}}) state.on_message(c, to_message(Heartbeat{}), now, out);
      state.on_tick(now, out);
      if (!out.empty()) break;
    }
    REQUIRE(out.size() >= 2);
    if (min == 1) {
      CHECK(out[0].msg.type == MsgType::Restart);
      const auto r = from_message<Restart>(out[0].msg);
      CHECK(r.restart_count == 1);  // unchanged
      CHECK_THAT(r.reason, Catch::Contains("2 of the 3 nodes of round 4 came back"));
      // They re-join normally and get a fresh round 5 of two nodes.
      out.clear();
      Message j1 = resume_msg("h1", 0, 3, 4, 1, false, min), j2 = resume_msg("h2", 1, 3, 4, 1, false, min);
      j1.fields.erase("resume_round"), j2.fields.erase("resume_round");
      state.on_message(1, j1, now, out);
      state.on_message(2, j2, now, out);
      REQUIRE(out.size() == 2);
      const auto round = from_message<Round>(out[0].msg);
      CHECK(round.round == 5);
      CHECK(round.nnodes == 2);
      CHECK(round.restart_count == 1);
    } else {
      CHECK(out[0].msg.type == MsgType::JobFailed);
      CHECK_THAT(from_message<JobFailed>(out[0].msg).reason, Catch::Contains("fewer than the minimum of 3"));
    }
  }
}

TEST_CASE("ResumeRefusesAgentsThatDisagreeOnTheRound", "[round][resume]") {
  ReopenStores stores;
  RoundState state{stores};
  std::vector<Outbound> out;
  const auto now = Clock::time_point{} + 1000s;
  state.on_message(1, resume_msg("h1", 0, 2, 5, 1), now, out);
  state.on_message(2, resume_msg("h2", 1, 2, 6, 1), now, out);  // another round
  REQUIRE(out.size() == 1);
  CHECK(out[0].msg.type == MsgType::Error);
  CHECK_THAT(out[0].msg.get("message"), Catch::Contains("cannot resume round 6"));
  out.clear();
  state.on_message(3, resume_msg("h3", 0, 2, 5, 1), now, out);  // rank 0 again
  REQUIRE(out.size() == 1);
  CHECK_THAT(out[0].msg.get("message"), Catch::Contains("resumed it already"));
}

// ---- FAILURE and SUCCEEDED that arrive while the round is being rebuilt ----
TEST_CASE("ResumeAppliesAFailureReportedBeforeTheRoundIsWholeAgain", "[round][resume]") {
  ReopenStores stores;
  RoundState state{stores};
  std::vector<Outbound> out;
  const auto now = Clock::time_point{} + 1000s;
  // Node 1's worker failed while the server was down: its agent re-joins and sends the queued
  // report at once, before node 0 is back. Dropping it (the old rule) left the job waiting.
  state.on_message(2, resume_msg("h2", 1, 2, 3, 1), now, out);
  state.on_message(2, to_message(Failure{.round = 3, .global_rank = 2, .exit_code = 1}), now, out);
  CHECK(out.empty());  // not whole yet: nothing decided
  state.on_message(1, resume_msg("h1", 0, 2, 3, 1), now, out);
  REQUIRE(out.size() == 2);
  CHECK(out[0].msg.type == MsgType::Restart);
  const auto r = from_message<Restart>(out[0].msg);
  CHECK(r.restart_count == 2);  // spent, as for any failure
  CHECK_THAT(r.reason, Catch::Contains("rank 2 on h2_1 (host h2) failed"));
  // A stale round's report (an older round) is not held.
  ReopenStores s2;
  RoundState st2{s2};
  out.clear();
  st2.on_message(2, resume_msg("h2", 1, 2, 3, 1), now, out);
  st2.on_message(2, to_message(Failure{.round = 2, .global_rank = 2, .exit_code = 1}), now, out);
  st2.on_message(1, resume_msg("h1", 0, 2, 3, 1), now, out);
  CHECK(out.empty());
}

TEST_CASE("ResumeCountsASuccessReportedBeforeTheRoundIsWholeAgain", "[round][resume]") {
  ReopenStores stores;
  RoundState state{stores};
  std::vector<Outbound> out;
  const auto now = Clock::time_point{} + 1000s;
  state.on_message(1, resume_msg("h1", 0, 2, 5, 1), now, out);
  state.on_message(1, to_message(Succeeded{.round = 5}), now, out);
  CHECK(out.empty());
  state.on_message(2, resume_msg("h2", 1, 2, 5, 1, /*succeeded=*/true), now, out);
  REQUIRE(out.size() == 2);
  CHECK(out[0].msg.type == MsgType::JobDone);
}

// ---- node rank 0's agent hosts the workers' store ----
namespace {
Message offer_msg(const std::string& host, int64_t port, const std::string& seen_from = "") {
  Join j = job_join(host, 2, 2);
  j.store_offer_port = port;
  j.seen_from = seen_from;
  return to_message(j);
}
}  // namespace

TEST_CASE("EveryNodeOfferingAStoreMakesNodeRank0HostIt", "[round][agent_store]") {
  FakeStores stores;
  RoundState state{stores};
  std::vector<Outbound> out;
  const auto now = Clock::time_point{} + 1000s;
  state.on_message(1, offer_msg("10.0.0.1", 45001, "10.0.0.1"), now, out);
  state.on_message(2, offer_msg("10.0.0.2", 45002, "192.168.0.2"), now, out);
  REQUIRE(out.size() == 2);
  CHECK(stores.open_stores.empty());  // the server opened none
  const auto r0 = from_message<Round>(out[0].msg), r1 = from_message<Round>(out[1].msg);
  REQUIRE(r0.node_rank == 0);
  for (const auto& r : {r0, r1}) {
    CHECK(r.store_host == "10.0.0.1");
    CHECK(r.store_port == 45001);
  }
  // Node rank 0 learns whom to admit: every node as the server saw it and as it says it is.
  CHECK(r0.store_peers == "10.0.0.1,192.168.0.2,10.0.0.2");
  CHECK(r1.store_peers.empty());
}

TEST_CASE("ANodeWithoutAnOfferKeepsTheStoreOnTheServer", "[round][agent_store]") {
  FakeStores stores;
  RoundState state{stores};
  std::vector<Outbound> out;
  const auto now = Clock::time_point{} + 1000s;
  state.on_message(1, offer_msg("10.0.0.1", 45001), now, out);
  state.on_message(2, offer_msg("10.0.0.2", 0), now, out);  // an older agent
  REQUIRE(out.size() == 2);
  CHECK(stores.open_stores.size() == 1);
  const auto r0 = from_message<Round>(out[0].msg);
  CHECK(r0.store_host.empty());
  CHECK(r0.store_port == 40000);
  CHECK(r0.store_peers.empty());
}

TEST_CASE("AnAgentHostedRoundWeighsFailuresByNodeRank0sProgressReport", "[round][agent_store]") {
  FakeStores stores;
  stores.progress = true;  // the server's stores are not asked: it opened none
  RoundState state{stores};
  std::vector<Outbound> out;
  auto now = Clock::time_point{} + 1000s;
  state.on_message(1, offer_msg("10.0.0.1", 45001), now, out);
  state.on_message(2, offer_msg("10.0.0.2", 45002), now, out);
  REQUIRE(out.size() == 2);
  // Round 0 fails before every worker joined: a restart; round 1 too: deterministic.
  for (int64_t round : {0, 1}) {
    out.clear();
    state.on_message(2, to_message(Failure{.round = round, .global_rank = 2, .exit_code = 1}), now, out);
    REQUIRE_FALSE(out.empty());
    if (round == 0) {
      REQUIRE(out[0].msg.type == MsgType::Restart);
      out.clear();
      state.on_message(1, offer_msg("10.0.0.1", 45003), now, out);
      state.on_message(2, offer_msg("10.0.0.2", 45004), now, out);
      REQUIRE(out.size() == 2);
      CHECK(from_message<Round>(out[0].msg).store_port == 45003);  // a new store per round
    } else {
      CHECK(out[0].msg.type == MsgType::JobFailed);
      CHECK(from_message<JobFailed>(out[0].msg).fail_cause() == FailCause::Deterministic);
    }
  }
  // Again, with node rank 0 reporting progress in between (node 1's claim does not count).
  FakeStores s2;
  s2.progress = false;
  RoundState st{s2};
  out.clear();
  st.on_message(1, offer_msg("10.0.0.1", 45001), now, out);
  st.on_message(2, offer_msg("10.0.0.2", 45002), now, out);
  st.on_message(2, to_message(Progress{.round = 0}), now, out);  // not the store's host
  st.on_message(2, to_message(Failure{.round = 0, .global_rank = 2, .exit_code = 1}), now, out);
  out.clear();
  st.on_message(1, offer_msg("10.0.0.1", 45003), now, out);
  st.on_message(2, offer_msg("10.0.0.2", 45004), now, out);
  REQUIRE(out.size() == 2);
  st.on_message(1, to_message(Progress{.round = 1}), now, out);
  out.clear();
  st.on_message(2, to_message(Failure{.round = 1, .global_rank = 2, .exit_code = 1}), now, out);
  REQUIRE_FALSE(out.empty());
  CHECK(out[0].msg.type == MsgType::Restart);  // progress in between: not deterministic
}

TEST_CASE("ResumingAnAgentHostedRoundReopensNoStore", "[round][agent_store][resume]") {
  for (const bool progressed : {false, true}) {
    ReopenStores stores;
    stores.progress = false;
    RoundState state{stores};
    std::vector<Outbound> out;
    const auto now = Clock::time_point{} + 1000s;
    auto resume = [&](const std::string& host, int64_t rank, const std::string& store_host) {
      Join j = from_message<Join>(resume_msg(host, rank, 2, 5, 1));
      j.resume_store_host = store_host;
      j.resume_store_port = 45001;
      j.resume_progressed = progressed;
      return to_message(j);
    };
    state.on_message(1, resume("10.0.0.1", 0, "10.0.0.1"), now, out);
    state.on_message(3, resume("10.0.0.3", 1, ""), now, out);  // disagrees on the store
    REQUIRE(out.size() == 1);
    CHECK_THAT(out[0].msg.get("message"), Catch::Contains("cannot resume round 5"));
    out.clear();
    state.on_message(2, resume("10.0.0.2", 1, "10.0.0.1"), now, out);
    CHECK(out.empty());
    CHECK(stores.reopened.empty());  // node rank 0 still has it
    state.on_message(2, to_message(Failure{.round = 5, .global_rank = 2, .exit_code = 1}), now, out);
    REQUIRE_FALSE(out.empty());
    REQUIRE(out[0].msg.type == MsgType::Restart);
    out.clear();
    state.on_message(1, offer_msg("10.0.0.1", 45003), now, out);
    state.on_message(2, offer_msg("10.0.0.2", 45004), now, out);
    REQUIRE(out.size() == 2);
    out.clear();
    state.on_message(2, to_message(Failure{.round = 6, .global_rank = 2, .exit_code = 1}), now, out);
    REQUIRE_FALSE(out.empty());
    // The progress node rank 0 carried in its re-join decides whether two failures in a row
    // came before any progress.
    CHECK(out[0].msg.type == (progressed ? MsgType::Restart : MsgType::JobFailed));
  }
}

namespace {
// A round of n nodes that each offered a store, node i at address(i); ROUND to node rank 0.
// Each node seen from its own address too, with `seen_from`.
Round round_of_offering_nodes(FakeStores& stores, int64_t n, const std::function<std::string(int64_t)>& address,
                              bool seen_from_another = false) {
  RoundState state{stores};
  std::vector<Outbound> out;
  const auto now = Clock::time_point{} + 1000s;
  for (int64_t i = 0; i < n; ++i) {
    Join j = from_message<Join>(offer_msg(address(i), 40000, seen_from_another ? "fd01" + address(i).substr(4) : ""));
    j.node_id = "n" + std::to_string(i);
    j.local_world_size = 1;
    j.min_nodes = j.max_nodes = n;
    out.clear();
    state.on_message(static_cast<ConnId>(i + 1), to_message(j), now, out);
  }
  REQUIRE(out.size() == static_cast<size_t>(n));
  return from_message<Round>(out[0].msg);
}
}  // namespace

TEST_CASE("ARoundOf16000NodesHasItsStoreOnNodeRankZero", "[round][agent_store]") {
  // One IPv4 address per node: 16,000 of them fit ROUND's store_peers, so node rank 0 hosts the
  // workers' store (each node's workers reach it through their node's relay, one connection).
  FakeStores stores;
  const int64_t n = 16000;
  const auto r = round_of_offering_nodes(stores, n, [](int64_t i) {
    return "10." + std::to_string(i / 65536) + "." + std::to_string(i / 256 % 256) + "." + std::to_string(i % 256);
  });
  CHECK(r.store_host == "10.0.0.0");
  CHECK(std::count(r.store_peers.begin(), r.store_peers.end(), ',') == n - 1);
  CHECK(r.store_peers.size() <= kMaxStorePeersLen);
  CHECK_FALSE(check_round(r, 1).has_value());
  CHECK(stores.open_stores.empty());
}

TEST_CASE("ARoundWhoseAddressesOutgrowRoundKeepsItsStoreOnTheServer", "[round][agent_store]") {
  // Past kMaxStorePeersLen ROUND to node rank 0 would outgrow a frame: the server keeps the store.
  FakeStores stores;
  const int64_t n = 12000;  // two IPv6 addresses of about 38 characters each: past 768 KiB
  const auto r = round_of_offering_nodes(stores, n, [](int64_t i) {
    char a[64];
    std::snprintf(a, sizeof a, "fd00:aaaa:bbbb:cccc:dddd:eeee:%x:%x", static_cast<unsigned>(i / 65536 + 1),
                  static_cast<unsigned>(i % 65536));
    return std::string(a);
  }, true);
  CHECK(r.store_host.empty());
  CHECK(r.store_peers.empty());
  CHECK(stores.open_stores.size() == 1);
}

TEST_CASE("StatusQueryReturnsTheMembersLastSnapshotsByNodeRank", "[rdzv]") {
  Harness h;
  h.join(1, "a");
  h.join(2, "b");
  // Before any snapshot: the job is known, with two members and nothing to show.
  Message q;
  q.type = MsgType::StatusQuery;
  q.set("run_id", "job");
  h.send(99, q);  // a connection that never joined may ask
  auto* r = h.to(99, MsgType::StatusReply);
  REQUIRE(r);
  StatusReply reply = from_message<StatusReply>(r->msg);
  CHECK(reply.found);
  CHECK(reply.members == 2);
  CHECK(reply.agents == "[]");
  CHECK_FALSE(r->close_after);
  // Heartbeats carry the snapshots; an empty one keeps the last; node rank order (conn 1 is
  // node rank 0: the first joiner).
  h.send(2, to_message(Heartbeat{.status = "{\"n\":1}"}));
  h.send(1, to_message(Heartbeat{.status = "{\"n\":0}"}));
  h.send(1, to_message(Heartbeat{}));
  h.send(99, q);
  reply = from_message<StatusReply>(h.to(99, MsgType::StatusReply)->msg);
  CHECK(reply.agents == "[{\"n\":0},{\"n\":1}]");
  // Too long a snapshot is dropped, the previous one stays.
  h.send(1, to_message(Heartbeat{.status = std::string(kMaxStatusBytes + 1, 'x')}));
  h.send(99, q);
  reply = from_message<StatusReply>(h.to(99, MsgType::StatusReply)->msg);
  CHECK(reply.agents == "[{\"n\":0},{\"n\":1}]");
  // A node that left takes its snapshot with it; an unknown job is not found.
  h.out.clear();
  h.state.on_disconnect(2, h.now, h.out);
  h.send(99, q);
  reply = from_message<StatusReply>(h.to(99, MsgType::StatusReply)->msg);
  CHECK(reply.agents.find("\"n\":1") == std::string::npos);
  q.set("run_id", "other");
  h.send(99, q);
  reply = from_message<StatusReply>(h.to(99, MsgType::StatusReply)->msg);
  CHECK_FALSE(reply.found);
  CHECK(reply.agents.empty());
}
