#include "ddprun/launcher/worker_status.h"

#include "ddprun/launcher/signal_names.h"

namespace ddprun::launcher {

std::string WorkerStatus::describe() const {
  if (signaled) return "signal " + signal_name(code) + " (" + std::to_string(code) + ")";
  return "exit code " + std::to_string(code);
}

}  // namespace ddprun::launcher
