// The agent's event loop: performs AgentState's actions, feeds back the events of the workers
// (WorkerGroup), the coordinator, signals and the timer. One path for one node and many: the
// rendezvous plan says where the round runs; the coordinator hides which.
#include "ddprun/launcher/agent.h"

#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <sys/epoll.h>
#include <sys/signalfd.h>
#include <sys/timerfd.h>
#include <sys/wait.h>
#include <unistd.h>

#include <filesystem>
#include <memory>
#include <optional>
#include <string>

#include <spdlog/sinks/stdout_sinks.h>
#include <spdlog/spdlog.h>

#include "agent/agent_impl.h"
#include "ddprun/client/net.h"
#include "ddprun/launcher/error_file.h"
#include "ddprun/launcher/log_events.h"
#include "ddprun/launcher/signal_names.h"
#include "ddprun/launcher/spare_plan.h"
#include "ddprun/launcher/worker_files.h"
#include "platform/sys_util.h"

namespace ddprun::launcher {
namespace {

namespace fs = std::filesystem;

double ms_since(Clock::time_point t) { return std::chrono::duration<double, std::milli>(Clock::now() - t).count(); }

WorkerStatus status_of_wait(int st) {
  return WIFSIGNALED(st) ? WorkerStatus::killed_by(WTERMSIG(st)) : WorkerStatus::exited(WEXITSTATUS(st));
}

}  // namespace

int Agent::run() {
  try {
    ensure_std_fds_open();
    setup_signals();
    prepare_command();
    guardian_ = std::make_unique<Guardian>();  // before the store's thread and the subreaper
    become_child_subreaper();
    prepare_log_root();
    group_ = std::make_unique<WorkerGroup>(opts_.output, opts_.spares, opts_.nodes.multi_node(), epoll_fd_, *guardian_);
    if (plan_.spares) group_->enable_spares();
    else if (opts_.spares.enabled.value_or(false))
      spdlog::warn("--warm_spares=1: the entry point does not run as `python -u SCRIPT|-m MODULE|-c CODE`; no spares");
    start_observers();
    start_coordinator();
    for (const auto& a : state_.start()) perform(a);
    loop();
  } catch (const UsageError& e) {
    write_log_line("error", "launch_refused", std::string("ddprun: error: ") + e.what() + "\n", e.what());
    close_all();
    return kUsageExitCode;
  } catch (const CoordinatorInterrupted& e) {
    const int s = stop_signal_seen_.value_or(SIGINT);
    spdlog::error("received {}: {}", signal_name(s), e.what());
    exit_code_ = is_preempt_signal(s) ? kPreemptedExitCode : 128 + s;
  } catch (const std::exception& e) {
    spdlog::error("{}", e.what());
    if (group_) group_->signal(SIGKILL);
    exit_code_ = 1;
  }
  if (group_) group_->teardown();
  if (group_) reap_workers(kKillWaitS);
  if (guardian_) guardian_->release();
  reap_leftovers(kKillWaitS);
  if (coordinator_) coordinator_->leave();
  coordinator_.reset();
  if (store_) {
    wait_for_other_agents();
    store_->stop();
  }
  observers_.each([](AgentObserver& o) { o.run_ended(); });
  std::string text = summary();
  observers_ = Observers();
  if (group_) exit_code_ = final_exit_code(exit_code_, group_->log_failures().any());
  close_all();
  if (log_root_is_temp_ && !keep_log_root_) {
    std::error_code ec;
    fs::remove_all(log_root_, ec);
  }
  spdlog::default_logger()->flush();
  if (!text.empty()) {
    std::string message = text;
    while (!message.empty() && message.back() == '\n') message.pop_back();
    write_log_line(exit_code_ == 0 ? "warning" : "error", "summary", text, message,
                   {{"exit_code", int64_t{exit_code_}}});
  }
  // JSON lines end with the agent's exit, whatever happened (text mode prints nothing here).
  if (log_format() == LogFormat::Json)
    write_log_line(exit_code_ == 0 ? "info" : "error", "agent_exit", "", fmt::format("ddprun exits {}", exit_code_),
                   {{"exit_code", int64_t{exit_code_}}, {"restarts", int64_t{state_.attempt()}}});
  return exit_code_;
}

void Agent::loop() {
  epoll_event events[64];
  while (!done_) {
    int n = ::epoll_wait(epoll_fd_, events, 64, -1);
    if (n < 0) {
      if (errno == EINTR) continue;
      DDPRUN_CHECK_SYS(n);
    }
    for (int i = 0; i < n && !done_; ++i) {
      const int fd = events[i].data.fd;
      if (fd == signal_fd_) {
        on_signalfd();
      } else if (coordinator_ && fd == coordinator_->fd()) {
        on_coordinator();
      } else if (fd == timer_fd_) {
        uint64_t expirations = 0;
        if (::read(timer_fd_, &expirations, sizeof expirations) == sizeof expirations) dispatch(TimerExpired{});
      } else if (fd == group_->retire_timer_fd()) {
        group_->on_retire_timer();
      } else if (observers_.on_ready(fd)) {
      } else if (fd == group_->console_timer_fd()) {
        group_->on_console_timer();
      } else if (Worker* w = group_->by_exit_watch(fd)) {
        on_exit_watch(*w);
      } else {
        group_->on_pipe(fd);
      }
    }
    if (child_signal_taken_ && !done_) {
      child_signal_taken_ = false;
      reap_children();
    }
  }
}

// The coordinator's answers (also the in-process round's) come back through its descriptor,
// on a later turn of the loop: an action never re-enters the agent.
void Agent::dispatch(const AgentEvent& e) {
  for (const auto& a : state_.on_event(e)) perform(a);
}

void Agent::perform(const Action& a) {
  try {
    switch (a.kind) {
      case Action::Kind::JoinRound:
        join_sent_ = Clock::now();
        observers_.each([](AgentObserver& o) { o.joining(); });
        spdlog::debug("joining the next round of job {} (attempt {})", opts_.rendezvous.id, a.attempt);
        coordinator_->join();
        break;
      case Action::Kind::StartAttempt: start_attempt(a.attempt); break;
      case Action::Kind::ReportFailure: record_failure(a); break;
      case Action::Kind::ReportSuccess:
        if (layout_.num_nodes > 1) {
          LogEvent ev("node_succeeded", {{"workers", int64_t{opts_.nodes.nproc_per_node}}});
          spdlog::info("all {} local workers succeeded; waiting for the other nodes", opts_.nodes.nproc_per_node);
        }
        coordinator_->report_success();
        break;
      case Action::Kind::SignalWorkers: group_->signal(a.signo); break;
      case Action::Kind::RetireWorkers: group_->retire(a.attempt, a.seconds); break;
      case Action::Kind::ArmTimer: arm_timerfd(timer_fd_, a.seconds); break;
      case Action::Kind::DisarmTimer: arm_timerfd(timer_fd_, 0); break;
      case Action::Kind::StopStragglers: stop_stragglers(a); break;
      case Action::Kind::AbandonWorkers: {
        LogEvent ev("workers_abandoned");
        spdlog::error(
            "workers{} did not exit {:.0f} s after SIGKILL (stuck in the kernel?); no longer waiting for them",
            group_->unreaped_pids(), kKillWaitS);
        break;
      }
      case Action::Kind::Finish:
        done_ = true;
        exit_code_ = a.exit_code;
        break;
    }
  } catch (const CoordinatorError& e) {
    // The connection's end shows on its descriptor next: on_coordinator() acts on it.
    spdlog::error("{}", e.what());
    if (stop_signal_seen_ && !state_.stop_signal()) {
      // A send stuck on a server that stopped reading was abandoned for a stop signal, which
      // stop_requested() took off the signalfd: queue it again so the loop acts on it.
      const int s = *stop_signal_seen_;
      stop_signal_seen_.reset();
      ::raise(s);
    }
  }
}

void Agent::on_coordinator() {
  try {
    for (const Notice& n : coordinator_->take_notices()) {
      if (done_) break;
      on_notice(n);
    }
  } catch (const CoordinatorInterrupted& e) {
    // A stop signal ended a reconnect: act on the signal (stop_requested() took it off the
    // signalfd), not on a lost job.
    spdlog::error("{}", e.what());
    if (stop_signal_seen_ && !state_.stop_signal()) {
      const int s = *stop_signal_seen_;
      stop_signal_seen_.reset();
      ::raise(s);
      return;
    }
    coordinator_lost(e.what());
  } catch (const CoordinatorError& e) {
    coordinator_lost(e.what());
  }
}

void Agent::coordinator_lost(const std::string& what) {
  ::epoll_ctl(epoll_fd_, EPOLL_CTL_DEL, coordinator_->fd(), nullptr);
  agent_error_ = what;  // the coordinator says what was lost and why
  LogEvent ev("rendezvous_lost");
  spdlog::error("{}", what);
  dispatch(CoordinatorNotice{CoordinatorNotice::Kind::JobFailed, 0});
}

void Agent::on_notice(const Notice& n) {
  switch (n.kind) {
    case Notice::Kind::Round:
      layout_ = n.layout;
      observers_.each([&, s = std::chrono::duration<double>(Clock::now() - join_sent_).count()](AgentObserver& o) {
        o.round(n.layout, n.max_restarts, s);
      });
      relay_store();
      max_restarts_ = n.max_restarts;
      set_log_node_rank(n.layout.node_rank);
      dispatch(RoundReady{n.layout.restart_count});
      break;
    case Notice::Kind::Restart:
      restart_seen_ = Clock::now();
      {
        LogEvent ev("restart_notice",
                    {{"reason", n.restart.reason}, {"restart_count", static_cast<int64_t>(n.restart.restart_count)}});
        if (state_.preempted())
          spdlog::info("the rendezvous restarts the job ({}): not here, stopping for a preemption", n.restart.reason);
        else spdlog::warn("restarting the job: {}", n.restart.reason);
      }
      dispatch(CoordinatorNotice{CoordinatorNotice::Kind::Restart, static_cast<int>(n.restart.restart_count)});
      break;
    case Notice::Kind::JobDone: dispatch(CoordinatorNotice{CoordinatorNotice::Kind::JobDone, 0}); break;
    case Notice::Kind::JobFailed:
      job_failed_ = n.failed;
      {
        LogEvent ev("job_failed", {{"reason", n.failed.reason}});
        if (state_.preempted())
          spdlog::info("the rendezvous ended the job ({}): already stopping for a preemption", n.failed.reason);
        else spdlog::error("the job ended: {}", n.failed.reason);
      }
      dispatch(CoordinatorNotice{CoordinatorNotice::Kind::JobFailed, 0});
      break;
  }
}

void Agent::start_attempt(int attempt) {
  const auto t0 = Clock::now();
  group_->start(attempt, layout_, fresh_attempt_log_dir(run_log_dir_, attempt), spawn_);
  workers_started_ = true;
  AttemptStarted started{.attempt = attempt,
                         .layout = &layout_,
                         .restart_cause = attempt == 0 && failures_seen_ == 0 ? nullptr
                                          : failed_since_round_               ? "worker_failure"
                                                                              : "peer_restart"};
  for (const auto& w : group_->current())
    started.workers.push_back({w->local_rank, w->global_rank, w->pid, w->error_file});
  observers_.each([&](AgentObserver& o) { o.attempt_started(started); });
  const double spawn_ms = ms_since(t0);
  const auto t_spawned = Clock::now();
  const std::string where = fmt::format("node rank {} of {}, world size {}, workers' store {}:{}", layout_.node_rank,
                                        layout_.num_nodes, layout_.world_size, layout_.store_host, layout_.store_port);
  const double rdzv_ms = std::chrono::duration<double, std::milli>(t0 - join_sent_).count();
  LogEvent ev("attempt_started", {{"attempt", int64_t{attempt}},
                                  {"run_id", layout_.run_id},
                                  {"node_rank", int64_t{layout_.node_rank}},
                                  {"nnodes", int64_t{layout_.num_nodes}},
                                  {"world_size", int64_t{layout_.world_size}},
                                  {"workers", static_cast<int64_t>(group_->current().size())},
                                  {"rendezvous_ms", rdzv_ms},
                                  {"spawn_ms", spawn_ms}});
  if (attempt == 0 && failures_seen_ == 0) {
    failed_since_round_ = false;
    spdlog::info("attempt 0 of job {}: {}; rendezvous {:.1f} ms, {} workers started in {:.1f} ms, ready {:.1f} ms "
                 "after launch{}{}",
                 layout_.run_id, where, rdzv_ms, group_->current().size(), spawn_ms, ms_since(t_launch_),
                 opts_.faults.monitor_interval != 0.1 ? " (--monitor_interval is unused: exits are seen at once)" : "",
                 start_line_note(plan_.interpreter) + gloo_note_);
    group_->kill_stale_orphans();
    group_->start_spares(layout_, spawn_);
    return;
  }
  // From this node's failure when it had one, else from the restart notice.
  const bool ours = failed_since_round_;
  const auto since = ours ? failure_seen_ : restart_seen_;
  const size_t retiring = group_->retiring_count();
  spdlog::info("restarting the worker group: attempt {} of {} ({}): {} workers started {:.1f} ms after the {} "
               "(a clean store for this attempt; spawn {:.1f} ms{}){}",
               attempt, max_restarts_, where, group_->current().size(),
               std::chrono::duration<double, std::milli>(t_spawned - since).count(),
               ours ? "failure was seen" : "restart notice", spawn_ms, group_->start_note(),
               retiring ? fmt::format("; {} old worker(s) still stopping in the background", retiring) : std::string());
  failed_since_round_ = false;
  group_->kill_stale_orphans();
  group_->start_spares(layout_, spawn_);
}

void Agent::on_signalfd() {
  bool child = false;
  std::vector<int> others;
  signalfd_siginfo si{};
  while (::read(signal_fd_, &si, sizeof si) == sizeof si) {
    if (static_cast<int>(si.ssi_signo) == SIGCHLD) child = true;
    else others.push_back(static_cast<int>(si.ssi_signo));
  }
  if (child) reap_children();
  for (int s : others) {
    if (done_) break;
    const bool preempt = is_preempt_signal(s);
    LogEvent ev("signal", {{"signal", std::string(signal_name(s))}, {"preemption", preempt}});
    if (preempt && state_.preempted()) {
      spdlog::info("received {} again: already stopping for a preemption", signal_name(s));
    } else if (preempt && state_.phase() == AgentState::Phase::Running) {
      spdlog::warn("received {} (a preemption signal): forwarding it to every worker's process group; they have "
                   "{:g} s (--preempt_grace) to stop, then SIGTERM; the job will exit {} (requeue it to resume)",
                   signal_name(s), opts_.faults.preempt_grace_s, kPreemptedExitCode);
    } else if (preempt) {
      spdlog::warn("received {} (a preemption signal): stopping; the job will exit {}", signal_name(s),
                   kPreemptedExitCode);
    } else {
      spdlog::warn("received {}: forwarding it to every worker's process group", signal_name(s));
    }
    dispatch(SignalReceived{.signo = s, .preempt = preempt});
  }
}

void Agent::reap_children() {
  while (true) {
    int st = 0;
    struct rusage ru {};
    pid_t pid = ::wait4(-1, &st, WNOHANG, &ru);
    if (pid <= 0) break;
    Worker* wp = group_->by_pid(pid);
    if (!wp) {
      if (group_->on_spare_reaped(pid, st)) continue;
      double ms = 0;
      if (group_->reaped_dying(pid, ms)) {
        worker_reaped(nullptr, pid, ru);
        spdlog::debug("worker pid {} of an ended attempt reaped {:.1f} ms after its exit was seen", pid, ms);
      } else {
        spdlog::debug("reaped descendant pid {}", pid);
      }
      continue;
    }
    Worker& w = *wp;
    w.reaped = true;
    group_->close_exit_watch(w);
    const WorkerStatus status = status_of_wait(st);
    if (!w.exit_reported) w.ended = Clock::now();
    worker_reaped(&w, pid, ru);
    if (w.exit_reported) {
      // Seen (and dispatched) as it began to exit; now it is gone.
      group_->drain(w);
      spdlog::debug("worker r{} (pid {}) reaped {:.1f} ms after its exit was seen: {}", w.global_rank, pid,
                    ms_since(w.ended), status.describe());
      if (status != *w.status)
        spdlog::warn("worker r{} (pid {}): exit status {} at the reap, {} when it began to exit", w.global_rank, pid,
                     status.describe(), w.status->describe());
      if (!group_->is_current(w) && !done_) group_->on_retired_exit(w);  // may free `w`
      continue;
    }
    w.ended = Clock::now();
    w.ended_wall = WallClock::now();
    w.status = status;
    worker_ended(w);
  }
}

// The early exit watch fired: the worker (and whatever inherited its filter) is exiting. A
// non-zero status in /proc is final (the task is past the point of no return) and is acted on
// now, 15-30 ms before the reap; a clean exit (status 0, once stored: early_exit_status waits
// for that) waits for the reap.
void Agent::on_exit_watch(Worker& w) {
  group_->close_exit_watch(w);
  if (w.reaped || w.exit_reported || done_) return;
  if (!group_->is_current(w)) return;  // a retiring worker: its reap is soon enough
  const auto raw = early_exit_status(w.pid);
  if (!raw) return;
  w.exit_reported = true;
  w.ended = Clock::now();
  w.ended_wall = WallClock::now();
  w.status = status_of_wait(*raw);
  worker_ended(w);
}

// `w` ended with w.status (reaped, or seen by the exit watch): tell the state machine.
void Agent::worker_ended(Worker& w) {
  group_->drain(w);  // its output is complete now (grandchildren aside), before anyone reads the tail
  spdlog::debug("worker r{} (pid {}) ended: {} after {:.1f} ms{}", w.global_rank, w.pid, w.status->describe(),
                std::chrono::duration<double, std::milli>(w.ended - w.started).count(),
                w.reaped ? "" : " (seen as it began to exit)");
  if (done_) return;
  const bool current = group_->is_current(w);  // else a retired worker of an earlier attempt
  if (current) observers_.each([&](AgentObserver& o) { o.worker_ended(w.local_rank, w.status->success()); });
  const bool was_preempted = state_.preempted();
  std::optional<PreemptAnnouncement> said;
  if (*w.status == WorkerStatus::exited(kPreemptedExitCode)) said = read_preempt_announcement(w.error_file);
  if (said && said->checkpoint && current)
    preempt_checkpoint_ = "r" + std::to_string(w.global_rank) + ": " + said->what;
  dispatch(WorkerExited{
      .local_rank = w.local_rank, .status = *w.status, .attempt = w.attempt, .announced_preemption = said.has_value()});
  if (current && state_.preempted()) {
    // Not failures: say how each worker took the preemption (one that dies of the signal
    // itself does not handle it, and wrote no checkpoint).
    const bool clean = w.status->success() || *w.status == WorkerStatus::exited(kPreemptedExitCode);
    LogEvent ev("worker_preempted", {{"status", w.status->describe()}}, w.global_rank);
    if (!was_preempted)
      spdlog::warn("worker r{} stopped for a preemption ({}): the job stops, without a restart, and will exit {}",
                   w.global_rank, w.status->describe(), kPreemptedExitCode);
    else if (clean) spdlog::info("worker r{} stopped for the preemption: {}", w.global_rank, w.status->describe());
    else spdlog::warn("worker r{} ended during the preemption with {}", w.global_rank, w.status->describe());
  }
  if (!current) group_->on_retired_exit(w);  // may free `w`
}

void Agent::stop_stragglers(const Action& a) {
  std::string ranks;
  for (int lr : state_.alive()) {
    if (const Worker* w = group_->current_rank(lr))
      ranks += fmt::format("{}r{} (local rank {}, pid {})", ranks.empty() ? "" : ", ", w->global_rank, lr, w->pid);
  }
  const Worker* first = group_->current_rank(a.local_rank);
  stragglers_ = fmt::format("r{} exited 0 and {:g} s later (--exit_barrier_timeout) still running: {}",
                            first ? first->global_rank : a.local_rank, a.seconds, ranks);
  LogEvent ev("stragglers", {{"seconds", a.seconds}});
  spdlog::error("{}; stopping them (SIGTERM, SIGKILL after {:g} s)", stragglers_, opts_.faults.shutdown_timeout_s);
}

std::string Agent::summary() const {
  const bool logs_lost = group_ && group_->log_failures().any();
  if (exit_code_ == 0 && failures_seen_ > 0) {
    LogEvent ev("job_succeeded", {{"restarts", int64_t{state_.attempt()}}});
    spdlog::info("all {} workers succeeded after {} restart(s)", opts_.nodes.nproc_per_node, state_.attempt());
  }
  if (exit_code_ == 0 && !logs_lost) return "";
  char host[256] = "?";
  ::gethostname(host, sizeof host - 1);
  SummaryInput in;
  in.exit_code = exit_code_;
  in.attempt = state_.attempt();
  in.max_restarts = job_failed_ ? static_cast<int>(job_failed_->max_restarts) : opts_.faults.max_restarts;
  in.run_id = opts_.rendezvous.id;
  in.host = host;
  in.shutdown_timeout_s = opts_.faults.shutdown_timeout_s;
  in.stop_signal = state_.stop_signal() ? state_.stop_signal() : stop_signal_seen_;
  in.preempt_checkpoint = preempt_checkpoint_;
  in.preempted = exit_code_ == kPreemptedExitCode &&
                 (state_.preempted() || (in.stop_signal && is_preempt_signal(*in.stop_signal)));
  in.preempt_grace_s = opts_.faults.preempt_grace_s;
  in.failure = failure_;
  in.job_failed = job_failed_;
  in.multi_node = !plan_.rendezvous.local;
  in.agent_error = agent_error_;
  in.interpreter = plan_.interpreter;
  in.workers_started = workers_started_;
  in.stragglers = stragglers_;
  SummaryNotes notes = observers_.summary_notes();
  in.nccl_trace_dir = std::move(notes.nccl_trace_dir);
  in.nccl_traces = std::move(notes.nccl_traces);
  in.nccl_traces_more = notes.nccl_traces_more;
  if (logs_lost) {
    in.log_losses = group_->log_failures().summary_lines();
    in.log_files_failed = group_->log_failures().files();
    in.log_bytes_lost = group_->log_failures().bytes_lost();
    in.log_console_note = group_->log_failures().console_note();
  }
  return format_summary(in);
}

int run(const LaunchPlan& plan, const EnvMap& env) {
  configure_logging(plan.options.output.log_format, plan.options.output.verbosity, plan.options.output.log_timestamps);
  Agent agent(plan, env);
  return agent.run();
}

}  // namespace ddprun::launcher
