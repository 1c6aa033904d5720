// The server and the client over real loopback sockets: every operation, deferred WAIT
// replies, CANCEL_WAIT, fragmentation, and hostile clients that must only lose their own
// connection.
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <catch2/catch.hpp>
#include <future>
#include <thread>

#include "ddprun/client/store_client.h"
#include "ddprun/client/tcp_connect.h"
#include "ddprun/server/store_server.h"
#include "../dead_port.h"

using namespace ddprun;
using namespace std::chrono_literals;

namespace {

std::unique_ptr<server::StoreServer> start_server(wire::Limits limits = {}, int io_threads = 1) {
  server::StoreServerOptions o;
  o.host = "127.0.0.1";
  o.port = 0;
  o.limits = limits;
  o.io_threads = io_threads;
  auto s = std::make_unique<server::StoreServer>(o);
  s->start();
  return s;
}

client::StoreClientOptions client_opts(uint16_t port, wire::Dialect d = wire::Dialect::D2) {
  client::StoreClientOptions o;
  o.host = "127.0.0.1";
  o.port = port;
  o.dialect = d;
  o.timeout = 5s;
  o.connect_timeout = 5s;
  return o;
}

// A raw socket, for speaking bytes the client would never send.
struct Raw {
  int fd = -1;
  explicit Raw(uint16_t port) {
    fd = ::socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_port = htons(port);
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    REQUIRE(::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0);
    int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
  }
  ~Raw() { ::close(fd); }
  void send(const std::string& s) { REQUIRE(::send(fd, s.data(), s.size(), MSG_NOSIGNAL) == (ssize_t)s.size()); }
  // Bytes received within `timeout`, or until EOF. Returns {bytes, eof}.
  std::pair<std::string, bool> recv_for(std::chrono::milliseconds timeout, size_t want = 1 << 20) {
    std::string out;
    auto deadline = std::chrono::steady_clock::now() + timeout;
    while (out.size() < want) {
      auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
      if (left.count() <= 0) break;
      pollfd p{fd, POLLIN, 0};
      if (::poll(&p, 1, (int)left.count()) <= 0) break;
      char buf[4096];
      ssize_t n = ::recv(fd, buf, sizeof buf, 0);
      if (n <= 0) return {out, true};
      out.append(buf, n);
    }
    return {out, false};
  }
};

std::string validate() {
  std::string s;
  wire::Writer(s).u8(0).u32(wire::kValidateMagic);
  return s;
}

}  // namespace

TEST_CASE("ClientSpeaksEveryOperation", "[server]") {
  const int io_threads = GENERATE(1, 4);
  auto srv = start_server({}, io_threads);
  client::StoreClient c(client_opts(srv->port()));
  c.set("a", "1");
  CHECK(c.get("a") == "1");
  CHECK(c.add("n", 3) == 3);
  CHECK(c.add("n", -1) == 2);
  CHECK(c.get("n") == "2");
  CHECK(c.compare_set("cas", "", "x") == "x");
  CHECK(c.compare_set("cas", "wrong", "y") == "x");
  CHECK(c.check({"a", "n"}));
  CHECK_FALSE(c.check({"a", "zzz"}));
  c.append("ap", "he");
  c.append("ap", "llo");
  CHECK(c.get("ap") == "hello");
  c.multi_set({"m1", "m2"}, {"v1", "v2"});
  CHECK(c.multi_get({"m2", "m1"}) == std::vector<std::string>{"v2", "v1"});
  CHECK(c.delete_key("m1"));
  CHECK_FALSE(c.delete_key("m1"));
  CHECK(c.num_keys() == 5);  // a, n, cas, ap, m2
  c.queue_push("q", "first");
  c.queue_push("q", "second");
  CHECK(c.queue_len("q") == 2);
  CHECK(c.queue_pop("q", 1s) == "first");
  auto keys = c.list_keys();
  CHECK(std::find(keys.begin(), keys.end(), "ap") != keys.end());
  CHECK(c.ping() > 0ns);
  CHECK(srv->stats().connections_closed_for_bad_input == 0);
}

TEST_CASE("WaitIsWokenBySetFromAnotherClient", "[server]") {
  const int io_threads = GENERATE(1, 4);
  auto srv = start_server({}, io_threads);
  client::StoreClient waiter(client_opts(srv->port()));
  auto fut = std::async(std::launch::async, [&] { return waiter.get("late"); });
  client::StoreClient setter(client_opts(srv->port()));
  // The waiter may or may not have registered yet; either way it must see the value.
  setter.set("late", "here");
  CHECK(fut.get() == "here");
}

TEST_CASE("WaitTimeoutCancelsAndKeepsTheConnectionUsable", "[server]") {
  const int io_threads = GENERATE(1, 4);
  auto srv = start_server({}, io_threads);
  client::StoreClient c(client_opts(srv->port()));
  CHECK_THROWS_AS(c.wait({"never"}, 50ms), client::StoreTimeout);
  c.set("after", "ok");
  CHECK(c.get("after") == "ok");
  client::StoreClient other(client_opts(srv->port()));
  other.set("never", "now");  // must not send a stray byte to `c`
  CHECK(c.add("cnt", 1) == 1);
}

TEST_CASE("LegacyDialectClientWorks", "[server]") {
  auto srv = start_server();
  client::StoreClient c(client_opts(srv->port(), wire::Dialect::D0));
  c.set("k", "v");
  CHECK(c.get("k") == "v");
  CHECK(c.add("init", 1) == 1);
  CHECK(c.compare_set("k", "v", "w") == "w");
  client::StoreClient d2(client_opts(srv->port()));
  CHECK(d2.get("k") == "w");  // one keyspace for every dialect
}

TEST_CASE("ByteByByteFragmentationIsParsed", "[server]") {
  const int io_threads = GENERATE(1, 4);
  auto srv = start_server({}, io_threads);
  Raw r(srv->port());
  std::string req = validate();
  wire::Request add;
  add.op = wire::Op::Add;
  add.keys = {"/frag"};
  add.number = 41;
  wire::encode_request(wire::Dialect::D2, add, req);
  for (char ch : req) r.send(std::string(1, ch));
  auto [bytes, eof] = r.recv_for(2s, 8);
  REQUIRE(bytes.size() == 8);
  CHECK(wire::load_u64(reinterpret_cast<const uint8_t*>(bytes.data())) == 41);
}

TEST_CASE("PipelinedRequestsAreAnsweredInOrderTheLastOneToo", "[server]") {
  const int io_threads = GENERATE(1, 4);
  auto srv = start_server({}, io_threads);
  Raw r(srv->port());
  std::string req = validate();
  wire::Request set;
  set.op = wire::Op::Set;
  set.keys = {"/pipe/value"};
  set.values = {"v"};
  wire::encode_request(wire::Dialect::D2, set, req);
  constexpr int kAdds = 40;
  for (int i = 0; i < kAdds; ++i) {
    wire::Request add;
    add.op = wire::Op::Add;
    add.keys = {"/pipe/ctr"};
    add.number = 1;
    wire::encode_request(wire::Dialect::D2, add, req);
  }
  wire::Request get;
  get.op = wire::Op::Get;
  get.keys = {"/pipe/value"};
  wire::encode_request(wire::Dialect::D2, get, req);
  r.send(req);
  const size_t want = kAdds * 8 + 8 + 1;
  auto [bytes, eof] = r.recv_for(5s, want);
  REQUIRE(bytes.size() == want);
  const auto* p = reinterpret_cast<const uint8_t*>(bytes.data());
  for (int i = 0; i < kAdds; ++i) CHECK(wire::load_u64(p + 8 * i) == static_cast<uint64_t>(i + 1));
  CHECK(wire::load_u64(p + 8 * kAdds) == 1);
  CHECK(bytes.back() == 'v');
}

TEST_CASE("AReplyComesBeforeTheWatchEventItsOwnRequestCaused", "[server]") {
  // A 1.13 (D0) connection watching a key writes it itself: its COMPARE_SET's reply, then the
  // event, as a server that applies requests one by one sends them.
  auto srv = start_server();
  Raw r(srv->port());
  wire::Request watch;
  watch.op = wire::Op::WatchKey;
  watch.keys = {"/watched"};
  std::string req;
  wire::encode_request(wire::Dialect::D0, watch, req);
  r.send(req);
  auto [ack, eof] = r.recv_for(5s, 1);
  REQUIRE(ack == std::string(1, '\3'));
  wire::Request cas;
  cas.op = wire::Op::CompareSet;
  cas.keys = {"/watched"};
  cas.values = {"", "v1"};
  req.clear();
  wire::encode_request(wire::Dialect::D0, cas, req);
  r.send(req);
  std::string expected;
  wire::Writer(expected).blob("v1").u8(wire::kWatchKeyCreated).blob("/watched").blob("").blob("v1");
  auto [bytes, eof2] = r.recv_for(5s, expected.size());
  CHECK(bytes == expected);
}

TEST_CASE("HostileClientsLoseOnlyTheirOwnConnection", "[server][robustness]") {
  wire::Limits lim;
  lim.max_key_len = 1024;
  auto srv = start_server(lim, GENERATE(1, 4));
  client::StoreClient good(client_opts(srv->port()));
  good.set("alive", "yes");

  auto bad_case = [&](const std::string& name, const std::string& bytes) {
    INFO(name);
    Raw r(srv->port());
    r.send(bytes);
    auto [got, eof] = r.recv_for(3s);
    CHECK(eof);
    CHECK(good.get("alive") == "yes");
  };
  std::string s;
  bad_case("unknown command", validate() + std::string(1, '\x63'));
  s = validate();
  wire::Writer(s).u8(3).u64(uint64_t(1) << 60);
  bad_case("absurd length prefix 2^60", s);
  s = validate();
  wire::Writer(s).u8(3).blob(std::string(2000, 'k'));
  bad_case("key over the limit", s);
  s = validate();
  wire::Writer(s).u8(1).blob("/txt").blob("abc").u8(4).blob("/txt").i64(1);
  bad_case("non-numeric ADD", s);
  s = validate() + validate();
  bad_case("second VALIDATE", s);
  s.clear();
  wire::Writer(s).u8(0).u32(0xdeadbeef);
  bad_case("bad magic (read as a legacy SET with an absurd key)", s);

  {  // disconnect mid-request
    Raw r(srv->port());
    std::string part = validate();
    wire::Writer(part).u8(1).u64(100).u8('x');
    r.send(part);
  }
  {  // disconnect while waiting
    Raw r(srv->port());
    std::string w = validate();
    wire::Writer(w).u8(6).u64(1).blob("/never");
    r.send(w);
  }
  good.set("never", "set");  // no crash writing to a vanished waiter
  CHECK(good.get("alive") == "yes");
  CHECK(srv->stats().connections_closed_for_bad_input >= 6);
}

TEST_CASE("ResetKeyspaceEmptiesTheStoreAndDropsClients", "[server]") {
  const int io_threads = GENERATE(1, 4);
  auto srv = start_server({}, io_threads);
  auto c = std::make_unique<client::StoreClient>(client_opts(srv->port()));
  c->set("old", "attempt0");
  srv->reset_keyspace();
  CHECK_THROWS_AS(c->get_nowait("old"), client::StoreError);
  client::StoreClient fresh(client_opts(srv->port()));
  CHECK(fresh.num_keys() == 0);
}

TEST_CASE("JoinStormOf300Clients", "[server]") {
  const int io_threads = GENERATE(1, 4);
  auto srv = start_server({}, io_threads);
  constexpr int kClients = 300;
  std::vector<std::unique_ptr<client::StoreClient>> clients;
  for (int i = 0; i < kClients; ++i) clients.push_back(std::make_unique<client::StoreClient>(client_opts(srv->port())));
  std::vector<std::thread> threads;
  std::atomic<int> released{0};
  for (int i = 0; i < kClients; ++i) {
    threads.emplace_back([&, i] {
      if (clients[i]->add("joined", 1) == kClients) clients[i]->set("last", "1");
      clients[i]->wait({"last"});
      ++released;
    });
  }
  for (auto& t : threads) t.join();
  CHECK(released == kClients);
  CHECK(srv->stats().connections_open == kClients);
}

TEST_CASE("ConnectRetriesUntilTheServerComesUp", "[server]") {
  // Reserve a free port, release it, then start the server there after the client began.
  uint16_t port;
  {
    auto probe = start_server();
    port = probe->port();
  }
  auto fut = std::async(std::launch::async, [&] {
    client::StoreClient c(client_opts(port));
    return c.add("x", 1);
  });
  std::this_thread::sleep_for(100ms);  // let the client see ECONNREFUSED at least once
  server::StoreServerOptions o;
  o.host = "127.0.0.1";
  o.port = port;
  server::StoreServer srv(o);
  srv.start();
  CHECK(fut.get() == 1);
}

TEST_CASE("ASocketConnectedToItselfIsSeenAsNoServer", "[server]") {
  // What a client retrying against a local port with no listener can get: the kernel picks the
  // destination port as the source port, and TCP's simultaneous open connects the two.
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  REQUIRE(fd >= 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  REQUIRE(::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0);
  socklen_t len = sizeof a;
  REQUIRE(::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len) == 0);
  REQUIRE(::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0);
  CHECK(client::connected_to_itself(fd));
  ::close(fd);
  // A real connection is not.
  auto srv = start_server();
  std::string error;
  const int c = client::connect_tcp("127.0.0.1", srv->port(), error);
  REQUIRE(c >= 0);
  CHECK_FALSE(client::connected_to_itself(c));
  ::close(c);
}

TEST_CASE("ConnectFailureSaysWhatToCheck", "[server]") {
  const testing::DeadPort dead;
  auto o = client_opts(dead.port());
  o.connect_timeout = 200ms;
  try {
    client::StoreClient c(o);
    FAIL("connected to nothing");
  } catch (const client::StoreError& e) {
    CHECK_THAT(e.what(), Catch::Contains("cannot connect to the store at 127.0.0.1"));
  }
}

TEST_CASE("WorldSizeOptionAddsToInitLikePyTorch", "[server]") {
  auto srv = start_server();
  auto o = client_opts(srv->port());
  o.world_size = 2;
  client::StoreClient a(o), b(o);
  auto raw = client_opts(srv->port());
  raw.pytorch_key_prefix = false;
  client::StoreClient r(raw);
  CHECK(r.get("init/") == "2");
}

// ---- several I/O threads: connections on different threads share one keyspace ----

TEST_CASE("AddsFromManyThreadsAreAtomicAcrossIoThreads", "[server][threads]") {
  auto srv = start_server({}, 4);
  REQUIRE(srv->io_threads() == 4);
  constexpr int kClients = 16, kAdds = 300;
  std::vector<std::vector<int64_t>> seen(kClients);
  std::vector<std::thread> threads;
  for (int i = 0; i < kClients; ++i) {
    threads.emplace_back([&, i] {
      client::StoreClient c(client_opts(srv->port()));
      for (int k = 0; k < kAdds; ++k) seen[i].push_back(c.add("ctr", 1));
    });
  }
  for (auto& t : threads) t.join();
  std::vector<int64_t> all;
  for (auto& v : seen) all.insert(all.end(), v.begin(), v.end());
  std::sort(all.begin(), all.end());
  REQUIRE(all.size() == size_t{kClients * kAdds});
  for (size_t i = 0; i < all.size(); ++i) REQUIRE(all[i] == static_cast<int64_t>(i + 1));  // each value once
}

TEST_CASE("WaitWakeUpsHopAcrossIoThreads", "[server][threads]") {
  // A ring: client i sets its successor's key of round r, then waits for its own. Every hop
  // crosses from one connection's thread to another's.
  auto srv = start_server({}, 4);
  constexpr int kRing = 8, kRounds = 100;
  std::vector<std::thread> threads;
  std::atomic<int> done{0}, wrong{0};  // Catch2 assertions stay on the test's thread
  for (int i = 0; i < kRing; ++i) {
    threads.emplace_back([&, i] {
      client::StoreClient c(client_opts(srv->port()));
      for (int r = 0; r < kRounds; ++r) {
        c.set("w/" + std::to_string(r) + "/" + std::to_string((i + 1) % kRing), std::to_string(i));
        if (c.get("w/" + std::to_string(r) + "/" + std::to_string(i)) != std::to_string((i + kRing - 1) % kRing))
          ++wrong;
      }
      ++done;
    });
  }
  for (auto& t : threads) t.join();
  CHECK(done == kRing);
  CHECK(wrong == 0);
}

TEST_CASE("WakeUpAndCancelWaitRacingOnDifferentThreadsKeepTheReplyOrder", "[server][threads]") {
  // The waiter times out (CANCEL_WAIT) at about the moment another connection, served by
  // another I/O thread, sets the key. Whatever wins, the waiter must read STOP_WAITING before
  // WAIT_CANCELED, or its next reply would be misread: every later add() checks that.
  auto srv = start_server({}, 4);
  client::StoreClient waiter(client_opts(srv->port()));
  client::StoreClient setter(client_opts(srv->port()));
  int timeouts = 0, wakes = 0;
  for (int i = 0; i < 200; ++i) {
    const std::string key = "race/" + std::to_string(i);
    auto fut = std::async(std::launch::async, [&] {
      std::this_thread::sleep_for(std::chrono::microseconds((i % 13) * 300));  // 0 .. 3.6 ms
      setter.set(key, "v");
    });
    try {
      waiter.wait({key}, 2ms);
      ++wakes;
    } catch (const client::StoreTimeout&) {
      ++timeouts;
    }
    fut.get();
    REQUIRE(waiter.add("sanity", 1) == i + 1);
  }
  INFO("wakes " << wakes << ", timeouts " << timeouts);
  CHECK(wakes + timeouts == 200);
  CHECK(wakes > 0);  // the delays straddle the timeout: both outcomes, and races between them
  CHECK(timeouts > 0);
}

TEST_CASE("APortInUseFailsWithEaddrinuseWhateverTheThreadCount", "[server][threads]") {
  // Several I/O threads listen as a SO_REUSEPORT group; a second server must still be refused
  // the port, not silently join the group and split the clients between two keyspaces.
  const int first_threads = GENERATE(1, 4);
  const int second_threads = GENERATE(1, 4);
  auto first = start_server({}, first_threads);
  server::StoreServerOptions o;
  o.host = "127.0.0.1";
  o.port = first->port();
  o.io_threads = second_threads;
  server::StoreServer second(o);
  try {
    second.start();
    FAIL("a second server bound the busy port " << o.port);
  } catch (const std::system_error& e) {
    CHECK(e.code().value() == EADDRINUSE);
  }
  client::StoreClient c(client_opts(first->port()));  // the first one still serves
  CHECK(c.add("k", 1) == 1);
}

// An idle connection costs about 9 KiB in a memory cgroup (the kernel's socket, the server's
// objects, its first input buffer), and a client may open tens of thousands: each is charged
// to the memory budget while open, so past it new ones are refused at accept rather than
// outgrowing a memory limit. A 1 MiB budget (and its reserve of an eighth for small holders)
// holds fewer than 100 at 12 KiB each; their input buffers alone (4 KiB) would let 288 in.
TEST_CASE("IdleConnectionsCountInTheMemoryBudget", "[server][memory]") {
  server::StoreServerOptions o;
  o.host = "127.0.0.1";
  o.port = 0;
  o.limits.max_key_len = 1024;
  o.limits.max_value_len = 1024;
  o.limits.max_request_bytes = 4096;
  o.store.max_reply_bytes = 4096;
  o.max_memory = 1 << 20;
  server::StoreServer srv(o);
  srv.start();
  std::vector<std::unique_ptr<Raw>> idle;
  for (int i = 0; i < 200; ++i) {
    idle.push_back(std::make_unique<Raw>(srv.port()));
    idle.back()->send(validate());
  }
  // Every connection was accepted or refused once the server has read all the VALIDATEs:
  // a client connecting last is answered or refused after them (a hang guard, not a timing).
  const auto deadline = std::chrono::steady_clock::now() + 10s;
  while (srv.stats().connections_accepted + srv.metrics().closed_for_memory < 200 &&
         std::chrono::steady_clock::now() < deadline)
    std::this_thread::sleep_for(10ms);
  const uint64_t refused = srv.metrics().closed_for_memory;
  CHECK(refused > 100);
  size_t closed = 0;  // the refused ones: their end is closed by now (loopback)
  for (auto& r : idle) {
    pollfd p{r->fd, POLLIN, 0};
    char byte;
    closed += ::poll(&p, 1, 0) == 1 && ::recv(r->fd, &byte, 1, 0) <= 0;
  }
  CHECK(closed == refused);
  idle.clear();
  // Once they go, the budget is free again.
  client::StoreClient c(client_opts(srv.port()));
  c.set("after", "ok");
  CHECK(c.get("after") == "ok");
}
