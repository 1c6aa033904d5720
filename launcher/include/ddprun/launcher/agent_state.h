// The agent's decisions, as a pure state machine: events in (a worker exited, a signal
// arrived, the armed timer expired), actions out (start an attempt, signal the workers, arm a
// timer, finish with an exit code). No processes, no clock: the agent (agent.cpp) performs
// the actions and feeds back events; tests drive it directly.
//
//   Running --worker fails--> Stopping --all exited--> Running (next attempt) or Done
//      |                        |  timer: SIGKILL
//      |--signal--> Stopping    v
//      |                      Killing --all exited or timer--> (same as above)
//      |--worker fails, restart due, overlap_restart--> RetireWorkers, Running (next attempt)
//      '--all exited 0--> Done(0)
//
// Overlapped restart (single node, AgentConfig::overlap_restart): the failed attempt's
// survivors are sent SIGTERM and handed to the agent as a retiring group (RetireWorkers);
// the next attempt starts at once instead of after they exited. The agent stops a retiring
// group on its own deadlines (SIGKILL after `seconds`, then gives up after the kill wait) and
// still reads its output; its exits come back as WorkerExited with the old `attempt` and are
// ignored here.
//
// Thread-safety: none (one owner).
#pragma once

#include <optional>
#include <set>
#include <string>
#include <variant>
#include <vector>

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

struct WorkerExited {
  int local_rank = 0;
  WorkerStatus status;
  // Whether the attempt had made progress when this worker ended: every worker of the group
  // had joined the store (init/ reached the world size). Only read for the first failure of
  // the running attempt.
  bool attempt_progressed = true;
  // The attempt the worker belonged to; unset: the current one. Exits of an earlier attempt
  // (a retiring group's) are ignored.
  std::optional<int> attempt;
};
struct SignalReceived {
  int signo = 0;
};
struct TimerExpired {};
// Multi-node (coordinated) mode: the rendezvous server decides restarts for the whole job.
struct RoundReady {
  int attempt = 0;  // the job-wide restart count the server sent with the round
};
struct CoordinatorNotice {
  enum class Kind {
    Restart,  // stop the local group (if running) and join the next round as `attempt`
    JobDone,  // every node succeeded
    JobFailed,  // the job ended (budget spent, lost nodes, rendezvous error, server gone)
  };
  Kind kind = Kind::Restart;
  int attempt = 0;
};
using AgentEvent = std::variant<WorkerExited, SignalReceived, TimerExpired, RoundReady, CoordinatorNotice>;

struct Action {
  enum class Kind {
    StartAttempt,   // (re)start every local worker; `attempt` = TORCHELASTIC_RESTART_COUNT.
                    // For attempt > 0 the worker keyspace must be reset first.
    ReportFailure,  // `local_rank` failed with `status` in `attempt`; `will_restart` says what next
    SignalWorkers,  // send `signo` to the process group of every worker of the attempt
    RetireWorkers,  // single node, overlapped restart: every still-running worker of `attempt`
                    // (already sent SIGTERM) leaves the attempt and retires in the background:
                    // SIGKILL after `seconds`, no longer waited for after the kill wait. Their
                    // exits are not events of any attempt. StartAttempt(attempt + 1) follows.
    ArmTimer,       // (re)arm the single timer to expire in `seconds`
    DisarmTimer,
    AbandonWorkers,  // workers still not reaped after SIGKILL + grace: stop waiting for them
    Finish,          // exit with `exit_code`
    // coordinated mode only:
    JoinRound,       // send JOIN for `attempt`; a RoundReady (or a JobFailed notice) follows
    ReportSuccess,   // every local worker of `attempt` exited 0: tell the server
  };
  Kind kind;
  int attempt = 0;
  int local_rank = -1;
  WorkerStatus status{};
  bool will_restart = false;
  int signo = 0;
  double seconds = 0;
  int exit_code = 0;

  bool operator==(const Action&) const = default;
};

struct AgentConfig {
  int nproc = 1;
  int max_restarts = 0;
  double shutdown_timeout_s = 30;  // SIGTERM -> SIGKILL grace
  double kill_wait_s = 5;          // SIGKILL -> give up waiting (processes stuck in the kernel)
  // Multi-node: restarts and the end of the job are the rendezvous server's decisions;
  // ReportFailure/ReportSuccess go to it and the agent waits for its notice.
  bool coordinated = false;
  // Single node: on a failure that will be restarted, start the next attempt without waiting
  // for the failed attempt's survivors to exit (RetireWorkers). Off: stop the whole group
  // (grace, SIGKILL), then start. Ignored in coordinated mode.
  bool overlap_restart = true;
};

struct FailureRecord {
  int local_rank = -1;
  int attempt = 0;
  WorkerStatus status;
};

class AgentState {
 public:
  // Joining and Awaiting exist in coordinated mode only: waiting for the server's round, and
  // for its verdict after the local group ended.
  enum class Phase { Idle, Joining, Running, Stopping, Killing, Awaiting, Done };

  explicit AgentState(AgentConfig config);

  // Idle -> Running: StartAttempt(0).
  std::vector<Action> start();
  std::vector<Action> on_event(const AgentEvent& event);

  Phase phase() const { return phase_; }
  int attempt() const { return attempt_; }
  const std::set<int>& alive() const { return alive_; }
  // The first failure of the latest failed attempt (what the summary reports).
  const std::optional<FailureRecord>& last_failure() const { return failure_; }
  // The job ended because the same attempt-start failure repeated (not retried).
  bool deterministic_failure() const { return deterministic_failure_; }
  // The signal that made the agent stop, if any.
  std::optional<int> stop_signal() const { return stop_signal_; }
  std::optional<int> exit_code() const { return exit_code_; }

 private:
  std::vector<Action> on_exit(const WorkerExited& e);
  std::vector<Action> on_signal(const SignalReceived& e);
  std::vector<Action> on_timer();
  std::vector<Action> on_round(const RoundReady& r);
  std::vector<Action> on_notice(const CoordinatorNotice& n);
  int failure_exit_code() const;
  void begin_attempt(std::vector<Action>& out);
  void begin_next_attempt(std::vector<Action>& out);
  void group_stopped(std::vector<Action>& out);
  void finish(int code, std::vector<Action>& out);

  AgentConfig config_;
  Phase phase_ = Phase::Idle;
  int attempt_ = 0;
  std::set<int> alive_;
  std::optional<FailureRecord> failure_;
  bool failed_this_attempt_ = false;
  std::optional<int> stop_signal_;
  std::optional<int> exit_code_;
  // coordinated mode: what to do once the stopping group is gone
  std::optional<int> pending_restart_;
  // Single node: a failure before progress in two attempts in a row ends the job.
  bool this_attempt_progressed_ = true;
  bool previous_failed_without_progress_ = false;
  bool deterministic_failure_ = false;
  bool pending_job_failed_ = false;
};

const char* phase_name(AgentState::Phase p);

}  // namespace ddprun::launcher
