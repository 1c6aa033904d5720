// Agents' rendezvous over real sockets: RendezvousClient against StoreServer.
#include <catch2/catch.hpp>
#include <future>

#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <mutex>
#include <thread>
#include <cerrno>

#include "ddprun/client/store_client.h"
#include "ddprun/rdzv/agent_auth.h"
#include "ddprun/rdzv/auth_io.h"
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

// A standing server runs job after job: the stores of rounds that ended are freed, not kept
// until the server goes.
TEST_CASE("TheStoresOfEndedRoundsAreFreed", "[rdzv][server]") {
  auto srv = start_server(GENERATE(1, 4));
  for (int i = 0; i < 10; ++i) {
    auto a = agent(srv->port());
    auto j = info("a", 1, 1, 1);
    j.run_id = "job" + std::to_string(i);
    const auto r = a->join(j, 10s);
    client::StoreClientOptions co;
    co.port = r.store_port;
    co.connect_timeout = 2s;
    client::StoreClient worker(co);  // a worker still connected when the round ends
    worker.set("k", "v");
    a->report_success(r.round);
    auto done = a->wait_message(5s);
    REQUIRE(done);
    CHECK(done->type == rdzv::MsgType::JobDone);
  }
  // Freed on a later tick of the server, once their listeners and connections are gone; a tick
  // runs while an agent is connected.
  auto keep_ticking = agent(srv->port());
  auto j = info("a", 1, 2, 2);
  j.run_id = "ticker";
  keep_ticking->send_join(j);
  const auto deadline = std::chrono::steady_clock::now() + 10s;
  while (srv->stats().round_stores_retained > 0 && std::chrono::steady_clock::now() < deadline)
    std::this_thread::sleep_for(20ms);
  CHECK(srv->stats().round_stores_retained == 0);
}

// Checking a munge credential asks munged (here: a check that takes 1.5 s for one agent): other
// agents' handshakes and JOINs do not wait behind it under the rounds lock. The slow agent's own
// I/O thread waits; 8 agents spread over 4 threads find at least one other.
TEST_CASE("ASlowCredentialCheckHoldsUpNoOtherAgent", "[rdzv][server][auth]") {
  server::StoreServerOptions o;
  o.host = "127.0.0.1";
  o.port = 0;
  o.io_threads = 4;
  const std::string secret = "a-connection-secret-0123456789abcdef";
  o.rdzv_munge = [secret](const std::string& credential, const std::string&) {
    if (credential == "slow") std::this_thread::sleep_for(1500ms);
    return secret;
  };
  auto srv = std::make_unique<server::StoreServer>(o);
  srv->start();
  auto creds = [secret](std::string credential) {
    return rdzv::AgentCredentials(rdzv::MungeCredentialMaker(
        [secret, credential](const std::string&) { return std::make_pair(credential, secret); }));
  };
  auto slow = std::async(std::launch::async, [&] {
    return std::make_unique<rdzv::RendezvousClient>("127.0.0.1", srv->port(), 5s, 300ms, nullptr, creds("slow"));
  });
  std::this_thread::sleep_for(200ms);  // its HELLO is being checked now
  std::vector<std::future<std::chrono::steady_clock::duration>> fast;
  for (int i = 0; i < 8; ++i)
    fast.push_back(std::async(std::launch::async, [&, i] {
      const auto t0 = std::chrono::steady_clock::now();
      rdzv::RendezvousClient a("127.0.0.1", srv->port(), 5s, 300ms, nullptr, creds("fast"));
      auto j = info("a", 1, 1, 1);
      j.run_id = "fast" + std::to_string(i);
      a.join(j, 10s);
      return std::chrono::steady_clock::now() - t0;
    }));
  auto quickest = std::chrono::steady_clock::duration::max();
  for (auto& f : fast) quickest = std::min(quickest, f.get());
  CHECK(quickest < 700ms);
  CHECK(slow.get() != nullptr);
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
  CHECK_THAT(n->get("reason"), Catch::Contains("lost node ") && Catch::Contains("(host c, 127.0.0.1)"));
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
  std::atomic<uint16_t> port{0};
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
  // Accepts one agent and answers its HELLO (an open rendezvous) on a thread, so the client's
  // constructor completes; accept_one() waits for that. After it, nothing is read.
  std::thread greeter{[this] {
    while (port == 0) std::this_thread::yield();
    const int fd = ::accept(listen_fd, nullptr, nullptr);
    uint8_t head[9];
    if (fd < 0 || ::recv(fd, head, sizeof head, MSG_WAITALL) != sizeof head) return;
    const uint32_t len = wire::load_u32(head + 5);
    std::string hello(len, '\0');
    if (::recv(fd, hello.data(), len, MSG_WAITALL) != static_cast<ssize_t>(len)) return;
    std::string challenge;
    rdzv::encode(rdzv::Challenge{.token_required = false}, challenge);
    (void)!::send(fd, challenge.data(), challenge.size(), MSG_NOSIGNAL);
    conn_fd = fd;
  }};
  void accept_one() {
    if (greeter.joinable()) greeter.join();
  }
  ~DeafServer() {
    accept_one();
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

namespace {
const std::string kToken = "the job's shared secret, 16+ bytes";
std::unique_ptr<server::StoreServer> start_token_server(int io_threads = 1) {
  server::StoreServerOptions o;
  o.host = "127.0.0.1";
  o.port = 0;
  o.io_threads = io_threads;
  o.rdzv_token = kToken;
  auto s = std::make_unique<server::StoreServer>(o);
  s->start();
  return s;
}
// A raw agent connection that skips the handshake: the magic, then `frames`; returns what the
// server sent back before it closed the connection (or 5 s passed).
std::vector<rdzv::Message> raw_agent(uint16_t port, const std::vector<rdzv::Message>& frames) {
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(port);
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  REQUIRE(::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0);
  std::string out;
  wire::Writer(out).u8(0).u32(rdzv::kAgentMagic);
  for (const auto& m : frames) rdzv::encode_message(m, out);
  REQUIRE(::send(fd, out.data(), out.size(), MSG_NOSIGNAL) == static_cast<ssize_t>(out.size()));
  std::vector<uint8_t> in;
  const auto deadline = std::chrono::steady_clock::now() + 5s;
  while (std::chrono::steady_clock::now() < deadline) {
    pollfd p{fd, POLLIN, 0};
    if (::poll(&p, 1, 100) <= 0) continue;
    uint8_t buf[4096];
    const ssize_t n = ::recv(fd, buf, sizeof buf, 0);
    if (n <= 0) break;
    in.insert(in.end(), buf, buf + n);
  }
  ::close(fd);
  std::vector<rdzv::Message> got;
  size_t pos = 0;
  while (pos < in.size()) {
    rdzv::Message m;
    auto r = rdzv::parse_message({in.data() + pos, in.size() - pos}, m);
    if (r.status != wire::ParseStatus::Ok) break;
    got.push_back(m);
    pos += r.consumed;
  }
  return got;
}
}  // namespace

TEST_CASE("WithATokenOnlyAgentsThatProveItJoinAndStrangersChangeNothing", "[rdzv][server][auth]") {
  auto srv = start_token_server(GENERATE(1, 4));
  auto connect = [&](const std::string& token) {
    return std::make_unique<rdzv::RendezvousClient>("127.0.0.1", srv->port(), 5s, 300ms, std::function<bool()>{},
                                                    token);
  };
  // Strangers first: a wrong token, no token, and raw frames that skip the handshake (a JOIN
  // declaring 2^31-1 workers, a forged FAILURE, JOIN-LEAVE) — before the job exists, so a
  // stranger cannot create it with its own settings either.
  try {
    connect("a different token, 16+ bytes");
    FAIL("a wrong token was accepted");
  } catch (const rdzv::RendezvousRefused& e) {
    CHECK_THAT(e.what(), Catch::Contains("rendezvous refused: token mismatch"));
    CHECK_THAT(e.what(), Catch::Contains("set DDPRUN_RDZV_TOKEN or --rdzv_token_file the same on every node"));
  }
  CHECK_THROWS_AS(connect(""), rdzv::RendezvousRefused);
  auto huge = info("intruder", 1, 2, 2, 3);
  huge.local_world_size = 2147483647;
  for (const auto& frames : std::vector<std::vector<rdzv::Message>>{
           {rdzv::to_message(huge)},
           {rdzv::to_message(info("intruder", 1, 1, 1, 0)), rdzv::to_message(rdzv::Failure{.round = 0})},
           {rdzv::to_message(info("intruder", 1, 2, 2, 3)), rdzv::to_message(rdzv::Leave{})},
           // a HELLO, then JOIN instead of the proof
           {rdzv::to_message(rdzv::Hello{.client_nonce = rdzv::random_nonce()}), rdzv::to_message(info("x", 1, 2, 2))},
       }) {
    auto got = raw_agent(srv->port(), frames);
    REQUIRE_FALSE(got.empty());
    CHECK(got.back().type == rdzv::MsgType::Error);
    CHECK_THAT(got.back().get("message"), Catch::Contains("rendezvous refused"));
  }
  CHECK(srv->stats().agents_refused == 4);  // the two clients above refused the server first

  // The real agents: the job has their settings, and WORLD_SIZE is theirs.
  auto a = connect(kToken), b = connect(kToken);
  auto fa = std::async(std::launch::async, [&] { return a->join(info("a", 2, 2, 2, 3), 10s); });
  auto rb = b->join(info("b", 1, 2, 2, 3), 10s);
  auto ra = fa.get();
  CHECK(ra.world_size == 3);
  CHECK(rb.restart_count == 0);
  // A stranger during the round cannot fail it.
  raw_agent(srv->port(), {rdzv::to_message(rdzv::Failure{.round = ra.round, .exit_code = 1})});
  CHECK_FALSE(a->wait_message(300ms));
  a->report_success(ra.round);
  b->report_success(rb.round);
  auto done = a->wait_message(5s);
  REQUIRE(done);
  CHECK(done->type == rdzv::MsgType::JobDone);
}

TEST_CASE("AnAgentWithATokenTrustsNoOpenServer", "[rdzv][server][auth]") {
  auto srv = start_server();
  try {
    rdzv::RendezvousClient a("127.0.0.1", srv->port(), 5s, 300ms, {}, kToken);
    FAIL("an agent with a token trusted a server without one");
  } catch (const rdzv::RendezvousRefused& e) {
    CHECK_THAT(e.what(), Catch::Contains("requires no token but this agent has one"));
  }
}

TEST_CASE("AnOpenServerRefusesOutOfBoundsJoinsBeforeTheJobExists", "[rdzv][server]") {
  auto srv = start_server();
  // Without a token anyone may join, but not with a world size that wraps: before the fix the
  // stranger created the job and the real workers got WORLD_SIZE=-2147483647.
  auto huge = info("intruder", 1, 2, 2);
  huge.local_world_size = 2147483647;
  auto got = raw_agent(srv->port(), {rdzv::to_message(huge)});
  REQUIRE(got.size() == 1);
  CHECK_THAT(got[0].get("message"), Catch::Contains("local_world_size 2147483647"));
  auto a = agent(srv->port()), b = agent(srv->port());
  auto fa = std::async(std::launch::async, [&] { return a->join(info("a", 2, 2, 2), 10s); });
  auto rb = b->join(info("b", 2, 2, 2), 10s);
  CHECK(fa.get().world_size == 4);
  CHECK(rb.world_size == 4);
}

TEST_CASE("AStoreThatAcceptsLaterRefusesConnectionsUntilToldWhomToAdmit", "[rdzv][server][agent_store]") {
  server::StoreServerOptions o;
  o.host = "127.0.0.1";
  o.port = 0;
  o.enable_rendezvous = false;
  o.restrict_main_store = true;
  o.accept_later = true;
  server::StoreServer s(o);
  s.start();
  REQUIRE(s.port() != 0);  // bound: its port can be offered
  {
    const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_port = htons(s.port());
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    const int rc = ::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a);
    const int err = errno;
    ::close(fd);
    CHECK(rc != 0);
    CHECK(err == ECONNREFUSED);  // what TCPStore clients retry
  }
  CHECK(s.set_store_peers({"10.1.2.3", "node-name", "::1"}) == std::vector<std::string>{"node-name"});
  s.accept_clients();
  client::StoreClientOptions co;
  co.host = "127.0.0.1";
  co.port = s.port();
  co.connect_timeout = 10s;
  client::StoreClient c(co);
  c.set("k", "v");
  CHECK(c.get("k") == "v");
}

TEST_CASE("RoundsOfAgentsThatOfferStoresNameNodeRank0sAndWhomItAdmits", "[rdzv][server][agent_store]") {
  auto srv = start_server();
  auto a = agent(srv->port()), b = agent(srv->port());
  auto ja = info("a", 1, 2, 2), jb = info("b", 1, 2, 2);
  ja.store_offer_port = 45001;
  jb.store_offer_port = 45002;
  ja.seen_from = jb.seen_from = "6.6.6.6";  // the server says where it saw them, not the agent
  auto fa = std::async(std::launch::async, [&] { return a->join(ja, 10s); });
  auto rb = b->join(jb, 10s);
  auto ra = fa.get();
  const auto& r0 = ra.node_rank == 0 ? ra : rb;
  const auto& r1 = ra.node_rank == 0 ? rb : ra;
  CHECK(r0.store_port == (ra.node_rank == 0 ? 45001 : 45002));
  CHECK(r1.store_port == r0.store_port);
  CHECK(r0.store_host == "127.0.0.1");
  CHECK(r1.store_host == "127.0.0.1");
  CHECK(r0.store_peers == "127.0.0.1");
  CHECK(r1.store_peers.empty());
}
