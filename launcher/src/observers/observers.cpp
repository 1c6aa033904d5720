#include "observers/observers.h"

#include <algorithm>

#include "status/rank_sampler.h"

namespace ddprun::launcher {

// The order they are told in: the status board and the metrics first (what a user reads while
// the job runs), then the log line, the run record and hang watch, the usage table.
Observers make_observers(const ObserverSetup& setup) {
  // /proc and NVML, shared by the status socket, the metrics endpoint and the usage table.
  auto sampler = std::make_shared<RankSampler>();
  std::vector<std::unique_ptr<AgentObserver>> list;
  auto add = [&](std::unique_ptr<AgentObserver> o) {
    if (o) list.push_back(std::move(o));
  };
  add(make_status_observer(setup, sampler));
  add(make_metrics_observer(setup, sampler));
  add(make_log_observer(setup));
  add(make_hang_observer(setup));
  add(make_usage_observer(setup, sampler));
  return Observers(std::move(list));
}

std::vector<int> Observers::watched_fds() const {
  std::vector<int> fds;
  for (const auto& o : list_) {
    const auto mine = o->watched_fds();
    fds.insert(fds.end(), mine.begin(), mine.end());
  }
  return fds;
}

bool Observers::on_ready(int fd) {
  for (auto& o : list_) {
    const auto mine = o->watched_fds();
    if (std::find(mine.begin(), mine.end(), fd) == mine.end()) continue;
    o->on_ready(fd);
    return true;
  }
  return false;
}

FailureNotes Observers::failure_notes(const WorkerFailed& f) {
  FailureNotes n;
  for (auto& o : list_) o->failure_notes(f, n);
  return n;
}

SummaryNotes Observers::summary_notes() const {
  SummaryNotes n;
  for (const auto& o : list_) o->summary_notes(n);
  return n;
}

std::function<std::string()> Observers::heartbeat_source() {
  for (auto& o : list_)
    if (auto fn = o->heartbeat_source()) return fn;
  return {};
}

}  // namespace ddprun::launcher
