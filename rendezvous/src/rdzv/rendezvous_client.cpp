#include "ddprun/rdzv/rendezvous_client.h"

#include "ddprun/client/net.h"
#include "ddprun/rdzv/agent_auth.h"
#include "ddprun/rdzv/auth_io.h"
#include "ddprun/rdzv/validate.h"

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
                                   std::chrono::milliseconds heartbeat_interval, std::function<bool()> interrupted,
                                   AgentCredentials credentials)
    : host_(std::move(host)), port_(port), interrupted_(std::move(interrupted)) {
  std::string error;
  client::ConnectOutcome outcome{};
  fd_ = client::connect_until(host_, port_, Clock::now() + connect_timeout, interrupted_, outcome, error);
  const std::string where = host_ + ":" + std::to_string(port_);
  if (outcome == client::ConnectOutcome::Interrupted)
    throw RendezvousInterrupted("stopped while connecting to the rendezvous endpoint " + where +
                                (error.empty() ? std::string() : " (last attempt: " + error + ")"));
  if (fd_ < 0)
    throw RendezvousError("cannot reach the rendezvous endpoint " + where + " within " +
                          std::to_string(connect_timeout.count() / 1000.0).substr(0, 5) + " s (" + error +
                          "); check --rdzv_endpoint / --master_addr and that the server is up");
  std::string hello;
  wire::Writer(hello).u8(0).u32(kAgentMagic);
  try {
    write_all(hello, Sender::Caller);
    handshake(credentials);
  } catch (...) {
    ::close(fd_);
    throw;
  }
  heartbeat_ = std::thread([this, heartbeat_interval] {
    std::unique_lock lk(hb_mu_);
    while (!hb_cv_.wait_for(lk, heartbeat_interval, [this] { return stopping_.load(); })) {
      // Unlocked while sending: the destructor's stop must never wait behind a stuck send.
      auto status_source = heartbeat_status_;
      lk.unlock();
      try {
        send(Heartbeat{.status = status_source ? status_source() : std::string()}, Sender::Heartbeat);
      } catch (const RendezvousError&) {
        return;  // the reader sees the closed connection (or we are stopping)
      }
      lk.lock();
    }
  });
}

RendezvousClient::~RendezvousClient() {
  {
    std::lock_guard lk(hb_mu_);
    stopping_ = true;
  }
  hb_cv_.notify_all();
  // Bounded: a heartbeat stuck on a server that stopped reading gives up within one slice.
  if (heartbeat_.joinable()) heartbeat_.join();
  if (fd_ >= 0) ::close(fd_);
}

namespace {
constexpr std::chrono::milliseconds kSendSlice{100};
}  // namespace

bool RendezvousClient::give_up(Sender who) const {
  if (stopping_) return true;
  // `interrupted` belongs to the caller's thread (the agent's reads its signalfd).
  return who == Sender::Caller && interrupted_ && interrupted_();
}

std::unique_lock<std::timed_mutex> RendezvousClient::lock_send(Sender who) {
  const std::string where = host_ + ":" + std::to_string(port_);
  const auto deadline = Clock::now() + kSendTimeout;
  // The lock too is taken in slices: the other sender may be the one stuck. Against the system
  // clock on purpose: try_lock_for (steady clock) is pthread_mutex_clocklock, which GCC 12's
  // TSan does not intercept, so it saw every unlock as "of an unlocked mutex"; timedlock it
  // sees. A clock step only stretches or shortens one 100 ms slice; the deadline is steady.
  std::unique_lock lk(send_mu_, std::defer_lock);
  while (!lk.try_lock_until(std::chrono::system_clock::now() + kSendSlice)) {
    if (give_up(who)) throw RendezvousInterrupted("stopped while sending to the rendezvous server " + where);
    if (Clock::now() >= deadline)
      throw RendezvousError("the rendezvous server at " + where + " stopped reading (a send waited " +
                            std::to_string(kSendTimeout.count() / 1000) + " s)");
  }
  return lk;
}

void RendezvousClient::write_all(const std::string& bytes, Sender who) {
  auto lk = lock_send(who);
  write_locked(bytes, who);
}

void RendezvousClient::send_message(Message m, Sender who) {
  auto lk = lock_send(who);
  // Sealed under the send lock: sequence numbers go out in the order they were given.
  if (mac_) mac_->seal(m);
  std::string bytes;
  encode_message(m, bytes);
  write_locked(bytes, who);
}

void RendezvousClient::write_locked(const std::string& bytes, Sender who) {
  const std::string where = host_ + ":" + std::to_string(port_);
  const auto deadline = Clock::now() + kSendTimeout;
  if (broken_) throw RendezvousError("the connection to the rendezvous server " + where + " was abandoned mid-message");
  size_t off = 0;
  while (off < bytes.size()) {
    // Never blocks: a server that stops reading must not hold us with the stop signals masked.
    ssize_t n = ::send(fd_, bytes.data() + off, bytes.size() - off, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (n >= 0) {
      off += static_cast<size_t>(n);
      continue;
    }
    if (errno == EINTR) continue;
    if (errno != EAGAIN && errno != EWOULDBLOCK)
      throw RendezvousError(std::string("lost the rendezvous server: ") + std::strerror(errno));
    // A message cut short leaves the stream unusable: later sends fail at once.
    if (give_up(who)) {
      broken_ = off > 0;
      throw RendezvousInterrupted("stopped while sending to the rendezvous server " + where + " (it is not reading)");
    }
    if (Clock::now() >= deadline) {
      broken_ = off > 0;
      throw RendezvousError("the rendezvous server at " + where + " stopped reading (a send waited " +
                            std::to_string(kSendTimeout.count() / 1000) + " s)");
    }
    pollfd p{fd_, POLLOUT, 0};
    ::poll(&p, 1, static_cast<int>(kSendSlice.count()));
  }
}

template <class T>
void RendezvousClient::send(const T& m, Sender who) {
  send_message(to_message(m), who);
}

bool RendezvousClient::read_some(bool block, std::chrono::milliseconds timeout) {
  pollfd p{fd_, POLLIN, 0};
  int rc = ::poll(&p, 1, block ? static_cast<int>(timeout.count()) : 0);
  if (rc < 0 && errno == EINTR) return false;
  if (rc <= 0) return false;
  uint8_t buf[65536];
  ssize_t n = ::recv(fd_, buf, sizeof buf, 0);
  if (n == 0)
    throw RendezvousError("the rendezvous server at " + host_ + ":" + std::to_string(port_) + " closed the connection");
  if (n < 0) {
    if (errno == EINTR || errno == EAGAIN) return false;
    throw RendezvousError(std::string("lost the rendezvous server: ") + std::strerror(errno));
  }
  in_.insert(in_.end(), buf, buf + n);
  return true;
}

std::optional<Message> RendezvousClient::take_buffered() {
  while (true) {
    Message m;
    auto r = parse_message({in_.data(), in_.size()}, m);
    if (r.status == wire::ParseStatus::NeedMore) return std::nullopt;
    if (r.status == wire::ParseStatus::Bad) throw RendezvousError("bad message from the rendezvous server: " + r.error);
    in_.erase(in_.begin(), in_.begin() + static_cast<long>(r.consumed));
    if (!mac_) return m;
    const auto verdict = mac_->open(m);
    if (verdict == SessionMac::Verdict::Ok) return m;
    // Not from the server that proved the token (a relay's): dropped, changing nothing.
    ++rejected_;
    last_rejected_ = std::string(msg_type_name(m.type)) + ": " + SessionMac::describe(verdict);
  }
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

void RendezvousClient::handshake(const AgentCredentials& credentials) {
  const std::string where = host_ + ":" + std::to_string(port_);
  std::optional<ClientHandshake> made;
  try {
    made.emplace(credentials, random_nonce(), where);
  } catch (const std::exception& e) {
    throw RendezvousError(std::string("cannot make this connection's munge credential: ") + e.what());
  }
  ClientHandshake& hs = *made;
  std::string bytes;
  encode_message(hs.hello(), bytes);
  write_all(bytes, Sender::Caller);
  const auto deadline = Clock::now() + kHandshakeTimeout;
  while (!hs.done()) {
    if (interrupted_ && interrupted_())
      throw RendezvousInterrupted("stopped while authenticating with the rendezvous server " + where);
    if (Clock::now() >= deadline)
      throw RendezvousError("the rendezvous server at " + where + " did not answer the handshake within " +
                            std::to_string(kHandshakeTimeout.count() / 1000) + " s (is it a ddprun rendezvous?)");
    auto m = wait_message(std::chrono::milliseconds(100));
    if (!m) continue;
    std::optional<Message> next;
    try {
      next = hs.on_reply(*m);
    } catch (const HandshakeRefused& e) {
      throw RendezvousRefused(e.what());
    }
    if (next) {
      bytes.clear();
      encode_message(*next, bytes);
      write_all(bytes, Sender::Caller);
    }
  }
  server_standing_ = hs.server_standing();
  mac_ = hs.session();
}

void RendezvousClient::send_join(const Join& info) { send(info); }

Round RendezvousClient::join(const Join& info, std::chrono::milliseconds timeout) {
  send_join(info);
  const auto deadline = Clock::now() + timeout;
  while (true) {
    if (interrupted_ && interrupted_()) throw RendezvousInterrupted("stopped while waiting for the rendezvous round");
    auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now());
    if (left.count() <= 0)
      throw RendezvousError("rendezvous timed out after " + std::to_string(timeout.count()) +
                            " ms waiting for a round");
    // In slices, so `interrupted` is asked at least every 100 ms.
    auto m = wait_message(std::min(left, std::chrono::milliseconds(100)));
    if (!m) continue;
    switch (m->type) {
      case MsgType::Round: {
        Round r = from_message<Round>(*m);
        if (auto why = check_round(r, info.local_world_size)) throw RendezvousError(*why);
        return r;
      }
      case MsgType::Error: throw RendezvousError(printable(from_message<Error>(*m).message, kMaxReasonLen));
      case MsgType::JobFailed:
        throw RendezvousError("the job failed: " + printable(from_message<JobFailed>(*m).reason, kMaxReasonLen));
      case MsgType::JobDone: throw RendezvousError("the job already finished");
      default: break;  // a RESTART that crossed our JOIN: we are joining already
    }
  }
}

void RendezvousClient::set_heartbeat_status(std::function<std::string()> source) {
  std::lock_guard lk(hb_mu_);
  heartbeat_status_ = std::move(source);
}

StatusReply RendezvousClient::query_status(const std::string& run_id, std::chrono::milliseconds timeout) {
  send(StatusQuery{.run_id = run_id});
  const auto deadline = Clock::now() + timeout;
  while (true) {
    if (interrupted_ && interrupted_()) throw RendezvousInterrupted("stopped while waiting for the status");
    auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now());
    if (left.count() <= 0) throw RendezvousError("no status reply within " + std::to_string(timeout.count()) + " ms");
    auto m = wait_message(std::min(left, std::chrono::milliseconds(100)));
    if (!m) continue;
    if (m->type == MsgType::StatusReply) return from_message<StatusReply>(*m);
    if (m->type == MsgType::Error) throw RendezvousError(printable(from_message<Error>(*m).message, kMaxReasonLen));
  }
}

void RendezvousClient::report_failure(const Failure& failure) { send(failure); }

void RendezvousClient::report_success(int64_t round) { send(Succeeded{.round = round}); }

void RendezvousClient::report_progress(int64_t round) { send(Progress{.round = round}); }

void RendezvousClient::leave() {
  try {
    send(Leave{});
  } catch (const RendezvousError&) {
  }
}

}  // namespace ddprun::rdzv
