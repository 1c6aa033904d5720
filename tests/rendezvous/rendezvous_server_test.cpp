// Agents' rendezvous over real sockets: RendezvousClient against StoreServer.
#include <catch2/catch.hpp>
#include <future>

#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>

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

namespace {
// A server that accepts and never reads, with a small receive buffer so a client's send
// buffer fills quickly.
struct DeafServer {
  int listen_fd = -1;
  int conn_fd = -1;
  uint16_t port = 0;
  DeafServer() {
    listen_fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    int small = 4096;
    ::setsockopt(listen_fd, SOL_SOCKET, SO_RCVBUF, &small, sizeof small);  // inherited by accepted
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    REQUIRE(::bind(listen_fd, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0);
    REQUIRE(::listen(listen_fd, 4) == 0);
    socklen_t len = sizeof a;
    ::getsockname(listen_fd, reinterpret_cast<sockaddr*>(&a), &len);
    port = ntohs(a.sin_port);
  }
  void accept_one() { conn_fd = ::accept(listen_fd, nullptr, nullptr); }
  ~DeafServer() {
    if (conn_fd >= 0) ::close(conn_fd);
    ::close(listen_fd);
  }
};

// Writes junk through the client's socket until there is no room left even for one byte: a
// small fixed send buffer (no autotuning), big writes then single bytes (the kernel refuses a
// big write while a small one still fits), again until a round after a pause writes nothing.
void fill(int fd) {
  int small = 4096;
  ::setsockopt(fd, SOL_SOCKET, SO_SNDBUF, &small, sizeof small);
  std::string junk(65536, 'x');
  while (true) {
    size_t wrote = 0;
    for (size_t chunk : {junk.size(), size_t{1}})
      for (ssize_t n; (n = ::send(fd, junk.data(), chunk, MSG_DONTWAIT | MSG_NOSIGNAL)) > 0;) wrote += n;
    REQUIRE((errno == EAGAIN || errno == EWOULDBLOCK));
    if (wrote == 0) return;
    pollfd p{fd, POLLOUT, 0};
    ::poll(&p, 1, 300);  // POLLOUT wants a third of the buffer free: mostly this times out
  }
}
}  // namespace

TEST_CASE("ASendToAServerThatStopsReadingIsAbandonedOnStopAndTheDestructorReturns", "[rdzv][client]") {
  DeafServer deaf;
  std::atomic<bool> stop{false};
  auto a = std::make_unique<rdzv::RendezvousClient>("127.0.0.1", deaf.port, 5s, 10ms, [&] { return stop.load(); });
  deaf.accept_one();
  fill(a->fd());
  stop = true;
  // Before the fix this blocked in ::send for as long as the server did not read.
  CHECK_THROWS_AS(a->report_success(0), rdzv::RendezvousInterrupted);
  a->leave();  // never throws, never waits once stopped
  // The heartbeat thread (every 10 ms) is stuck on the same full socket: the destructor must
  // still return (a hang here is this test's failure, by the ctest timeout).
  a.reset();
  SUCCEED();
}

TEST_CASE("ASendToAServerThatStopsReadingGivesUpAfterTheSendTimeout", "[rdzv][client]") {
  DeafServer deaf;
  rdzv::RendezvousClient a("127.0.0.1", deaf.port, 5s, 1h);
  deaf.accept_one();
  fill(a.fd());
  try {
    a.report_success(0);
    FAIL("a send into a full socket returned");
  } catch (const rdzv::RendezvousInterrupted&) {
    FAIL("interrupted without a stop");
  } catch (const rdzv::RendezvousError& e) {
    CHECK_THAT(e.what(), Catch::Contains("stopped reading"));
  }
}

TEST_CASE("ConnectingToANameThatDoesNotResolveStopsWhenAsked", "[rdzv][client]") {
  // .invalid never resolves (RFC 6761); whether the lookup fails fast or hangs on the name
  // service, a stop ends the connect.
  CHECK_THROWS_AS(rdzv::RendezvousClient("ddprun-no-such-host.invalid", 29500, 60s, 1s, [] { return true; }),
                  rdzv::RendezvousInterrupted);
}
