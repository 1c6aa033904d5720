// ddprun_rdzv_bench: one process simulating N agents joining one rendezvous round.
//   ddprun_rdzv_bench --host 127.0.0.1 --port P --agents N [--nproc 8] [--token T]
// Prints one line: agents, connect time, round time (first JOIN sent -> last ROUND read).
// With --token, every agent runs the token handshake while connecting (counted in the connect
// time), seals its JOIN and checks the MAC of its ROUND (session_mac.h), as a real agent does.
//   ddprun_rdzv_bench --mac-cost N: no server; the CPU time of sealing and opening one JOIN of
//   this tool's, N times, against only encoding it (the MAC's cost per message, both ends).
#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/epoll.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <vector>

#include <optional>

#include "ddprun/rdzv/agent_auth.h"
#include "ddprun/rdzv/auth_io.h"
#include "ddprun/rdzv/agent_protocol.h"

using namespace ddprun;
using Clock = std::chrono::steady_clock;

int main(int argc, char** argv) {
  std::string host = "127.0.0.1", run_id = "bench";
  uint16_t port = 29400;
  int agents = 64, nproc = 8;
  CLI::App app{"simulate N agents joining one ddprun rendezvous round"};
  app.add_option("--host", host);
  app.add_option("--port", port);
  app.add_option("--agents", agents)->check(CLI::Range(1, 1 << 20));
  app.add_option("--nproc", nproc);
  app.add_option("--run-id", run_id);
  std::string token;
  app.add_option("--token", token, "run the token handshake and MAC every message (as agents with a token do)");
  int mac_cost = 0;
  app.add_option("--mac-cost", mac_cost, "only time sealing and opening a JOIN this many times (no server)")
      ->check(CLI::Range(1, 1 << 24));
  CLI11_PARSE(app, argc, argv);
  if (mac_cost > 0) {
    const std::string nc = rdzv::random_nonce(), ns = rdzv::random_nonce(), key = "a token of 16+ bytes, for timing";
    rdzv::SessionMac agent(key, nc, ns, rdzv::SessionMac::Side::Agent),
        server(key, nc, ns, rdzv::SessionMac::Side::Server);
    const rdzv::Join j{.run_id = run_id,
                       .node_id = "sim1234",
                       .host = "127.0.0.1",
                       .local_world_size = nproc,
                       .min_nodes = agents,
                       .max_nodes = agents};
    size_t bytes = 0;
    auto t0 = Clock::now();
    for (int i = 0; i < mac_cost; ++i) {
      std::string b;
      rdzv::encode_message(rdzv::to_message(j), b);
      bytes = b.size();
    }
    auto t1 = Clock::now();
    for (int i = 0; i < mac_cost; ++i) {
      auto m = rdzv::to_message(j);
      agent.seal(m);
      std::string b;
      rdzv::encode_message(m, b);
      if (server.open(m) != rdzv::SessionMac::Verdict::Ok) return 1;
    }
    auto t2 = Clock::now();
    auto us = [&](auto a, auto b) { return std::chrono::duration<double, std::micro>(b - a).count() / mac_cost; };
    std::printf("frame_bytes=%zu encode_us=%.2f sealed_us=%.2f mac_us=%.2f\n", bytes, us(t0, t1), us(t1, t2),
                us(t1, t2) - us(t0, t1));
    return 0;
  }

  rlimit rl{};
  getrlimit(RLIMIT_NOFILE, &rl);
  rl.rlim_cur = rl.rlim_max;
  setrlimit(RLIMIT_NOFILE, &rl);
  if (rl.rlim_cur < static_cast<rlim_t>(agents) + 64) {
    std::fprintf(stderr, "need %d file descriptors, the limit is %llu\n", agents + 64,
                 static_cast<unsigned long long>(rl.rlim_cur));
    return 2;
  }
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(port);
  inet_pton(AF_INET, host.c_str(), &addr.sin_addr);

  // One blocking read of a whole frame (the handshake's answers).
  auto read_frame = [](int fd, rdzv::Message& m) {
    std::vector<uint8_t> buf;
    uint8_t b[4096];
    while (true) {
      auto r = rdzv::parse_message({buf.data(), buf.size()}, m);
      if (r.status == wire::ParseStatus::Ok) return true;
      if (r.status == wire::ParseStatus::Bad) return false;
      const ssize_t n = ::recv(fd, b, sizeof b, 0);
      if (n <= 0) return false;
      buf.insert(buf.end(), b, b + n);
    }
  };
  std::vector<std::optional<rdzv::SessionMac>> sessions;
  auto t0 = Clock::now();
  std::vector<int> fds;
  int refused = 0;
  for (int i = 0; i < agents; ++i) {
    int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0) {
      ++refused;
      ::close(fd);
      continue;
    }
    int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    fds.push_back(fd);
    if (token.empty()) {
      sessions.emplace_back();
      continue;
    }
    rdzv::ClientHandshake hs(token, rdzv::random_nonce(), host);
    std::string b;
    wire::Writer(b).u8(0).u32(rdzv::kAgentMagic);
    rdzv::encode_message(hs.hello(), b);
    rdzv::Message m;
    while (true) {
      if (!b.empty() && ::send(fd, b.data(), b.size(), MSG_NOSIGNAL) != static_cast<ssize_t>(b.size())) {
        std::perror("send");
        return 1;
      }
      b.clear();
      if (hs.done()) break;
      if (!read_frame(fd, m)) {
        std::fprintf(stderr, "agent %d: the handshake broke off\n", i);
        return 1;
      }
      try {
        if (auto next = hs.on_reply(m)) rdzv::encode_message(*next, b);
      } catch (const std::exception& e) {
        std::fprintf(stderr, "agent %d: %s\n", i, e.what());
        return 1;
      }
    }
    sessions.push_back(hs.session());
  }
  auto t_connected = Clock::now();
  if (refused) {
    std::fprintf(stderr, "%d connections refused\n", refused);
    return 1;
  }
  int ep = epoll_create1(EPOLL_CLOEXEC);
  std::vector<std::vector<uint8_t>> in(fds.size());
  auto t_join = Clock::now();
  for (size_t i = 0; i < fds.size(); ++i) {
    std::string b;
    if (token.empty()) wire::Writer(b).u8(0).u32(rdzv::kAgentMagic);
    auto join = rdzv::to_message(rdzv::Join{.run_id = run_id,
                                            .node_id = "sim" + std::to_string(i),
                                            .host = "127.0.0.1",
                                            .local_world_size = nproc,
                                            .min_nodes = agents,
                                            .max_nodes = agents,
                                            .last_call_ms = 30000,
                                            .join_timeout_ms = 120000,
                                            .heartbeat_timeout_ms = 120000});
    if (sessions[i]) sessions[i]->seal(join);
    rdzv::encode_message(join, b);
    if (::send(fds[i], b.data(), b.size(), MSG_NOSIGNAL) != static_cast<ssize_t>(b.size())) {
      std::perror("send");
      return 1;
    }
    fcntl(fds[i], F_SETFL, O_NONBLOCK);
    epoll_event ev{};
    ev.events = EPOLLIN;
    ev.data.u64 = i;
    epoll_ctl(ep, EPOLL_CTL_ADD, fds[i], &ev);
  }
  size_t rounds = 0;
  int64_t world = -1;
  std::vector<epoll_event> evs(1024);
  while (rounds < fds.size()) {
    int n = epoll_wait(ep, evs.data(), static_cast<int>(evs.size()), 60000);
    if (n <= 0) {
      std::fprintf(stderr, "timed out with %zu of %zu rounds\n", rounds, fds.size());
      return 1;
    }
    for (int k = 0; k < n; ++k) {
      size_t i = evs[k].data.u64;
      uint8_t buf[4096];
      ssize_t r;
      while ((r = ::recv(fds[i], buf, sizeof buf, 0)) > 0) in[i].insert(in[i].end(), buf, buf + r);
      if (r == 0) {
        std::fprintf(stderr, "agent %zu: server closed the connection\n", i);
        return 1;
      }
      rdzv::Message m;
      auto res = rdzv::parse_message({in[i].data(), in[i].size()}, m);
      if (res.status == wire::ParseStatus::Ok) {
        in[i].erase(in[i].begin(), in[i].begin() + static_cast<long>(res.consumed));
        if (sessions[i] && sessions[i]->open(m) != rdzv::SessionMac::Verdict::Ok) {
          std::fprintf(stderr, "agent %zu: a %s whose MAC does not check\n", i, rdzv::msg_type_name(m.type));
          return 1;
        }
        if (m.type != rdzv::MsgType::Round) {
          std::fprintf(stderr, "agent %zu got %s: %s\n", i, rdzv::msg_type_name(m.type),
                       rdzv::from_message<rdzv::Error>(m).message.c_str());
          return 1;
        }
        world = rdzv::from_message<rdzv::Round>(m).world_size;
        ++rounds;
      }
    }
  }
  auto t_done = Clock::now();
  auto ms = [](auto a, auto b) { return std::chrono::duration<double, std::milli>(b - a).count(); };
  std::printf("agents=%d connect_ms=%.1f round_ms=%.1f world_size=%lld\n", agents, ms(t0, t_connected),
              ms(t_join, t_done), static_cast<long long>(world));
  for (int fd : fds) ::close(fd);
  return world == static_cast<int64_t>(agents) * nproc ? 0 : 1;
}
