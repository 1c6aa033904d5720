// `ddprun status`: the board the agent's events are recorded on, and the owner-only socket
// that serves it (status/status_server.h), up before the first round so a job still in its
// rendezvous shows.
#include <spdlog/spdlog.h>

#include "observers/observers.h"
#include "status/status_server.h"

namespace ddprun::launcher {
namespace {

class StatusObserver : public AgentObserver {
 public:
  StatusObserver(const ObserverSetup& s, std::shared_ptr<RankSampler> sampler)
      : board_(std::make_shared<StatusBoard>(s.opts.rendezvous.id, s.opts.faults.max_restarts, std::move(sampler))) {
    std::string why;
    socket_ = StatusSocket::start(*board_, status_dir(s.env), &why);
    if (!socket_) spdlog::warn("`ddprun status` cannot see this job: {}", why);
    else spdlog::debug("status socket {}", socket_->path());
  }

  void joining() override { board_->joining(); }
  void round(const GroupLayout& l, int max_restarts, double) override {
    board_->round(l.run_id, l.node_rank, l.num_nodes, max_restarts);
  }
  void attempt_started(const AttemptStarted& a) override {
    std::vector<StatusBoard::Worker> ws;
    for (const auto& w : a.workers) ws.push_back({w.local_rank, w.global_rank, w.pid});
    board_->attempt_started(a.attempt, ws);
  }
  void worker_ended(int local_rank, bool success) override { board_->worker_ended(local_rank, success); }
  void worker_failed(const WorkerFailed& f) override {
    board_->failed(f.global_rank,
                   fmt::format("r{}: {} after {:.1f} s (attempt {})", f.global_rank, f.what, f.after_s, f.attempt));
  }
  std::function<std::string()> heartbeat_source() override {
    return [board = board_] { return board->publish_if_due(); };
  }

 private:
  std::shared_ptr<StatusBoard> board_;  // shared with the heartbeats that carry its snapshots
  std::unique_ptr<StatusSocket> socket_;
};

}  // namespace

std::unique_ptr<AgentObserver> make_status_observer(const ObserverSetup& s, std::shared_ptr<RankSampler> sampler) {
  return std::make_unique<StatusObserver>(s, std::move(sampler));
}

}  // namespace ddprun::launcher
