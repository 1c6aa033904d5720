// The agent's decisions, as a pure state machine: events in (a worker exited, a signal
// arrived, the armed timer expired, the coordinator's round or notice), actions out (join,
// start an attempt, signal the workers, report, arm a timer, finish with an exit code). No
// processes, no clock: the agent (agent.cpp) performs the actions and feeds back events; tests
// drive it directly.
//
// The agent always runs coordinated (coordinator.h), for one node as for many: whether and
// when to restart is the round's decision (budget, progress, deterministic failures); the
// agent reports and follows the notice.
//
//   Joining --round--> Running --all exited 0--> Awaiting --JobDone--> Done(0)
//                        |  worker fails: report, SIGTERM
//                        v
//                      Stopping --timer: SIGKILL--> Killing --all exited or timer-->
//                        |                               group stopped: Restart known -> Joining
//                        |                               JobFailed known -> Done; else Awaiting
//                        '--Restart notice, overlap_restart--> RetireWorkers, Joining
//
// Hang (--hang_timeout, WorkerHung): in Running, a worker that stopped making progress fails
// as if it had exited (report, SIGTERM -> Stopping); the failure says `hung`.
//
// Exit barrier (AgentConfig::exit_barrier_timeout_s): in Running, the first exit 0 while
// others run arms the timer; when it expires first, StopStragglers + SIGTERM -> Stopping, and
// the group's end is Done(kExitBarrierTimeoutExitCode), never a restart.
//
// Overlapped restart (AgentConfig::overlap_restart, a local policy): when the Restart notice
// comes while the failed group is still stopping, its survivors (already sent SIGTERM) are
// handed to the agent as a retiring group (RetireWorkers) and the next round is joined at
// once instead of after they exited. The agent stops a retiring group on its own deadlines
// (SIGKILL after `seconds`, then gives up after the kill wait) and still reads its output; its
// exits come back as WorkerExited with the old `attempt` and are ignored here.
//
// Preemption (a scheduler wants the node back: Slurm's `--signal=USR1@T` warning, `scancel
// --signal=USR1`): a preemption signal (SignalReceived::preempt) is forwarded to the workers,
// which get AgentConfig::preempt_grace_s to stop on their own (write a checkpoint, exit) before
// the ordinary stop (SIGTERM, shutdown grace, SIGKILL):
//
//   Running --preemption signal: forward it--> Preempting --timer: SIGTERM--> Stopping ...
//
// A worker of the current attempt that exits with kPreemptedExitCode after a preemption signal
// reached this agent, or after announcing a preemption (WorkerExited::announced_preemption: the
// worker runtime's agree_stop() on a node the signal did not reach), is a preemption too; any
// other exit with that code is an ordinary failure. The others get the same grace,
// unsignalled. So is that exit from a group stopped for a stop signal or a JobFailed notice,
// but not from one stopped for a Restart notice (a scale-up: the workers only stopped cleanly
// at a step boundary, and the restart goes on). Once preempted, worker exits are not failures
// (nothing is reported, nothing restarted: a preemption costs no restart budget), notices no
// longer restart the group, and the agent finishes with kPreemptedExitCode whatever the
// workers' statuses were: the batch script requeues the job and it resumes from its last
// checkpoint. Repeated preemption signals are ignored (Slurm signals every process of a step,
// srun may relay it again); a stop signal while preempting cuts the grace short (forwarded,
// shutdown grace, SIGKILL). A preemption signal while joining or awaiting finishes at once;
// while a failed group stops, it only cancels the restart.
//
// Thread-safety: none (one owner).
#pragma once

#include <optional>
#include <set>
#include <string>
#include <variant>
#include <vector>

#include "ddprun/launcher/worker_status.h"

namespace ddprun::launcher {

// The exit code of a job that stopped because of a preemption, of ddprun and of workers that
// stopped for one (libddprun_worker's kExitPreempted). Distinct from every code ddprun gives
// otherwise (0, a worker's failure code, 1, 2 for usage errors, 128 + signal), from the
// sysexits.h range (64-78: the worker runtime's comm failure is 75) and from the shell's
// (124-127), so a batch script can tell "requeue me" from everything else.
inline constexpr int kPreemptedExitCode = 99;

struct WorkerExited {
  int local_rank = 0;
  WorkerStatus status;
  // The attempt the worker belonged to; unset: the current one. Exits of an earlier attempt
  // (a retiring group's) are ignored.
  std::optional<int> attempt;
  // The worker said it stopped for a preemption (its DDPRUN_PREEMPT_FILE exists): its
  // kPreemptedExitCode is then a preemption even when no preemption signal reached this agent.
  bool announced_preemption = false;
};
// --hang_timeout: the hang watch (hang.h) found `local_rank` stuck in `attempt` (its stacks are
// saved). In Running it is a failure like an exit (ReportFailure with `hung`, SIGTERM to the
// group, the round decides on a restart); otherwise (already stopping) it changes nothing.
struct WorkerHung {
  int local_rank = 0;
  int attempt = 0;
};
struct SignalReceived {
  int signo = 0;
  bool preempt = false;  // one of --preempt_signals: ask the workers to stop, give them the grace
};
struct TimerExpired {};
// The coordinator's round is complete: this node's attempt number (the job-wide restart count).
struct RoundReady {
  int attempt = 0;
};
struct CoordinatorNotice {
  enum class Kind {
    Restart,    // stop the local group (if running) and join the next round (`attempt`)
    JobDone,    // every node succeeded
    JobFailed,  // the job ended (budget spent, deterministic failure, lost nodes, rendezvous
                // error, coordinator gone)
  };
  Kind kind = Kind::Restart;
  int attempt = 0;
};
using AgentEvent = std::variant<WorkerExited, SignalReceived, TimerExpired, RoundReady, CoordinatorNotice, WorkerHung>;

// The status a hung worker's failure is reported with (it has not exited): ddprun's exit code
// when the job ends because of a hang.
inline constexpr int kHangExitCode = 1;

struct Action {
  enum class Kind {
    JoinRound,      // ask the coordinator for the next round; a RoundReady (or a JobFailed
                    // notice) follows. `attempt`: the one expected (informational)
    StartAttempt,   // (re)start every local worker; `attempt` = TORCHELASTIC_RESTART_COUNT. The
                    // round's workers' store is fresh (the coordinator saw to it).
    ReportFailure,  // `local_rank` failed with `status` in `attempt`: tell the coordinator
                    // (`hung`: it stopped making progress and still runs)
    ReportSuccess,  // every local worker of `attempt` exited 0: tell the coordinator
    SignalWorkers,  // send `signo` to the process group of every worker of the attempt
    RetireWorkers,  // overlapped restart: every still-running worker of `attempt` (already
                    // sent SIGTERM) leaves the attempt and retires in the background: SIGKILL
                    // after `seconds`, no longer waited for after the kill wait. Their exits
                    // are not events of any attempt. JoinRound follows.
    ArmTimer,       // (re)arm the single timer to expire in `seconds`
    DisarmTimer,
    AbandonWorkers,  // workers still not reaped after SIGKILL + grace: stop waiting for them
    StopStragglers,  // the exit barrier expired: `local_rank` exited 0 `seconds` ago and the
                     // workers in alive() still run; say so (SignalWorkers SIGTERM follows)
    Finish,          // exit with `exit_code`
  };
  Kind kind;
  int attempt = 0;
  int local_rank = -1;
  WorkerStatus status{};
  int signo = 0;
  double seconds = 0;
  int exit_code = 0;
  bool hung = false;

  bool operator==(const Action&) const = default;
};

struct AgentConfig {
  int nproc = 1;
  double shutdown_timeout_s = 30;  // SIGTERM -> SIGKILL grace
  double kill_wait_s = 5;          // SIGKILL -> give up waiting (processes stuck in the kernel)
  // On a Restart notice while the group is stopping, join the next round without waiting for
  // the survivors to exit (RetireWorkers). Off: stop the whole group (grace, SIGKILL), then join.
  bool overlap_restart = true;
  // Preemption signal (or a worker's kPreemptedExitCode exit) -> the ordinary stop (SIGTERM).
  double preempt_grace_s = 90;

  // Once a worker of the attempt has exited 0, the others get this long before they are
  // stopped and the agent finishes with kExitBarrierTimeoutExitCode (no restart: the work that
  // finished is done). 0: no limit.
  double exit_barrier_timeout_s = 0;
};

struct FailureRecord {
  int local_rank = -1;
  int attempt = 0;
  WorkerStatus status;
  bool hung = false;  // --hang_timeout: it stopped making progress (status: kHangExitCode)
};

class AgentState {
 public:
  // Joining: waiting for the coordinator's round. Awaiting: for its verdict after the local
  // group ended.
  // Preempting: the workers were asked to stop for a preemption and have the preempt grace.
  enum class Phase { Idle, Joining, Running, Preempting, Stopping, Killing, Awaiting, Done };

  explicit AgentState(AgentConfig config);

  // Idle -> Joining: JoinRound(0).
  std::vector<Action> start();
  std::vector<Action> on_event(const AgentEvent& event);

  Phase phase() const { return phase_; }
  int attempt() const { return attempt_; }
  const std::set<int>& alive() const { return alive_; }
  // The first failure of the latest failed attempt (what the summary reports).
  const std::optional<FailureRecord>& last_failure() const { return failure_; }
  // The signal that made the agent stop, if any.
  std::optional<int> stop_signal() const { return stop_signal_; }
  // A preemption signal arrived or a worker exited with kPreemptedExitCode: the agent finishes
  // with kPreemptedExitCode.
  bool preempted() const { return preempted_; }
  std::optional<int> exit_code() const { return exit_code_; }

 private:
  std::vector<Action> on_exit(const WorkerExited& e);
  std::vector<Action> on_hung(const WorkerHung& e);
  void fail(const FailureRecord& f, std::vector<Action>& out);
  std::vector<Action> on_signal(const SignalReceived& e);
  std::vector<Action> on_timer();
  std::vector<Action> on_round(const RoundReady& r);
  std::vector<Action> on_notice(const CoordinatorNotice& n);
  int failure_exit_code() const;
  void begin_attempt(std::vector<Action>& out);
  void join(int attempt, std::vector<Action>& out);
  void group_stopped(std::vector<Action>& out);
  void finish(int code, std::vector<Action>& out);
  void finish_for_signal(std::vector<Action>& out);
  bool preempt_exit(const WorkerExited& e) const {
    return !e.status.signaled && e.status.code == kPreemptedExitCode && (e.announced_preemption || preempt_signal_);
  }

  AgentConfig config_;
  Phase phase_ = Phase::Idle;
  int attempt_ = 0;
  std::set<int> alive_;
  std::optional<FailureRecord> failure_;
  bool failed_this_attempt_ = false;
  std::optional<int> stop_signal_;
  bool preempted_ = false;
  bool preempt_signal_ = false;  // a preemption signal reached this agent
  std::optional<int> exit_code_;
  // What to do once the stopping group is gone (the notice came while it stopped).
  std::optional<int> pending_restart_;
  bool pending_job_failed_ = false;
  bool barrier_armed_ = false;        // the timer waits for the attempt's stragglers
  bool stopping_stragglers_ = false;  // the exit barrier expired; ends in Done(124)
  int first_done_rank_ = -1;
};

const char* phase_name(AgentState::Phase p);

}  // namespace ddprun::launcher
