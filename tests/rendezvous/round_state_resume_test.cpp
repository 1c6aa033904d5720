// Round state: fixed-port stores, a restarted server's resume, and the store on node rank 0.
#include "round_state_harness.h"

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
  CHECK_THAT(r.reason, Catch::Contains("rank 2 on node 1 (host h2) failed"));
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

TEST_CASE("NodeRank0LearnsEachPeerAddressOnceInTheOrderTheNodesHaveTheirRanks", "[round][agent_store]") {
  FakeStores stores;
  RoundState state{stores};
  std::vector<Outbound> out;
  const auto now = Clock::time_point{} + 1000s;
  auto offer = [](const std::string& host, const std::string& seen_from) {
    Join j = job_join(host, 4, 4);
    j.store_offer_port = 45001;
    j.seen_from = seen_from;
    return to_message(j);
  };
  // Two agents on one host, one seen through a NAT, and one claiming an address with a comma
  // (it would name two peers): each address once, the comma one never.
  state.on_message(1, offer("10.0.0.1", "10.0.0.1"), now, out);
  state.on_message(2, offer("10.0.0.1", "10.0.0.1"), now, out);
  state.on_message(3, offer("10.0.0.3", "192.168.0.1"), now, out);
  state.on_message(4, offer("a,b", "10.0.0.1"), now, out);
  REQUIRE(out.size() == 4);
  CHECK(from_message<Round>(out[0].msg).store_peers == "10.0.0.1,192.168.0.1,10.0.0.3");
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
  const auto r = round_of_offering_nodes(
      stores, n,
      [](int64_t i) {
        char a[64];
        std::snprintf(a, sizeof a, "fd00:aaaa:bbbb:cccc:dddd:eeee:%x:%x", static_cast<unsigned>(i / 65536 + 1),
                      static_cast<unsigned>(i % 65536));
        return std::string(a);
      },
      true);
  CHECK(r.store_host.empty());
  CHECK(r.store_peers.empty());
  CHECK(stores.open_stores.size() == 1);
}
