// The agent's observers (agent_observer.h), in the order they are told: built from the options
// in one place (make_observers), notified in turn. The agent holds one Observers and calls its
// hooks; it knows none of the observers.
#pragma once

#include <memory>
#include <vector>

#include "observers/agent_observer.h"

namespace ddprun::launcher {

class RankSampler;

class Observers {
 public:
  Observers() = default;
  explicit Observers(std::vector<std::unique_ptr<AgentObserver>> list) : list_(std::move(list)) {}

  // Calls `hook` on every observer, in order.
  template <class Hook>
  void each(Hook&& hook) {
    for (auto& o : list_) hook(*o);
  }
  // The descriptors to watch; on_ready() is false for one no observer asked for.
  std::vector<int> watched_fds() const;
  bool on_ready(int fd);
  FailureNotes failure_notes(const WorkerFailed& f);
  SummaryNotes summary_notes() const;
  // The first observer's heartbeat snapshot, or an empty function.
  std::function<std::string()> heartbeat_source();

 private:
  std::vector<std::unique_ptr<AgentObserver>> list_;
};

// Every observer the options ask for (`ddprun status`, --metrics_port, JSON log events, the
// run record and --hang_timeout, the usage table). Throws UsageError for a bad setting (a
// taken --metrics_port).
Observers make_observers(const ObserverSetup& setup);

// Each built-in observer (observers.cpp orders them); nullptr where the options want none.
std::unique_ptr<AgentObserver> make_status_observer(const ObserverSetup& s, std::shared_ptr<RankSampler> sampler);
std::unique_ptr<AgentObserver> make_metrics_observer(const ObserverSetup& s, std::shared_ptr<RankSampler> sampler);
std::unique_ptr<AgentObserver> make_log_observer(const ObserverSetup& s);
std::unique_ptr<AgentObserver> make_hang_observer(const ObserverSetup& s);
std::unique_ptr<AgentObserver> make_usage_observer(const ObserverSetup& s, std::shared_ptr<RankSampler> sampler);

}  // namespace ddprun::launcher
