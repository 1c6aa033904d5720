#include "round_state_harness.h"

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
  CHECK(second_failure_ends_job({3, 1, 300}, {3, 1, 400}));                        // an import error, twice
  CHECK_FALSE(second_failure_ends_job({3, 1, 3000}, {3, 1, 3000}));                // ran 3 s: transient, retried
  CHECK_FALSE(second_failure_ends_job({3, 1, 300}, {2, 1, 300}));                  // another rank
  CHECK_FALSE(second_failure_ends_job({3, 1, 300}, {3, 2, 300}));                  // another way
  CHECK_FALSE(second_failure_ends_job({3, 1, 3000}, {3, 1, 300}));                 // the first was not quick
  CHECK_FALSE(second_failure_ends_job({3, 1, 300}, {3, 1, 300}, /*retry=*/true));  // asked to retry
  CHECK(second_failure_ends_job({3, 1, -1}, {3, 1, -1}));                          // an older agent says no runtime
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
  CHECK_THAT(h.to(1, MsgType::Restart)->msg.get("reason"), Catch::Contains("lost node 1 (host b)"));
  h.join(1, "a", 1, 2, 3);
  CHECK(h.out.empty());  // c not back yet
  h.join(3, "c", 1, 2, 3);
  auto* r = h.to(3, MsgType::Round);
  REQUIRE(r);  // completes at once: every survivor is back, no last call
  CHECK(r->msg.get_int("nnodes") == 2);
  CHECK(r->msg.get_int("node_rank") == 1);  // c keeps its order after a
}

TEST_CASE("A lost node is named by its node rank and host name, not by the agent's id", "[rdzv]") {
  Harness h;
  auto join = [&](ConnId c, const std::string& id) {
    Message m = h.join_msg("127.0.0.1");
    m.set("node_id", id);
    h.send(c, m);
  };
  join(1, "gpu-a_127.0.0.1_12428");
  join(2, "vm_127.0.0.1_12429");
  h.out.clear();
  h.state.on_disconnect(2, h.now, h.out);
  auto* f = h.to(1, MsgType::JobFailed);
  REQUIRE(f);
  CHECK_THAT(f->msg.get("reason"), Catch::Contains("lost node 1 (host vm, 127.0.0.1)"));
  CHECK_THAT(f->msg.get("reason"), !Catch::Contains("12429"));
  CHECK(RoundState::host_name_of("vm_10.0.0.7_42", "10.0.0.7") == "vm");
  CHECK(RoundState::host_name_of("vm", "10.0.0.7") == "vm");
  CHECK(RoundState::host_name_of("b_1", "b") == "b");
  CHECK(RoundState::host_name_of("odd_id", "10.0.0.7") == "odd_id");
}

TEST_CASE("LostNodeBelowMinEndsTheJobNamingIt", "[rdzv]") {
  Harness h;
  h.join(1, "a");
  h.join(2, "b");
  h.out.clear();
  h.state.on_disconnect(2, h.now, h.out);
  auto* f = h.to(1, MsgType::JobFailed);
  REQUIRE(f);
  CHECK_THAT(f->msg.get("reason"), Catch::Contains("lost node 1 (host b)"));
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
  CHECK_THAT(h.to(3, MsgType::Error)->msg.get("message"), Catch::Contains("already taken by a node (host x)"));
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
  Join j{.run_id = "r",
         .node_id = "n",
         .host = "h",
         .local_world_size = 3,
         .min_nodes = 2,
         .max_nodes = 4,
         .max_restarts = 5,
         .last_call_ms = 6,
         .join_timeout_ms = 7,
         .heartbeat_timeout_ms = 8,
         .fixed_store_port = true,
         .node_rank = 1,
         .prefer_rank0 = true};
  auto back = from_message<Join>(to_message(j));
  CHECK(back.run_id == "r");
  CHECK(back.local_world_size == 3);
  CHECK(back.max_nodes == 4);
  CHECK(back.heartbeat_timeout_ms == 8);
  CHECK(back.fixed_store_port);
  CHECK(back.node_rank == 1);
  CHECK(back.prefer_rank0);
  CHECK(from_message<Join>(to_message(Join{})).node_rank == -1);  // absent fields keep defaults
  JobFailed f{.reason = "x",
              .cause = static_cast<int64_t>(FailCause::Deterministic),
              .max_restarts = 3,
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
