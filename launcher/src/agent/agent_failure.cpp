// The agent's one failure path (a worker that exited non-zero, was killed, or hung: the same
// record, the same observers told, the same report to the rendezvous), and what it gives its
// observers (observers/observers.h): their setup, the reaped workers, the host's answers.
#include <sys/epoll.h>
#include <sys/wait.h>
#include <unistd.h>

#include <spdlog/spdlog.h>

#include "agent/agent_impl.h"
#include "ddprun/launcher/error_file.h"
#include "ddprun/launcher/signal_names.h"
#include "ddprun/launcher/worker_files.h"
#include "platform/sys_util.h"

namespace ddprun::launcher {
namespace {

constexpr size_t kMaxErrorFileBytes = 1024 * 1024;
constexpr size_t kMaxTailBytes = 8192;  // of a failure's stderr, sent to the other nodes

const char* failure_cause(const Action& a, bool config_error) {
  return a.hung ? "hang" : config_error ? "config_error" : a.status.signaled ? "signal" : "exit_code";
}

}  // namespace

// After the run's log directory exists, before the first round (`ddprun status` shows a job
// still in its rendezvous; the metrics record its time).
void Agent::start_observers() {
  observers_ = make_observers(ObserverSetup{.opts = opts_,
                                            .env = env_,
                                            .run_log_dir = run_log_dir_,
                                            .python = plan_.interpreter.empty() ? std::string() : spawn_.executable,
                                            .host = *this});
  for (int fd : observers_.watched_fds()) {
    epoll_event ev{};
    ev.events = EPOLLIN;
    ev.data.fd = fd;
    DDPRUN_CHECK_SYS(::epoll_ctl(epoll_fd_, EPOLL_CTL_ADD, fd, &ev));
  }
}

void Agent::record_failure(const Action& a) {
  ++failures_seen_;
  Worker* w = group_->current_rank(a.local_rank);
  if (!w) return;
  FailureDetails f;
  f.attempt = a.attempt;
  f.local_rank = w->local_rank;
  f.global_rank = w->global_rank;
  f.pid = w->pid;
  f.status = a.status;
  // A hung worker still runs: its failure is now.
  failure_seen_ = a.hung ? Clock::now() : w->ended;
  f.when = a.hung ? WallClock::now() : w->ended_wall;
  f.after_s = std::chrono::duration<double>(failure_seen_ - w->started).count();
  f.tail = w->tail.lines();
  f.error_file = w->error_file;
  // The worker's file (worker_files.h): never followed, never blocked on, at most 1 MiB.
  if (!a.hung) f.error_file_content = read_worker_file(w->error_file, kMaxErrorFileBytes);
  failed_since_round_ = true;
  const bool config_error = !a.hung && says_config_error(a.status.code, a.status.signaled,
                                                         f.error_file_content ? &*f.error_file_content : nullptr);
  const WorkerFailed event{.attempt = a.attempt,
                           .local_rank = w->local_rank,
                           .global_rank = w->global_rank,
                           .pid = w->pid,
                           .status = a.status,
                           .hung = a.hung,
                           .config_error = config_error,
                           .cause = failure_cause(a, config_error),
                           .after_s = f.after_s,
                           .what = a.hung ? "hung" : a.status.describe()};
  FailureNotes notes = observers_.failure_notes(event);
  f.hang = std::move(notes.hang);
  f.stacks_dir = std::move(notes.stacks_dir);
  f.hang_stacks = std::move(notes.hang_stacks);
  failure_ = std::move(f);
  observers_.each([&](AgentObserver& o) { o.worker_failed(event); });
  std::string tail;
  if (a.hung) {
    tail = failure_->hang + "\n";
  } else {
    for (const auto& line : failure_->tail) tail += line + "\n";
    if (tail.size() > kMaxTailBytes) tail = tail.substr(tail.size() - kMaxTailBytes);
  }
  coordinator_->report_failure(rdzv::Failure{.global_rank = w->global_rank,
                                             .local_rank = w->local_rank,
                                             .exit_code = a.status.signaled ? 0 : a.status.code,
                                             .signal = a.status.signaled ? signal_name(a.status.code) : "",
                                             .when = wall_time(failure_->when),
                                             .stderr_tail = tail,
                                             .runtime_ms = static_cast<int64_t>(failure_->after_s * 1000),
                                             .config_error = config_error});
}

// A reaped worker process: `w` when the group still knows it.
void Agent::worker_reaped(const Worker* w, pid_t pid, const struct rusage& ru) {
  WorkerReaped r{.pid = pid, .usage = ru};
  if (w) {
    r.known = true;
    r.local_rank = w->local_rank;
    r.global_rank = w->global_rank;
    r.attempt = w->attempt;
    r.wall_s = std::chrono::duration<double>(w->ended - w->started).count();
    r.error_file = w->error_file;
  }
  observers_.each([&](AgentObserver& o) { o.worker_reaped(r); });
}

// At the end, the current attempt's workers the loop did not reap (their exit seen early, or
// killed by teardown): each one's rusage still goes to the observers (the end-of-run table).
void Agent::reap_workers(double seconds) {
  const auto deadline = Clock::now() + std::chrono::duration<double>(seconds);
  for (const auto& wp : group_->current()) {
    Worker& w = *wp;
    while (!w.reaped && w.pid > 0) {  // never wait4(-1): only this worker
      int st = 0;
      struct rusage ru {};
      const pid_t pid = ::wait4(w.pid, &st, WNOHANG, &ru);
      if (pid == w.pid) {
        w.reaped = true;
        if (!w.exit_reported && !w.status) w.ended = Clock::now();
        worker_reaped(&w, pid, ru);
      } else if (pid < 0 || Clock::now() >= deadline) {
        break;  // not our child any more, or stuck: reap_leftovers says so
      } else {
        ::usleep(1000);
      }
    }
  }
}

bool Agent::attempt_running(int attempt) const {
  return state_.phase() == AgentState::Phase::Running && state_.attempt() == attempt;
}

std::vector<bool> Agent::alive(size_t ranks) const {
  std::vector<bool> out(ranks, false);
  for (int lr : state_.alive()) {
    if (lr >= 0 && static_cast<size_t>(lr) < ranks) out[static_cast<size_t>(lr)] = true;
  }
  return out;
}

void Agent::worker_hung(int local_rank, int attempt) {
  dispatch(WorkerHung{.local_rank = local_rank, .attempt = attempt});
}

}  // namespace ddprun::launcher
