#include "hang/stack_dump.h"

#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <ctime>
#include <set>
#include <stdexcept>
#include <sstream>
#include <system_error>
#include <thread>

#include <fmt/format.h>

#include "ddprun/launcher/process.h"
#include "platform/private_files.h"

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

constexpr size_t kMaxStackText = 4 << 20;  // what is read back of one rank's file

// The file's text after its header line (`header` bytes), at most kMaxStackText.
std::string read_after_header(int fd, size_t header) {
  std::string out;
  char buf[16384];
  auto off = static_cast<off_t>(header);
  while (out.size() < kMaxStackText) {
    const ssize_t n = ::pread(fd, buf, sizeof buf, off);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    out.append(buf, static_cast<size_t>(n));
    off += n;
  }
  if (out.size() > kMaxStackText) out.resize(kMaxStackText);
  return out;
}

void write_text(int fd, const std::string& text) {
  if (fd >= 0) (void)!::write(fd, text.data(), text.size());
}

// PATH without its relative entries ("" and "." are the working directory, which may be a
// directory another user can write).
std::string absolute_entries(const std::string& path_var) {
  std::string out;
  size_t start = 0;
  while (start <= path_var.size()) {
    size_t end = path_var.find(':', start);
    if (end == std::string::npos) end = path_var.size();
    const std::string dir = path_var.substr(start, end - start);
    if (!dir.empty() && dir[0] == '/') out += (out.empty() ? "" : ":") + dir;
    start = end + 1;
  }
  return out.empty() ? "/usr/local/bin:/usr/bin:/bin" : out;
}

}  // namespace

StackTools find_stack_tools(const std::string& python_exec, const std::string& path_in) {
  const std::string path_var = absolute_entries(path_in);
  StackTools t;
  if (!python_exec.empty() && python_exec.find('/') != std::string::npos) {
    std::string why;
    t.py_spy = trusted_program(fs::path(python_exec).parent_path().string(), "py-spy", &why);
    if (!why.empty()) t.refused = "the py-spy beside " + python_exec + " is not run: " + why;
  }
  if (!t.py_spy) t.py_spy = find_executable("py-spy", path_var);
  t.eu_stack = find_executable("eu-stack", path_var);
  t.gdb = find_executable("gdb", path_var);
  return t;
}

StackDir make_stack_dir(const fs::path& run_dir, const std::string& name) {
  std::string why;
  UniqueFd run(open_own_dir_at(AT_FDCWD, run_dir.string(), run_dir.string(), &why));
  if (!run) throw std::runtime_error(why);
  const fs::path stacks = run_dir / "stacks";
  UniqueFd st(make_own_dir_at(run.get(), "stacks", stacks.string(), &why));
  if (!st) throw std::runtime_error(why);
  std::string made;
  UniqueFd out = make_fresh_dir_at(st.get(), name, &made);
  StackDir d;
  d.path = (stacks / made).string();
  d.fd = ::dup(out.get());
  if (d.fd < 0) throw std::system_error(errno, std::generic_category(), "dup");
  return d;
}

void close_stack_dir(StackDir& dir) {
  if (dir.fd >= 0) ::close(dir.fd);
  dir.fd = -1;
}

std::vector<StackDump> dump_stacks(const std::vector<StackTarget>& targets, const StackTools& tools,
                                   const StackDir& out, double timeout_s) {
  std::vector<StackDump> dumps;
  std::vector<pid_t> pids;
  std::vector<UniqueFd> files;
  std::vector<size_t> headers;
  char when[40];
  const std::time_t now = std::time(nullptr);
  std::tm tm{};
  ::gmtime_r(&now, &tm);
  std::strftime(when, sizeof when, "%Y-%m-%d %H:%M:%S UTC", &tm);
  for (const auto& t : targets) {
    StackDump d;
    d.target = t;
    const std::string name = fmt::format("r{}.txt", t.global_rank);
    d.file = out.path + "/" + name;
    const auto argv = command_for(tools, t, d.tool);
    pid_t pid = -1;
    // A new file: nothing there is followed or overwritten.
    UniqueFd fd(::openat(out.fd, name.c_str(), O_RDWR | O_CREAT | O_EXCL | O_NOFOLLOW | O_APPEND | O_CLOEXEC, 0600));
    if (!fd) d.text = "could not create " + d.file + ": " + std::strerror(errno) + "\n";
    const std::string header = fmt::format("# r{} (local rank {}, pid {}) at {}: {}\n", t.global_rank, t.local_rank,
                                           t.pid, when, argv.empty() ? "no stack tool found" : d.tool);
    write_text(fd.get(), header);
    if (fd && argv.empty()) {
      write_text(fd.get(), "install py-spy (pip) for Python stacks, or elfutils (eu-stack) or gdb for native ones\n");
    } else if (fd) {
      pid = spawn_tool(argv, fd.get());
      if (pid < 0) write_text(fd.get(), "could not start " + argv[0] + ": " + std::strerror(errno) + "\n");
    }
    dumps.push_back(std::move(d));
    pids.push_back(pid);
    files.push_back(std::move(fd));
    headers.push_back(header.size());
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
        write_text(files[i].get(),
                   fmt::format("\n(stopped: {} gave no complete answer within {:g} s)\n", dumps[i].tool, timeout_s));
      }
      break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  for (size_t i = 0; i < dumps.size(); ++i) {
    if (files[i]) dumps[i].text = read_after_header(files[i].get(), headers[i]);
  }
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
  if (python_native && !tools.py_spy)
    out += "; native stacks of Python workers: py-spy is not installed (pip install py-spy)";
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
