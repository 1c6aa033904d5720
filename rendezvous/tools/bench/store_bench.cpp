// ddprun_store_bench: a TCPStore load generator built on ddprun's wire codec. Many
// connections from ONE process (epoll over non-blocking sockets, on --threads T threads that
// share the connections out; default 1), so the client is not the bottleneck: on a small
// machine one thread, on a many-core host as many as it takes to saturate the server. Works
// against any TCPStore server that speaks dialect D2 (ddprund, PyTorch 2.2+) or D0 (PyTorch 1.13).
//
//   ddprun_store_bench ops   --port P --op get|add|compare_set|wait --clients N --seconds S
//   ddprun_store_bench storm --port P --clients N [--timeout S]
//   common: --host H (default 127.0.0.1) --dialect D2|D0 --tag T (key namespace) --threads T
//           --source-ips K (connect from 127.0.1.1..K, like clients on K hosts; loopback only)
//
// ops: every connection runs a closed loop of one operation, like a PyTorch client would:
//   get = WAIT(k) + GET(k) (PyTorch's get()), add = ADD, compare_set = COMPARE_SET (always the
//   success branch, alternating values), wait = a wake-up hop: connection i SETs its
//   successor's key of round r, then WAITs for its own key of round r (set by its predecessor)
//   and GETs it; latency = from the predecessor's SET to this connection's wake-up. With
//   several threads each thread's connections form their own ring.
// storm: N connections connect at once, handshake (VALIDATE+PING on D2), ADD a counter, WAIT
//   on a last-worker key which the connection whose ADD returns N sets; the time until all N
//   are released. Resets/refusals/EOFs are counted (the goal is zero).
//
// Output: one line "RESULT key=value ..." (machine-readable), plus a human line on stderr.
#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/epoll.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <memory>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

#include "ddprun/wire/codec.h"

namespace {

using Clock = std::chrono::steady_clock;
using ddprun::wire::Dialect;
using ddprun::wire::Op;

enum class Reply : uint8_t { None, U8, U32, I64, Blob };

struct Conn {
  int fd = -1;
  int idx = 0;
  bool connected = false, done = false, failed = false, want_out = false;
  std::string out;
  size_t out_off = 0;
  std::vector<uint8_t> in;
  Reply expect = Reply::None;
  int step = 0;
  int64_t round = 0;
  Clock::time_point t0;
  std::string value;  // compare_set: current value
};

struct Options {
  std::string mode, host = "127.0.0.1", op = "get", tag = "bench";
  uint16_t port = 0;
  int clients = 1;
  int threads = 1;
  int source_ips = 0;  // 0: the kernel's choice (127.0.0.1); K: 127.0.1.1 .. 127.0.1.K
  double seconds = 3, timeout = 60;
  Dialect dialect = Dialect::D2;
  bool verbose = false;
};

struct Stats {
  uint64_t resets = 0, refused = 0, eof = 0, other_errors = 0;
  std::vector<uint32_t> lat_ns;
  uint64_t ops = 0;
  void add(const Stats& o) {
    resets += o.resets;
    refused += o.refused;
    eof += o.eof;
    other_errors += o.other_errors;
    ops += o.ops;
    lat_ns.insert(lat_ns.end(), o.lat_ns.begin(), o.lat_ns.end());
  }
};

[[noreturn]] void die(const std::string& msg) {
  std::fprintf(stderr, "ddprun_store_bench: %s\n", msg.c_str());
  std::exit(2);
}

std::string encode(Dialect d, Op op, std::vector<std::string> keys, std::vector<std::string> values = {},
                   int64_t number = 0, uint32_t u32 = 0) {
  ddprun::wire::Request r;
  r.op = op;
  r.keys = std::move(keys);
  r.values = std::move(values);
  r.number = number;
  r.u32 = u32;
  std::string out;
  if (!ddprun::wire::encode_request(d, r, out)) die(std::string("dialect cannot encode ") + ddprun::wire::op_name(op));
  return out;
}

class Bench {
 public:
  // This generator's share: connections [base, base + count) of o.clients.
  Bench(Options o, int base, int count) : o_(std::move(o)), base_(base), count_(count) {
    ep_ = epoll_create1(EPOLL_CLOEXEC);
    if (ep_ < 0) die("epoll_create1 failed");
    addr_.sin_family = AF_INET;
    addr_.sin_port = htons(o_.port);
    if (inet_pton(AF_INET, o_.host.c_str(), &addr_.sin_addr) != 1) die("--host must be an IPv4 address");
  }

  // Opens n non-blocking connections at once.
  void open_all(int n) {
    conns_.resize(static_cast<size_t>(n));
    for (int i = 0; i < n; ++i) {
      Conn& c = conns_[static_cast<size_t>(i)];
      c.idx = i;
      c.fd = ::socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
      if (c.fd < 0) die(std::string("socket: ") + std::strerror(errno));
      int one = 1;
      setsockopt(c.fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
      if (o_.source_ips > 0) {
        // Like clients on many hosts: source 127.0.1.(1 + i mod K). The kernel's ephemeral
        // port search per connect() grows with the connections one source address already
        // has to the same destination; spread, connect() costs what it does across hosts.
        setsockopt(c.fd, IPPROTO_IP, IP_BIND_ADDRESS_NO_PORT, &one, sizeof one);
        sockaddr_in src{};
        src.sin_family = AF_INET;
        src.sin_addr.s_addr = htonl((127u << 24) | (1u << 8) | (1u + static_cast<uint32_t>((base_ + i) % o_.source_ips)));
        if (::bind(c.fd, reinterpret_cast<sockaddr*>(&src), sizeof src) != 0) die(std::string("bind: ") + std::strerror(errno));
      }
      int rc = ::connect(c.fd, reinterpret_cast<sockaddr*>(&addr_), sizeof addr_);
      if (rc < 0 && errno != EINPROGRESS) {
        fail(c, errno);
        continue;
      }
      epoll_event ev{};
      ev.events = EPOLLIN | EPOLLOUT;
      ev.data.u32 = static_cast<uint32_t>(i);
      epoll_ctl(ep_, EPOLL_CTL_ADD, c.fd, &ev);
      c.want_out = true;
    }
  }

  int count() const { return count_; }
  uint64_t failures() const { return st_.resets + st_.refused + st_.eof + st_.other_errors; }

  void close_all() {
    for (auto& c : conns_)
      if (c.fd >= 0) {
        ::close(c.fd);
        c.fd = -1;
      }
  }

  // Runs the loop until pred() or the deadline; returns false on deadline.
  template <typename Pred>
  bool loop(Clock::time_point deadline, Pred pred) {
    std::vector<epoll_event> evs(1024);
    while (!pred()) {
      auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count();
      if (left <= 0) return false;
      int n = epoll_wait(ep_, evs.data(), static_cast<int>(evs.size()), static_cast<int>(std::min<long long>(left, 100)));
      if (n < 0) {
        if (errno == EINTR) continue;
        die("epoll_wait failed");
      }
      for (int i = 0; i < n; ++i) {
        Conn& c = conns_[evs[static_cast<size_t>(i)].data.u32];
        if (c.fd < 0) continue;
        if (!c.connected && (evs[static_cast<size_t>(i)].events & (EPOLLOUT | EPOLLERR | EPOLLHUP))) {
          int err = 0;
          socklen_t len = sizeof err;
          getsockopt(c.fd, SOL_SOCKET, SO_ERROR, &err, &len);
          if (err) {
            fail(c, err);
            continue;
          }
          c.connected = true;
          ++connected_;
          on_connected(c);
          if (c.fd < 0) continue;
          flush(c);
          continue;
        }
        if (evs[static_cast<size_t>(i)].events & EPOLLOUT) flush(c);
        if (c.fd >= 0 && (evs[static_cast<size_t>(i)].events & (EPOLLIN | EPOLLERR | EPOLLHUP))) readable(c);
      }
    }
    return true;
  }

  Options o_;
  int base_ = 0, count_ = 1;
  Stats st_;
  std::vector<Conn> conns_;
  int connected_ = 0, finished_ = 0;
  Clock::time_point stop_at_;
  bool stopping_ = false;
  // storm
  int released_ = 0, handshaken_storm_ = 0, added_ = 0;
  // wait hops: time of SET of (round, setter)
  std::unordered_map<uint64_t, Clock::time_point> set_time_;

 private:
  void fail(Conn& c, int err) {
    if (err == ECONNRESET || err == EPIPE) ++st_.resets;
    else if (err == ECONNREFUSED) ++st_.refused;
    else if (err == 0) ++st_.eof;
    else ++st_.other_errors;
    if (st_.resets + st_.refused + st_.eof + st_.other_errors <= 5)
      std::fprintf(stderr, "connection %d failed: %s\n", c.idx, err ? std::strerror(err) : "EOF from server");
    if (c.fd >= 0) ::close(c.fd);
    c.fd = -1;
    c.failed = true;
    if (!c.done) {
      c.done = true;
      ++finished_;
    }
  }

  void send(Conn& c, const std::string& bytes, Reply expect) {
    c.out += bytes;
    c.expect = expect;
    flush(c);
  }

  void flush(Conn& c) {
    while (c.fd >= 0 && c.out_off < c.out.size()) {
      ssize_t n = ::send(c.fd, c.out.data() + c.out_off, c.out.size() - c.out_off, MSG_NOSIGNAL);
      if (n < 0) {
        if (errno == EINTR) continue;
        if (errno == EAGAIN) break;
        fail(c, errno);
        return;
      }
      c.out_off += static_cast<size_t>(n);
    }
    if (c.fd < 0) return;
    if (c.out_off == c.out.size()) {
      c.out.clear();
      c.out_off = 0;
    }
    bool want = !c.out.empty() || !c.connected;
    if (want != c.want_out) {
      epoll_event ev{};
      ev.events = EPOLLIN | (want ? EPOLLOUT : 0u);
      ev.data.u32 = static_cast<uint32_t>(c.idx);
      epoll_ctl(ep_, EPOLL_CTL_MOD, c.fd, &ev);
      c.want_out = want;
    }
  }

  // Size of a complete reply at the front of c.in, or 0.
  static size_t complete(const Conn& c) {
    const size_t n = c.in.size();
    switch (c.expect) {
      case Reply::U8: return n >= 1 ? 1 : 0;
      case Reply::U32: return n >= 4 ? 4 : 0;
      case Reply::I64: return n >= 8 ? 8 : 0;
      case Reply::Blob: {
        if (n < 8) return 0;
        uint64_t len = ddprun::wire::load_u64(c.in.data());
        return n >= 8 + len ? 8 + len : 0;
      }
      case Reply::None: return 0;
    }
    return 0;
  }

  void readable(Conn& c) {
    uint8_t buf[65536];
    while (c.fd >= 0) {
      ssize_t n = ::recv(c.fd, buf, sizeof buf, 0);
      if (n == 0) {
        fail(c, 0);
        return;
      }
      if (n < 0) {
        if (errno == EINTR) continue;
        if (errno == EAGAIN) break;
        fail(c, errno);
        return;
      }
      c.in.insert(c.in.end(), buf, buf + n);
    }
    while (c.fd >= 0 && !c.done) {
      size_t sz = complete(c);
      if (!sz) break;
      std::string reply(c.in.begin(), c.in.begin() + static_cast<long>(sz));
      c.in.erase(c.in.begin(), c.in.begin() + static_cast<long>(sz));
      c.expect = Reply::None;
      on_reply(c, reply);
    }
  }

  std::string k(const std::string& s) const { return "/" + o_.tag + "/" + s; }

  void on_connected(Conn& c) {
    if (o_.dialect == Dialect::D2) {
      // VALIDATE + PING in one write, like PyTorch 2.6+ clients.
      std::string hello = encode(o_.dialect, Op::Validate, {}, {}, 0, ddprun::wire::kValidateMagic) +
                          encode(o_.dialect, Op::Ping, {}, {}, 0, 0x1000u + static_cast<uint32_t>(c.idx));
      c.step = -1;
      send(c, hello, Reply::U32);
    } else {
      start(c);
    }
  }


 public:
  Clock::time_point t_begin_ = Clock::now();
  void stage(const char* what) {
    if (!o_.verbose) return;
    std::fprintf(stderr, "  +%.3f s: %s\n", std::chrono::duration<double>(Clock::now() - t_begin_).count(), what);
  }

 private:
  void start(Conn& c) {
    ++handshaken_storm_;
    if (o_.mode == "storm" && handshaken_storm_ == count_) stage("all connected and handshaken");
    if (o_.mode == "storm") {
      c.step = 0;
      send(c, encode(o_.dialect, Op::Add, {k("storm/count")}, {}, 1), Reply::I64);
      return;
    }
    ready_ops(c);
  }

 public:
  int handshaken_ = 0;
  bool go_ = false;
  std::vector<int> parked_;
  void go() {
    go_ = true;
    for (int i : parked_) next_op(conns_[static_cast<size_t>(i)]);
    parked_.clear();
  }

 private:
  void ready_ops(Conn& c) {
    ++handshaken_;
    // Setup before the clock starts (SET has no reply; the server handles it before the
    // next request of this connection).
    if (o_.op == "compare_set") {
      c.value = "x";
      send(c, encode(o_.dialect, Op::Set, {k("cas/" + std::to_string(base_ + c.idx))}, {"x"}), Reply::None);
    } else if (o_.op == "get") {
      send(c, encode(o_.dialect, Op::Set, {k("key")}, {std::string(32, 'v')}), Reply::None);
    }
    if (go_) next_op(c);
    else parked_.push_back(c.idx);
  }

  void next_op(Conn& c) {
    if (stopping_ || Clock::now() >= stop_at_) {
      stopping_ = true;
      if (!c.done) {
        c.done = true;
        ++finished_;
      }
      return;
    }
    c.t0 = Clock::now();
    c.step = 0;
    const Dialect d = o_.dialect;
    if (o_.op == "get") {
      send(c, encode(d, Op::Wait, {k("key")}), Reply::U8);
    } else if (o_.op == "add") {
      send(c, encode(d, Op::Add, {k("ctr")}, {}, 1), Reply::I64);
    } else if (o_.op == "compare_set") {
      std::string desired = c.value == "x" ? "y" : "x";
      send(c, encode(d, Op::CompareSet, {k("cas/" + std::to_string(base_ + c.idx))}, {c.value, desired}), Reply::Blob);
    } else {  // wait hop
      const int n = count_;
      const int succ = (c.idx + 1) % n;
      set_time_[static_cast<uint64_t>(c.round) * static_cast<uint64_t>(n) + static_cast<uint64_t>(c.idx)] = Clock::now();
      std::string bytes = encode(d, Op::Set, {k("w/" + std::to_string(c.round) + "/" + std::to_string(base_ + succ))}, {"1"});
      bytes += encode(d, Op::Wait, {k("w/" + std::to_string(c.round) + "/" + std::to_string(base_ + c.idx))});
      send(c, bytes, Reply::U8);
    }
  }

  void record(Clock::time_point from) {
    auto ns = std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now() - from).count();
    st_.lat_ns.push_back(static_cast<uint32_t>(std::min<long long>(ns, 0xffffffffLL)));
    ++st_.ops;
  }

  void on_reply(Conn& c, const std::string& reply) {
    if (c.step == -1) {  // PING echo
      if (ddprun::wire::load_u32(reinterpret_cast<const uint8_t*>(reply.data())) != 0x1000u + static_cast<uint32_t>(c.idx))
        die("PING echo mismatch");
      start(c);
      return;
    }
    if (o_.mode == "storm") {
      if (c.step == 0) {  // ADD reply
        ++added_;
        if (added_ == count_) stage("all ADD replies received");
        int64_t v = static_cast<int64_t>(ddprun::wire::load_u64(reinterpret_cast<const uint8_t*>(reply.data())));
        std::string bytes;
        if (v == o_.clients) bytes = encode(o_.dialect, Op::Set, {k("storm/last_worker")}, {"1"});
        bytes += encode(o_.dialect, Op::Wait, {k("storm/last_worker")});
        c.step = 1;
        send(c, bytes, Reply::U8);
      } else {
        c.done = true;
        ++released_;
        ++finished_;
      }
      return;
    }
    const Dialect d = o_.dialect;
    if (o_.op == "get") {
      if (c.step == 0) {
        c.step = 1;
        send(c, encode(d, Op::Get, {k("key")}), Reply::Blob);
        return;
      }
      record(c.t0);
    } else if (o_.op == "add") {
      record(c.t0);
    } else if (o_.op == "compare_set") {
      std::string desired = c.value == "x" ? "y" : "x";
      if (reply.substr(8) != desired) die("compare_set did not take the success branch: got '" + reply.substr(8) + "'");
      c.value = desired;
      record(c.t0);
    } else {  // wait hop: WAIT done, now GET the value like PyTorch's get()
      if (c.step == 0) {
        c.step = 1;
        send(c, encode(d, Op::Get, {k("w/" + std::to_string(c.round) + "/" + std::to_string(base_ + c.idx))}), Reply::Blob);
        return;
      }
      const int n = count_;
      const int pred = (c.idx + n - 1) % n;
      auto key = static_cast<uint64_t>(c.round) * static_cast<uint64_t>(n) + static_cast<uint64_t>(pred);
      auto it = set_time_.find(key);
      if (it != set_time_.end()) {
        record(it->second);
        set_time_.erase(it);
      }
      ++c.round;
    }
    next_op(c);
  }

  int ep_ = -1;
  sockaddr_in addr_{};
};

double pct(std::vector<uint32_t>& v, double p) {
  if (v.empty()) return 0;
  size_t i = static_cast<size_t>(p * static_cast<double>(v.size() - 1));
  std::nth_element(v.begin(), v.begin() + static_cast<long>(i), v.end());
  return v[i] / 1000.0;
}

int raise_fd_limit(int need) {
  rlimit rl{};
  getrlimit(RLIMIT_NOFILE, &rl);
  if (rl.rlim_cur < rl.rlim_max) {
    rl.rlim_cur = rl.rlim_max;
    setrlimit(RLIMIT_NOFILE, &rl);
  }
  getrlimit(RLIMIT_NOFILE, &rl);
  (void)need;
  return static_cast<int>(std::min<rlim_t>(rl.rlim_cur, 1 << 30));
}

const char* dname(Dialect d) { return d == Dialect::D0 ? "D0" : "D2"; }

// The connections [base, base + count) of each of o.threads generators.
std::vector<std::pair<int, int>> shares(const Options& o) {
  std::vector<std::pair<int, int>> out;
  const int t = std::max(1, std::min(o.threads, o.clients));
  for (int i = 0, base = 0; i < t; ++i) {
    const int count = o.clients / t + (i < o.clients % t ? 1 : 0);
    out.emplace_back(base, count);
    base += count;
  }
  return out;
}

// A start line every generator thread waits at, so the clock starts for all at once.
class StartLine {
 public:
  explicit StartLine(int n) : waiting_(n) {}
  void arrive_and_wait() {
    waiting_.fetch_sub(1);
    while (!go_.load()) std::this_thread::sleep_for(std::chrono::microseconds(200));
  }
  void wait_all_arrived() const {
    while (waiting_.load() > 0) std::this_thread::sleep_for(std::chrono::microseconds(200));
  }
  void go() { go_ = true; }

 private:
  std::atomic<int> waiting_;
  std::atomic<bool> go_{false};
};

int run_ops(const Options& o) {
  auto parts = shares(o);
  std::vector<std::unique_ptr<Bench>> benches;
  for (auto [base, count] : parts) benches.push_back(std::make_unique<Bench>(o, base, count));
  StartLine line(static_cast<int>(parts.size()));
  std::atomic<bool> setup_failed{false};
  Clock::time_point t0, stop_at;
  std::vector<std::thread> threads;
  for (size_t i = 0; i < benches.size(); ++i) {
    threads.emplace_back([&, i] {
      Bench& b = *benches[i];
      b.stop_at_ = Clock::now() + std::chrono::hours(1);
      b.open_all(b.count());
      // Setup: connect + handshake every connection before the clock starts.
      auto setup_deadline = Clock::now() + std::chrono::seconds(30);
      if (!b.loop(setup_deadline, [&] { return b.handshaken_ + static_cast<int>(b.failures()) >= b.count(); }))
        setup_failed = true;
      line.arrive_and_wait();
      if (setup_failed) return;
      b.stop_at_ = stop_at;
      b.go();
      // Ops in flight at the deadline finish within a second; wait hops whose predecessor
      // stopped never would, so the loop ends there regardless.
      b.loop(b.stop_at_ + std::chrono::seconds(1), [&] { return b.finished_ >= b.count(); });
    });
  }
  line.wait_all_arrived();
  t0 = Clock::now();
  stop_at = t0 + std::chrono::microseconds(static_cast<long long>(o.seconds * 1e6));
  line.go();
  for (auto& t : threads) t.join();
  if (setup_failed) die("setup did not finish in 30 s");
  double elapsed = std::chrono::duration<double>(std::min(Clock::now(), stop_at) - t0).count();
  Stats all;
  for (auto& b : benches) all.add(b->st_);
  std::printf("RESULT mode=ops op=%s clients=%d threads=%zu dialect=%s seconds=%.2f ops=%llu ops_per_s=%.0f p50_us=%.1f "
              "p99_us=%.1f resets=%llu refused=%llu eof=%llu errors=%llu\n",
              o.op.c_str(), o.clients, parts.size(), dname(o.dialect), elapsed, static_cast<unsigned long long>(all.ops),
              all.ops / elapsed, pct(all.lat_ns, 0.5), pct(all.lat_ns, 0.99), static_cast<unsigned long long>(all.resets),
              static_cast<unsigned long long>(all.refused), static_cast<unsigned long long>(all.eof),
              static_cast<unsigned long long>(all.other_errors));
  std::fflush(stdout);
  for (auto& b : benches) b->close_all();
  return 0;
}

int run_storm(const Options& o) {
  const int limit = raise_fd_limit(o.clients + 64);
  if (o.clients + 64 > limit) {
    std::printf("RESULT mode=storm clients=%d skipped=1 reason=fd_limit_%d\n", o.clients, limit);
    return 0;
  }
  auto parts = shares(o);
  std::vector<std::unique_ptr<Bench>> benches;
  for (auto [base, count] : parts) benches.push_back(std::make_unique<Bench>(o, base, count));
  StartLine line(static_cast<int>(parts.size()));
  Clock::time_point t0;
  std::atomic<int> completed{0};
  std::vector<std::thread> threads;
  for (size_t i = 0; i < benches.size(); ++i) {
    threads.emplace_back([&, i] {
      Bench& b = *benches[i];
      line.arrive_and_wait();
      b.t_begin_ = t0;
      b.stage("past the start line");
      b.open_all(b.count());
      b.stage("every connect() issued");
      if (b.loop(t0 + std::chrono::microseconds(static_cast<long long>(o.timeout * 1e6)),
                 [&] { return b.finished_ >= b.count(); }))
        ++completed;
    });
  }
  line.wait_all_arrived();
  t0 = Clock::now();
  line.go();
  for (auto& t : threads) t.join();
  double secs = std::chrono::duration<double>(Clock::now() - t0).count();
  Stats all;
  int released = 0, connected = 0, handshaken = 0, added = 0;
  for (auto& b : benches) {
    all.add(b->st_);
    released += b->released_;
    connected += b->connected_;
    handshaken += b->handshaken_storm_;
    added += b->added_;
  }
  const bool ok = completed == static_cast<int>(benches.size());
  std::printf("RESULT mode=storm clients=%d threads=%zu dialect=%s seconds=%.3f released=%d completed=%d connected=%d "
              "handshaken=%d added=%d resets=%llu refused=%llu eof=%llu errors=%llu\n",
              o.clients, parts.size(), dname(o.dialect), secs, released, ok ? 1 : 0, connected, handshaken, added,
              static_cast<unsigned long long>(all.resets), static_cast<unsigned long long>(all.refused),
              static_cast<unsigned long long>(all.eof), static_cast<unsigned long long>(all.other_errors));
  std::fflush(stdout);
  for (auto& b : benches) b->close_all();
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  Options o;
  if (argc < 2) die("usage: ddprun_store_bench ops|storm --port P [--host H] [--op get|add|compare_set|wait] "
                    "[--clients N] [--seconds S] [--timeout S] [--dialect D2|D0] [--tag T] [--threads T] [--source-ips K]");
  o.mode = argv[1];
  if (o.mode != "ops" && o.mode != "storm") die("mode must be ops or storm");
  for (int i = 2; i < argc; ++i) {
    std::string a = argv[i];
    auto next = [&]() -> std::string {
      if (i + 1 >= argc) die(a + " needs a value");
      return argv[++i];
    };
    if (a == "--host") o.host = next();
    else if (a == "--port") o.port = static_cast<uint16_t>(std::atoi(next().c_str()));
    else if (a == "--op") o.op = next();
    else if (a == "--clients") o.clients = std::atoi(next().c_str());
    else if (a == "--seconds") o.seconds = std::atof(next().c_str());
    else if (a == "--timeout") o.timeout = std::atof(next().c_str());
    else if (a == "--tag") o.tag = next();
    else if (a == "--threads") o.threads = std::atoi(next().c_str());
    else if (a == "--source-ips") o.source_ips = std::atoi(next().c_str());
    else if (a == "--verbose") o.verbose = true;
    else if (a == "--dialect") {
      auto d = next();
      if (d == "D0") o.dialect = Dialect::D0;
      else if (d == "D2") o.dialect = Dialect::D2;
      else die("--dialect must be D2 or D0");
    } else die("unknown argument " + a);
  }
  if (!o.port) die("--port is required");
  if (o.clients < 1) die("--clients must be >= 1");
  if (o.threads < 1) die("--threads must be >= 1");
  if (o.source_ips < 0 || o.source_ips > 250) die("--source-ips must be 0..250");
  if (o.source_ips > 0 && o.host.rfind("127.", 0) != 0) die("--source-ips needs a loopback --host (127.x.y.z)");
  if (o.op != "get" && o.op != "add" && o.op != "compare_set" && o.op != "wait") die("--op must be get|add|compare_set|wait");
  const int limit = raise_fd_limit(o.clients + 64);
  // Grow the descriptor table now, single-threaded: once the generator's threads run, every
  // doubling of a shared table waits for an RCU grace period (ms each), which showed up as most
  // of a small storm's time (54 ms of connect loop for 1024 connections, against 19 ms).
  if (const int fd = ::fcntl(2, F_DUPFD_CLOEXEC, std::min(limit, o.clients + 64) - 1); fd >= 0) ::close(fd);
  return o.mode == "ops" ? run_ops(o) : run_storm(o);
}
