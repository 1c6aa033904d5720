#include "workers/worker_group.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/epoll.h>
#include <sys/stat.h>
#include <sys/timerfd.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>

#include <spdlog/spdlog.h>

#include "ddprun/launcher/signal_names.h"
#include "ddprun/launcher/worker_files.h"
#include "platform/sys_util.h"
#include "spares/spares.h"
#include "ddprun/client/net.h"

namespace ddprun::launcher {
namespace {

namespace fs = std::filesystem;

// A parked spare answers a launch in milliseconds; this only bounds a stuck one (its rank then
// starts cold).
constexpr int kSpareAnswerTimeoutMs = 10000;

// Whether this process has any child left (workers or adopted orphans), without reaping.
bool has_children() {
  siginfo_t info{};
  return ::waitid(P_ALL, 0, &info, WEXITED | WNOHANG | WNOWAIT) == 0;
}

double ms_since(Clock::time_point t) { return std::chrono::duration<double, std::milli>(Clock::now() - t).count(); }

// Whether our stdout and stderr are the same file (a terminal, one log): one console line.
bool same_console() {
  struct stat a {
  }, b{};
  return ::fstat(1, &a) == 0 && ::fstat(2, &b) == 0 && a.st_dev == b.st_dev && a.st_ino == b.st_ino &&
         a.st_rdev == b.st_rdev;
}

// "[r3]: ", or --log_line_prefix_template rendered for this worker.
std::string line_prefix(const OutputOptions& output, int node_rank, const Worker& w, bool multi_node) {
  if (output.line_prefix.text.empty()) return console_prefix(node_rank, w.global_rank, multi_node);
  static const std::string host = client::hostname();
  return render_line_prefix(output.line_prefix.text, {w.global_rank, w.local_rank, output.line_prefix.role, host});
}

}  // namespace

struct WorkerGroup::Pending {
  std::optional<Spares::Launch> warm;
  std::optional<SpawnedProcess> cold;
  EnvMap env;
};
struct WorkerGroup::StartRun {
  std::vector<Pending> pending;       // by local rank
  std::vector<std::string> cold_why;  // "r1 (why)": ranks a spare could not start
};

WorkerGroup::WorkerGroup(const OutputOptions& output, const SpareOptions& spares, bool multi_node, int epoll_fd,
                         Guardian& guardian)
    : output_(output),
      job_multi_node_(multi_node),
      epoll_fd_(epoll_fd),
      guardian_(guardian),
      console_(same_console()),
      spares_(std::make_unique<Spares>(spares, epoll_fd, guardian)) {
  retire_timer_fd_ = ::timerfd_create(CLOCK_MONOTONIC, TFD_NONBLOCK | TFD_CLOEXEC);
  DDPRUN_CHECK_SYS(retire_timer_fd_);
  watch_fd(retire_timer_fd_);
  console_timer_fd_ = ::timerfd_create(CLOCK_MONOTONIC, TFD_NONBLOCK | TFD_CLOEXEC);
  DDPRUN_CHECK_SYS(console_timer_fd_);
  watch_fd(console_timer_fd_);
}

void WorkerGroup::enable_spares() { spares_->enable(); }
bool WorkerGroup::on_spare_reaped(pid_t pid, int wait_status) { return spares_->on_reaped(pid, wait_status); }
bool WorkerGroup::owns_pipe(int fd) const { return by_fd_.count(fd) != 0 || spares_->owns_fd(fd); }

WorkerGroup::~WorkerGroup() {
  for (auto& w : workers_) forget(*w);
  for (auto& g : retiring_)
    for (auto& w : g.workers) forget(*w);
  if (retire_timer_fd_ >= 0) ::close(retire_timer_fd_);
  if (console_timer_fd_ >= 0) ::close(console_timer_fd_);
}

void WorkerGroup::watch_fd(int fd) {
  epoll_event ev{};
  ev.events = EPOLLIN;  // a seccomp listener reports POLLHUP (always reported) when no task uses it
  ev.data.fd = fd;
  DDPRUN_CHECK_SYS(::epoll_ctl(epoll_fd_, EPOLL_CTL_ADD, fd, &ev));
}

void WorkerGroup::forget(Worker& w) {
  close_stream(w.out);
  close_stream(w.err);
  close_exit_watch(w);
}

Worker* WorkerGroup::by_pid(pid_t pid) {
  auto it = by_pid_.find(pid);
  return it == by_pid_.end() ? nullptr : it->second;
}

Worker* WorkerGroup::by_exit_watch(int fd) {
  auto it = by_exit_watch_fd_.find(fd);
  return it == by_exit_watch_fd_.end() ? nullptr : it->second;
}

bool WorkerGroup::is_current(const Worker& w) const {
  return std::any_of(workers_.begin(), workers_.end(), [&](const auto& x) { return x.get() == &w; });
}

Worker* WorkerGroup::current_rank(int local_rank) {
  for (auto& w : workers_)
    if (w->local_rank == local_rank) return w.get();
  return nullptr;
}

size_t WorkerGroup::retiring_count() const {
  size_t n = 0;
  for (auto& g : retiring_)
    for (auto& w : g.workers) n += !w->reaped;
  return n;
}

bool WorkerGroup::reaped_dying(pid_t pid, double& ms) {
  auto d = dying_.find(pid);
  if (d == dying_.end()) return false;
  ms = ms_since(d->second);
  dying_.erase(d);
  return true;
}

// One attempt's spawn, in steps: per rank, its log files and a launch offered to its warm
// spare; the spares' answers; then every rank started (from its spare, else fork/exec) and
// registered; then the exit watches taken and the execs awaited (a few ms in all).
void WorkerGroup::start(int attempt, const GroupLayout& layout, const fs::path& attempt_dir,
                        const SpawnTemplate& spawn) {
  end_attempt();  // the previous attempt's workers, if any
  node_rank_ = layout.node_rank;
  multi_node_ = layout.num_nodes > 1 || job_multi_node_;
  attempt_started_tick_ = boot_ticks_now();
  start_note_.clear();
  StartRun run;
  run.pending.resize(static_cast<size_t>(layout.local_world_size));
  for (int lr = 0; lr < layout.local_world_size; ++lr) {
    auto w = std::make_unique<Worker>();
    w->attempt = attempt;
    w->local_rank = lr;
    w->global_rank = layout.global_rank_base + lr;
    w->prefix = line_prefix(output_, node_rank_, *w, multi_node_);
    open_logs(*w, attempt_dir);
    Pending& p = run.pending[static_cast<size_t>(lr)];
    p.env = spawn.env(layout, lr, w->error_file);
    offer_spare(*w, p, spawn, run.cold_why);
    workers_.push_back(std::move(w));
  }
  await_spares(run);
  int from_spares = 0;
  for (size_t i = 0; i < run.pending.size(); ++i) from_spares += begin_worker(*workers_[i], run.pending[i], spawn, i);
  take_exit_watches(run, spawn);
  wait_execs(run, spawn);
  note_start(from_spares, run);
}

// A warm spare first (spares.h): the launch goes out now, its answer is awaited later.
void WorkerGroup::offer_spare(Worker& w, Pending& p, const SpawnTemplate& spawn, std::vector<std::string>& cold_why) {
  std::string why;
  int out[2] = {-1, -1}, err[2] = {-1, -1};
  if (spares_->enabled() && ::pipe2(out, O_CLOEXEC) == 0 && ::pipe2(err, O_CLOEXEC) == 0) {
    p.warm = spares_->launch(w.local_rank, spawn.argv, p.env, spawn.stdin_for(w.global_rank), out[1], err[1], why);
  }
  for (int fd : {out[1], err[1]})
    if (fd >= 0) ::close(fd);
  if (p.warm) {
    w.out.fd = out[0];
    w.err.fd = err[0];
  } else {
    for (int fd : {out[0], err[0]})
      if (fd >= 0) ::close(fd);
    if (!why.empty()) cold_why.push_back(fmt::format("r{} ({})", w.global_rank, why));
  }
}

// The spares' answers (each parked on its socket: milliseconds); one that refuses is killed
// and its rank starts cold.
void WorkerGroup::await_spares(StartRun& run) {
  for (size_t i = 0; i < run.pending.size(); ++i) {
    auto& warm = run.pending[i].warm;
    if (!warm) continue;
    const std::string why = Spares::answer(*warm, kSpareAnswerTimeoutMs);
    if (why.empty()) continue;
    Worker& w = *workers_[i];
    spares_->reject(*warm, why);
    run.cold_why.push_back(fmt::format("r{} (its spare, pid {}: {})", w.global_rank, warm->pid, why));
    warm.reset();
    for (int* fd : {&w.out.fd, &w.err.fd}) {
      ::close(*fd);
      *fd = -1;
    }
  }
}

// The rank runs: its spare took the launch, or it is fork/exec'd now; its pipes and pid are
// registered. True when it came from a spare.
bool WorkerGroup::begin_worker(Worker& w, Pending& p, const SpawnTemplate& spawn, size_t i) {
  if (p.warm) {
    w.pid = p.warm->pid;
    w.from_spare = true;
    w.exit_watch_fd = p.warm->exit_watch_fd;  // the spare's own: the same process
    for (int fd : {w.out.fd, w.err.fd}) ::fcntl(fd, F_SETFL, ::fcntl(fd, F_GETFL) | O_NONBLOCK);
  } else {
    SpawnRequest req;
    req.executable = spawn.executable;
    req.argv = spawn.argv;
    req.envp = to_envp(p.env);
    req.stdin_fd = spawn.stdin_for(w.global_rank);
    req.reset_to_default = spawn.reset_to_default;
    req.exit_watch = spawn.exit_watch;
    // Without CAP_SYS_ADMIN the filter needs no_new_privs: allowed, as --early_exit_watch says.
    req.exit_watch_no_new_privs = true;
    if (!spawn.cpu_affinity.empty()) req.cpu_affinity = spawn.cpu_affinity[i];  // --numa-binding
    p.cold = spawn_process(req);
    w.pid = p.cold->pid;
    w.out.fd = p.cold->stdout_fd;
    w.err.fd = p.cold->stderr_fd;
    guardian_.watch(w.pid);  // a spare's group is watched since its start
  }
  w.started = Clock::now();
  w.interactive = spawn.stdin_terminal && spawn.stdin_rank == w.global_rank;
  for (auto [fd, is_err] : {std::pair{w.out.fd, false}, std::pair{w.err.fd, true}}) {
    watch_fd(fd);
    by_fd_[fd] = {&w, is_err};
  }
  by_pid_[w.pid] = &w;
  return w.from_spare;
}

void WorkerGroup::take_exit_watches(StartRun& run, const SpawnTemplate& spawn) {
  for (size_t i = 0; i < run.pending.size(); ++i) {
    Worker& w = *workers_[i];
    if (run.pending[i].cold) w.exit_watch_fd = receive_exit_watch(run.pending[i].cold->exit_watch_sock);
    if (w.exit_watch_fd >= 0) {
      watch_fd(w.exit_watch_fd);
      by_exit_watch_fd_[w.exit_watch_fd] = &w;
    } else if (spawn.exit_watch && i == 0) {
      spdlog::debug("no early exit watch for local rank 0 (seccomp listener not allowed here): exits are "
                    "seen when reaped");
    }
  }
}

void WorkerGroup::wait_execs(StartRun& run, const SpawnTemplate& spawn) {
  for (size_t i = 0; i < run.pending.size(); ++i) {
    if (!run.pending[i].cold) continue;
    int err = wait_exec_status(run.pending[i].cold->exec_status_fd);
    if (err != 0) {
      std::string msg = "ddprun: cannot exec " + spawn.executable + ": " + std::strerror(err);
      workers_[i]->tail.push(msg);
      spdlog::error("local rank {}: {}", i, msg);
    }
  }
}

// "; 2 of 2 from warm spares; started cold: r1 (why)" for the start line.
void WorkerGroup::note_start(int from_spares, const StartRun& run) {
  if (!spares_->off_reason().empty()) {
    start_note_ = "; started cold: warm spares are off (" + spares_->off_reason() + ")";
  } else if (from_spares > 0 || !run.cold_why.empty()) {
    start_note_ = fmt::format("; {} of {} from warm spares", from_spares, run.pending.size());
    if (!run.cold_why.empty()) {
      std::string list;
      for (const auto& c : run.cold_why) list += (list.empty() ? "" : ", ") + c;
      start_note_ += "; started cold: " + list;
    }
  }
}

void WorkerGroup::start_spares(const GroupLayout& layout, const SpawnTemplate& spawn) {
  spares_->replenish(layout, spawn);
}

void WorkerGroup::kill_stale_orphans() {
  if (attempts_started_++ > 0) kill_orphans(std::nullopt);
}

// The ended attempt's workers (all reaped, or abandoned): close their pipes, SIGKILL what is
// left of their process groups. Retired workers are not in workers_ any more.
void WorkerGroup::end_attempt() {
  for (auto& w : workers_) {
    drain(*w);
    forget(*w);
    if (w->exit_reported && !w->reaped) dying_[w->pid] = w->ended;
    by_pid_.erase(w->pid);
    signal_process_group(w->pid, SIGKILL);  // leftovers of its group (grandchildren)
    old_pgroups_.push_back(w->pid);
    guardian_.forget(w->pid);
  }
  workers_.clear();
}

// Orphans adopted as subreaper that left their worker's process group: SIGKILL every child
// that is not a worker (of the current attempt or a retiring one). With a tick, only those
// that started before it (the current attempt's own orphans are its business until it ends).
void WorkerGroup::kill_orphans(std::optional<unsigned long long> started_before_tick) {
  if (!has_children()) return;
  const auto children =
      started_before_tick ? children_started_before(::getpid(), *started_before_tick) : children_of(::getpid());
  for (pid_t child : children) {
    if (!by_pid_.count(child) && !dying_.count(child) && !spares_->owns_pid(child)) {
      spdlog::debug("killing orphan pid {} (adopted from an ended attempt)", child);
      ::kill(child, SIGKILL);
    }
  }
}

void WorkerGroup::retire(int attempt, double grace_s) {
  Retiring g;
  g.attempt = attempt;
  g.since = Clock::now();
  g.deadline = g.since + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(grace_s));
  // Every worker of the attempt moves, reaped or not: a reaped leader's process group may
  // still hold grandchildren, which get the same grace as the survivors.
  g.workers = std::move(workers_);
  workers_.clear();
  size_t running = 0;
  for (auto& w : g.workers) running += !w->reaped;
  spdlog::debug("attempt {}: {} worker(s) still running retire in the background (SIGKILL in {:.1f} s)", attempt,
                running, grace_s);
  retiring_.push_back(std::move(g));
  arm_retire_timer();
}

void WorkerGroup::on_retired_exit(Worker& w) {
  for (size_t i = 0; i < retiring_.size(); ++i) {
    auto& g = retiring_[i];
    if (g.attempt != w.attempt) continue;
    if (std::all_of(g.workers.begin(), g.workers.end(), [](auto& x) { return x->reaped; })) {
      release_retired(i);
      arm_retire_timer();
    }
    return;
  }
}

void WorkerGroup::on_retire_timer() {
  uint64_t expirations = 0;
  if (::read(retire_timer_fd_, &expirations, sizeof expirations) != sizeof expirations) return;
  const auto now = Clock::now();
  for (size_t i = 0; i < retiring_.size();) {
    auto& g = retiring_[i];
    if (g.deadline > now) {
      ++i;
      continue;
    }
    std::string pids;
    for (auto& w : g.workers)
      if (!w->reaped) pids += fmt::format(" r{} (pid {})", w->global_rank, w->pid);
    if (!g.killed) {
      spdlog::warn("attempt {}'s worker(s){} still running {:.1f} s after SIGTERM (--shutdown_timeout): SIGKILL",
                   g.attempt, pids, std::chrono::duration<double>(now - g.since).count());
      for (auto& w : g.workers) signal_process_group(w->pid, SIGKILL);
      g.killed = true;
      g.deadline = now + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(kKillWaitS));
      ++i;
    } else {
      spdlog::error("attempt {}'s worker(s){} did not exit {:.0f} s after SIGKILL (stuck in the kernel?); no "
                    "longer waiting for them",
                    g.attempt, pids, kKillWaitS);
      release_retired(i);
    }
  }
  arm_retire_timer();
}

// The group is gone (or given up on): close its pipes, SIGKILL its leftovers, stop watching it.
void WorkerGroup::release_retired(size_t index) {
  Retiring g = std::move(retiring_[index]);
  retiring_.erase(retiring_.begin() + static_cast<std::ptrdiff_t>(index));
  std::string how;
  for (auto& w : g.workers) {
    drain(*w);
    forget(*w);
    by_pid_.erase(w->pid);
    signal_process_group(w->pid, SIGKILL);  // grandchildren left in its group
    old_pgroups_.push_back(w->pid);
    guardian_.forget(w->pid);
    if (w->status) how += fmt::format(" r{} {};", w->global_rank, w->status->describe());
  }
  // Their children that left the group and were adopted by us since the restart; never the
  // running attempt's (they started after it).
  kill_orphans(attempt_started_tick_);
  spdlog::debug("attempt {}'s retired workers are gone {:.1f} ms after the restart:{}", g.attempt, ms_since(g.since),
                how);
}

void WorkerGroup::arm_retire_timer() {
  if (retiring_.empty()) {
    arm_timerfd(retire_timer_fd_, 0);
    return;
  }
  auto next = retiring_.front().deadline;
  for (auto& g : retiring_) next = std::min(next, g.deadline);
  // At least 1 ns: a deadline already passed fires at once (0 would disarm).
  arm_timerfd(retire_timer_fd_, std::max(1e-9, std::chrono::duration<double>(next - Clock::now()).count()));
}

void WorkerGroup::close_exit_watch(Worker& w) {
  if (w.exit_watch_fd < 0) return;
  ::epoll_ctl(epoll_fd_, EPOLL_CTL_DEL, w.exit_watch_fd, nullptr);
  by_exit_watch_fd_.erase(w.exit_watch_fd);
  ::close(w.exit_watch_fd);
  w.exit_watch_fd = -1;
}

void WorkerGroup::signal(int signo) {
  for (auto& w : workers_) {
    // The group outlives its leader while grandchildren remain, so signal it even then.
    if (signal_process_group(w->pid, signo))
      spdlog::debug("sent {} to process group {} (r{})", signal_name(signo), w->pid, w->global_rank);
  }
}

std::string WorkerGroup::unreaped_pids() const {
  std::string pids;
  for (auto& w : workers_)
    if (!w->reaped) pids += " " + std::to_string(w->pid);
  return pids;
}

void WorkerGroup::teardown() {
  // Process groups of every attempt (retiring ones too), adopted orphans.
  for (auto& w : workers_) drain(*w);
  for (auto& g : retiring_)
    for (auto& w : g.workers) drain(*w);
  signal(SIGKILL);
  for (auto& g : retiring_)
    for (auto& w : g.workers) signal_process_group(w->pid, SIGKILL);
  for (pid_t pg : old_pgroups_) signal_process_group(pg, SIGKILL);
  spares_->kill_all();
}

}  // namespace ddprun::launcher
