// Admission without sockets: connections are objects with a peer address, never connected.
#include <catch2/catch.hpp>

#include <time.h>

#include "../../rendezvous/src/server/admission.h"
#include "../../rendezvous/src/server/keyspaces.h"

using namespace ddprun;
using namespace ddprun::server;
namespace asio = boost::asio;

namespace {
struct Peers {
  asio::io_context io;
  std::vector<ConnPtr> conns;
  ConnPtr from(const std::string& addr) {
    auto c = std::make_shared<Connection>(asio::ip::tcp::socket(io), nullptr, nullptr);
    c->session.peer = asio::ip::make_address(addr);
    c->id = conns.size() + 1;
    conns.push_back(c);
    return c;
  }
};
}  // namespace

// An agent that connected as a stranger and was admitted is a member: its slot no longer
// counts against --max-stranger-connections, so a job with more hosts than that limit gets
// every agent in, and strangers keep their own slots.
TEST_CASE("AnAdmittedAgentNoLongerCountsAgainstTheStrangersLimit", "[server][admission]") {
  StoreServerOptions o;
  o.max_connections = 100;
  o.max_stranger_connections = 2;
  WarnLimiter warns;
  Admission a(o, warns);
  a.size_to_descriptors();
  REQUIRE(a.max_strangers() == 2);
  Peers p;
  auto agent = p.from("192.0.2.1");
  auto other = p.from("192.0.2.2");
  const auto now = std::chrono::steady_clock::now();
  REQUIRE(a.may_connect_locked(0, agent, now).ok);
  REQUIRE(a.may_connect_locked(0, other, now).ok);
  CHECK_FALSE(a.may_connect_locked(0, p.from("192.0.2.3"), now).ok);  // two strangers: the limit
  CHECK(a.strangers_refused() == 1);

  a.begin_agent(*agent);
  rdzv::Message join;
  join.type = rdzv::MsgType::Join;
  auto step = a.handshake_step(*agent, join);  // an open rendezvous admits at JOIN
  a.on_handshake_locked(*agent, step);
  REQUIRE(step.admitted);
  CHECK_FALSE(agent->session.counted_stranger);
  CHECK(a.may_connect_locked(0, p.from("192.0.2.4"), now).ok);  // the member's slot is free again
  CHECK_FALSE(a.may_connect_locked(0, p.from("192.0.2.5"), now).ok);
  // The member's host is trusted: its further connections are not strangers.
  CHECK(a.may_connect_locked(0, p.from("192.0.2.1"), now).ok);
  a.closed_locked(*agent);  // closing a member gives back no stranger's slot it did not hold
  CHECK_FALSE(a.may_connect_locked(0, p.from("192.0.2.6"), now).ok);
}

namespace {
rdzv::ServerHandshake::Step admit_open(Admission& a, const ConnPtr& c) {
  a.begin_agent(*c);
  rdzv::Message join;
  join.type = rdzv::MsgType::Join;
  auto step = a.handshake_step(*c, join);  // an open rendezvous admits at JOIN
  a.on_handshake_locked(*c, step);
  return step;
}
}  // namespace

// A stranger holding the strangers' whole share with connections that prove nothing used to
// keep out every agent of a host not admitted yet (a new job's nodes, all nodes after a
// restart). Now a new stranger takes the slot of the oldest unproven one once that had its
// time; a burst within that time is still refused, and proven connections keep their slots.
TEST_CASE("ANewStrangerTakesTheSlotOfTheOldestUnprovenStranger", "[server][admission]") {
  StoreServerOptions o;
  o.max_connections = 100;
  o.max_stranger_connections = 3;
  WarnLimiter warns;
  Admission a(o, warns);
  a.size_to_descriptors();
  Peers p;
  const auto t0 = std::chrono::steady_clock::now();
  std::vector<ConnPtr> held;
  for (int i = 0; i < 3; ++i) {
    held.push_back(p.from("198.51.100.7"));
    REQUIRE(a.may_connect_locked(0, held.back(), t0).ok);
  }
  // Within kReplaceableAfter: a burst past the share is refused, as before.
  CHECK_FALSE(a.may_connect_locked(0, p.from("203.0.113.1"), t0 + kReplaceableAfter / 2).ok);
  CHECK(a.strangers_refused() == 1);

  // Later, an agent of a new host gets the oldest one's slot; that one is to be closed.
  const auto t1 = t0 + 2 * kReplaceableAfter;
  auto agent = p.from("203.0.113.1");
  auto admit = a.may_connect_locked(0, agent, t1);
  REQUIRE(admit.ok);
  REQUIRE(admit.replaces == held[0]);
  CHECK(held[0]->session.replaced);
  CHECK_FALSE(held[0]->session.counted_stranger);
  CHECK(a.replaced() == 1);
  a.closed_locked(*held[0]);  // its close, on its thread

  // Once admitted, the agent proved itself: it is never replaced, and no longer a stranger.
  REQUIRE(admit_open(a, agent).admitted);
  CHECK_FALSE(agent->session.unproven);
  auto fresh = p.from("198.51.100.7");  // the agent's slot is free again
  auto more = a.may_connect_locked(0, fresh, t1);
  REQUIRE(more.ok);
  CHECK_FALSE(more.replaces);
  // A stranger's TCPStore client that made a request (proven) keeps its slot: of the three,
  // only held[2] can be replaced.
  a.proven_locked(*held[1]);
  auto next = a.may_connect_locked(0, p.from("198.51.100.7"), t1);
  REQUIRE(next.ok);
  CHECK(next.replaces == held[2]);
  a.closed_locked(*held[2]);
  // Now the share holds a proven client and two connections that are not old enough: refused.
  CHECK_FALSE(a.may_connect_locked(0, p.from("198.51.100.8"), t1).ok);
  CHECK(a.strangers_refused() == 2);
}

// --max-connections filled with connections that prove nothing (silent, VALIDATE only, loopback
// or not) used to lock every agent out until they closed. Now a new connection takes the slot
// of the oldest unproven one, whatever its address; proven connections are never replaced, and
// no more than kMaxReplacing replaced ones wait for their close at once.
TEST_CASE("AtTheConnectionLimitANewConnectionTakesTheSlotOfTheOldestUnprovenOne", "[server][admission]") {
  StoreServerOptions o;
  o.max_connections = 1000;
  WarnLimiter warns;
  Admission a(o, warns);
  a.size_to_descriptors();
  REQUIRE(a.max_connections() == 1000);
  Peers p;
  const auto t0 = std::chrono::steady_clock::now();
  auto client = p.from("127.0.0.1");
  REQUIRE(a.may_connect_locked(0, client, t0).ok);
  a.proven_locked(*client);  // a TCPStore client that made a request: a client for good
  std::vector<ConnPtr> idle;
  for (int i = 0; i < 40; ++i) {
    idle.push_back(p.from("127.0.0.1"));
    REQUIRE(a.may_connect_locked(1 + i, idle.back(), t0 + std::chrono::milliseconds(i)).ok);
  }
  const uint64_t full = a.max_connections();
  CHECK_FALSE(a.may_connect_locked(full, p.from("127.0.0.1"), t0 + kReplaceableAfter / 2).ok);
  CHECK(a.refused_over_limit() == 1);

  const auto t1 = t0 + 2 * kReplaceableAfter;
  std::vector<ConnPtr> replaced;
  for (uint64_t i = 0; i < kMaxReplacing; ++i) {
    auto admit = a.may_connect_locked(full, p.from(i % 2 ? "127.0.0.1" : "192.0.2.9"), t1);
    REQUIRE(admit.ok);
    CHECK(admit.replaces == idle[i]);  // the oldest first; never the proven client
    replaced.push_back(admit.replaces);
  }
  // The closes have not run yet: no more descriptors past the limit than that.
  CHECK_FALSE(a.may_connect_locked(full, p.from("127.0.0.1"), t1).ok);
  for (auto& c : replaced) a.closed_locked(*c);
  auto admit = a.may_connect_locked(full, p.from("127.0.0.1"), t1);
  REQUIRE(admit.ok);
  CHECK(admit.replaces == idle[kMaxReplacing]);
  CHECK(a.replaced() == kMaxReplacing + 1);
  CHECK_FALSE(client->session.replaced);
}

// A round's store needs listening descriptors: when unproven connections fill the limit, they
// make room for it as for a new connection, instead of the JOIN getting an ERROR.
TEST_CASE("AJobsStoreTakesTheSlotsOfUnprovenConnections", "[server][admission]") {
  StoreServerOptions o;
  o.max_connections = 100;
  WarnLimiter warns;
  Admission a(o, warns);
  a.size_to_descriptors();
  Peers p;
  const auto t0 = std::chrono::steady_clock::now();
  std::vector<ConnPtr> idle;
  for (int i = 0; i < 3; ++i) {
    idle.push_back(p.from("::1"));
    REQUIRE(a.may_connect_locked(i, idle.back(), t0).ok);
  }
  const uint64_t full = a.max_connections();
  CHECK_FALSE(a.make_room_locked(full, 2, t0).ok);  // none had its time yet
  auto room = a.make_room_locked(full, 2, t0 + 2 * kReplaceableAfter);
  REQUIRE(room.ok);
  REQUIRE(room.replaced.size() == 2);
  CHECK(room.replaced[0] == idle[0]);
  CHECK(room.replaced[1] == idle[1]);
  CHECK_FALSE(a.make_room_locked(full, 2, t0 + 2 * kReplaceableAfter).ok);  // one unproven left
}

namespace {
struct NoStores : rdzv::WorkerStores {
  uint16_t open(const std::string&, int64_t, bool) override { return 41000; }
  void close(const std::string&, int64_t) override {}
  bool progressed(const std::string&, int64_t, int64_t) override { return false; }
};

double thread_cpu_seconds() {
  timespec ts{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) + static_cast<double>(ts.tv_nsec) * 1e-9;
}

// n agents at n addresses, admitted and in one round of job "big"; then every address's store
// client asks for the job's store and the main store, 10 times over. CPU seconds of the asking.
double store_checks_cpu(int n) {
  StoreServerOptions o;
  o.max_connections = 1 << 20;
  WarnLimiter warns;
  Admission a(o, warns);
  a.size_to_descriptors();
  Peers p;
  NoStores stores;
  rdzv::RoundState rounds{stores};
  std::vector<rdzv::Outbound> out;
  const auto now = rdzv::Clock::time_point{} + std::chrono::seconds(1000);
  std::vector<ConnPtr> agents;
  for (int i = 0; i < n; ++i) {
    auto c =
        p.from("10." + std::to_string(i >> 16) + "." + std::to_string((i >> 8) & 255) + "." + std::to_string(i & 255));
    REQUIRE(admit_open(a, c).admitted);
    rounds.on_message(c->id,
                      rdzv::to_message(rdzv::Join{.run_id = "big",
                                                  .node_id = "n" + std::to_string(i),
                                                  .host = c->session.peer.to_string(),
                                                  .local_world_size = 8,
                                                  .min_nodes = n,
                                                  .max_nodes = n}),
                      now, out);
    agents.push_back(c);
  }
  REQUIRE(rounds.participants("big").size() == static_cast<size_t>(n));
  Keyspace ks(store::StoreLimits{}, false);
  ks.run_id = "big";
  const Keyspace main_ks(store::StoreLimits{}, false);
  CHECK_FALSE(a.store_client_allowed_locked(ks, false, asio::ip::make_address("10.255.0.1"), rounds));
  size_t allowed = 0;
  const double t0 = thread_cpu_seconds();
  for (int r = 0; r < 10; ++r)
    for (const auto& c : agents)
      allowed += a.store_client_allowed_locked(ks, false, c->session.peer, rounds) +
                 a.store_client_allowed_locked(main_ks, true, c->session.peer, rounds);
  const double spent = thread_cpu_seconds() - t0;
  CHECK(allowed == 20 * static_cast<size_t>(n));
  return spent;
}
}  // namespace

// Every worker connection from another host asks whether its host runs an agent of the round.
// That used to walk the job's agents: at 8x the agents each check cost 8x, 128,000 workers of
// 16,000 nodes ~10^9 steps under the lock. Now a lookup of the address: 8x the agents, about
// 8x the checks' CPU (quadratic: 64x; the bound, 32x, has a wide margin both ways).
TEST_CASE("StoreClientChecksDoNotWalkTheJob", "[server][admission][scale]") {
  double small = 1e9, big = 1e9;
  for (int t = 0; t < 5; ++t) small = std::min(small, store_checks_cpu(500));
  for (int t = 0; t < 2; ++t) big = std::min(big, store_checks_cpu(4000));
  INFO("store-client checks: 500 agents " << small * 1e3 << " ms CPU, 4000 agents " << big * 1e3 << " ms, ratio "
                                          << big / small);
  CHECK(big / small < 32.0);
}
