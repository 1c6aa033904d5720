// The agent's side of the rendezvous (docs/RENDEZVOUS.md): one long-lived connection to the
// server, one JOIN and one ROUND per round, heartbeats from a background thread, and the
// server's notices (ROUND, RESTART, JOB_DONE, JOB_FAILED, ERROR) read whenever fd() is
// readable. Messages are the typed structs of agent_protocol.h.
//
// Every blocking step can be abandoned: the constructor's connect retries (name resolution
// included), join() and every send ask `interrupted` at least every 100 ms and throw
// RendezvousInterrupted when it says yes (the launcher passes "a stop signal arrived"). A send
// never blocks on the socket: it waits for room in 100 ms slices, at most kSendTimeout in all
// (then RendezvousError: the server stopped reading). A send cut short mid-message makes every
// later send fail. The destructor returns within about one slice even when the server stopped
// reading (the heartbeat thread's send gives up on the stop flag).
//
// Thread-safety: join/poll/wait_message/report_*/leave are for one thread (the agent's loop),
// and `interrupted` is only called on it; the heartbeat thread only writes, under the send
// mutex. Errors throw RendezvousError.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <mutex>
#include <optional>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "ddprun/rdzv/agent_auth.h"
#include "ddprun/rdzv/agent_protocol.h"
#include "ddprun/rdzv/session_mac.h"

namespace ddprun::rdzv {

class RendezvousError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// A wait was abandoned because `interrupted` said so.
class RendezvousInterrupted : public RendezvousError {
 public:
  using RendezvousError::RendezvousError;
};

// The handshake refused this agent or the server (a token mismatch either way, a token on one
// side only): the message says which and what to set. Retrying cannot help.
class RendezvousRefused : public RendezvousError {
 public:
  using RendezvousError::RendezvousError;
};

class RendezvousClient {
 public:
  // Connects (retrying until `connect_timeout`), announces the agent protocol and runs the
  // token handshake (agent_auth.h; `token` "" = none), waiting at most kHandshakeTimeout for
  // the server's answers. Throws RendezvousRefused when either side's proof fails.
  RendezvousClient(std::string host, uint16_t port, std::chrono::milliseconds connect_timeout,
                   std::chrono::milliseconds heartbeat_interval, std::function<bool()> interrupted = {},
                   AgentCredentials credentials = {});
  ~RendezvousClient();
  RendezvousClient(const RendezvousClient&) = delete;
  RendezvousClient& operator=(const RendezvousClient&) = delete;

  // Sends JOIN and blocks until the ROUND (or throws with the server's ERROR/JOB_FAILED text,
  // on timeout, or when interrupted). Notices that arrive first (e.g. a late RESTART) are
  // skipped.
  Round join(const Join& info, std::chrono::milliseconds timeout);
  // Sends JOIN without waiting: the ROUND comes later through poll() (for event loops).
  void send_join(const Join& info);
  // Readable when a notice may be waiting; pass it to epoll.
  int fd() const { return fd_; }
  // Reads what is available without blocking; returns the next complete notice, if any.
  // Throws RendezvousError when the server closed the connection.
  std::optional<Message> poll();
  // Blocks up to `timeout` for the next notice.
  std::optional<Message> wait_message(std::chrono::milliseconds timeout);

  void report_failure(const Failure& failure);
  void report_success(int64_t round);
  // This agent hosts round `round`'s workers' store and every worker joined it (PROGRESS).
  void report_progress(int64_t round);
  void leave();  // never throws
  // What each heartbeat carries as Heartbeat::status (the agent's status snapshot; "" = none),
  // asked on the heartbeat thread before each beat. Thread-safe.
  void set_heartbeat_status(std::function<std::string()> source);
  // `ddprun status`: sends STATUS_QUERY (no JOIN needed) and waits, at most `timeout`, for the
  // STATUS_REPLY. Throws RendezvousError on the server's ERROR, a closed connection or the
  // timeout.
  StatusReply query_status(const std::string& run_id, std::chrono::milliseconds timeout);

  // With a token: how many messages were dropped because they were not the server's (a wrong or
  // missing MAC, a replay: session_mac.h), and what the last one was. For the agent's loop.
  uint64_t rejected() const { return rejected_; }
  const std::string& last_rejected() const { return last_rejected_; }

  // The server is a standing daemon (ddprund), as its handshake said.
  bool server_standing() const { return server_standing_; }
  const std::string& host() const { return host_; }
  uint16_t port() const { return port_; }

  // How long one message may wait for the server to make room.
  static constexpr std::chrono::milliseconds kSendTimeout{10000};
  static constexpr std::chrono::milliseconds kHandshakeTimeout{10000};

 private:
  enum class Sender { Caller, Heartbeat };
  template <class T>
  void send(const T& m, Sender who = Sender::Caller);
  std::unique_lock<std::timed_mutex> lock_send(Sender who);
  void write_all(const std::string& bytes, Sender who);
  void write_locked(const std::string& bytes, Sender who);  // under send_mu_
  void send_message(Message m, Sender who);
  bool give_up(Sender who) const;
  bool read_some(bool block, std::chrono::milliseconds timeout);
  void handshake(const AgentCredentials& credentials);
  std::optional<Message> take_buffered();

  std::string host_;
  uint16_t port_;
  std::function<bool()> interrupted_;
  int fd_ = -1;
  std::vector<uint8_t> in_;
  std::timed_mutex send_mu_;
  bool broken_ = false;  // under send_mu_
  std::thread heartbeat_;
  std::mutex hb_mu_;
  std::condition_variable hb_cv_;
  std::atomic<bool> stopping_{false};
  std::function<std::string()> heartbeat_status_;  // under hb_mu_
  bool server_standing_ = false;
  // With a token, set by the handshake before the heartbeat thread starts. Its sending half is
  // used under send_mu_, its receiving half by the caller's thread (distinct fields).
  std::optional<SessionMac> mac_;
  uint64_t rejected_ = 0;
  std::string last_rejected_;
};

}  // namespace ddprun::rdzv
