#include "ddprun/launcher/process.h"

#include <dirent.h>
#include <fcntl.h>
#include <linux/filter.h>
#include <linux/seccomp.h>
#include <poll.h>
#include <sched.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/utsname.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <initializer_list>
#include <memory>
#include <system_error>

#include "platform/sys_util.h"

namespace ddprun::launcher {
namespace {

[[noreturn]] void throw_errno(const char* what) {
  throw std::system_error(errno, std::generic_category(), what);
}

void close_fds_from(int first) {
#ifdef SYS_close_range
  if (::syscall(SYS_close_range, static_cast<unsigned>(first), ~0U, 0U) == 0) return;
#endif
  long max = ::sysconf(_SC_OPEN_MAX);
  if (max < 0 || max > 65536) max = 65536;
  for (int fd = first; fd < max; ++fd) ::close(fd);
}

// In the child: a seccomp filter that allows everything, with a listener, sent to the agent
// over `sock` (one byte, the listener attached when there is one). Async-signal-safe.
void install_exit_watch(int sock, bool allow_no_new_privs) {
  sock_filter allow_all = BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ALLOW);
  sock_fprog prog{1, &allow_all};
  long listener = ::syscall(SYS_seccomp, SECCOMP_SET_MODE_FILTER, SECCOMP_FILTER_FLAG_NEW_LISTENER, &prog);
  if (listener < 0 && errno == EACCES && allow_no_new_privs && ::prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) == 0) {
    listener = ::syscall(SYS_seccomp, SECCOMP_SET_MODE_FILTER, SECCOMP_FILTER_FLAG_NEW_LISTENER, &prog);
  }
  const char byte = listener >= 0 ? 1 : 0;
  const int fd = static_cast<int>(listener);
  ssize_t ignored = send_with_fds(sock, &byte, 1, &fd, listener >= 0 ? 1 : 0);
  (void)ignored;
  if (listener >= 0) ::close(static_cast<int>(listener));
  ::close(sock);
}

// Only async-signal-safe calls from here on: the agent has other threads (the store).
[[noreturn]] void exec_child(const SpawnRequest& req, pid_t parent, int out_w, int err_w,
                             int status_w, int watch_w, char* const* argv, char* const* envp,
                             const cpu_set_t* affinity, size_t affinity_size) {
  // A session of its own (torchrun's start_new_session): its own process group, signalled as
  // one; no controlling terminal, so a read of the terminal (pdb on --stdin_rank) does not
  // stop it; and its own scheduler autogroup, so the workers compete with the rest of the host
  // as separate jobs, not as one share with the shell that started ddprun.
  ::setsid();
  // Before exec, so the worker's first thread and every thread it starts inherit the set.
  if (affinity != nullptr && ::sched_setaffinity(0, affinity_size, affinity) != 0) {
    int e = errno;
    ssize_t ignored = ::write(status_w, &e, sizeof e);
    (void)ignored;
    ::_exit(127);
  }
  ::prctl(PR_SET_PDEATHSIG, SIGKILL);
  if (::getppid() != parent) ::_exit(126);  // the agent died before prctl took effect
  if (watch_w >= 0) install_exit_watch(watch_w, req.exit_watch_no_new_privs);

  sigset_t none;
  sigemptyset(&none);
  ::sigprocmask(SIG_SETMASK, &none, nullptr);
  struct sigaction dfl {};
  dfl.sa_handler = SIG_DFL;
  for (int s : req.reset_to_default) ::sigaction(s, &dfl, nullptr);

  if (req.stdin_fd >= 0) ::dup2(req.stdin_fd, 0);
  ::dup2(out_w, 1);
  ::dup2(err_w, 2);
  // Keep only 0-2, the exec-status pipe (close-on-exec itself) as 3 and the passed fd as 4.
  // Both are first moved above 4, so that placing one cannot overwrite the other.
  int keep = ::fcntl(status_w, F_DUPFD_CLOEXEC, 5);
  if (keep < 0) ::_exit(127);
  int pass = req.pass_fd >= 0 ? ::fcntl(req.pass_fd, F_DUPFD_CLOEXEC, 5) : -1;
  if (req.pass_fd >= 0 && pass < 0) ::_exit(127);
  ::dup2(keep, 3);
  ::fcntl(3, F_SETFD, FD_CLOEXEC);
  if (pass >= 0) ::dup2(pass, 4);  // dup2 leaves the new descriptor open across exec
  close_fds_from(pass >= 0 ? 5 : 4);
  ::execve(req.executable.c_str(), argv, envp);
  int err = errno;
  ssize_t ignored = ::write(3, &err, sizeof err);
  (void)ignored;
  ::_exit(127);
}

}  // namespace

namespace {

// The CPU set, sized for the highest CPU named (CPU_ALLOC: machines may have > 1024); none
// when `cpus` is empty.
struct CpuSetFree {
  void operator()(cpu_set_t* p) const { CPU_FREE(p); }
};
struct CpuSet {
  std::unique_ptr<cpu_set_t, CpuSetFree> set;
  size_t size = 0;
};
CpuSet make_cpu_set(const std::vector<int>& cpus) {
  CpuSet out;
  if (cpus.empty()) return out;
  int max_cpu = 0;
  for (int c : cpus) max_cpu = std::max(max_cpu, c);
  out.set.reset(CPU_ALLOC(max_cpu + 1));
  if (!out.set) throw_errno("CPU_ALLOC");
  out.size = CPU_ALLOC_SIZE(max_cpu + 1);
  CPU_ZERO_S(out.size, out.set.get());
  for (int c : cpus) {
    if (c >= 0) CPU_SET_S(static_cast<size_t>(c), out.size, out.set.get());
  }
  return out;
}

}  // namespace

SpawnedProcess spawn_process(const SpawnRequest& req) {
  // Everything that allocates happens before fork.
  std::vector<char*> argv;
  for (const auto& a : req.argv) argv.push_back(const_cast<char*>(a.c_str()));
  argv.push_back(nullptr);
  std::vector<char*> envp;
  for (const auto& e : req.envp) envp.push_back(const_cast<char*>(e.c_str()));
  envp.push_back(nullptr);
  const CpuSet affinity = make_cpu_set(req.cpu_affinity);

  int out[2], err[2], status[2];
  if (::pipe2(out, O_CLOEXEC) != 0) throw_errno("pipe2");
  if (::pipe2(err, O_CLOEXEC) != 0) {
    int e = errno;
    ::close(out[0]);
    ::close(out[1]);
    errno = e;
    throw_errno("pipe2");
  }
  if (::pipe2(status, O_CLOEXEC) != 0) {
    int e = errno;
    for (int fd : {out[0], out[1], err[0], err[1]}) ::close(fd);
    errno = e;
    throw_errno("pipe2");
  }
  int watch[2] = {-1, -1};
  if (req.exit_watch && ::socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, watch) != 0) {
    watch[0] = watch[1] = -1;  // no watch for this one: the reap still tells
  }
  const pid_t parent = ::getpid();
  pid_t pid = ::fork();
  if (pid < 0) {
    int e = errno;
    for (int fd : {out[0], out[1], err[0], err[1], status[0], status[1], watch[0], watch[1]}) {
      if (fd >= 0) ::close(fd);
    }
    errno = e;
    throw_errno("fork");
  }
  if (pid == 0) {
    exec_child(req, parent, out[1], err[1], status[1], watch[1], argv.data(), envp.data(), affinity.set.get(),
               affinity.size);
  }

  // Until the child's setsid(), its group is ours: signal_process_group() then signals the
  // child alone (it cannot be made a group leader from here: setsid() would then fail).
  ::close(out[1]);
  ::close(err[1]);
  ::close(status[1]);
  if (watch[1] >= 0) ::close(watch[1]);
  ::fcntl(out[0], F_SETFL, ::fcntl(out[0], F_GETFL) | O_NONBLOCK);
  ::fcntl(err[0], F_SETFL, ::fcntl(err[0], F_GETFL) | O_NONBLOCK);
  return SpawnedProcess{pid, out[0], err[0], status[0], watch[0]};
}

namespace {
// Whether `fd` became readable (or reached EOF) within `timeout_ms`.
bool wait_readable(int fd, int timeout_ms) {
  pollfd p{fd, POLLIN, 0};
  int ready;
  do {
    ready = ::poll(&p, 1, timeout_ms);
  } while (ready < 0 && errno == EINTR);
  return ready > 0;
}
}  // namespace

int receive_exit_watch(int sock, int timeout_ms) {
  if (sock < 0) return -1;
  int listener = -1;
  if (wait_readable(sock, timeout_ms)) {
    char byte = 0;
    iovec iov{&byte, 1};
    alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int))] = {};
    msghdr msg{};
    msg.msg_iov = &iov;
    msg.msg_iovlen = 1;
    msg.msg_control = control;
    msg.msg_controllen = sizeof control;
    ssize_t n;
    do {
      n = ::recvmsg(sock, &msg, MSG_CMSG_CLOEXEC | MSG_DONTWAIT);
    } while (n < 0 && errno == EINTR);
    if (n == 1) {
      for (cmsghdr* c = CMSG_FIRSTHDR(&msg); c; c = CMSG_NXTHDR(&msg, c)) {
        if (c->cmsg_level == SOL_SOCKET && c->cmsg_type == SCM_RIGHTS && c->cmsg_len == CMSG_LEN(sizeof(int))) {
          std::memcpy(&listener, CMSG_DATA(c), sizeof listener);
        }
      }
    }
  }
  ::close(sock);
  return listener;
}

bool kernel_reports_exit_early() {
  utsname u{};
  if (::uname(&u) != 0) return false;
  int major = 0, minor = 0;
  if (std::sscanf(u.release, "%d.%d", &major, &minor) != 2) return false;
  return major > 6 || (major == 6 && minor >= 11);
}

namespace {
// Numeric fields of /proc/<pid>/stat, numbered as in proc(5) (4 ppid, 22 starttime, 23 vsize,
// 52 exit_code), in ascending order, into `values`; false when the file cannot be read or
// ends before the last one.
bool read_stat_fields(pid_t pid, std::initializer_list<int> fields, unsigned long long* values) {
  char path[64];
  std::snprintf(path, sizeof path, "/proc/%d/stat", static_cast<int>(pid));
  int fd = ::open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0) return false;
  char buf[2048];
  ssize_t n;
  do {
    n = ::read(fd, buf, sizeof buf - 1);
  } while (n < 0 && errno == EINTR);
  ::close(fd);
  if (n <= 0) return false;
  buf[n] = '\0';
  // "pid (comm) state ..." - comm may hold spaces and parentheses: fields count from the last ')'.
  const char* p = std::strrchr(buf, ')');
  if (!p) return false;
  ++p;
  int field = 2;
  auto want = fields.begin();
  while (*p && want != fields.end()) {
    while (*p == ' ') ++p;
    if (!*p || *p == '\n') break;
    ++field;
    const char* tok = p;
    while (*p && *p != ' ' && *p != '\n') ++p;
    if (field == *want) {
      *values++ = std::strtoull(tok, nullptr, 10);
      ++want;
    }
  }
  return want == fields.end();
}
}  // namespace

std::optional<int> early_exit_status(pid_t pid) {
  // The exiting task drops its seccomp filter (which wakes the listener) a few instructions
  // before it stores its exit code, and it gives up its address space (vsize 0) only after
  // that. So "code 0 with the address space still there" may mean "not stored yet": look again
  // for a moment. Code 0 with vsize 0 is a clean exit. On the same CPU the yield lets the
  // exiting task run; the bound keeps a stalled exit from holding the agent.
  const auto until = std::chrono::steady_clock::now() + std::chrono::milliseconds(2);
  unsigned long long f[2] = {0, 0};  // vsize, exit_code (Linux 3.5+)
  while (read_stat_fields(pid, {23, 52}, f) && f[1] == 0 && f[0] != 0 && std::chrono::steady_clock::now() < until) {
    ::sched_yield();
  }
  if (f[1] == 0 || f[1] > 0xffff) return std::nullopt;
  return static_cast<int>(f[1]);
}

int wait_exec_status(int fd, int timeout_ms) {
  int err = 0;
  ssize_t n = -1;
  if (wait_readable(fd, timeout_ms)) {
    do {
      n = ::read(fd, &err, sizeof err);
    } while (n < 0 && errno == EINTR);
  }
  ::close(fd);
  return n == static_cast<ssize_t>(sizeof err) ? err : 0;
}

std::optional<std::string> find_executable(const std::string& name, const std::string& path_var) {
  auto ok = [](const std::string& p) {
    struct stat st {};
    return ::stat(p.c_str(), &st) == 0 && S_ISREG(st.st_mode) && ::access(p.c_str(), X_OK) == 0;
  };
  if (name.empty()) return std::nullopt;
  if (name.find('/') != std::string::npos) return ok(name) ? std::optional(name) : std::nullopt;
  std::stringstream in(path_var.empty() ? std::string("/usr/local/bin:/usr/bin:/bin") : path_var);
  std::string dir;
  while (std::getline(in, dir, ':')) {
    std::string candidate = (dir.empty() ? std::string(".") : dir) + "/" + name;
    if (ok(candidate)) return candidate;
  }
  return std::nullopt;
}

void become_child_subreaper() {
  if (::prctl(PR_SET_CHILD_SUBREAPER, 1) != 0) throw_errno("prctl(PR_SET_CHILD_SUBREAPER)");
}

bool signal_process_group(pid_t pgid, int signo) {
  if (pgid <= 1) return false;
  if (::kill(-pgid, signo) == 0) return true;
  // No such group: a child between fork and its setsid() is still in ours.
  return errno == ESRCH && pgid != ::getpid() && ::getpgid(pgid) == ::getpgrp() && ::kill(pgid, signo) == 0;
}

namespace {

// Children of `parent` (from /proc/<pid>/stat) whose start time, in clock ticks since boot, is
// below `before_tick`.
std::vector<pid_t> scan_children(pid_t parent, unsigned long long before_tick) {
  std::vector<pid_t> out;
  DIR* d = ::opendir("/proc");
  if (!d) return out;
  while (dirent* e = ::readdir(d)) {
    char* end = nullptr;
    long pid = std::strtol(e->d_name, &end, 10);
    if (pid <= 0 || *end != '\0') continue;
    unsigned long long f[2] = {0, 0};  // ppid, starttime
    if (before_tick == ~0ULL ? !read_stat_fields(static_cast<pid_t>(pid), {4}, f)
                             : !read_stat_fields(static_cast<pid_t>(pid), {4, 22}, f))
      continue;
    if (f[0] != static_cast<unsigned long long>(parent)) continue;
    if (before_tick != ~0ULL && f[1] >= before_tick) continue;
    out.push_back(static_cast<pid_t>(pid));
  }
  ::closedir(d);
  return out;
}

}  // namespace

std::vector<pid_t> children_of(pid_t parent) { return scan_children(parent, ~0ULL); }

std::vector<pid_t> children_started_before(pid_t parent, unsigned long long tick) {
  return scan_children(parent, tick);
}

unsigned long long boot_ticks_now() {
  // /proc/<pid>/stat's start time is the task's CLOCK_BOOTTIME start in USER_HZ ticks.
  timespec ts{};
  ::clock_gettime(CLOCK_BOOTTIME, &ts);
  const long hz = ::sysconf(_SC_CLK_TCK);
  const unsigned long long ns = static_cast<unsigned long long>(ts.tv_sec) * 1000000000ULL +
                                static_cast<unsigned long long>(ts.tv_nsec);
  return ns / (1000000000ULL / static_cast<unsigned long long>(hz > 0 ? hz : 100));
}

void ensure_std_fds_open() {
  for (int fd = 0; fd < 3; ++fd) {
    if (::fcntl(fd, F_GETFD) == -1 && errno == EBADF) {
      int n = ::open("/dev/null", O_RDWR);
      if (n >= 0 && n != fd) {
        ::dup2(n, fd);
        ::close(n);
      }
    }
  }
}

Guardian::Guardian() {
  int fds[2];
  if (::pipe2(fds, O_CLOEXEC) != 0) throw_errno("pipe2 (guardian)");
  // Double fork: the guardian is not our child (so "any child left?" stays a cheap question
  // for the agent) and lives in its own session (a signal to the job's process group does not
  // take it out with the agent).
  pid_t mid = ::fork();
  if (mid < 0) {
    int e = errno;
    ::close(fds[0]);
    ::close(fds[1]);
    errno = e;
    throw_errno("fork (guardian)");
  }
  if (mid == 0) {
    ::setsid();
    pid_t g = ::fork();
    if (g != 0) ::_exit(g > 0 ? 0 : 1);
    // The guardian: a fixed-size table, no allocation.
    ::close(fds[1]);
    struct sigaction ign {};
    ign.sa_handler = SIG_IGN;
    for (int sig : {SIGINT, SIGTERM, SIGHUP, SIGQUIT, SIGPIPE}) ::sigaction(sig, &ign, nullptr);
    int null = ::open("/dev/null", O_RDWR);
    for (int fd = 0; fd < 3; ++fd) ::dup2(null, fd);
    if (fds[0] != 3) ::dup2(fds[0], 3);  // keep only the read end, as fd 3
    close_fds_from(4);
    ::chdir("/");
    constexpr int kMaxGroups = 1 << 16;
    static pid_t groups[kMaxGroups];
    int n = 0;
    while (true) {
      int32_t v = 0;
      ssize_t r = ::read(3, &v, sizeof v);
      if (r < 0 && errno == EINTR) continue;
      if (r != static_cast<ssize_t>(sizeof v)) break;  // EOF: the agent is gone
      if (v == 0) ::_exit(0);                          // released
      if (v > 0 && n < kMaxGroups) groups[n++] = v;
      if (v < 0) {
        for (int i = 0; i < n; ++i) {
          if (groups[i] == -v) groups[i--] = groups[--n];
        }
      }
    }
    for (int i = 0; i < n; ++i) ::kill(-groups[i], SIGKILL);
    ::_exit(0);
  }
  ::close(fds[0]);
  int st = 0;
  while (::waitpid(mid, &st, 0) < 0 && errno == EINTR) {
  }
  if (!WIFEXITED(st) || WEXITSTATUS(st) != 0) {
    ::close(fds[1]);
    throw std::system_error(EAGAIN, std::generic_category(), "fork (guardian)");
  }
  fd_ = fds[1];
}

Guardian::~Guardian() { release(); }

void Guardian::send(int32_t value) {
  if (fd_ < 0) return;
  ssize_t r;
  do {
    r = ::write(fd_, &value, sizeof value);
  } while (r < 0 && errno == EINTR);
}

void Guardian::watch(pid_t pgid) {
  if (pgid > 1) send(static_cast<int32_t>(pgid));
}

void Guardian::forget(pid_t pgid) {
  if (pgid > 1) send(-static_cast<int32_t>(pgid));
}

void Guardian::release() {
  if (fd_ < 0) return;
  send(0);
  ::close(fd_);
  fd_ = -1;
}

}  // namespace ddprun::launcher
