// ddprun's own log line for a worker's failure: the `worker_failed` event (--log_format=json),
// the same for an exit and a hang.
#include <spdlog/spdlog.h>

#include "ddprun/launcher/log_events.h"
#include "ddprun/launcher/signal_names.h"
#include "observers/observers.h"

namespace ddprun::launcher {
namespace {

class LogObserver : public AgentObserver {
 public:
  void worker_failed(const WorkerFailed& f) override {
    const bool sig = f.status.signaled;
    LogEvent ev("worker_failed",
                {{"local_rank", int64_t{f.local_rank}},
                 {"pid", int64_t{f.pid}},
                 {sig ? "signal" : "exit_code",
                  sig ? LogFieldValue(std::string(signal_name(f.status.code))) : LogFieldValue(int64_t{f.status.code})},
                 {"after_s", f.after_s},
                 {"attempt", int64_t{f.attempt}},
                 {"config_error", f.config_error},
                 {"cause", std::string(f.cause)}},
                f.global_rank);
    if (f.hung)
      spdlog::warn("worker r{} (local rank {}, pid {}) hung after {:.2f} s; stopping the group", f.global_rank,
                   f.local_rank, f.pid, f.after_s);
    else
      spdlog::warn("worker r{} (local rank {}, pid {}) failed: {} after {:.2f} s; stopping the group", f.global_rank,
                   f.local_rank, f.pid, f.what, f.after_s);
  }
};

}  // namespace

std::unique_ptr<AgentObserver> make_log_observer(const ObserverSetup&) { return std::make_unique<LogObserver>(); }

}  // namespace ddprun::launcher
