// What the agent tells whoever watches it: the observer interface, in the spirit of
// torchelastic's `events.record` handlers. The agent notifies an ordered list of observers
// (observers.h) of its rounds, attempts, failures (an exit and a hang alike), reaped workers
// and its end; each observer does its own thing (`ddprun status`, --metrics_port, JSON log
// events, the run record and the hang watch, the end-of-run usage table). The agent never
// names one: they are built in one place (observers.cpp) from the options.
//
// Every hook runs on the agent's loop thread and has an empty default. An observer that needs
// a descriptor watched (a timerfd) lists it in watched_fds(); the loop calls on_ready(fd).
#pragma once

#include <sys/resource.h>
#include <sys/types.h>

#include <filesystem>
#include <functional>
#include <string>
#include <vector>

#include "ddprun/launcher/env_map.h"
#include "ddprun/launcher/options.h"
#include "ddprun/launcher/worker_env.h"
#include "ddprun/launcher/worker_status.h"

namespace ddprun::launcher {

struct ObservedWorker {
  int local_rank = 0;
  int global_rank = 0;
  pid_t pid = -1;
  std::string error_file;  // its TORCHELASTIC_ERROR_FILE; its progress file sits beside it
};

struct AttemptStarted {
  int attempt = 0;
  const GroupLayout* layout = nullptr;
  std::vector<ObservedWorker> workers;
  // Why the group (re)started: nullptr for the job's first attempt, "worker_failure" (this
  // node's) or "peer_restart".
  const char* restart_cause = nullptr;
};

// A worker of the current attempt failed: it exited non-zero, was killed, or hung.
struct WorkerFailed {
  int attempt = 0;
  int local_rank = 0;
  int global_rank = 0;
  pid_t pid = -1;
  WorkerStatus status;  // kHangExitCode for a hang
  bool hung = false;
  bool config_error = false;  // its exit says the configuration is wrong (error_file.h)
  const char* cause = "";     // "exit_code", "signal", "config_error" or "hang"
  double after_s = 0;         // since it started
  std::string what;           // "exit code 3", "SIGKILL", "hung"
};

// A worker process was reaped. `known`: one of the attempts' workers the group still knows
// (the others, of ended attempts, have only a pid).
struct WorkerReaped {
  pid_t pid = -1;
  bool known = false;
  int local_rank = 0;
  int global_rank = 0;
  int attempt = 0;
  double wall_s = 0;
  std::string error_file;
  struct rusage usage {};
};

// What observers add to a failure's record (the summary's) and to the end-of-run summary.
struct FailureNotes {
  std::string hang, stacks_dir, hang_stacks;  // summary.h's FailureDetails
};
struct SummaryNotes {
  std::string nccl_trace_dir;  // summary.h's SummaryInput
  std::vector<std::string> nccl_traces;
  size_t nccl_traces_more = 0;
};

// What an observer may ask of the agent.
class ObserverHost {
 public:
  virtual ~ObserverHost() = default;
  // Whether `attempt` is the running one, and which of its local ranks are alive.
  virtual bool attempt_running(int attempt) const = 0;
  virtual std::vector<bool> alive(size_t ranks) const = 0;
  // A worker stopped making progress: the agent fails it (WorkerHung).
  virtual void worker_hung(int local_rank, int attempt) = 0;
  // Something worth keeping (stacks) went into the run's log directory.
  virtual void keep_log_dir() = 0;
};

class AgentObserver {
 public:
  virtual ~AgentObserver() = default;

  virtual void joining() {}
  virtual void round(const GroupLayout&, int /*max_restarts*/, double /*rendezvous_s*/) {}
  // Each worker's environment, before it starts (never over a value already there).
  virtual void worker_env(EnvMap&, const std::string& /*error_file*/) {}
  virtual void attempt_started(const AttemptStarted&) {}
  virtual void worker_ended(int /*local_rank*/, bool /*success*/) {}  // of the current attempt
  virtual void failure_notes(const WorkerFailed&, FailureNotes&) {}
  virtual void worker_failed(const WorkerFailed&) {}
  virtual void worker_reaped(const WorkerReaped&) {}
  // The workers are gone; before the summary (the end-of-run table).
  virtual void run_ended() {}
  virtual void summary_notes(SummaryNotes&) const {}

  virtual std::vector<int> watched_fds() const { return {}; }
  virtual void on_ready(int /*fd*/) {}
  // The snapshot a multi-node agent's heartbeats carry (`ddprun status --rdzv_endpoint`).
  virtual std::function<std::string()> heartbeat_source() { return {}; }
};

// What the observers are built from (observers.cpp), after the run's log directory exists.
struct ObserverSetup {
  const LaunchOptions& opts;
  const EnvMap& env;
  std::filesystem::path run_log_dir;
  std::string python;  // the workers' interpreter when they run Python, else ""
  ObserverHost& host;
};

}  // namespace ddprun::launcher
