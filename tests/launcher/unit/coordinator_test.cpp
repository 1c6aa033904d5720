// The coordinator seam: the local (in-process round) and the remote (rendezvous client against
// a real in-process server on loopback) implementations pass one suite of cases, so one node
// and many follow the same rules.
#include <catch2/catch.hpp>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <thread>

#include "ddprun/client/store_client.h"
#include "ddprun/launcher/coordinator.h"
#include "ddprun/rdzv/agent_auth.h"
#include "ddprun/rdzv/auth_io.h"
#include "ddprun/server/store_server.h"
#include "../../dead_port.h"

using namespace ddprun;
using namespace ddprun::launcher;
using namespace std::chrono_literals;

namespace {

std::unique_ptr<server::StoreServer> start_server() {
  server::StoreServerOptions o;
  o.host = "127.0.0.1";
  o.port = 0;
  auto s = std::make_unique<server::StoreServer>(o);
  s->start();
  return s;
}

rdzv::Join settings(int64_t nproc, int64_t max_restarts, const std::string& run_id = "job") {
  rdzv::Join j;
  j.run_id = run_id;
  j.local_world_size = nproc;
  j.max_restarts = max_restarts;
  j.last_call_ms = 0;
  j.heartbeat_timeout_ms = 30000;
  return j;
}

struct Local {
  std::unique_ptr<server::StoreServer> store = start_server();
  std::unique_ptr<Coordinator> make(rdzv::Join j) { return make_local_coordinator(*store, std::move(j), "127.0.0.1"); }
  uint16_t main_port() const { return store->port(); }
};

struct Remote {
  std::unique_ptr<server::StoreServer> server = start_server();
  std::unique_ptr<Coordinator> make(rdzv::Join j) {
    return make_remote_coordinator({.host = "127.0.0.1",
                                    .port = server->port(),
                                    .settings = std::move(j),
                                    .connect_timeout = 10s,
                                    .heartbeat_interval = 200ms});
  }
  uint16_t main_port() const { return server->port(); }
};

// A standing ddprund: the round's workers' store is this (node rank 0's) agent's own, and the
// server can be restarted on its port.
struct Standing {
  server::StoreServerOptions options = [] {
    server::StoreServerOptions o;
    o.host = "127.0.0.1";
    o.port = 0;
    o.standing = true;
    return o;
  }();
  std::unique_ptr<server::StoreServer> server = start();
  std::unique_ptr<server::StoreServer> start() {
    auto s = std::make_unique<server::StoreServer>(options);
    s->start();
    options.port = s->port();  // a restart comes back on it
    return s;
  }
  void restart_server() {
    server.reset();
    server = start();
  }
  std::unique_ptr<Coordinator> make(rdzv::Join j) {
    return make_remote_coordinator({.host = "127.0.0.1",
                                    .port = server->port(),
                                    .settings = std::move(j),
                                    .connect_timeout = 10s,
                                    .heartbeat_interval = 200ms});
  }
  uint16_t main_port() const { return server->port(); }
};

// The next notices, waiting on fd() as the agent's loop does (bounded).
std::vector<Notice> next(Coordinator& c) {
  const auto deadline = std::chrono::steady_clock::now() + 20s;
  while (std::chrono::steady_clock::now() < deadline) {
    pollfd p{c.fd(), POLLIN, 0};
    ::poll(&p, 1, 200);
    auto n = c.take_notices();
    if (!n.empty()) return n;
  }
  FAIL("no notice within 20 s");
  return {};
}
Notice one(Coordinator& c, Notice::Kind kind) {
  auto n = next(c);
  REQUIRE(n.size() == 1);
  REQUIRE(static_cast<int>(n[0].kind) == static_cast<int>(kind));
  return n[0];
}

client::StoreClientOptions store_at(const GroupLayout& g) {
  client::StoreClientOptions o;
  o.host = g.store_host;
  o.port = g.store_port;
  o.connect_timeout = 10s;
  o.timeout = 10s;
  return o;
}
// Every worker of the round joins its store, as PyTorch's TCPStore(world_size=N) does.
void make_progress(const GroupLayout& g) {
  auto o = store_at(g);
  o.world_size = g.world_size;
  for (int i = 0; i < g.world_size; ++i) client::StoreClient c(o);
}

rdzv::Failure failure(int rank, int code) {
  return rdzv::Failure{.global_rank = rank, .local_rank = rank, .exit_code = code};
}

}  // namespace

TEMPLATE_TEST_CASE("a round gives this node its layout and a store that works", "[coordinator]", Local, Remote,
                   Standing) {
  TestType f;
  auto c = f.make(settings(3, 0));
  c->join();
  const auto r = one(*c, Notice::Kind::Round);
  CHECK(r.layout.node_rank == 0);
  CHECK(r.layout.num_nodes == 1);
  CHECK(r.layout.local_world_size == 3);
  CHECK(r.layout.world_size == 3);
  CHECK(r.layout.global_rank_base == 0);
  CHECK(r.layout.restart_count == 0);
  CHECK(r.layout.run_id == "job");
  client::StoreClient s(store_at(r.layout));
  s.set("k", "v");
  CHECK(s.get("k") == "v");
  c->report_success();
  one(*c, Notice::Kind::JobDone);
}

TEMPLATE_TEST_CASE("a failure after progress restarts within the budget, on a fresh store", "[coordinator]", Local,
                   Remote, Standing) {
  TestType f;
  auto c = f.make(settings(2, 1));
  c->join();
  const auto r0 = one(*c, Notice::Kind::Round);
  make_progress(r0.layout);
  client::StoreClient(store_at(r0.layout)).set("nccl_id", "attempt0");
  c->report_failure(failure(1, 3));
  const auto restart = one(*c, Notice::Kind::Restart);
  CHECK(restart.restart.restart_count == 1);
  CHECK_THAT(restart.restart.reason, Catch::Contains("rank 1") && Catch::Contains("exit code 3"));
  c->join();
  const auto r1 = one(*c, Notice::Kind::Round);
  CHECK(r1.layout.restart_count == 1);
  CHECK(r1.max_restarts == 1);
  client::StoreClient fresh(store_at(r1.layout));
  CHECK(fresh.num_keys() == 0);  // nothing of attempt 0
  c->report_success();
  one(*c, Notice::Kind::JobDone);
}

TEMPLATE_TEST_CASE("the budget spent ends the job with the first failure", "[coordinator]", Local, Remote, Standing) {
  TestType f;
  auto c = f.make(settings(1, 0));
  c->join();
  make_progress(one(*c, Notice::Kind::Round).layout);
  c->report_failure(failure(0, 6));
  const auto end = one(*c, Notice::Kind::JobFailed);
  CHECK(end.failed.fail_cause() == rdzv::FailCause::BudgetSpent);
  CHECK_THAT(end.failed.reason, Catch::Contains("max_restarts=0"));
  REQUIRE(end.failed.first_failure);
  CHECK(end.failed.first_failure->exit_code == 6);
}

TEMPLATE_TEST_CASE("two failures before progress are not retried, and the reason says restarts were left",
                   "[coordinator]", Local, Remote, Standing) {
  TestType f;
  auto c = f.make(settings(2, 3));
  c->join();
  one(*c, Notice::Kind::Round);
  c->report_failure(failure(0, 1));  // nobody joined the store: maybe bad luck, retried
  CHECK(one(*c, Notice::Kind::Restart).restart.restart_count == 1);
  c->join();
  one(*c, Notice::Kind::Round);
  c->report_failure(failure(0, 1));
  const auto end = one(*c, Notice::Kind::JobFailed);
  CHECK(end.failed.fail_cause() == rdzv::FailCause::Deterministic);
  CHECK_THAT(end.failed.reason, Catch::Contains("not retried") && Catch::Contains("2 of 3 restarts are left"));
}

TEMPLATE_TEST_CASE("a fixed store port: every round's store is the server's own port", "[coordinator]", Local, Remote,
                   Standing) {
  TestType f;
  auto j = settings(1, 2);
  j.fixed_store_port = true;
  auto c = f.make(j);
  c->join();
  const auto r0 = one(*c, Notice::Kind::Round);
  CHECK(r0.layout.store_port == f.main_port());
  make_progress(r0.layout);
  client::StoreClient(store_at(r0.layout)).set("old", "1");
  c->report_failure(failure(0, 1));
  one(*c, Notice::Kind::Restart);
  c->join();
  const auto r1 = one(*c, Notice::Kind::Round);
  CHECK(r1.layout.store_port == f.main_port());
  client::StoreClient s(store_at(r1.layout));
  CHECK_THROWS_AS(s.get("old", 100ms), client::StoreTimeout);  // emptied for the new round
}

TEST_CASE("remote: a node with other job-wide settings is refused, the error naming both values", "[coordinator]") {
  Remote f;
  auto j = settings(1, 3);
  j.min_nodes = j.max_nodes = 2;
  auto first = f.make(j);
  first->join();
  auto k = j;
  k.max_restarts = 1;
  auto second = f.make(k);
  second->join();
  const auto end = one(*second, Notice::Kind::JobFailed);
  CHECK_THAT(end.failed.reason,
             Catch::Contains("--max_restarts") && Catch::Contains("runs with 3") && Catch::Contains("asked for 1"));
}

TEST_CASE("remote: a connect with nothing listening gives up when interrupted", "[coordinator]") {
  const ddprun::testing::DeadPort dead;  // nothing listens there
  const uint16_t port = dead.port();
  std::atomic<bool> stop{false};
  std::thread stopper([&] {
    std::this_thread::sleep_for(300ms);
    stop = true;
  });
  const auto t0 = std::chrono::steady_clock::now();
  CHECK_THROWS_AS(make_remote_coordinator({.host = "127.0.0.1",
                                           .port = port,
                                           .settings = settings(1, 0),
                                           .connect_timeout = 600s,
                                           .heartbeat_interval = 200ms,
                                           .interrupted = [&] { return stop.load(); }}),
                  CoordinatorInterrupted);
  stopper.join();
  // Generous for a loaded CI host: the contract is "within 100 ms of the answer".
  CHECK(std::chrono::steady_clock::now() - t0 < 5s);
}

TEST_CASE("notices: what each server message means to the agent", "[coordinator]") {
  auto j = settings(4, 2, "nj");
  CHECK_FALSE(notice_of(rdzv::to_message(rdzv::Heartbeat{}), j, "h"));
  auto r = notice_of(rdzv::to_message(rdzv::Round{.round = 3,
                                                  .restart_count = 1,
                                                  .max_restarts = 2,
                                                  .node_rank = 1,
                                                  .nnodes = 2,
                                                  .world_size = 7,
                                                  .base_rank = 3,
                                                  .store_port = 4242}),
                     j, "10.0.0.1");
  REQUIRE(r);
  CHECK(static_cast<int>(r->kind) == static_cast<int>(Notice::Kind::Round));
  CHECK(r->round == 3);
  CHECK(r->layout.local_world_size == 4);  // this node's own
  CHECK(r->layout.global_rank_base == 3);
  CHECK(r->layout.store_host == "10.0.0.1");
  CHECK(r->layout.store_port == 4242);
  CHECK(r->layout.run_id == "nj");
  CHECK(r->layout.restart_count == 1);
  auto e = notice_of(rdzv::to_message(rdzv::Error{.message = "refused"}), j, "h");
  REQUIRE(e);
  CHECK(static_cast<int>(e->kind) == static_cast<int>(Notice::Kind::JobFailed));
  CHECK(e->failed.reason == "refused");
}

TEST_CASE("remote: nothing listening past the connect timeout is an error that says what to check", "[coordinator]") {
  const ddprun::testing::DeadPort dead;
  try {
    make_remote_coordinator({.host = "127.0.0.1",
                             .port = dead.port(),
                             .settings = settings(1, 0),
                             .connect_timeout = 300ms,
                             .heartbeat_interval = 200ms,
                             .interrupted = [] { return false; }});
    FAIL("connected to nothing");
  } catch (const CoordinatorInterrupted&) {
    FAIL("not interrupted: timed out");
  } catch (const CoordinatorError& e) {
    CHECK_THAT(e.what(), Catch::Contains("cannot reach the rendezvous endpoint 127.0.0.1:") &&
                             Catch::Contains("--rdzv_endpoint"));
  }
}

TEST_CASE("standing: the workers' store is the agent's own and outlives a restart of the server", "[coordinator]") {
  Standing f;
  auto c = f.make(settings(2, 0));
  c->join();
  const auto r = one(*c, Notice::Kind::Round);
  CHECK(r.layout.store_host == "127.0.0.1");
  CHECK(r.layout.store_port != f.main_port());
  client::StoreClient s(store_at(r.layout));
  s.set("k", "before");
  f.restart_server();
  // The agent reconnects and re-joins (no notice: the round runs on); the store never moved.
  CHECK(c->take_notices().empty());
  CHECK(s.get("k") == "before");
  s.set("k", "after");
  // SET has no reply: a GET on the same connection is answered after it is applied, so a
  // second connection's GET afterwards cannot overtake it.
  CHECK(s.get("k") == "after");
  client::StoreClient s2(store_at(r.layout));
  CHECK(s2.get("k") == "after");
  c->report_success();
  one(*c, Notice::Kind::JobDone);
}

TEST_CASE("standing: a failure reported while the server is down reaches the restarted one", "[coordinator]") {
  Standing f;
  auto c = f.make(settings(1, 1));
  c->join();
  make_progress(one(*c, Notice::Kind::Round).layout);
  f.server.reset();                  // the daemon dies ...
  c->report_failure(failure(0, 5));  // ... the report goes nowhere (or fails to send) ...
  f.server = f.start();              // ... and it comes back: the re-join carries the failure again
  const auto restart = one(*c, Notice::Kind::Restart);
  CHECK(restart.restart.restart_count == 1);
  CHECK_THAT(restart.restart.reason, Catch::Contains("exit code 5"));
}

TEST_CASE("standing: a success reported while the server is down ends the job after the re-join", "[coordinator]") {
  Standing f;
  auto c = f.make(settings(1, 0));
  c->join();
  one(*c, Notice::Kind::Round);
  f.server.reset();
  c->report_success();
  f.server = f.start();
  one(*c, Notice::Kind::JobDone);
}

namespace {
// A listening TCP socket on 127.0.0.1:port (a fake peer of the tests below).
int listen_loopback(uint16_t port, int backlog) {
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  int one = 1;
  ::setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(port);
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  REQUIRE(::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0);
  REQUIRE(::listen(fd, backlog) == 0);
  return fd;
}

// What a stranger would do on a standing server's port while the server is down: answer each
// connection with one frame (an ERROR, or a genuine CHALLENGE it recorded earlier), then close.
class Impostor {
 public:
  Impostor(uint16_t port, std::vector<std::string> answers) : answers_(std::move(answers)) {
    fd_ = listen_loopback(port, 16);
    thread_ = std::thread([this] {
      while (!stop_) {
        pollfd p{fd_, POLLIN, 0};
        if (::poll(&p, 1, 50) <= 0) continue;
        const int c = ::accept4(fd_, nullptr, nullptr, SOCK_CLOEXEC);
        if (c < 0) continue;
        pollfd r{c, POLLIN, 0};
        char buf[4096];
        if (::poll(&r, 1, 1000) > 0) (void)!::recv(c, buf, sizeof buf, 0);  // its HELLO
        const std::string& answer = answers_[static_cast<size_t>(served_) % answers_.size()];
        (void)!::send(c, answer.data(), answer.size(), MSG_NOSIGNAL);
        ++served_;
        ::shutdown(c, SHUT_WR);
        ::poll(&r, 1, 200);
        ::close(c);
      }
    });
  }
  ~Impostor() {
    stop_ = true;
    thread_.join();
    ::close(fd_);
  }
  int served() const { return served_; }

 private:
  std::vector<std::string> answers_;
  int fd_ = -1;
  std::atomic<bool> stop_{false};
  std::atomic<int> served_{0};
  std::thread thread_;
};

// The server's CHALLENGE to a HELLO of our own: genuine, with the right token's proof, but for
// another connection's nonce (what a recording stranger can replay).
std::string recorded_challenge(uint16_t port) {
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(port);
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  REQUIRE(::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0);
  std::string out;
  wire::Writer(out).u8(0).u32(rdzv::kAgentMagic);
  rdzv::encode(rdzv::Hello{.client_nonce = rdzv::random_nonce()}, out);
  REQUIRE(::send(fd, out.data(), out.size(), MSG_NOSIGNAL) == static_cast<ssize_t>(out.size()));
  std::vector<uint8_t> in;
  rdzv::Message m;
  for (int i = 0; i < 50; ++i) {
    pollfd p{fd, POLLIN, 0};
    if (::poll(&p, 1, 100) <= 0) continue;
    uint8_t buf[4096];
    const ssize_t n = ::recv(fd, buf, sizeof buf, 0);
    if (n <= 0) break;
    in.insert(in.end(), buf, buf + n);
    auto r = rdzv::parse_message({in.data(), in.size()}, m);
    if (r.status == wire::ParseStatus::Ok) break;
  }
  ::close(fd);
  REQUIRE(m.type == rdzv::MsgType::Challenge);
  REQUIRE_FALSE(m.get("server_proof").empty());
  std::string frame;
  rdzv::encode_message(m, frame);
  return frame;
}
}  // namespace

TEST_CASE("standing: while the server is down, a stranger that refuses or replays on its port cannot end the job",
          "[coordinator]") {
  const std::string token = "the job's shared secret, 16+ bytes";
  Standing f;
  f.options.rdzv_token = token;
  f.restart_server();
  auto c = make_remote_coordinator({.host = "127.0.0.1",
                                    .port = f.server->port(),
                                    .settings = settings(1, 0),
                                    .connect_timeout = 10s,
                                    .heartbeat_interval = 200ms,
                                    .token = token});
  c->join();
  one(*c, Notice::Kind::Round);
  const std::string challenge = recorded_challenge(f.server->port());
  std::string error;
  rdzv::encode(rdzv::Error{.message = "rendezvous refused: token mismatch"}, error);
  f.server.reset();
  {
    Impostor stranger(f.options.port, {error, challenge});
    const auto until = std::chrono::steady_clock::now() + 3s;
    while (std::chrono::steady_clock::now() < until) {
      pollfd p{c->fd(), POLLIN, 0};
      ::poll(&p, 1, 100);
      std::vector<Notice> n;
      REQUIRE_NOTHROW(n = c->take_notices());  // not the server: the agent keeps trying
      CHECK(n.empty());
    }
    CHECK(stranger.served() >= 4);  // both kinds, twice
  }
  // The server comes back: the agent re-joins and the job ends as its workers do.
  f.server = f.start();
  c->report_success();
  one(*c, Notice::Kind::JobDone);
}

namespace {
// Something on a standing server's port while the server is down that accepts connections and
// never answers the handshake (a hung process, a half-dead daemon).
class Silent {
 public:
  explicit Silent(uint16_t port) {
    fd_ = listen_loopback(port, 64);  // the kernel completes the connects; nobody reads
  }
  ~Silent() { ::close(fd_); }

 private:
  int fd_ = -1;
};
}  // namespace

TEST_CASE("standing: a reconnect's handshake is bounded by the reconnect time left", "[coordinator]") {
  Standing f;
  auto j = settings(1, 0);
  j.join_timeout_ms = 1500;  // the reconnect budget
  auto c = f.make(j);
  c->join();
  one(*c, Notice::Kind::Round);
  f.server.reset();
  Silent hung(f.options.port);
  const auto t0 = std::chrono::steady_clock::now();
  std::string error;
  while (error.empty() && std::chrono::steady_clock::now() - t0 < 30s) {
    pollfd p{c->fd(), POLLIN, 0};
    ::poll(&p, 1, 100);
    try {
      c->take_notices();
    } catch (const CoordinatorError& e) {
      error = e.what();
    }
  }
  const double took = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  CHECK_THAT(error, Catch::Contains("did not come back within 1 s") && Catch::Contains("handshake"));
  // The budget (1.5 s), not the client's own handshake timeout (10 s); generous for a loaded
  // machine.
  CHECK(took < 6.0);
}
