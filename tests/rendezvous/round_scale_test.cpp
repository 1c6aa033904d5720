// RoundState's cost grows linearly with the agents of a job: a whole job's life (JOIN, ROUND,
// heartbeats, a failure and its re-round, SUCCEEDED, and a rebuild after a server restart) at
// N and 8N agents. Linear work costs about 8x (a little more for the logarithms of the maps);
// work per message that walks the whole job costs 64x. The bound, 32x, separates the two with
// a wide margin either way; CPU time of this thread, the least of a few tries, so a busy
// machine does not decide it.
#include <time.h>

#include <catch2/catch.hpp>
#include <set>

#include "ddprun/rdzv/round_state.h"

using namespace ddprun::rdzv;
using namespace std::chrono_literals;

namespace {

struct CountingStores : WorkerStores {
  uint16_t open(const std::string&, int64_t, bool) override { return 41000; }
  void close(const std::string&, int64_t) override {}
  bool progressed(const std::string&, int64_t, int64_t) override { return true; }
};

Join agent_join(int64_t i, int64_t n, bool fixed_rank) {
  return Join{.run_id = "big",
              .node_id = "node" + std::to_string(i),
              .host = "10.0." + std::to_string(i / 250) + "." + std::to_string(i % 250),
              .local_world_size = 8,
              .min_nodes = n,
              .max_nodes = n,
              .max_restarts = 3,
              .last_call_ms = 30000,
              .join_timeout_ms = 600000,
              .heartbeat_timeout_ms = 600000,
              .node_rank = fixed_rank ? i : -1};
}

size_t count(const std::vector<Outbound>& out, MsgType t) {
  size_t k = 0;
  for (const auto& o : out) k += o.msg.type == t;
  return k;
}

// One job's life at n agents (half of them with a fixed --node_rank); checks what it must.
void job_life(int64_t n) {
  CountingStores stores;
  RoundState state{stores};
  const auto now = Clock::time_point{} + 1000s;
  std::vector<Outbound> out;
  for (int64_t i = 0; i < n; ++i)
    state.on_message(static_cast<ConnId>(i + 1), to_message(agent_join(i, n, i % 2)), now, out);
  REQUIRE(count(out, MsgType::Round) == static_cast<size_t>(n));
  std::set<int64_t> ranks;
  for (const auto& o : out) ranks.insert(from_message<Round>(o.msg).node_rank);
  REQUIRE(ranks.size() == static_cast<size_t>(n));
  out.clear();
  for (int64_t i = 0; i < n; ++i) state.on_message(static_cast<ConnId>(i + 1), to_message(Heartbeat{}), now, out);
  // A failure: every agent is told to restart, and all of them join the next round.
  state.on_message(1, to_message(Failure{.round = 0, .global_rank = 3, .exit_code = 1}), now, out);
  REQUIRE(count(out, MsgType::Restart) == static_cast<size_t>(n));
  out.clear();
  for (int64_t i = 0; i < n; ++i)
    state.on_message(static_cast<ConnId>(i + 1), to_message(agent_join(i, n, i % 2)), now, out);
  REQUIRE(count(out, MsgType::Round) == static_cast<size_t>(n));
  out.clear();
  for (int64_t i = 0; i < n; ++i)
    state.on_message(static_cast<ConnId>(i + 1), to_message(Succeeded{.round = 1}), now, out);
  REQUIRE(count(out, MsgType::JobDone) == static_cast<size_t>(n));

  // A restarted server: every agent re-joins with the round it runs.
  RoundState fresh{stores};
  out.clear();
  for (int64_t i = 0; i < n; ++i) {
    Join j = agent_join(i, n, false);
    j.resume_round = 1;
    j.resume_restart_count = 1;
    j.resume_node_rank = i;
    j.resume_nnodes = n;
    j.resume_store_port = 41000;
    fresh.on_message(static_cast<ConnId>(i + 1), to_message(j), now, out);
  }
  REQUIRE(out.empty());  // rebuilt: no ROUND, no error
  REQUIRE(fresh.participants("big").size() == static_cast<size_t>(n));
}

double cpu_seconds() {
  timespec ts{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) + static_cast<double>(ts.tv_nsec) * 1e-9;
}

double least_cpu(int64_t n, int tries) {
  double best = 1e9;
  for (int t = 0; t < tries; ++t) {
    const double t0 = cpu_seconds();
    job_life(n);
    best = std::min(best, cpu_seconds() - t0);
  }
  return best;
}

}  // namespace

TEST_CASE("RoundCostGrowsLinearlyWithTheAgents", "[rdzv][scale]") {
  constexpr int64_t kSmall = 1000, kBig = 8000;
  const double small = least_cpu(kSmall, 5), big = least_cpu(kBig, 2);
  INFO("job life: " << kSmall << " agents " << small * 1e3 << " ms CPU, " << kBig << " agents " << big * 1e3
                    << " ms CPU, ratio " << big / small << " (linear ~8, quadratic ~64)");
  CHECK(big / small < 32.0);
}

// For a server (deferred messages), a message to every agent of a job is made once and shared:
// under the server's lock, a RESTART to 16,000 agents was 16,000 copies of a map of strings.
// Each agent's own copy, made after the lock, reads as the message itself.
TEST_CASE("AMessageToEveryAgentIsOneSharedCopyUntilItIsSealed", "[rdzv][scale]") {
  constexpr int64_t n = 1000;
  CountingStores stores;
  RoundState state{stores};
  state.set_deferred_rounds(true);
  const auto now = Clock::time_point{} + 1000s;
  std::vector<Outbound> out;
  for (int64_t i = 0; i < n; ++i)
    state.on_message(static_cast<ConnId>(i + 1), to_message(agent_join(i, n, false)), now, out);
  out.clear();
  auto one_shared = [&](MsgType type) {
    REQUIRE(out.size() == static_cast<size_t>(n));
    const Message* first = out.front().shared.get();
    REQUIRE(first != nullptr);
    CHECK(out.front().shared.use_count() == n);
    for (auto& o : out) {
      CHECK(o.msg.type == type);
      CHECK(o.shared.get() == first);
    }
    const Message copy = out.back().message();
    CHECK(copy.type == type);
    CHECK(copy.fields == first->fields);
    CHECK(out.back().shared == nullptr);
  };
  state.on_message(1, to_message(Failure{.round = 0, .global_rank = 3, .exit_code = 1}), now, out);
  one_shared(MsgType::Restart);
  CHECK(from_message<Restart>(out.front().message()).restart_count == 1);
  out.clear();
  for (int64_t i = 0; i < n; ++i)
    state.on_message(static_cast<ConnId>(i + 1), to_message(agent_join(i, n, false)), now, out);
  out.clear();
  for (int64_t i = 0; i < n; ++i)
    state.on_message(static_cast<ConnId>(i + 1), to_message(Succeeded{.round = 1}), now, out);
  one_shared(MsgType::JobDone);
}

// A server's deferred ROUNDs share the round's fields (node rank 0 its own, with the store's
// peers) and read, once made, exactly as the ROUNDs made at once.
TEST_CASE("DeferredRoundsShareTheRoundsFieldsAndReadAsTheRoundsMadeAtOnce", "[rdzv][scale]") {
  constexpr int64_t n = 1000;
  CountingStores stores;
  RoundState now_made{stores}, deferred{stores};
  deferred.set_deferred_rounds(true);
  const auto now = Clock::time_point{} + 1000s;
  std::vector<Outbound> a, b;
  for (int64_t i = 0; i < n; ++i) {
    Join j = agent_join(i, n, i % 3 == 0);
    j.store_offer_port = 29400;
    j.prefer_rank0 = i == 7;
    now_made.on_message(static_cast<ConnId>(i + 1), to_message(j), now, a);
    deferred.on_message(static_cast<ConnId>(i + 1), to_message(j), now, b);
  }
  REQUIRE(a.size() == static_cast<size_t>(n));
  REQUIRE(b.size() == a.size());
  std::set<const Round*> copies;
  for (auto& o : b) copies.insert(o.round.get());
  CHECK(copies.size() == 2);  // node rank 0's and everyone else's
  for (size_t i = 0; i < a.size(); ++i) {
    CHECK(b[i].conn == a[i].conn);
    CHECK(b[i].message().fields == a[i].msg.fields);
  }
  CHECK_FALSE(from_message<Round>(a.front().msg).store_peers.empty());
}
