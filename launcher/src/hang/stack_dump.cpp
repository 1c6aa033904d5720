#include "hang/stack_dump.h"

#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <ctime>
#include <set>
#include <sstream>
#include <system_error>
#include <thread>

#include <fmt/format.h>

#include "ddprun/launcher/process.h"
#include "ddprun/launcher/worker_files.h"

extern char** environ;

namespace ddprun::launcher {
namespace fs = std::filesystem;

namespace {

std::vector<std::string> command_for(const StackTools& tools, const StackTarget& t, std::string& tool) {
  const std::string pid = std::to_string(t.pid);
  if (t.python && tools.py_spy) {
    tool = "py-spy";
    return {*tools.py_spy, "dump", "--pid", pid};
  }
  if (tools.eu_stack) {
    tool = "eu-stack";
    return {*tools.eu_stack, "-p", pid};
  }
  if (tools.gdb) {
    tool = "gdb";
    return {*tools.gdb, "-nx", "-batch", "-p", pid, "-ex", "set pagination off", "-ex", "thread apply all bt"};
  }
  tool.clear();
  return {};
}

// Starts `argv` in a process group of its own, stdin /dev/null, stdout and stderr appended to
// `fd`, with the default signal mask and dispositions (the agent blocks its signals).
pid_t spawn_tool(const std::vector<std::string>& argv, int fd) {
  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  posix_spawn_file_actions_addopen(&fa, 0, "/dev/null", O_RDONLY, 0);
  posix_spawn_file_actions_adddup2(&fa, fd, 1);
  posix_spawn_file_actions_adddup2(&fa, fd, 2);
  posix_spawnattr_t attr;
  posix_spawnattr_init(&attr);
  sigset_t none, all;
  sigemptyset(&none);
  sigfillset(&all);
  posix_spawnattr_setsigmask(&attr, &none);
  posix_spawnattr_setsigdefault(&attr, &all);
  posix_spawnattr_setpgroup(&attr, 0);
  posix_spawnattr_setflags(&attr, POSIX_SPAWN_SETSIGMASK | POSIX_SPAWN_SETSIGDEF | POSIX_SPAWN_SETPGROUP);
  std::vector<char*> args;
  for (const auto& a : argv) args.push_back(const_cast<char*>(a.c_str()));
  args.push_back(nullptr);
  pid_t pid = -1;
  const int rc = ::posix_spawn(&pid, args[0], &fa, &attr, args.data(), environ);
  posix_spawn_file_actions_destroy(&fa);
  posix_spawnattr_destroy(&attr);
  return rc == 0 ? pid : -1;
}

// The stack file without its header line; at most kMaxStackFileBytes of it (the file sits in
// the run's log directory, which the workers can write: worker_files.h).
std::string read_after_header(const std::string& path) {
  const std::string text = read_worker_file(path, kMaxStackFileBytes).value_or("");
  const size_t nl = text.find('\n');
  return nl == std::string::npos ? std::string() : text.substr(nl + 1);
}

}  // namespace

StackTools find_stack_tools(const std::string& python_exec, const std::string& path_var) {
  StackTools t;
  if (!python_exec.empty() && python_exec.find('/') != std::string::npos) {
    const fs::path beside = fs::path(python_exec).parent_path() / "py-spy";
    if (::access(beside.c_str(), X_OK) == 0) t.py_spy = beside.string();
  }
  if (!t.py_spy) t.py_spy = find_executable("py-spy", path_var);
  t.eu_stack = find_executable("eu-stack", path_var);
  t.gdb = find_executable("gdb", path_var);
  return t;
}

std::vector<StackDump> dump_stacks(const std::vector<StackTarget>& targets, const StackTools& tools,
                                   const fs::path& out_dir, double timeout_s) {
  fs::create_directories(out_dir);
  std::vector<StackDump> dumps;
  std::vector<pid_t> pids;
  char when[40];
  const std::time_t now = std::time(nullptr);
  std::tm tm{};
  ::gmtime_r(&now, &tm);
  std::strftime(when, sizeof when, "%Y-%m-%d %H:%M:%S UTC", &tm);
  for (const auto& t : targets) {
    StackDump d;
    d.target = t;
    d.file = (out_dir / fmt::format("r{}.txt", t.global_rank)).string();
    const auto argv = command_for(tools, t, d.tool);
    pid_t pid = -1;
    const int fd = create_worker_file(d.file, O_WRONLY | O_APPEND);  // what was there is removed, never opened
    if (fd >= 0) {
      const std::string header = fmt::format("# r{} (local rank {}, pid {}) at {}: {}\n", t.global_rank, t.local_rank,
                                             t.pid, when, argv.empty() ? "no stack tool found" : d.tool);
      (void)!::write(fd, header.data(), header.size());
      if (argv.empty()) {
        const std::string why = "install py-spy (pip) for Python stacks, or elfutils (eu-stack) or gdb for native ones\n";
        (void)!::write(fd, why.data(), why.size());
      } else {
        pid = spawn_tool(argv, fd);
        if (pid < 0) {
          const std::string why = "could not start " + argv[0] + ": " + std::strerror(errno) + "\n";
          (void)!::write(fd, why.data(), why.size());
        }
      }
      ::close(fd);
    }
    dumps.push_back(std::move(d));
    pids.push_back(pid);
  }
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(timeout_s);
  std::set<size_t> running;
  for (size_t i = 0; i < pids.size(); ++i) {
    if (pids[i] > 0) running.insert(i);
  }
  while (!running.empty()) {
    for (auto it = running.begin(); it != running.end();) {
      int st = 0;
      const pid_t r = ::waitpid(pids[*it], &st, WNOHANG);
      if (r == pids[*it] || (r < 0 && errno == ECHILD)) it = running.erase(it);
      else ++it;
    }
    if (running.empty()) break;
    if (std::chrono::steady_clock::now() >= deadline) {
      for (size_t i : running) {
        ::kill(-pids[i], SIGKILL);
        int st = 0;
        ::waitpid(pids[i], &st, 0);
        // A tracer killed while it held the worker stopped leaves it stopped: let it go on.
        ::kill(dumps[i].target.pid, SIGCONT);
        dumps[i].timed_out = true;
        if (const int fd = open_worker_file(dumps[i].file, O_WRONLY | O_APPEND); fd >= 0) {
          const std::string why = fmt::format("\n(stopped: {} gave no complete answer within {:g} s)\n", dumps[i].tool, timeout_s);
          (void)!::write(fd, why.data(), why.size());
          ::close(fd);
        }
      }
      break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  for (auto& d : dumps) d.text = read_after_header(d.file);
  return dumps;
}

std::string describe_stack_tools(const std::vector<StackDump>& dumps, const StackTools& tools) {
  std::set<std::string> used;
  bool python_native = false;
  for (const auto& d : dumps) {
    used.insert(d.tool.empty() ? "no tool" : d.tool);
    if (d.target.python && d.tool != "py-spy") python_native = true;
  }
  std::string out;
  for (const auto& u : used) out += (out.empty() ? "" : ", ") + u;
  if (python_native && !tools.py_spy) out += "; native stacks of Python workers: py-spy is not installed (pip install py-spy)";
  return out;
}

std::string first_lines(const std::string& text, size_t max_lines, const std::string& file) {
  std::istringstream in(text);
  std::string out, line;
  size_t n = 0, more = 0;
  while (std::getline(in, line)) {
    if (n < max_lines) {
      out += line + "\n";
      ++n;
    } else {
      ++more;
    }
  }
  if (more) out += fmt::format("... ({} more lines in {})\n", more, file);
  return out;
}

}  // namespace ddprun::launcher
