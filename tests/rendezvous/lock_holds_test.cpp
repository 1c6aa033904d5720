// The server names what held its state lock: each lock site's longest hold, with the count it
// worked on (the agents the rounds knew). Real sockets, token agents; counts only, no timings.
#include <catch2/catch.hpp>

#include <algorithm>
#include <future>
#include <memory>

#include "ddprun/server/store_server.h"
#include "sealed_agent.h"

using namespace ddprun;

namespace {
const server::StoreServerStats::LockHold* find_hold(const server::StoreServerStats& st, const std::string& site) {
  auto it = std::find_if(st.lock_holds.begin(), st.lock_holds.end(), [&](const auto& h) { return h.site == site; });
  return it == st.lock_holds.end() ? nullptr : &*it;
}

rdzv::Message join(int index, int n) {
  return rdzv::to_message(rdzv::Join{.run_id = "holds",
                                     .node_id = "n" + std::to_string(index),
                                     .host = "127.0.0.1",
                                     .local_world_size = 1,
                                     .min_nodes = n / 2,
                                     .max_nodes = n,
                                     .max_restarts = 1,
                                     .last_call_ms = 30000,
                                     .heartbeat_timeout_ms = 60000});
}

rdzv::MsgType next_type(test::SealedAgent& a) { return a.next().type; }
}  // namespace

// A round of n agents is made in the hold of its last JOIN: that hold is the round's completion,
// of n agents. One agent's connection closing restarts the round: a disconnect of n agents, and
// every survivor reads its RESTART (each through its MAC and sequence check).
TEST_CASE("TheLockHoldsAreNamedAfterTheOperationThatHeldThem", "[rdzv][server][auth]") {
  constexpr int n = 64;
  server::StoreServerOptions o;
  o.host = "127.0.0.1";
  o.port = 0;
  o.io_threads = 2;
  o.rdzv_token = test::kSecret;
  server::StoreServer srv(o);
  srv.start();
  std::vector<std::unique_ptr<test::SealedAgent>> agents;
  for (int i = 0; i < n; ++i) agents.push_back(std::make_unique<test::SealedAgent>(srv.port()));
  {
    const auto st = srv.stats();
    CHECK(find_hold(st, "handshake") != nullptr);
    CHECK(find_hold(st, "round completion") == nullptr);
  }
  for (int i = 0; i < n; ++i) agents[static_cast<size_t>(i)]->send({join(i, n)});
  std::vector<std::future<rdzv::MsgType>> firsts;
  for (auto& a : agents) firsts.push_back(std::async(std::launch::async, [&a] { return next_type(*a); }));
  for (auto& f : firsts) REQUIRE(f.get() == rdzv::MsgType::Round);
  auto st = srv.stats();
  const auto* completion = find_hold(st, "round completion");
  REQUIRE(completion != nullptr);
  CHECK(completion->count == n);
  CHECK(completion->what == "round completion, 64 agents");
  const auto* joins = find_hold(st, "JOIN");
  REQUIRE(joins != nullptr);  // the JOINs before the last, which completed nothing
  CHECK(joins->count < n);
  CHECK(find_hold(st, "disconnect") == nullptr);
  REQUIRE(!st.lock_holds.empty());
  CHECK(st.longest_lock_holder == st.lock_holds.front().what);
  CHECK(st.longest_lock_hold_us == st.lock_holds.front().longest_us);

  agents.back().reset();
  std::vector<std::future<rdzv::MsgType>> told;
  for (int i = 0; i + 1 < n; ++i)
    told.push_back(std::async(std::launch::async, [&, i] { return next_type(*agents[static_cast<size_t>(i)]); }));
  for (auto& f : told) REQUIRE(f.get() == rdzv::MsgType::Restart);
  st = srv.stats();
  const auto* lost = find_hold(st, "disconnect");
  REQUIRE(lost != nullptr);
  CHECK(lost->count == n);  // the rounds knew every agent when the hold began
  srv.stop();
}
