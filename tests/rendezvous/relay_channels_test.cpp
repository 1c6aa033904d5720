// A store relay's multiplexed connection (wire/mux.h) over real loopback sockets: each channel
// is served as a client of its own (WAIT on one released by SET on another), CLOSE either way
// ends a channel as a closed socket would, a malformed frame closes the relay's connection
// only; and PyTorch-style clients through a StoreRelay reach the store over one connection.
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <future>
#include <map>
#include <thread>

#include "ddprun/client/store_client.h"
#include "ddprun/relay/store_relay.h"
#include "ddprun/server/store_server.h"
#include "ddprun/wire/codec.h"
#include "ddprun/wire/mux.h"

using namespace ddprun;
using namespace std::chrono_literals;
namespace mux = wire::mux;

namespace {

std::unique_ptr<server::StoreServer> start_server() {
  server::StoreServerOptions o;
  o.host = "127.0.0.1";
  o.port = 0;
  auto s = std::make_unique<server::StoreServer>(o);
  s->start();
  return s;
}

client::StoreClientOptions client_opts(uint16_t port) {
  client::StoreClientOptions o;
  o.host = "127.0.0.1";
  o.port = port;
  o.dialect = wire::Dialect::D2;
  o.timeout = 10s;
  o.connect_timeout = 10s;
  return o;
}

std::string request(wire::Op op, std::vector<std::string> keys, std::vector<std::string> values = {}) {
  wire::Request r{.op = op, .keys = std::move(keys), .values = std::move(values)};
  if (op == wire::Op::Validate) r.u32 = wire::kValidateMagic;
  std::string out;
  REQUIRE(wire::encode_request(wire::Dialect::D2, r, out));
  return out;
}
std::string validate() { return request(wire::Op::Validate, {}); }
std::string blob(const std::string& v) {
  std::string s;
  wire::Writer(s).blob(v);
  return s;
}

// A relay's connection spoken by hand: frames out, frames in (per channel).
struct MuxConn {
  int fd = -1;
  std::string in;
  std::map<uint32_t, std::string> data;  // bytes received per channel
  std::vector<uint32_t> closed;          // channels the server closed
  bool eof = false;
  explicit MuxConn(uint16_t port) {
    fd = ::socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_port = htons(port);
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    REQUIRE(::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0);
    int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    std::string hello;
    mux::append_hello(hello);
    send(hello);
  }
  ~MuxConn() { ::close(fd); }
  void send(const std::string& s) { REQUIRE(::send(fd, s.data(), s.size(), MSG_NOSIGNAL) == (ssize_t)s.size()); }
  void frame(uint32_t channel, mux::Kind kind, const std::string& bytes = "") {
    std::string f;
    if (kind == mux::Kind::Data) mux::append_data(f, channel, bytes);
    else mux::append_frame(f, channel, kind);
    send(f);
  }
  // Reads frames until `done()` or EOF; a hang guard, not a timing bound.
  template <class F>
  void until(F&& done) {
    const auto guard = std::chrono::steady_clock::now() + 30s;
    while (!done() && !eof) {
      REQUIRE(std::chrono::steady_clock::now() < guard);
      pollfd p{fd, POLLIN, 0};
      if (::poll(&p, 1, 100) <= 0) continue;
      char buf[4096];
      const ssize_t n = ::recv(fd, buf, sizeof buf, 0);
      if (n <= 0) {
        eof = true;
        break;
      }
      in.append(buf, n);
      for (;;) {
        auto d = mux::decode_frame({reinterpret_cast<const uint8_t*>(in.data()), in.size()});
        if (d.status == wire::ParseStatus::NeedMore) break;
        REQUIRE(d.status == wire::ParseStatus::Ok);
        if (d.frame.kind == mux::Kind::Data)
          data[d.frame.channel].append(reinterpret_cast<const char*>(d.frame.payload.data()), d.frame.payload.size());
        else if (d.frame.kind == mux::Kind::Close) closed.push_back(d.frame.channel);
        in.erase(0, d.consumed);
      }
    }
  }
};

}  // namespace

TEST_CASE("TwoSessionsOfOneRelayConnectionAreTwoClients", "[relay]") {
  auto srv = start_server();
  MuxConn m(srv->port());
  m.frame(1, mux::Kind::Open);
  m.frame(2, mux::Kind::Open);
  m.frame(1, mux::Kind::Data, validate() + request(wire::Op::Wait, {"k"}));
  m.frame(2, mux::Kind::Data, validate() + request(wire::Op::Set, {"k"}, {"v"}) + request(wire::Op::Get, {"k"}));
  m.until([&] { return m.data[1].size() >= 1 && m.data[2].size() >= blob("v").size(); });
  CHECK(m.data[1] == std::string(1, static_cast<char>(wire::kWaitStop)));  // released by channel 2's SET
  CHECK(m.data[2] == blob("v"));
  const auto st = srv->stats();
  CHECK(st.connections_open == 1);
  CHECK(st.relay_connections_open == 1);
  CHECK(st.relay_sessions_open == 2);
  CHECK(st.connections_closed_for_bad_input == 0);
}

TEST_CASE("CloseEitherWayEndsOnlyThatSession", "[relay]") {
  auto srv = start_server();
  MuxConn m(srv->port());
  m.frame(1, mux::Kind::Open);
  m.frame(3, mux::Kind::Open);
  m.frame(3, mux::Kind::Data, validate() + request(wire::Op::Wait, {"never"}));
  m.frame(3, mux::Kind::Close);  // the worker went: its WAIT goes with it
  m.frame(1, mux::Kind::Data,
          validate() + request(wire::Op::Set, {"never"}, {"x"}) + request(wire::Op::Get, {"never"}));
  m.until([&] { return m.data[1].size() >= blob("x").size(); });
  CHECK(m.data[1] == blob("x"));
  CHECK(m.data.count(3) == 0);  // no reply of the cancelled WAIT
  CHECK(srv->stats().relay_sessions_open == 1);
  // A channel the server closes (a bad first message) hears CLOSE; the others go on.
  m.frame(4, mux::Kind::Open);
  m.frame(4, mux::Kind::Data, std::string("\0\xff\xff\xff\xff", 5));
  m.until([&] { return !m.closed.empty(); });
  CHECK(m.closed == std::vector<uint32_t>{4});
  m.frame(1, mux::Kind::Data, request(wire::Op::Add, {"n"}, {}));
  m.until([&] { return m.data[1].size() >= blob("x").size() + 8; });
  CHECK(!m.eof);
  CHECK(srv->stats().relay_sessions_open == 1);
}

TEST_CASE("AMalformedFrameClosesTheRelayConnectionOnly", "[relay]") {
  auto srv = start_server();
  client::StoreClient direct(client_opts(srv->port()));
  direct.set("x", "1");
  const std::string bad_kind = [] {
    std::string s;
    wire::Writer(s).u32(1).u8(9).u32(0);
    return s;
  }();
  const std::string oversize = [] {
    std::string s;
    wire::Writer(s).u32(1).u8(2).u32(mux::kMaxPayload + 1);
    return s;
  }();
  std::string open_twice;
  mux::append_frame(open_twice, 1, mux::Kind::Open);
  for (const std::string& bad : {bad_kind, oversize, open_twice}) {
    MuxConn m(srv->port());
    m.frame(1, mux::Kind::Open);
    m.frame(1, mux::Kind::Data, validate() + request(wire::Op::Wait, {"pending"}));
    m.send(bad);
    m.until([] { return false; });
    CHECK(m.eof);
  }
  CHECK(direct.get("x") == "1");
  CHECK(srv->stats().connections_closed_for_bad_input == 3);
  CHECK(srv->stats().relay_sessions_open == 0);
}

TEST_CASE("ClientsThroughAStoreRelayShareOneConnection", "[relay]") {
  auto srv = start_server();
  relay::StoreRelay r({.upstream_host = "127.0.0.1", .upstream_port = srv->port()});
  const uint16_t port = r.start();
  client::StoreClient waiter(client_opts(port));
  auto fut = std::async(std::launch::async, [&] { return waiter.get("late"); });
  client::StoreClient setter(client_opts(port));
  CHECK(setter.add("n", 5) == 5);
  setter.set("late", "here");
  CHECK(fut.get() == "here");
  {
    client::StoreClient third(client_opts(port));
    CHECK(third.add("n", 2) == 7);
    CHECK(third.compare_set("cas", "", "x") == "x");
    const auto st = srv->stats();
    CHECK(st.connections_open == 1);
    CHECK(st.relay_sessions_open == 3);
  }
  // The client that went is a closed channel (its CLOSE travels after its last request).
  const auto guard = std::chrono::steady_clock::now() + 30s;
  while (srv->stats().relay_sessions_open != 2) {
    REQUIRE(std::chrono::steady_clock::now() < guard);
    std::this_thread::sleep_for(10ms);
  }
  CHECK(r.stats().accepted == 3);
  // The store lost: the relay closes its clients, which fail as on a lost store.
  srv->stop();
  CHECK_THROWS(setter.get("late"));
  CHECK_THROWS(client::StoreClient(client_opts(port)).get("late"));
  CHECK(r.stats().upstream_lost);
}
