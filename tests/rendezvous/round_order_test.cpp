// The server seals an agent's messages after its rounds lock is let go, a round's broadcast on
// several threads at once: every agent still gets its messages in the order the rounds made
// them, with exact sequence numbers. Real sockets, token agents that open every MAC.
#include <catch2/catch.hpp>

#include <algorithm>
#include <future>
#include <optional>
#include <stdexcept>

#include "ddprun/rdzv/agent_auth.h"
#include "ddprun/server/store_server.h"
#include "sealed_agent.h"

using namespace ddprun;
using namespace std::chrono_literals;

using test::kSecret;
using test::SealedAgent;

namespace {
// What one agent saw: its ROUND's node rank, and each STATUS_REPLY's member count, split by
// whether it came before or after the ROUND.
struct Seen {
  int64_t node_rank = -1;
  std::vector<int64_t> before, after;
};

// JOIN with a STATUS_QUERY right behind it, then one query after each reply, until the ROUND
// and three replies after it came.
Seen run_agent(SealedAgent& a, int index, int n) {
  const auto query = rdzv::to_message(rdzv::StatusQuery{.run_id = "order"});
  a.send({rdzv::to_message(rdzv::Join{.run_id = "order",
                                      .node_id = "n" + std::to_string(index),
                                      .host = "127.0.0.1",
                                      .local_world_size = 1,
                                      .min_nodes = n,
                                      .max_nodes = n,
                                      .last_call_ms = 30000,
                                      .heartbeat_timeout_ms = 60000}),
          query});
  Seen s;
  while (s.node_rank < 0 || s.after.size() < 3) {
    const rdzv::Message m = a.next();
    if (m.type == rdzv::MsgType::Round) {
      if (s.node_rank >= 0) throw std::runtime_error("a second ROUND");
      s.node_rank = rdzv::from_message<rdzv::Round>(m).node_rank;
    } else if (m.type == rdzv::MsgType::StatusReply) {
      (s.node_rank < 0 ? s.before : s.after).push_back(rdzv::from_message<rdzv::StatusReply>(m).members);
      a.send({query});
    } else {
      throw std::runtime_error(std::string("unexpected ") + rdzv::msg_type_name(m.type));
    }
  }
  return s;
}
}  // namespace

// The round is made in the lock hold of its last JOIN: a reply that counts every member was made
// after it, so it must come after the ROUND; one that counts fewer, before it. With more agents
// than one thread seals at once, the broadcast is spread over the I/O threads while the agents'
// queries are answered on theirs.
TEST_CASE("AnAgentsRoundAndTheRepliesAroundItArriveInTheOrderTheyWereMade", "[rdzv][server][auth]") {
  const int threads = GENERATE(1, 4);
  constexpr int n = 48;
  server::StoreServerOptions o;
  o.host = "127.0.0.1";
  o.port = 0;
  o.io_threads = threads;
  o.rdzv_token = kSecret;
  server::StoreServer srv(o);
  srv.start();
  std::vector<std::unique_ptr<SealedAgent>> agents;
  for (int i = 0; i < n; ++i) agents.push_back(std::make_unique<SealedAgent>(srv.port()));
  std::vector<std::future<Seen>> runs;
  for (int i = 0; i < n; ++i)
    runs.push_back(std::async(std::launch::async, [&, i] { return run_agent(*agents[static_cast<size_t>(i)], i, n); }));
  std::vector<int> ranks(n, 0);
  for (auto& r : runs) {
    Seen s;
    REQUIRE_NOTHROW(s = r.get());
    REQUIRE(s.node_rank >= 0);
    REQUIRE(s.node_rank < n);
    ++ranks[static_cast<size_t>(s.node_rank)];
    for (int64_t members : s.before) CHECK(members < n);
    for (int64_t members : s.after) CHECK(members == n);
  }
  CHECK(std::count(ranks.begin(), ranks.end(), 1) == n);
  srv.stop();
}
