// The agent's side of the rendezvous (docs/RENDEZVOUS.md): one long-lived connection to the
// server, one JOIN and one ROUND per round, heartbeats from a background thread, and the
// server's notices (RESTART, JOB_DONE, JOB_FAILED, ERROR) read whenever fd() is readable.
//
// Thread-safety: join/poll/wait_message/report_* are for one thread (the agent's loop); the
// heartbeat thread only writes, under the send mutex. Errors throw RendezvousError.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <mutex>
#include <optional>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "ddprun/rdzv/agent_protocol.h"

namespace ddprun::rdzv {

class RendezvousError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

struct JoinInfo {
  std::string run_id = "none";
  std::string node_id;  // unique per agent: host_pid
  std::string host;     // the address this node advertises
  int local_world_size = 1;
  int min_nodes = 1, max_nodes = 1;
  int max_restarts = 0;
  std::chrono::milliseconds last_call{30000}, join_timeout{600000}, heartbeat_timeout{5000};
  int fixed_node_rank = -1;  // static mode: --node_rank
  bool prefer_rank0 = false;  // this node hosts the endpoint
};

struct RoundInfo {
  int64_t round = 0, restart_count = 0, max_restarts = 0;
  int node_rank = 0, nnodes = 1, world_size = 1, base_rank = 0;
  uint16_t store_port = 0;  // the round's workers' store, on the rendezvous server's address
};

class RendezvousClient {
 public:
  RendezvousClient(std::string host, uint16_t port, std::chrono::milliseconds connect_timeout,
                   std::chrono::milliseconds heartbeat_interval);
  ~RendezvousClient();
  RendezvousClient(const RendezvousClient&) = delete;
  RendezvousClient& operator=(const RendezvousClient&) = delete;

  // Sends JOIN and blocks until the ROUND (or throws with the server's ERROR/JOB_FAILED text,
  // or on timeout). Notices that arrive first (e.g. a late RESTART) are skipped.
  RoundInfo join(const JoinInfo& info, std::chrono::milliseconds timeout);
  // Sends JOIN without waiting: the ROUND comes later through poll() (for event loops).
  void send_join(const JoinInfo& info);
  // The layout carried by a ROUND message.
  static RoundInfo parse_round(const Message& m);
  // Readable when a notice may be waiting; pass it to epoll.
  int fd() const { return fd_; }
  // Reads what is available without blocking; returns the next complete notice, if any.
  // Throws RendezvousError when the server closed the connection.
  std::optional<Message> poll();
  // Blocks up to `timeout` for the next notice.
  std::optional<Message> wait_message(std::chrono::milliseconds timeout);

  void report_failure(const Message& failure);  // type is set to FAILURE
  void report_success(int64_t round);
  void leave();

  const std::string& host() const { return host_; }

 private:
  void send(const Message& m);
  bool read_some(bool block, std::chrono::milliseconds timeout);
  std::optional<Message> take_buffered();

  std::string host_;
  uint16_t port_;
  int fd_ = -1;
  std::vector<uint8_t> in_;
  std::mutex send_mu_;
  std::thread heartbeat_;
  std::mutex hb_mu_;
  std::condition_variable hb_cv_;
  bool stopping_ = false;
};

}  // namespace ddprun::rdzv
