// The workers' store a node offers a standing rendezvous server with every JOIN, and hosts
// when the round makes this node rank 0 (internal to launcher/src; the remote coordinator's).
//
// A standing server may restart while the round runs; the workers' store must not go with it
// (PyTorch's TCPStore clients do not reconnect). So every JOIN offers a store of this agent's
// own, bound but not yet accepting: if the round names it, this node hosts the round's
// workers' store (round_state.h "Agent-hosted stores") and says when every worker joined it
// (PROGRESS, which the server weighs failures by). Any failure to open one just leaves the
// store to the server.
//
// Thread-safety: one owner (the agent's loop thread).
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>

#include "ddprun/rdzv/agent_protocol.h"
#include "ddprun/server/store_server.h"

namespace ddprun::launcher {

class RoundStoreHost {
 public:
  // `epfd`: the coordinator's epoll set, which the progress poll's timer joins.
  explicit RoundStoreHost(int epfd);
  ~RoundStoreHost();
  RoundStoreHost(const RoundStoreHost&) = delete;
  RoundStoreHost& operator=(const RoundStoreHost&) = delete;

  // Before a JOIN: the last round's store goes; a new one is opened, on a new port. Returns
  // the port to offer (0: none could be opened, the server keeps the store).
  uint16_t offer();
  // No store offered or hosted (a JOIN that offers none).
  void drop();
  // A ROUND came: hosts its workers' store when it names this node's (node rank 0 with an
  // agent-hosted store), else drops the offer. Throws CoordinatorError when the round names
  // a store this node did not offer.
  void on_round(const rdzv::Round& r);
  // The round ended (RESTART, JOB_*): the store stays until the next offer; its progress no
  // longer matters.
  void stop_hosting();
  // Hosting a round every worker has joined: true once (PROGRESS is due then). Also empties
  // the progress timer, which fires every kProgressPoll while hosting.
  bool take_progress();
  // This node hosts the running round's store and every worker joined it (a re-join says so).
  bool progressed() const { return hosting_ && progress_sent_; }

 private:
  void set_poll(bool on);

  int epfd_;
  int timer_ = -1;  // in epfd_: polls the store's join counter while hosting
  std::unique_ptr<server::StoreServer> store_;
  bool hosting_ = false;        // store_ is the current round's workers' store
  bool progress_sent_ = false;  // every worker joined it (PROGRESS sent or owed to a re-join)
  int64_t world_size_ = 0;      // of the hosted round
  static constexpr std::chrono::milliseconds kProgressPoll{50};
};

}  // namespace ddprun::launcher
