// The process layer against real processes (fork/exec, groups, pipes), no agent.
#include <catch2/catch.hpp>

#include <poll.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <csignal>
#include <string>

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
