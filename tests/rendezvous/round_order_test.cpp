// The server seals an agent's messages after its rounds lock is let go, a round's broadcast on
// several threads at once: every agent still gets its messages in the order the rounds made
// them, with exact sequence numbers. Real sockets, token agents that open every MAC.
#include <catch2/catch.hpp>

#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <future>
#include <optional>
#include <stdexcept>

#include "ddprun/rdzv/agent_auth.h"
#include "ddprun/server/store_server.h"

using namespace ddprun;
using namespace std::chrono_literals;

namespace {
const std::string kSecret = "the job's shared secret, 16+ bytes";

// A token agent on a raw socket: every message it reads must open (MAC and the next sequence
// number), or it throws.
class SealedAgent {
 public:
  explicit SealedAgent(uint16_t port) : fd_(::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0)) {
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_port = htons(port);
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (::connect(fd_, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0) throw std::runtime_error("connect");
    rdzv::ClientHandshake hs(kSecret, rdzv::random_nonce(),
                             "127.0.0.1:" + std::to_string(port));
    std::string out;
    wire::Writer(out).u8(0).u32(rdzv::kAgentMagic);
    rdzv::encode_message(hs.hello(), out);
    write(out);
    while (!hs.done()) {
      if (auto next = hs.on_reply(read_frame())) {
        out.clear();
        rdzv::encode_message(*next, out);
        write(out);
      }
    }
    mac_ = hs.session();
  }
  ~SealedAgent() { ::close(fd_); }
  void send(std::vector<rdzv::Message> ms) {
    std::string out;
    for (auto& m : ms) {
      mac_->seal(m);
      rdzv::encode_message(m, out);
    }
    write(out);
  }
  rdzv::Message next() {
    rdzv::Message m = read_frame();
    if (const auto v = mac_->open(m); v != rdzv::SessionMac::Verdict::Ok)
      throw std::runtime_error(std::string("a ") + rdzv::msg_type_name(m.type) + ": " + rdzv::SessionMac::describe(v));
    return m;
  }

 private:
  void write(const std::string& b) {
    if (::send(fd_, b.data(), b.size(), MSG_NOSIGNAL) != static_cast<ssize_t>(b.size())) throw std::runtime_error("send");
  }
  rdzv::Message read_frame() {
    const auto deadline = std::chrono::steady_clock::now() + 20s;
    while (true) {
      rdzv::Message m;
      const auto r = rdzv::parse_message({in_.data(), in_.size()}, m);
      if (r.status == wire::ParseStatus::Ok) {
        in_.erase(in_.begin(), in_.begin() + static_cast<long>(r.consumed));
        return m;
      }
      if (r.status == wire::ParseStatus::Bad) throw std::runtime_error("a frame that does not parse");
      if (std::chrono::steady_clock::now() > deadline) throw std::runtime_error("no message for 20 s");
      pollfd p{fd_, POLLIN, 0};
      if (::poll(&p, 1, 100) <= 0) continue;
      uint8_t buf[4096];
      const ssize_t n = ::recv(fd_, buf, sizeof buf, 0);
      if (n <= 0) throw std::runtime_error("closed by the server");
      in_.insert(in_.end(), buf, buf + n);
    }
  }
  int fd_;
  std::vector<uint8_t> in_;
  std::optional<rdzv::SessionMac> mac_;
};

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
