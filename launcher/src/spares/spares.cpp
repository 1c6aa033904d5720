#include "spares/spares.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstring>
#include <fstream>

#include <spdlog/spdlog.h>

#include "ddprun/launcher/signal_names.h"
#include "ddprun/launcher/spare_plan.h"
#include "platform/nvml.h"
#include "platform/sys_util.h"

namespace ddprun::launcher {
namespace {

constexpr int kCtlFdInSpare = 4;  // SpawnRequest::pass_fd

double seconds_since(std::chrono::steady_clock::time_point t) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t).count();
}

// "<n> kB" of a /proc/<pid>/{status,smaps_rollup} field, in MiB; -1 when unreadable.
double proc_mib(pid_t pid, const char* file, const char* field) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/" + file);
  std::string line;
  const size_t n = std::strlen(field);
  while (std::getline(in, line)) {
    if (line.compare(0, n, field) == 0 && line.size() > n && line[n] == ':')
      return std::stod(line.substr(n + 1)) / 1024.0;
  }
  return -1;
}

std::string describe_wait(int st) {
  if (WIFSIGNALED(st)) return "killed by " + signal_name(WTERMSIG(st));
  return "exit code " + std::to_string(WEXITSTATUS(st));
}

bool send_all(int fd, const char* p, size_t n) {
  while (n > 0) {
    ssize_t w = ::send(fd, p, n, MSG_NOSIGNAL);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) return false;
    p += w;
    n -= static_cast<size_t>(w);
  }
  return true;
}

}  // namespace

Spares::Spares(const SpareOptions& opts, int epoll_fd, Guardian& guardian)
    : opts_(opts), epoll_fd_(epoll_fd), guardian_(guardian) {}

Spares::~Spares() {
  for (auto& [lr, s] : by_rank_) {
    for (int* fd : {&s->ctl, &s->out, &s->err}) unwatch(*fd);
    if (s->exit_watch >= 0) ::close(s->exit_watch);
  }
}

void Spares::unwatch(int& fd) {
  if (fd < 0) return;
  ::epoll_ctl(epoll_fd_, EPOLL_CTL_DEL, fd, nullptr);
  by_fd_.erase(fd);
  ::close(fd);
  fd = -1;
}

void Spares::replenish(const GroupLayout& layout, const SpawnTemplate& spawn) {
  if (!enabled_) return;
  for (int lr = 0; lr < layout.local_world_size; ++lr) {
    if (by_rank_.count(lr)) continue;
    auto s = std::make_unique<Spare>();
    s->local_rank = lr;
    s->env = spawn.env(layout, lr, "");
    int sv[2];
    if (::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) != 0) {
      spdlog::warn("warm spare for local rank {}: socketpair: {}; it starts cold on a restart", lr,
                   std::strerror(errno));
      continue;
    }
    SpawnRequest req;
    req.executable = spawn.executable;
    req.argv = spare_argv(spawn.argv, kCtlFdInSpare, spare_priority_name(opts_.priority), opts_.preload, opts_.cuda);
    req.envp = to_envp(s->env);
    req.stdin_fd = s->stdin_fd = spawn.stdin_for(layout.global_rank_base + lr);
    req.reset_to_default = spawn.reset_to_default;
    req.exit_watch = spawn.exit_watch;
    req.exit_watch_no_new_privs = true;
    if (!spawn.cpu_affinity.empty()) req.cpu_affinity = spawn.cpu_affinity[static_cast<size_t>(lr)];
    req.pass_fd = sv[1];
    SpawnedProcess p;
    try {
      p = spawn_process(req);
    } catch (const std::exception& e) {
      ::close(sv[0]);
      ::close(sv[1]);
      spdlog::warn("warm spare for local rank {}: {}; it starts cold on a restart", lr, e.what());
      continue;
    }
    ::close(sv[1]);
    ::close(p.exec_status_fd);  // an exec failure shows as the spare's exit
    s->pid = p.pid;
    s->ctl = sv[0];
    s->out = p.stdout_fd;
    s->err = p.stderr_fd;
    s->exit_watch = receive_exit_watch(p.exit_watch_sock);
    s->started = std::chrono::steady_clock::now();
    for (int fd : {s->ctl, s->out, s->err}) {
      epoll_event ev{};
      ev.events = EPOLLIN;
      ev.data.fd = fd;
      DDPRUN_CHECK_SYS(::epoll_ctl(epoll_fd_, EPOLL_CTL_ADD, fd, &ev));
      by_fd_[fd] = s.get();
    }
    guardian_.watch(s->pid);
    pids_[s->pid] = lr;
    spdlog::debug("warm spare for local rank {} started: pid {}, importing {} at {} priority", lr, s->pid,
                  fmt::join(opts_.preload, ","), spare_priority_name(opts_.priority));
    loss_.erase(lr);
    by_rank_[lr] = std::move(s);
  }
}

void Spares::on_fd(int fd) {
  Spare* s = by_fd_.at(fd);
  if (fd == s->ctl) read_ctl(*s);
  else read_output(*s, fd);
}

void Spares::read_output(Spare& s, int fd) {
  char buf[8192];
  ssize_t n;
  do {
    n = ::read(fd, buf, sizeof buf);
  } while (n < 0 && errno == EINTR);
  if (n < 0 && errno == EAGAIN) return;
  std::vector<std::string> lines;
  LineSplitter& split = fd == s.out ? s.split_out : s.split_err;
  if (n > 0) {
    split.feed(std::string_view(buf, static_cast<size_t>(n)), lines);
  } else {
    std::string rest;
    if (split.flush(rest)) lines.push_back(rest);
    unwatch(fd == s.out ? s.out : s.err);
  }
  for (const auto& l : lines) {
    spdlog::debug("warm spare r{} (pid {}): {}", s.local_rank, s.pid, l);
    s.tail.push(l);
  }
}

void Spares::read_ctl(Spare& s) {
  char buf[256];
  ssize_t n;
  do {
    n = ::recv(s.ctl, buf, sizeof buf, MSG_DONTWAIT);
  } while (n < 0 && errno == EINTR);
  if (n < 0 && errno == EAGAIN) return;
  if (n <= 0) {  // it is exiting: the reap says how
    unwatch(s.ctl);
    return;
  }
  s.ctl_buf.append(buf, static_cast<size_t>(n));
  auto nl = s.ctl_buf.find('\n');
  if (s.ready || nl == std::string::npos || s.ctl_buf[0] != 'R') return;
  const std::optional<SpareReady> r = parse_spare_ready(s.ctl_buf.substr(0, nl));
  s.ctl_buf.clear();
  s.ready = true;
  const SpareReady ready = r.value_or(SpareReady{});
  std::string gpu;
  if (ready.gpu == SpareReady::Gpu::Warm) {
    gpu = fmt::format("; GPU {} warm: context {:.0f} ms, ", ready.device, ready.context_ms);
    gpu += ready.nccl_ms >= 0 ? fmt::format("NCCL set-up {:.0f} ms", ready.nccl_ms)
                              : "NCCL not warmed (" + ready.why + ")";
    gpu += ", " + gpu_memory_of(s.pid);
  } else if (ready.gpu == SpareReady::Gpu::Skipped) {
    gpu = "; GPU not warmed: " + ready.why;
    if (!gpu_skip_said_) {
      gpu_skip_said_ = true;
      spdlog::warn("--spare_cuda=1: the warm spare for local rank {} did not warm its GPU: {}; it serves restarts "
                   "without (--spare_cuda=0 stops trying)",
                   s.local_rank, ready.why);
    }
  }
  spdlog::log(ready.gpu == SpareReady::Gpu::Warm ? spdlog::level::info : spdlog::level::debug,
              "warm spare for local rank {} ready: pid {}, {} imported in {:.2f} s ({:.2f} s after its start), "
              "{} thread(s), RSS {:.0f} MiB (PSS {:.0f} MiB){}",
              s.local_rank, s.pid, fmt::join(opts_.preload, ","), ready.import_s, seconds_since(s.started),
              ready.threads, proc_mib(s.pid, "status", "VmRSS"), proc_mib(s.pid, "smaps_rollup", "Pss"), gpu);
}

std::string Spares::gpu_memory_of(pid_t pid) {
  if (!nvml_tried_) {
    nvml_tried_ = true;
    nvml_ = platform::Nvml::load(&nvml_error_);
  }
  if (!nvml_) return "GPU memory unknown (" + nvml_error_ + ")";
  const int count = nvml_->device_count().value_or(0);
  for (int i = 0; i < count; ++i) {
    for (const auto& p : nvml_->compute_processes(i).value_or(std::vector<platform::GpuProcess>{})) {
      if (p.pid != static_cast<unsigned>(pid)) continue;
      if (p.used_bytes == 0) return "GPU memory unknown (NVML does not say for this process)";
      return fmt::format("holds {:.0f} MiB of GPU {} (NVML index)", static_cast<double>(p.used_bytes) / (1 << 20), i);
    }
  }
  return "GPU memory unknown (NVML lists no process " + std::to_string(pid) + "; in a container it may see other pids)";
}

void Spares::drop(int local_rank, const std::string& why, bool kill) {
  auto it = by_rank_.find(local_rank);
  if (it == by_rank_.end()) return;
  Spare& s = *it->second;
  for (int* fd : {&s.ctl, &s.out, &s.err}) unwatch(*fd);
  if (s.exit_watch >= 0) ::close(s.exit_watch);
  if (kill) signal_process_group(s.pid, SIGKILL);
  loss_[local_rank] = why;
  by_rank_.erase(it);
}

void Spares::disable(const std::string& why) {
  if (!enabled_) return;
  enabled_ = false;
  off_reason_ = why.substr(0, why.find('\n'));
  // Asked for (--warm_spares=1): a warning. On by default (a Python entry point with restarts,
  // maybe one that does not use torch): said once, without alarm.
  spdlog::log(opts_.enabled.has_value() ? spdlog::level::warn : spdlog::level::info,
              "warm spares off for this run: {}; restarts start their workers cold{}", why,
              opts_.enabled.has_value() ? "" : " (--warm_spares=0 turns them off from the start)");
  std::vector<int> ranks;
  for (auto& [lr, s] : by_rank_) ranks.push_back(lr);
  for (int lr : ranks) drop(lr, "warm spares are off", true);
}

bool Spares::on_reaped(pid_t pid, int st) {
  auto p = pids_.find(pid);
  if (p == pids_.end()) return false;
  const int lr = p->second;
  pids_.erase(p);
  guardian_.forget(pid);
  auto it = by_rank_.find(lr);
  if (it != by_rank_.end() && it->second->pid == pid) {
    // Died in the pool: drain what it printed, then say how.
    Spare& s = *it->second;
    for (int fd : {s.out, s.err})
      if (fd >= 0) read_output(s, fd);
    const bool ready = s.ready;
    const std::string how = describe_wait(st);
    std::string tail;
    for (const auto& l : s.tail.lines()) tail += "\n    " + l;
    drop(lr, fmt::format("its spare (pid {}) {}", pid, how), false);
    if (!ready && WIFEXITED(st) && WEXITSTATUS(st) != 0) {
      disable(fmt::format("the spare for local rank {} (pid {}) could not import {} ({}){}", lr, pid,
                          fmt::join(opts_.preload, ","), how, tail));
    } else {
      spdlog::warn("warm spare for local rank {} (pid {}) {}{}; its next restart starts cold, and a new spare is "
                   "started with the next attempt",
                   lr, pid, how, ready ? "" : " before it was ready");
    }
  } else {
    spdlog::debug("warm spare pid {} (local rank {}, dropped) reaped: {}", pid, lr, describe_wait(st));
  }
  return true;
}

std::optional<Spares::Launch> Spares::launch(int local_rank, const std::vector<std::string>& argv, const EnvMap& env,
                                             int stdin_fd, int stdout_w, int stderr_w, std::string& why) {
  auto it = by_rank_.find(local_rank);
  if (it == by_rank_.end()) {
    auto l = loss_.find(local_rank);
    why = l != loss_.end() ? l->second : (enabled_ ? "no spare yet" : "");
    return std::nullopt;
  }
  Spare& s = *it->second;
  if (!s.ready && s.ctl >= 0) read_ctl(s);  // a readiness not read off the socket yet
  if (s.ctl < 0) {                          // its socket closed: it is exiting, and its reap is on the way
    why = fmt::format("its spare (pid {}) is exiting", s.pid);
    return std::nullopt;
  }
  if (!s.ready) {
    // Kept: it finishes its import in the background and serves the next restart.
    const double age = seconds_since(s.started);
    why = fmt::format("its spare (pid {}) is still importing ({:.1f} s after its start)", s.pid, age);
    // An import takes seconds; many more at idle priority mean the job keeps every core busy
    // (data loaders) and the spare gets no CPU: it may never be ready.
    if (opts_.priority == SparePriority::Idle && age > kIdleStarvedHintS)
      why += " at idle priority, which gets no CPU while the job keeps every core busy: --spare_priority=normal "
             "has spares import beside the workers";
    return std::nullopt;
  }
  if (std::string m = spare_env_mismatch(s.env, env); !m.empty()) {
    why = "the environment changed (" + m + ")";
    drop(local_rank, why, true);
    return std::nullopt;
  }
  if (s.stdin_fd != stdin_fd) {  // the rank that reads stdin (--stdin_rank) moved to another node's slot
    why = "it was started with another stdin (--stdin_rank)";
    drop(local_rank, why, true);
    return std::nullopt;
  }
  char cwd_buf[4096];
  const std::string cwd = ::getcwd(cwd_buf, sizeof cwd_buf) ? cwd_buf : ".";
  const std::string payload = encode_spare_launch(cwd, argv, env);
  char head[9] = {'G'};
  const uint64_t size = payload.size();
  for (int i = 0; i < 8; ++i) head[1 + i] = static_cast<char>((size >> (8 * i)) & 0xff);
  const int fds[2] = {stdout_w, stderr_w};
  const ssize_t n = send_with_fds(s.ctl, head, sizeof head, fds, 2);
  // A partial header: the rest goes with the payload (a stream socket).
  const bool sent = n > 0 && send_all(s.ctl, head + n, sizeof head - static_cast<size_t>(n)) &&
                    send_all(s.ctl, payload.data(), payload.size());
  Launch l{local_rank, s.pid, -1, s.exit_watch};
  // Out of the pool: the ctl socket goes to the caller, the parked output pipes are done with
  // (whatever the spare printed while parked was logged), the pid becomes the worker's.
  ::epoll_ctl(epoll_fd_, EPOLL_CTL_DEL, s.ctl, nullptr);
  by_fd_.erase(s.ctl);
  l.ctl_fd = s.ctl;
  s.ctl = -1;
  for (int fd : {s.out, s.err})
    if (fd >= 0) read_output(s, fd);
  for (int* fd : {&s.out, &s.err}) unwatch(*fd);
  s.exit_watch = -1;
  pids_.erase(s.pid);
  by_rank_.erase(it);
  if (!sent) {
    why =
        fmt::format("its spare (pid {}) did not take the launch ({})", l.pid, n < 0 ? std::strerror(errno) : "closed");
    ::close(l.ctl_fd);
    reject(l, why);
    return std::nullopt;
  }
  return l;
}

std::string Spares::answer(Launch& l, int timeout_ms) {
  std::string why;
  pollfd p{l.ctl_fd, POLLIN, 0};
  int ready;
  do {
    ready = ::poll(&p, 1, timeout_ms);
  } while (ready < 0 && errno == EINTR);
  char buf[512];
  ssize_t n = ready > 0 ? ::recv(l.ctl_fd, buf, sizeof buf - 1, MSG_DONTWAIT) : -1;
  if (ready == 0) why = fmt::format("no answer in {:.0f} s", timeout_ms / 1000.0);
  else if (n <= 0) why = "it exited as it took the launch";
  else if (buf[0] != 'A') {
    buf[n] = '\0';
    std::string text(buf + (buf[0] == 'E' ? 2 : 0));
    while (!text.empty() && text.back() == '\n') text.pop_back();
    why = "it refused the launch: " + text;
  }
  ::close(l.ctl_fd);
  l.ctl_fd = -1;
  return why;
}

void Spares::reject(Launch& l, const std::string& why) {
  if (l.exit_watch_fd >= 0) ::close(l.exit_watch_fd);
  l.exit_watch_fd = -1;
  signal_process_group(l.pid, SIGKILL);
  pids_[l.pid] = l.local_rank;
  loss_[l.local_rank] = why;
}

std::string Spares::loss(int local_rank) const {
  auto it = loss_.find(local_rank);
  return it == loss_.end() ? "" : it->second;
}

void Spares::kill_all() {
  for (auto& [lr, s] : by_rank_) signal_process_group(s->pid, SIGKILL);
}

}  // namespace ddprun::launcher
