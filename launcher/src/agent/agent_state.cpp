#include "ddprun/launcher/agent_state.h"

#include <csignal>

#include "ddprun/launcher/options.h"
#include "ddprun/launcher/signal_names.h"

namespace ddprun::launcher {

const char* phase_name(AgentState::Phase p) {
  switch (p) {
    case AgentState::Phase::Idle: return "idle";
    case AgentState::Phase::Joining: return "joining";
    case AgentState::Phase::Awaiting: return "awaiting the job's verdict";
    case AgentState::Phase::Running: return "running";
    case AgentState::Phase::Preempting: return "preempting";
    case AgentState::Phase::Stopping: return "stopping";
    case AgentState::Phase::Killing: return "killing";
    case AgentState::Phase::Done: return "done";
  }
  return "?";
}

AgentState::AgentState(AgentConfig config) : config_(config) {}

std::vector<Action> AgentState::start() {
  std::vector<Action> out;
  if (phase_ != Phase::Idle) return out;
  attempt_ = 0;
  join(0, out);
  return out;
}

void AgentState::join(int attempt, std::vector<Action>& out) {
  phase_ = Phase::Joining;
  out.push_back({.kind = Action::Kind::JoinRound, .attempt = attempt});
}

void AgentState::begin_attempt(std::vector<Action>& out) {
  phase_ = Phase::Running;
  failed_this_attempt_ = false;
  barrier_armed_ = false;
  first_done_rank_ = -1;
  alive_.clear();
  for (int r = 0; r < config_.nproc; ++r) alive_.insert(r);
  out.push_back({.kind = Action::Kind::StartAttempt, .attempt = attempt_});
}

std::vector<Action> AgentState::on_event(const AgentEvent& event) {
  if (phase_ == Phase::Idle || phase_ == Phase::Done) return {};
  if (auto* e = std::get_if<WorkerExited>(&event)) return on_exit(*e);
  if (auto* s = std::get_if<SignalReceived>(&event)) return on_signal(*s);
  if (auto* r = std::get_if<RoundReady>(&event)) return on_round(*r);
  if (auto* n = std::get_if<CoordinatorNotice>(&event)) return on_notice(*n);
  if (auto* h = std::get_if<WorkerHung>(&event)) return on_hung(*h);
  return on_timer();
}

int AgentState::failure_exit_code() const {
  return failure_ ? (failure_->status.exit_code() != 0 ? failure_->status.exit_code() : 1) : 1;
}

std::vector<Action> AgentState::on_round(const RoundReady& r) {
  std::vector<Action> out;
  if (phase_ != Phase::Joining) return out;
  attempt_ = r.attempt;
  begin_attempt(out);
  return out;
}

std::vector<Action> AgentState::on_notice(const CoordinatorNotice& n) {
  std::vector<Action> out;
  using K = CoordinatorNotice::Kind;
  switch (phase_) {
    case Phase::Running:
    case Phase::Stopping:
      if (n.kind == K::JobDone) return out;  // cannot be: this node has not succeeded yet
      if (n.kind == K::Restart && config_.overlap_restart && !stop_signal_ && !preempted_) {
        // The survivors wind down in the background; the next round does not wait for the
        // kernel to tear them down (tens of ms per process with PyTorch loaded).
        if (phase_ == Phase::Running) out.push_back({.kind = Action::Kind::SignalWorkers, .signo = SIGTERM});
        else out.push_back({.kind = Action::Kind::DisarmTimer});
        out.push_back(
            {.kind = Action::Kind::RetireWorkers, .attempt = attempt_, .seconds = config_.shutdown_timeout_s});
        alive_.clear();
        join(n.attempt, out);
        return out;
      }
      if (n.kind == K::Restart) pending_restart_ = n.attempt;
      else pending_job_failed_ = true;
      if (phase_ == Phase::Running) {
        phase_ = Phase::Stopping;
        out.push_back({.kind = Action::Kind::SignalWorkers, .signo = SIGTERM});
        out.push_back({.kind = Action::Kind::ArmTimer, .seconds = config_.shutdown_timeout_s});
      }
      return out;
    case Phase::Preempting:  // the preemption decides the ending (group_stopped)
    case Phase::Killing:
      if (n.kind == K::Restart) pending_restart_ = n.attempt;
      else if (n.kind == K::JobFailed) pending_job_failed_ = true;
      return out;
    case Phase::Awaiting:
    case Phase::Joining:
      if (n.kind == K::Restart) {
        if (phase_ == Phase::Joining) return out;  // the JOIN we sent answers it
        join(n.attempt, out);
      } else if (n.kind == K::JobDone) {
        finish(failed_this_attempt_ ? failure_exit_code() : 0, out);
      } else {
        finish(failure_exit_code(), out);
      }
      return out;
    default: return out;
  }
}

std::vector<Action> AgentState::on_exit(const WorkerExited& e) {
  std::vector<Action> out;
  if (e.attempt && *e.attempt != attempt_) return out;  // a retired worker of an earlier attempt
  if (alive_.erase(e.local_rank) == 0) return out;      // not one of this attempt's live workers
  if (phase_ == Phase::Running) {
    if (preempt_exit(e)) {
      // The workers stopped for a preemption (their ranks agreed on it): no failure. The others
      // are on their way out; they get the preemption grace, and no signal that could cut a
      // checkpoint short.
      preempted_ = true;
      if (alive_.empty()) {
        group_stopped(out);
      } else {
        phase_ = Phase::Preempting;
        out.push_back({.kind = Action::Kind::ArmTimer, .seconds = config_.preempt_grace_s});
      }
      return out;
    }
    if (e.status.success()) {
      if (alive_.empty()) {
        if (barrier_armed_) out.push_back({.kind = Action::Kind::DisarmTimer});
        barrier_armed_ = false;
        phase_ = Phase::Awaiting;
        out.push_back({.kind = Action::Kind::ReportSuccess, .attempt = attempt_});
      } else if (config_.exit_barrier_timeout_s > 0 && !barrier_armed_) {
        barrier_armed_ = true;
        first_done_rank_ = e.local_rank;
        out.push_back({.kind = Action::Kind::ArmTimer, .seconds = config_.exit_barrier_timeout_s});
      }
      return out;
    }
    fail(FailureRecord{e.local_rank, attempt_, e.status}, out);
    return out;
  }
  // Preempting, Stopping or Killing: wait for the rest. A group stopped for a stop signal or
  // because the job ended (another node left after its preemption) whose workers answer with
  // the preemption code was preempted, unless this attempt failed here first. Stopped for a
  // restart (a scale-up, another node's failure), the code only says they stopped cleanly
  // (after a checkpoint, with libddprun_worker): the restart goes on.
  if (preempt_exit(e) && !failed_this_attempt_ && !pending_restart_) preempted_ = true;
  if (alive_.empty()) {
    out.push_back({.kind = Action::Kind::DisarmTimer});
    group_stopped(out);
  }
  return out;
}

void AgentState::fail(const FailureRecord& f, std::vector<Action>& out) {
  failure_ = f;
  failed_this_attempt_ = true;
  barrier_armed_ = false;  // the timer is the stop's from here on
  out.push_back({.kind = Action::Kind::ReportFailure,
                 .attempt = attempt_,
                 .local_rank = f.local_rank,
                 .status = f.status,
                 .hung = f.hung});
  // Stop the whole group, including process groups whose leader is gone.
  out.push_back({.kind = Action::Kind::SignalWorkers, .signo = SIGTERM});
  if (alive_.empty()) {
    group_stopped(out);
  } else {
    phase_ = Phase::Stopping;
    out.push_back({.kind = Action::Kind::ArmTimer, .seconds = config_.shutdown_timeout_s});
  }
}

std::vector<Action> AgentState::on_hung(const WorkerHung& e) {
  std::vector<Action> out;
  // Only a live worker of the running attempt: a verdict that raced the worker's exit, a
  // failure or a signal changes nothing.
  if (phase_ != Phase::Running || e.attempt != attempt_ || !alive_.contains(e.local_rank)) return out;
  fail(FailureRecord{e.local_rank, attempt_, WorkerStatus::exited(kHangExitCode), true}, out);
  return out;
}

std::vector<Action> AgentState::on_signal(const SignalReceived& s) {
  std::vector<Action> out;
  if (s.preempt) {
    preempt_signal_ = true;
    if (preempted_) return out;  // already stopping for a preemption: a repeat changes nothing
    preempted_ = true;
    switch (phase_) {
      case Phase::Joining:
      case Phase::Awaiting:
        stop_signal_ = s.signo;
        finish_for_signal(out);
        return out;
      case Phase::Running:
        stop_signal_ = s.signo;
        phase_ = Phase::Preempting;
        out.push_back({.kind = Action::Kind::SignalWorkers, .signo = s.signo});
        out.push_back({.kind = Action::Kind::ArmTimer, .seconds = config_.preempt_grace_s});
        return out;
      default:
        // Already stopping (a failure, a notice, a stop signal): the preemption changes only the
        // ending (no restart, the preemption code). The workers still hear of it.
        if (!stop_signal_) {
          stop_signal_ = s.signo;
          out.push_back({.kind = Action::Kind::SignalWorkers, .signo = s.signo});
        }
        return out;
    }
  }
  if (phase_ == Phase::Joining || phase_ == Phase::Awaiting) {
    stop_signal_ = s.signo;
    finish_for_signal(out);
    return out;
  }
  if (phase_ == Phase::Running || phase_ == Phase::Preempting || (phase_ == Phase::Stopping && !stop_signal_)) {
    // Forward the signal itself; the workers decide how to wind down. A signal while a
    // failed group is stopping cancels the restart; one while preempting ends the grace.
    if (!stop_signal_) stop_signal_ = s.signo;
    out.push_back({.kind = Action::Kind::SignalWorkers, .signo = s.signo});
    if (phase_ != Phase::Stopping) {
      phase_ = Phase::Stopping;
      out.push_back({.kind = Action::Kind::ArmTimer, .seconds = config_.shutdown_timeout_s});
    }
    return out;
  }
  if (phase_ == Phase::Stopping) {
    // A second signal: the user does not want to wait for the grace period.
    phase_ = Phase::Killing;
    out.push_back({.kind = Action::Kind::SignalWorkers, .signo = SIGKILL});
    out.push_back({.kind = Action::Kind::ArmTimer, .seconds = config_.kill_wait_s});
  }
  return out;
}

std::vector<Action> AgentState::on_timer() {
  std::vector<Action> out;
  if (phase_ == Phase::Running && barrier_armed_) {
    barrier_armed_ = false;
    stopping_stragglers_ = true;
    phase_ = Phase::Stopping;
    out.push_back({.kind = Action::Kind::StopStragglers,
                   .local_rank = first_done_rank_,
                   .seconds = config_.exit_barrier_timeout_s});
    out.push_back({.kind = Action::Kind::SignalWorkers, .signo = SIGTERM});
    out.push_back({.kind = Action::Kind::ArmTimer, .seconds = config_.shutdown_timeout_s});
    return out;
  }
  if (phase_ == Phase::Preempting) {
    // The preemption grace is over: the ordinary stop.
    phase_ = Phase::Stopping;
    out.push_back({.kind = Action::Kind::SignalWorkers, .signo = SIGTERM});
    out.push_back({.kind = Action::Kind::ArmTimer, .seconds = config_.shutdown_timeout_s});
  } else if (phase_ == Phase::Stopping) {
    phase_ = Phase::Killing;
    out.push_back({.kind = Action::Kind::SignalWorkers, .signo = SIGKILL});
    out.push_back({.kind = Action::Kind::ArmTimer, .seconds = config_.kill_wait_s});
  } else if (phase_ == Phase::Killing) {
    out.push_back({.kind = Action::Kind::AbandonWorkers});
    alive_.clear();
    group_stopped(out);
  }
  return out;
}

void AgentState::group_stopped(std::vector<Action>& out) {
  if (preempted_ || stop_signal_) {
    finish_for_signal(out);
  } else if (stopping_stragglers_) {
    finish(kExitBarrierTimeoutExitCode, out);
  } else if (pending_job_failed_) {
    finish(failure_exit_code(), out);
  } else if (pending_restart_) {
    const int next = *pending_restart_;
    pending_restart_.reset();
    join(next, out);
  } else {
    phase_ = Phase::Awaiting;  // our failure was reported; the coordinator decides
  }
}

void AgentState::finish_for_signal(std::vector<Action>& out) {
  finish(preempted_ ? kPreemptedExitCode : 128 + stop_signal_.value_or(SIGTERM), out);
}

void AgentState::finish(int code, std::vector<Action>& out) {
  phase_ = Phase::Done;
  exit_code_ = code;
  out.push_back({.kind = Action::Kind::Finish, .exit_code = code});
}

}  // namespace ddprun::launcher
