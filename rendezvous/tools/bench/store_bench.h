// ddprun_store_bench's connections, options, statistics and the Bench that drives them (one
// translation unit includes it: store_bench.cpp).
#pragma once

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

namespace ddprun_store_bench {

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
        src.sin_addr.s_addr =
            htonl((127u << 24) | (1u << 8) | (1u + static_cast<uint32_t>((base_ + i) % o_.source_ips)));
        if (::bind(c.fd, reinterpret_cast<sockaddr*>(&src), sizeof src) != 0)
          die(std::string("bind: ") + std::strerror(errno));
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
      int n =
          epoll_wait(ep_, evs.data(), static_cast<int>(evs.size()), static_cast<int>(std::min<long long>(left, 100)));
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
      set_time_[static_cast<uint64_t>(c.round) * static_cast<uint64_t>(n) + static_cast<uint64_t>(c.idx)] =
          Clock::now();
      std::string bytes =
          encode(d, Op::Set, {k("w/" + std::to_string(c.round) + "/" + std::to_string(base_ + succ))}, {"1"});
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
      if (ddprun::wire::load_u32(reinterpret_cast<const uint8_t*>(reply.data())) !=
          0x1000u + static_cast<uint32_t>(c.idx))
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
        send(c, encode(d, Op::Get, {k("w/" + std::to_string(c.round) + "/" + std::to_string(base_ + c.idx))}),
             Reply::Blob);
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

}  // namespace ddprun_store_bench
