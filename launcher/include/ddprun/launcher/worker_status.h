// How a worker process ended (from waitpid or the early exit watch), as the agent's decisions,
// the summary and the worker group all describe it. Pure.
#pragma once

#include <string>

namespace ddprun::launcher {

// How a worker ended (from waitpid).
struct WorkerStatus {
  bool signaled = false;
  int code = 0;  // exit code, or the signal number when signaled

  static WorkerStatus exited(int c) { return {false, c}; }
  static WorkerStatus killed_by(int signo) { return {true, signo}; }
  bool success() const { return !signaled && code == 0; }
  // The launcher's exit code for this status: the exit code, or 128 + signal.
  int exit_code() const { return signaled ? 128 + code : code; }
  // "exit code 3" or "signal SIGKILL (9)".
  std::string describe() const;

  bool operator==(const WorkerStatus&) const = default;
};

}  // namespace ddprun::launcher
