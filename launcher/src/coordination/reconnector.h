// Connecting to the rendezvous server, and reconnecting to a standing one that went away
// without blocking the agent's loop (internal to launcher/src; the remote coordinator's).
//
// A reconnect runs for at most a budget (the join timeout): attempts with backoff (50 ms
// doubling to 500 ms), each a connect bounded by kAttempt and, when something answers, the
// token handshake bounded by the client's own timeout and by the budget left. Between attempts
// the agent's loop runs on: a timerfd in the coordinator's epoll set says when the next is due.
//
// Thread-safety: one owner (the agent's loop thread).
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "ddprun/rdzv/agent_auth.h"
#include "ddprun/rdzv/rendezvous_client.h"

namespace ddprun::launcher {

// Where the rendezvous server is and how this agent talks to it.
struct RendezvousEndpoint {
  std::string host;
  uint16_t port = 0;
  std::chrono::milliseconds heartbeat_interval{1000};
  // Asked at least every 100 ms while connecting: yes gives up (CoordinatorInterrupted).
  std::function<bool()> interrupted;
  rdzv::AgentCredentials token;
  // What the heartbeats carry (RendezvousClient::set_heartbeat_status); may be empty.
  std::function<std::string()> status_source;
  std::string where() const { return host + ":" + std::to_string(port); }
};

// Connects (retrying until `timeout`) and runs the handshake. Throws CoordinatorInterrupted
// for a stop, CoordinatorError otherwise.
std::unique_ptr<rdzv::RendezvousClient> connect_rendezvous(const RendezvousEndpoint& e,
                                                           std::chrono::milliseconds timeout);

class Reconnector {
 public:
  // `epfd`: the coordinator's epoll set, which the retry timer joins.
  Reconnector(RendezvousEndpoint endpoint, int epfd);
  ~Reconnector();
  Reconnector(const Reconnector&) = delete;
  Reconnector& operator=(const Reconnector&) = delete;

  // The server went away (`why`): reconnect for at most `budget`; the first attempt is due
  // at once.
  void start(const std::string& why, std::chrono::milliseconds budget);
  bool active() const { return active_; }
  // When the retry timer fired: one attempt. The connected client (active() is false then),
  // or nullptr with the next attempt armed (also when the timer was not due). Throws
  // CoordinatorError once the budget is spent, naming the last attempt's failure, and
  // CoordinatorInterrupted for a stop.
  std::unique_ptr<rdzv::RendezvousClient> attempt();
  // Since start().
  double seconds() const;

  static constexpr std::chrono::milliseconds kAttempt{250};

 private:
  std::unique_ptr<rdzv::RendezvousClient> connect_within_budget(std::chrono::milliseconds connect_timeout);
  void arm(std::chrono::milliseconds after);

  RendezvousEndpoint endpoint_;
  int timer_ = -1;  // in the coordinator's epoll set: the next attempt is due
  bool active_ = false;
  std::string lost_why_;
  std::chrono::milliseconds budget_{0};
  std::chrono::steady_clock::time_point t0_, deadline_;
  std::chrono::milliseconds backoff_{50};
};

}  // namespace ddprun::launcher
