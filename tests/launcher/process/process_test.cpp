// The process layer against real processes (fork/exec, groups, pipes), no agent.
#include <catch2/catch.hpp>

#include <fcntl.h>
#include <poll.h>
#include <sched.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <csignal>
#include <string>
#include <vector>

#include "ddprun/launcher/process.h"

using namespace ddprun::launcher;

namespace {

std::string read_all(int fd) {
  std::string out;
  char buf[4096];
  while (true) {
    ssize_t n = ::read(fd, buf, sizeof buf);
    if (n > 0) {
      out.append(buf, static_cast<size_t>(n));
    } else if (n < 0 && (errno == EAGAIN || errno == EINTR)) {
      pollfd p{fd, POLLIN, 0};
      REQUIRE(::poll(&p, 1, 30000) == 1);  // hang guard only
    } else {
      break;
    }
  }
  ::close(fd);
  return out;
}

int wait_status(pid_t pid) {
  int st = 0;
  REQUIRE(::waitpid(pid, &st, 0) == pid);
  return st;
}

// A child that sleeps until kill_and_reap().
SpawnedProcess spawn_sleeper() {
  SpawnRequest req;
  req.executable = *find_executable("sleep", "/usr/bin:/bin");
  req.argv = {"sleep", "300"};
  auto p = spawn_process(req);
  REQUIRE(wait_exec_status(p.exec_status_fd) == 0);
  return p;
}

void kill_and_reap(const SpawnedProcess& p) {
  ::kill(p.pid, SIGKILL);
  wait_status(p.pid);
  ::close(p.stdout_fd);
  ::close(p.stderr_fd);
}

}  // namespace

TEST_CASE("spawned worker: own process group, pipes, env, argv", "[process]") {
  SpawnRequest req;
  req.executable = *find_executable("sh", "/usr/bin:/bin");
  req.argv = {"sh", "-c", "echo out $FOO $1; echo err >&2; ps -o pgid= -p $$ | tr -d ' '", "sh", "arg1"};
  req.envp = {"FOO=bar", "PATH=/usr/bin:/bin"};
  auto p = spawn_process(req);
  CHECK(wait_exec_status(p.exec_status_fd) == 0);
  std::string out = read_all(p.stdout_fd);
  std::string err = read_all(p.stderr_fd);
  CHECK(out == "out bar arg1\n" + std::to_string(p.pid) + "\n");
  CHECK(err == "err\n");
  int st = wait_status(p.pid);
  CHECK(WIFEXITED(st));
  CHECK(WEXITSTATUS(st) == 0);
}

TEST_CASE("pass_fd: the child gets it as fd 4, and no other descriptor but 0-2", "[process]") {
  int sv[2];
  REQUIRE(::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) == 0);
  int leak = ::open("/dev/null", O_RDONLY);  // not close-on-exec on purpose: must not reach the child
  REQUIRE(leak >= 0);
  SpawnRequest req;
  req.executable = *find_executable("ls", "/usr/bin:/bin");
  req.argv = {"ls", "/proc/self/fd"};  // ls's own directory handle takes the lowest free number: 3
  req.pass_fd = sv[1];
  auto p = spawn_process(req);
  CHECK(wait_exec_status(p.exec_status_fd) == 0);
  CHECK(read_all(p.stdout_fd) == "0\n1\n2\n3\n4\n");
  read_all(p.stderr_fd);
  CHECK(WIFEXITED(wait_status(p.pid)));

  req.executable = *find_executable("sh", "/usr/bin:/bin");
  req.argv = {"sh", "-c", "echo via4 >&4"};
  p = spawn_process(req);
  ::close(sv[1]);
  CHECK(wait_exec_status(p.exec_status_fd) == 0);
  read_all(p.stdout_fd);
  read_all(p.stderr_fd);
  CHECK(WIFEXITED(wait_status(p.pid)));
  CHECK(read_all(sv[0]) == "via4\n");
  ::close(leak);
}

TEST_CASE("cpu_affinity: the worker starts on exactly the CPUs asked for", "[process]") {
  cpu_set_t mine;
  CPU_ZERO(&mine);
  REQUIRE(::sched_getaffinity(0, sizeof mine, &mine) == 0);
  int last = -1;
  for (int c = 0; c < CPU_SETSIZE; ++c) {
    if (CPU_ISSET(c, &mine)) last = c;
  }
  REQUIRE(last >= 0);
  SpawnRequest req;
  req.executable = *find_executable("sh", "/usr/bin:/bin");
  req.argv = {"sh", "-c", "grep Cpus_allowed_list /proc/self/status"};
  req.cpu_affinity = {last};
  auto p = spawn_process(req);
  CHECK(wait_exec_status(p.exec_status_fd) == 0);
  CHECK(read_all(p.stdout_fd) == "Cpus_allowed_list:\t" + std::to_string(last) + "\n");
  ::close(p.stderr_fd);
  CHECK(WEXITSTATUS(wait_status(p.pid)) == 0);

  // A set the kernel refuses (no CPU of it exists): the worker does not start, and the errno
  // shows where an exec failure would.
  req.cpu_affinity = {CPU_SETSIZE * 4 - 1};
  auto q = spawn_process(req);
  CHECK(wait_exec_status(q.exec_status_fd) == EINVAL);
  CHECK(WEXITSTATUS(wait_status(q.pid)) == 127);
  ::close(q.stdout_fd);
  ::close(q.stderr_fd);
}

TEST_CASE("exec failure: errno reported, exit 127", "[process]") {
  SpawnRequest req;
  req.executable = "/nonexistent/ddprun-test-binary";
  req.argv = {"x"};
  auto p = spawn_process(req);
  CHECK(wait_exec_status(p.exec_status_fd) == ENOENT);
  ::close(p.stdout_fd);
  ::close(p.stderr_fd);
  int st = wait_status(p.pid);
  CHECK(WIFEXITED(st));
  CHECK(WEXITSTATUS(st) == 127);
}

TEST_CASE("signalling the group reaches grandchildren", "[process]") {
  SpawnRequest req;
  req.executable = *find_executable("sh", "/usr/bin:/bin");
  // The grandchild (sleep) holds stdout open; when the group is killed, stdout reaches EOF.
  req.argv = {"sh", "-c", "sleep 300 & echo started; wait"};
  req.envp = {"PATH=/usr/bin:/bin"};
  auto p = spawn_process(req);
  REQUIRE(wait_exec_status(p.exec_status_fd) == 0);
  char buf[16];
  pollfd pf{p.stdout_fd, POLLIN, 0};
  REQUIRE(::poll(&pf, 1, 30000) == 1);
  REQUIRE(::read(p.stdout_fd, buf, sizeof buf) > 0);
  CHECK(signal_process_group(p.pid, SIGKILL));
  int st = wait_status(p.pid);
  CHECK(WIFSIGNALED(st));
  CHECK(WTERMSIG(st) == SIGKILL);
  CHECK(read_all(p.stdout_fd).empty());  // EOF: the grandchild died too
  ::close(p.stderr_fd);
}

TEST_CASE("find_executable", "[process]") {
  CHECK(find_executable("sh", "/nonexistent:/bin").value() == "/bin/sh");
  CHECK_FALSE(find_executable("ddprun-no-such-program", "/bin:/usr/bin"));
  CHECK(find_executable("/bin/sh", "").value() == "/bin/sh");
  CHECK_FALSE(find_executable("/etc/passwd", ""));  // not executable
  CHECK_FALSE(find_executable("/bin", ""));         // a directory
}

TEST_CASE("children_started_before: only children from an earlier clock tick", "[process]") {
  auto older = spawn_sleeper();
  // The next tick (USER_HZ, 10 ms): everything spawned from now on starts at or after it.
  const unsigned long long spawned_tick = boot_ticks_now();
  unsigned long long mark = spawned_tick;
  for (int i = 0; i < 1000 && mark == spawned_tick; ++i) {
    ::usleep(1000);
    mark = boot_ticks_now();
  }
  REQUIRE(mark > spawned_tick);
  auto newer = spawn_sleeper();
  auto before = children_started_before(::getpid(), mark);
  CHECK(std::find(before.begin(), before.end(), older.pid) != before.end());
  CHECK(std::find(before.begin(), before.end(), newer.pid) == before.end());
  auto all = children_of(::getpid());
  CHECK(std::find(all.begin(), all.end(), newer.pid) != all.end());
  kill_and_reap(older);
  kill_and_reap(newer);
}

TEST_CASE("children_of lists direct children", "[process]") {
  auto p = spawn_sleeper();
  auto kids = children_of(::getpid());
  CHECK(std::find(kids.begin(), kids.end(), p.pid) != kids.end());
  kill_and_reap(p);
}

namespace {

// Spawns argv (argv[0] looked up on /usr/bin:/bin) with the early exit watch; returns the
// process and its listener (-1 when none could be had).
std::pair<SpawnedProcess, int> spawn_watched(std::vector<std::string> argv, int stdin_fd = -1) {
  SpawnRequest req;
  req.executable = *find_executable(argv[0], "/usr/bin:/bin");
  req.argv = std::move(argv);
  req.stdin_fd = stdin_fd;
  req.exit_watch = true;
  req.exit_watch_no_new_privs = true;
  auto p = spawn_process(req);
  REQUIRE(p.exit_watch_sock >= 0);
  const int listener = receive_exit_watch(p.exit_watch_sock);
  REQUIRE(wait_exec_status(p.exec_status_fd) == 0);
  return {p, listener};
}

std::pair<SpawnedProcess, int> spawn_watched(const std::string& script) { return spawn_watched({"sh", "-c", script}); }

// Whether a worker can get the watch here: Linux 6.11+ and seccomp listeners allowed (a
// container may forbid them). Says why when not.
bool exit_watch_here() {
  if (!kernel_reports_exit_early()) {
    WARN("skipped: Linux < 6.11 drops seccomp filters only at the reap");
    return false;
  }
  auto [p, listener] = spawn_watched("exit 0");
  int st = 0;
  ::waitpid(p.pid, &st, 0);
  ::close(p.stdout_fd);
  ::close(p.stderr_fd);
  if (listener < 0) {
    WARN("skipped: this environment allows no seccomp listener");
    return false;
  }
  ::close(listener);
  return true;
}

// Waits for the listener to report that no task uses the filter any more.
void wait_hup(int listener) {
  pollfd p{listener, POLLIN, 0};
  REQUIRE(::poll(&p, 1, 30000) == 1);  // hang guard only
  CHECK((p.revents & POLLHUP) != 0);
}

void close_watched(const SpawnedProcess& p, int listener) {
  for (int fd : {listener, p.stdout_fd, p.stderr_fd}) ::close(fd);
}

}  // namespace

TEST_CASE("early exit watch: the listener reports the exit and /proc holds the status before the reap",
          "[process][exit_watch]") {
  if (!exit_watch_here()) return;
  SECTION("SIGKILL") {
    auto [p, listener] = spawn_watched("exec sleep 300");
    REQUIRE(listener >= 0);
    ::kill(p.pid, SIGKILL);
    wait_hup(listener);
    auto early = early_exit_status(p.pid);  // not reaped yet: the zombie keeps it
    REQUIRE(early);
    CHECK(WIFSIGNALED(*early));
    CHECK(WTERMSIG(*early) == SIGKILL);
    const int st = wait_status(p.pid);
    CHECK(st == *early);
    close_watched(p, listener);
  }
  SECTION("exit code 3") {
    auto [p, listener] = spawn_watched("exit 3");
    REQUIRE(listener >= 0);
    wait_hup(listener);
    auto early = early_exit_status(p.pid);
    REQUIRE(early);
    CHECK(WIFEXITED(*early));
    CHECK(WEXITSTATUS(*early) == 3);
    CHECK(wait_status(p.pid) == *early);
    close_watched(p, listener);
  }
  SECTION("a clean exit shows no early status: the reap tells") {
    auto [p, listener] = spawn_watched("exit 0");
    REQUIRE(listener >= 0);
    wait_hup(listener);
    CHECK_FALSE(early_exit_status(p.pid));
    const int st = wait_status(p.pid);
    CHECK((WIFEXITED(st) && WEXITSTATUS(st) == 0));
    close_watched(p, listener);
  }
  SECTION("a child that inherited the filter holds the report back until it exits too") {
    // The worker exits at once; its background child lives on until its stdin pipe closes.
    int gate[2];
    REQUIRE(::pipe2(gate, O_CLOEXEC) == 0);
    auto [p, listener] = spawn_watched({"sh", "-c", "exec 3<&0; (read x <&3) & exit 5"}, gate[0]);
    REQUIRE(listener >= 0);
    const int st = wait_status(p.pid);  // the worker itself is gone
    CHECK((WIFEXITED(st) && WEXITSTATUS(st) == 5));
    pollfd pf{listener, POLLIN, 0};
    CHECK(::poll(&pf, 1, 0) == 0);  // its child still uses the filter
    ::close(gate[1]);               // the child's read returns: it exits
    wait_hup(listener);
    ::close(gate[0]);
    close_watched(p, listener);
  }
}

TEST_CASE("early exit watch: the exit is seen before the kernel has torn a big process down", "[process][exit_watch]") {
  if (!exit_watch_here()) return;
  if (!find_executable("python3", "/usr/bin:/bin")) {
    WARN("skipped: no python3");
    return;
  }
  // 512 MiB touched (131072 pages), then SIGKILL to itself: freeing it takes the kernel tens of ms, and the
  // parent hears of the exit only after that. The listener must fire before; scheduling noise
  // may hide it once, so three tries, of which one must show it.
  int early_seen = 0;
  for (int trial = 0; trial < 3 && early_seen == 0; ++trial) {
    // Small pages (MADV_NOHUGEPAGE): with transparent huge pages set to "always" the memory
    // would go back in a few hundred 2 MiB frees, too fast to see.
    auto [p, listener] = spawn_watched({"python3", "-c",
                                        "import mmap, os\nm = mmap.mmap(-1, 512 << 20, flags=mmap.MAP_PRIVATE | "
                                        "mmap.MAP_ANONYMOUS)\nm.madvise(mmap.MADV_NOHUGEPAGE)\n"
                                        "for i in range(0, len(m), 4096): m[i] = 1\nos.kill(os.getpid(), 9)"});
    REQUIRE(listener >= 0);
    wait_hup(listener);
    siginfo_t si{};
    REQUIRE(::waitid(P_PID, static_cast<id_t>(p.pid), &si, WEXITED | WNOHANG | WNOWAIT) == 0);
    const bool still_tearing_down = si.si_pid == 0;
    auto early = early_exit_status(p.pid);
    if (still_tearing_down) {
      REQUIRE(early);
      CHECK(WTERMSIG(*early) == SIGKILL);
      ++early_seen;
    }
    const int st = wait_status(p.pid);
    CHECK((WIFSIGNALED(st) && WTERMSIG(st) == SIGKILL));
    close_watched(p, listener);
  }
  CHECK(early_seen == 1);
}

TEST_CASE("early exit watch off: no socket, no listener", "[process][exit_watch]") {
  auto p = spawn_sleeper();
  CHECK(p.exit_watch_sock == -1);
  CHECK(receive_exit_watch(p.exit_watch_sock) == -1);
  kill_and_reap(p);
}
