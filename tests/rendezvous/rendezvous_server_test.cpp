// Agents' rendezvous over real sockets: RendezvousClient against StoreServer.
#include <catch2/catch.hpp>
#include <future>

#include "ddprun/client/store_client.h"
#include "ddprun/rdzv/rendezvous_client.h"
#include "ddprun/server/store_server.h"

using namespace ddprun;
using namespace std::chrono_literals;

namespace {
std::unique_ptr<server::StoreServer> start_server(int io_threads = 1) {
  server::StoreServerOptions o;
  o.host = "127.0.0.1";
  o.port = 0;
  o.io_threads = io_threads;
  auto s = std::make_unique<server::StoreServer>(o);
  s->start();
  return s;
}
rdzv::Join info(const std::string& node, int nproc, int min, int max, int restarts = 2) {
  rdzv::Join j;
  j.run_id = "it";
  j.node_id = node;
  j.host = "127.0.0.1";
  j.local_world_size = nproc;
  j.min_nodes = min;
  j.max_nodes = max;
  j.max_restarts = restarts;
  j.last_call_ms = 5000;  // every round here fills to max (closes at once); a stalled joiner still makes it
  j.heartbeat_timeout_ms = 2000;
  return j;
}
std::unique_ptr<rdzv::RendezvousClient> agent(uint16_t port) {
  return std::make_unique<rdzv::RendezvousClient>("127.0.0.1", port, 5s, 300ms);
}
}  // namespace

TEST_CASE("TwoAgentsGetARoundAndAFreshWorkerStorePerRound", "[rdzv][server]") {
  auto srv = start_server(GENERATE(1, 4));
  auto a = agent(srv->port()), b = agent(srv->port());
  auto fa = std::async(std::launch::async, [&] { return a->join(info("a", 2, 2, 2), 10s); });
  auto rb = b->join(info("b", 1, 2, 2), 10s);
  auto ra = fa.get();
  CHECK(ra.world_size == 3);
  CHECK(ra.node_rank + rb.node_rank == 1);
  REQUIRE(ra.store_port == rb.store_port);
  REQUIRE(ra.store_port != srv->port());

  client::StoreClientOptions co;
  co.port = ra.store_port;
  co.connect_timeout = 2s;
  co.timeout = 2s;
  {
    client::StoreClient worker(co);
    worker.set("nccl_id", "attempt0");
  }
  // A failure on node b: both get RESTART; they rejoin; the new round's store is empty.
  b->report_failure(rdzv::Failure{.round = ra.round, .global_rank = 2, .exit_code = 1});
  auto na = a->wait_message(5s);
  REQUIRE(na);
  CHECK(na->type == rdzv::MsgType::Restart);
  CHECK(na->get_int("restart_count") == 1);
  auto fa2 = std::async(std::launch::async, [&] { return a->join(info("a", 2, 2, 2), 10s); });
  auto rb2 = b->join(info("b", 1, 2, 2), 10s);
  auto ra2 = fa2.get();
  CHECK(ra2.restart_count == 1);
  CHECK(rb2.restart_count == 1);
  CHECK(ra2.node_rank == ra.node_rank);
  co.port = ra2.store_port;
  client::StoreClient worker2(co);
  CHECK(worker2.num_keys() == 0);
  CHECK_THROWS_AS(worker2.get("nccl_id", 100ms), client::StoreTimeout);

  a->report_success(ra2.round);
  b->report_success(rb2.round);
  auto done = a->wait_message(5s);
  REQUIRE(done);
  CHECK(done->type == rdzv::MsgType::JobDone);
}

TEST_CASE("AgentKilledMeansRestartForTheSurvivors", "[rdzv][server]") {
  auto srv = start_server(GENERATE(1, 4));
  auto a = agent(srv->port()), b = agent(srv->port()), c = agent(srv->port());
  auto fa = std::async(std::launch::async, [&] { return a->join(info("a", 1, 2, 3), 10s); });
  auto fb = std::async(std::launch::async, [&] { return b->join(info("b", 1, 2, 3), 10s); });
  auto rc = c->join(info("c", 1, 2, 3), 10s);
  fa.get();
  fb.get();
  CHECK(rc.nnodes == 3);
  c.reset();  // its connection closes, as when the agent is SIGKILLed
  auto n = a->wait_message(5s);
  REQUIRE(n);
  CHECK(n->type == rdzv::MsgType::Restart);
  CHECK_THAT(n->get("reason"), Catch::Contains("lost node c"));
}

TEST_CASE("JoinTimeoutErrorReachesTheAgent", "[rdzv][server]") {
  auto srv = start_server();
  auto a = agent(srv->port());
  auto j = info("a", 1, 2, 2);
  j.join_timeout_ms = 300;
  try {
    a->join(j, 10s);
    FAIL("joined alone");
  } catch (const rdzv::RendezvousError& e) {
    CHECK_THAT(e.what(), Catch::Contains("1 of at least 2 nodes joined"));
  }
}

TEST_CASE("StoreClientsAndAgentsShareThePort", "[rdzv][server]") {
  auto srv = start_server(GENERATE(1, 4));
  client::StoreClientOptions co;
  co.port = srv->port();
  client::StoreClient store(co);
  store.set("k", "v");
  auto a = agent(srv->port());
  auto r = a->join(info("solo", 4, 1, 1), 5s);
  CHECK(r.world_size == 4);
  CHECK(store.get("k") == "v");
}
