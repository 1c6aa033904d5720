// A relay between an agent and the server (a man in the middle on the network): what it
// injects or replays is dropped by the side it reaches; towards the server, the agent's
// connection is closed at once as well (nothing after a dropped message would pass the
// sequence check), which is what cutting the connection would do.
#include <catch2/catch.hpp>
#include <future>

#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <mutex>
#include <thread>

#include "ddprun/rdzv/agent_auth.h"
#include "ddprun/rdzv/auth_io.h"
#include "ddprun/rdzv/rendezvous_client.h"
#include "ddprun/rdzv/session_mac.h"
#include "ddprun/server/store_server.h"

using namespace ddprun;
using namespace std::chrono_literals;

namespace {
const std::string kToken = "the job's shared secret, 16+ bytes";
std::unique_ptr<server::StoreServer> start_token_server() {
  server::StoreServerOptions o;
  o.host = "127.0.0.1";
  o.port = 0;
  o.rdzv_token = kToken;
  auto s = std::make_unique<server::StoreServer>(o);
  s->start();
  return s;
}
rdzv::Join info(const std::string& node) {
  rdzv::Join j;
  j.run_id = "it";
  j.node_id = node;
  j.host = "127.0.0.1";
  j.local_world_size = 1;
  j.min_nodes = j.max_nodes = 2;
  j.max_restarts = 0;  // a failure the server believed would end the job
  j.last_call_ms = 5000;
  j.heartbeat_timeout_ms = 2000;
  return j;
}
}  // namespace

namespace {
// A man in the middle between one agent and the server: forwards whole frames both ways, keeps
// a copy of each, and sends what a test gives it between two frames (never inside one).
class Relay {
 public:
  explicit Relay(uint16_t server_port) : server_port_(server_port) {
    lfd_ = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    REQUIRE(::bind(lfd_, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0);
    REQUIRE(::listen(lfd_, 4) == 0);
    socklen_t len = sizeof a;
    ::getsockname(lfd_, reinterpret_cast<sockaddr*>(&a), &len);
    port_ = ntohs(a.sin_port);
    thread_ = std::thread([this] { run(); });
  }
  ~Relay() {
    stop_ = true;
    thread_.join();
    ::close(lfd_);
  }
  uint16_t port() const { return port_; }
  void inject(bool to_server, const std::string& frame) {
    std::lock_guard lk(mu_);
    (to_server ? up_.inject : down_.inject) += frame;
  }
  std::vector<std::string> frames(bool to_server) {
    std::lock_guard lk(mu_);
    return to_server ? up_.seen : down_.seen;
  }

 private:
  struct Way {
    int from = -1, to = -1;
    std::string buf, inject;
    size_t skip = 0;  // the agent's 5-byte protocol announcement
    std::vector<std::string> seen;
  };
  void pump(Way& w, bool readable) {
    if (readable) {
      char b[65536];
      const ssize_t n = ::recv(w.from, b, sizeof b, 0);
      if (n <= 0) {
        stop_ = true;
        return;
      }
      w.buf.append(b, static_cast<size_t>(n));
    }
    std::string out;
    if (w.skip > 0 && w.buf.size() >= w.skip) {
      out = w.buf.substr(0, w.skip);
      w.buf.erase(0, w.skip);
      w.skip = 0;
    }
    while (w.skip == 0) {
      rdzv::Message m;
      auto r = rdzv::parse_message({reinterpret_cast<const uint8_t*>(w.buf.data()), w.buf.size()}, m);
      if (r.status != wire::ParseStatus::Ok) break;
      w.seen.push_back(w.buf.substr(0, r.consumed));
      out += w.seen.back();
      w.buf.erase(0, r.consumed);
    }
    out += w.inject;
    w.inject.clear();
    if (!out.empty()) ::send(w.to, out.data(), out.size(), MSG_NOSIGNAL);
  }
  void run() {
    pollfd l{lfd_, POLLIN, 0};
    while (!stop_ && ::poll(&l, 1, 50) <= 0) {
    }
    if (stop_) return;
    const int agent = ::accept4(lfd_, nullptr, nullptr, SOCK_CLOEXEC);
    const int server = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_port = htons(server_port_);
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (::connect(server, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0) stop_ = true;
    up_.from = down_.to = agent;
    up_.to = down_.from = server;
    up_.skip = 5;
    while (!stop_) {
      pollfd p[2] = {{agent, POLLIN, 0}, {server, POLLIN, 0}};
      ::poll(p, 2, 20);
      std::lock_guard lk(mu_);
      pump(up_, (p[0].revents & (POLLIN | POLLHUP)) != 0);
      if (!stop_) pump(down_, (p[1].revents & (POLLIN | POLLHUP)) != 0);
    }
    ::close(agent);
    ::close(server);
  }
  uint16_t server_port_, port_ = 0;
  int lfd_ = -1;
  std::atomic<bool> stop_{false};
  std::thread thread_;
  std::mutex mu_;
  Way up_, down_;
};
std::string frame(const rdzv::Message& m) {
  std::string s;
  rdzv::encode_message(m, s);
  return s;
}
}  // namespace

namespace {
// Two agents of a 2-node job in their round: `through` behind a relay, `direct` not.
struct Job {
  std::unique_ptr<server::StoreServer> srv = start_token_server();
  Relay relay{srv->port()};
  std::unique_ptr<rdzv::RendezvousClient> through =
      std::make_unique<rdzv::RendezvousClient>("127.0.0.1", relay.port(), 5s, 300ms, std::function<bool()>{}, kToken);
  std::unique_ptr<rdzv::RendezvousClient> direct =
      std::make_unique<rdzv::RendezvousClient>("127.0.0.1", srv->port(), 5s, 300ms, std::function<bool()>{}, kToken);
  rdzv::Round ra, rb;
  Job() {
    auto fa = std::async(std::launch::async, [&] { return through->join(info("a"), 10s); });
    rb = direct->join(info("b"), 10s);
    ra = fa.get();
  }
};
}  // namespace

TEST_CASE("ARelayCanNeitherInjectNorReplayToTheAgent", "[rdzv][server][auth]") {
  Job job;
  // To the agent, in the server's name: JOB_FAILED, and the server's ROUND again.
  job.relay.inject(false, frame(rdzv::to_message(rdzv::JobFailed{.reason = "injected by the relay"})));
  const auto down = job.relay.frames(false);  // CHALLENGE, WELCOME, ROUND
  REQUIRE(down.size() >= 3);
  job.relay.inject(false, down[2]);

  // Nothing reaches the agent: no JOB_FAILED; it counts what it dropped.
  CHECK_FALSE(job.through->wait_message(1500ms));
  CHECK(job.through->rejected() == 2);
  CHECK_THAT(job.through->last_rejected(), Catch::Contains("ROUND") && Catch::Contains("replayed"));
  CHECK_FALSE(job.direct->wait_message(100ms));

  // The job goes on and ends well, through the relay too.
  job.through->report_success(job.ra.round);
  job.direct->report_success(job.rb.round);
  for (auto* c : {job.through.get(), job.direct.get()}) {
    auto done = c->wait_message(5s);
    REQUIRE(done);
    CHECK(done->type == rdzv::MsgType::JobDone);
  }
}

// A message to the server that fails its MAC or sequence check used to be dropped with the
// connection left open: the agent's JOIN or heartbeats altered by a relay were lost, and every
// message after them failed the sequence check, so the job waited for the heartbeat timeout
// (or 50 s for a ROUND). Now the server closes the connection at once: a node lost now, or an
// agent of a standing server that reconnects. Never the forged message's effect.
TEST_CASE("AMessageToTheServerThatFailsItsMacClosesTheConnectionAtOnce", "[rdzv][server][auth]") {
  Job job;
  const auto refused_before = job.srv->stats().agents_refused;
  SECTION("a plain FAILURE in the agent's name") {
    const auto failure = rdzv::Failure{.round = job.ra.round, .global_rank = 0, .exit_code = 1};
    job.relay.inject(true, frame(rdzv::to_message(failure)));
  }
  SECTION("a FAILURE sealed under a guessed key") {
    rdzv::SessionMac guess(kToken, rdzv::random_nonce(), rdzv::random_nonce(), rdzv::SessionMac::Side::Agent);
    auto sealed = rdzv::to_message(rdzv::Failure{.round = job.ra.round, .global_rank = 0, .exit_code = 1});
    guess.seal(sealed);
    job.relay.inject(true, frame(sealed));
  }
  SECTION("the agent's own JOIN replayed") {
    const auto up = job.relay.frames(true);  // HELLO, AUTH, JOIN, heartbeats
    REQUIRE(up.size() >= 3);
    job.relay.inject(true, up[2]);
  }
  // The agent behind the relay sees its connection closed (generously bounded: it was never
  // closed before, while heartbeats kept going).
  bool closed = false;
  const auto deadline = std::chrono::steady_clock::now() + 10s;
  while (!closed && std::chrono::steady_clock::now() < deadline) {
    try {
      job.through->wait_message(100ms);
    } catch (const rdzv::RendezvousError&) {
      closed = true;
    }
  }
  CHECK(closed);
  CHECK(job.srv->stats().agents_refused == refused_before + 1);
  // The other node hears of a lost connection, not of the forged failure.
  auto heard = job.direct->wait_message(10s);
  REQUIRE(heard);
  REQUIRE(heard->type == rdzv::MsgType::JobFailed);
  CHECK_THAT(rdzv::from_message<rdzv::JobFailed>(*heard).reason, Catch::Contains("connection closed"));
}
