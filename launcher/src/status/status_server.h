// The agent's side of `ddprun status`: the board the agent records its events on, and the
// owner-only unix socket that answers each connection with one snapshot (launcher/README.md,
// "ddprun status").
//
// StatusBoard: the agent's loop records on it under a mutex, only on events (a round, an
// attempt, a worker's end, a failure); snapshot() reads each rank's /proc and GPU on the
// caller's thread. StatusSocket: one thread blocked in poll() on the listening socket; a
// connection from a process of another user is answered with a refusal and nothing else.
// Nothing runs on a timer: an agent nobody asks costs one sleeping thread.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "ddprun/launcher/agent_status.h"
#include "ddprun/launcher/env_map.h"
#include "status/rank_sampler.h"

namespace ddprun::launcher {

class StatusBoard {
 public:
  struct Worker {
    int local_rank, global_rank;
    pid_t pid;
  };
  StatusBoard(std::string run_id, int max_restarts, std::shared_ptr<RankSampler> sampler);

  // From the agent's loop.
  void joining();  // waiting for a round
  void round(const std::string& run_id, int node_rank, int num_nodes, int max_restarts);
  void attempt_started(int attempt, const std::vector<Worker>& workers);
  void worker_ended(int local_rank, bool success);
  void failed(int global_rank, const std::string& what);  // stops the group
  // From the socket's thread: the status now, each rank sampled.
  AgentStatus snapshot();
  // For the rendezvous server (the heartbeats of a multi-node agent): the snapshot's JSON at
  // most every kPublishEvery, "" in between (the heartbeat then carries none).
  std::string publish_if_due();
  static constexpr std::chrono::seconds kPublishEvery{2};

 private:
  using Clock = std::chrono::steady_clock;
  struct Rank {
    Worker w;
    std::string state;
    Clock::time_point started, ended;
  };
  struct CpuSample {
    double cpu_s;
    Clock::time_point at;
  };
  std::mutex mu_;
  AgentStatus base_;  // everything but the ranks
  std::vector<Rank> ranks_;
  Clock::time_point agent_started_ = Clock::now();
  std::optional<Clock::time_point> last_publish_;
  std::map<pid_t, CpuSample> last_cpu_;  // per pid: the previous snapshot's sample
  std::shared_ptr<RankSampler> sampler_;
};

class StatusSocket {
 public:
  // Binds <dir>/<agent pid>.sock (mode 0600) in `dir`, which is created with mode 0700 or must
  // already be a private directory of this user under directories only root or this user can
  // change (ensure_private_dir, platform/private_files.h), and starts the thread. nullptr and
  // *why when that cannot be done (the agent runs without it).
  static std::unique_ptr<StatusSocket> start(StatusBoard& board, const std::string& dir, std::string* why);
  ~StatusSocket();  // stops the thread, removes the socket file
  StatusSocket(const StatusSocket&) = delete;
  StatusSocket& operator=(const StatusSocket&) = delete;
  const std::string& path() const { return path_; }

 private:
  StatusSocket(StatusBoard& board, std::string path, int listen_fd, int stop_fd);
  void serve();
  void answer(int fd);
  StatusBoard& board_;
  std::string path_;
  int listen_fd_ = -1;
  int stop_fd_ = -1;  // an eventfd: the destructor wakes the thread
  std::thread thread_;
};

// This user's socket directory for this environment (runtime_dir, platform/private_files.h):
// the agent and `ddprun status` both ask here.
std::string status_dir(const EnvMap& env);

}  // namespace ddprun::launcher
