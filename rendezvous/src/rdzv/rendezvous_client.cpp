#include "ddprun/rdzv/rendezvous_client.h"

#include "ddprun/client/tcp_connect.h"

#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <sstream>

namespace ddprun::rdzv {

using Clock = std::chrono::steady_clock;

RendezvousClient::RendezvousClient(std::string host, uint16_t port, std::chrono::milliseconds connect_timeout,
                                   std::chrono::milliseconds heartbeat_interval)
    : host_(std::move(host)), port_(port) {
  const auto deadline = Clock::now() + connect_timeout;
  std::string error;
  auto backoff = std::chrono::milliseconds(20);
  while (fd_ < 0) {
    fd_ = client::connect_tcp(host_, port_, error);
    if (fd_ >= 0) break;
    if (Clock::now() + backoff >= deadline)
      throw RendezvousError("cannot reach the rendezvous endpoint " + host_ + ":" + std::to_string(port_) + " (" +
                            error + "); check --rdzv_endpoint / --master_addr and that the server is up");
    std::this_thread::sleep_for(backoff);
    backoff = std::min(backoff * 2, std::chrono::milliseconds(500));
  }
  std::string hello;
  wire::Writer(hello).u8(0).u32(kAgentMagic);
  if (::send(fd_, hello.data(), hello.size(), MSG_NOSIGNAL) != static_cast<ssize_t>(hello.size()))
    throw RendezvousError("cannot talk to the rendezvous endpoint " + host_ + ":" + std::to_string(port_));
  heartbeat_ = std::thread([this, heartbeat_interval] {
    std::unique_lock lk(hb_mu_);
    while (!hb_cv_.wait_for(lk, heartbeat_interval, [this] { return stopping_; })) {
      Message m;
      m.type = MsgType::Heartbeat;
      try {
        send(m);
      } catch (const RendezvousError&) {
        return;  // the reader sees the closed connection
      }
    }
  });
}

RendezvousClient::~RendezvousClient() {
  {
    std::lock_guard lk(hb_mu_);
    stopping_ = true;
  }
  hb_cv_.notify_all();
  if (heartbeat_.joinable()) heartbeat_.join();
  if (fd_ >= 0) ::close(fd_);
}

void RendezvousClient::send(const Message& m) {
  std::string bytes;
  encode_message(m, bytes);
  std::lock_guard lk(send_mu_);
  size_t off = 0;
  while (off < bytes.size()) {
    ssize_t n = ::send(fd_, bytes.data() + off, bytes.size() - off, MSG_NOSIGNAL);
    if (n < 0) {
      if (errno == EINTR) continue;
      throw RendezvousError(std::string("lost the rendezvous server: ") + std::strerror(errno));
    }
    off += static_cast<size_t>(n);
  }
}

bool RendezvousClient::read_some(bool block, std::chrono::milliseconds timeout) {
  pollfd p{fd_, POLLIN, 0};
  int rc = ::poll(&p, 1, block ? static_cast<int>(timeout.count()) : 0);
  if (rc < 0 && errno == EINTR) return false;
  if (rc <= 0) return false;
  uint8_t buf[65536];
  ssize_t n = ::recv(fd_, buf, sizeof buf, 0);
  if (n == 0) throw RendezvousError("the rendezvous server at " + host_ + ":" + std::to_string(port_) + " closed the connection");
  if (n < 0) {
    if (errno == EINTR || errno == EAGAIN) return false;
    throw RendezvousError(std::string("lost the rendezvous server: ") + std::strerror(errno));
  }
  in_.insert(in_.end(), buf, buf + n);
  return true;
}

std::optional<Message> RendezvousClient::take_buffered() {
  Message m;
  auto r = parse_message({in_.data(), in_.size()}, m);
  if (r.status == wire::ParseStatus::NeedMore) return std::nullopt;
  if (r.status == wire::ParseStatus::Bad) throw RendezvousError("bad message from the rendezvous server: " + r.error);
  in_.erase(in_.begin(), in_.begin() + static_cast<long>(r.consumed));
  return m;
}

std::optional<Message> RendezvousClient::poll() {
  if (auto m = take_buffered()) return m;
  while (read_some(false, std::chrono::milliseconds(0)))
    if (auto m = take_buffered()) return m;
  return std::nullopt;
}

std::optional<Message> RendezvousClient::wait_message(std::chrono::milliseconds timeout) {
  const auto deadline = Clock::now() + timeout;
  while (true) {
    if (auto m = take_buffered()) return m;
    auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now());
    if (left.count() <= 0) return std::nullopt;
    read_some(true, left);
  }
}

void RendezvousClient::send_join(const JoinInfo& info) {
  Message j;
  j.type = MsgType::Join;
  j.set("run_id", info.run_id).set("node_id", info.node_id).set("host", info.host);
  j.set("local_world_size", info.local_world_size).set("min_nodes", info.min_nodes).set("max_nodes", info.max_nodes);
  j.set("max_restarts", info.max_restarts).set("last_call_ms", info.last_call.count());
  j.set("join_timeout_ms", info.join_timeout.count()).set("heartbeat_timeout_ms", info.heartbeat_timeout.count());
  if (info.fixed_node_rank >= 0) j.set("node_rank", info.fixed_node_rank);
  if (info.prefer_rank0) j.set("prefer_rank0", "1");
  send(j);
}

RoundInfo RendezvousClient::parse_round(const Message& m) {
  RoundInfo r;
  r.round = m.get_int("round");
  r.restart_count = m.get_int("restart_count");
  r.max_restarts = m.get_int("max_restarts");
  r.node_rank = static_cast<int>(m.get_int("node_rank"));
  r.nnodes = static_cast<int>(m.get_int("nnodes"));
  r.world_size = static_cast<int>(m.get_int("world_size"));
  r.base_rank = static_cast<int>(m.get_int("base_rank"));
  r.store_port = static_cast<uint16_t>(m.get_int("store_port"));
  return r;
}

RoundInfo RendezvousClient::join(const JoinInfo& info, std::chrono::milliseconds timeout) {
  send_join(info);
  const auto deadline = Clock::now() + timeout;
  while (true) {
    auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now());
    auto m = wait_message(std::max(left, std::chrono::milliseconds(0)));
    if (!m) throw RendezvousError("rendezvous timed out after " + std::to_string(timeout.count()) + " ms waiting for a round");
    switch (m->type) {
      case MsgType::Round: return parse_round(*m);
      case MsgType::Error: throw RendezvousError(m->get("message"));
      case MsgType::JobFailed: throw RendezvousError("the job failed: " + m->get("reason"));
      case MsgType::JobDone: throw RendezvousError("the job already finished");
      default: break;  // a RESTART that crossed our JOIN: we are joining already
    }
  }
}

void RendezvousClient::report_failure(const Message& failure) {
  Message m = failure;
  m.type = MsgType::Failure;
  send(m);
}

void RendezvousClient::report_success(int64_t round) {
  Message m;
  m.type = MsgType::Succeeded;
  m.set("round", round);
  send(m);
}

void RendezvousClient::leave() {
  Message m;
  m.type = MsgType::Leave;
  try {
    send(m);
  } catch (const RendezvousError&) {
  }
}

}  // namespace ddprun::rdzv
