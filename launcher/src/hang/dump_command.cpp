// `ddprun dump [RUN]`: finds a running job of this user through the runs directory (or the run
// directory given) and dumps its workers' stacks. Nothing found there is taken on trust: the
// runs directory must be this user's private directory (private_files.h), a link's target and
// its `workers` file this user's (opened without following links), the agent a live ddprun
// process of this user and each worker its live child; the stack tools come from PATH or from
// beside the interpreter the live worker runs, never from a path written in a file.
#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <ctime>
#include <filesystem>
#include <optional>
#include <string>
#include <tuple>
#include <vector>

#include "ddprun/launcher/hang.h"
#include "ddprun/launcher/subcommand_args.h"
#include "hang/run_record.h"
#include "hang/stack_dump.h"
#include "platform/private_files.h"

namespace ddprun::launcher {
namespace fs = std::filesystem;

namespace {

struct Found {
  std::string run_dir;
  RunWorkers workers;
  timespec mtime{};
};

bool alive(pid_t pid) { return pid > 0 && (::kill(pid, 0) == 0 || errno == EPERM); }

std::optional<std::string> read_small(const std::string& path, size_t max) {
  UniqueFd fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC));
  if (!fd) return std::nullopt;
  std::string out(max, '\0');
  const ssize_t n = ::read(fd.get(), out.data(), max);
  if (n < 0) return std::nullopt;
  out.resize(static_cast<size_t>(n));
  return out;
}

// The owner of the live process `pid` (the owner of /proc/<pid>), nullopt when it is gone.
std::optional<uid_t> process_owner(pid_t pid) {
  const PathFacts f = lstat_facts("/proc/" + std::to_string(pid));
  if (!f.exists) return std::nullopt;
  return f.uid;
}

std::optional<pid_t> parent_of(pid_t pid) {
  const auto stat = read_small("/proc/" + std::to_string(pid) + "/stat", 4096);
  if (!stat) return std::nullopt;
  const size_t paren = stat->rfind(')');  // the command name may hold anything but ends there
  if (paren == std::string::npos) return std::nullopt;
  char state = 0;
  int ppid = 0;
  if (std::sscanf(stat->c_str() + paren + 1, " %c %d", &state, &ppid) != 2) return std::nullopt;
  return ppid;
}

// "" when `pid` is a live ddprun agent of this user, else why not.
std::string agent_problem(pid_t pid) {
  const auto owner = process_owner(pid);
  if (!owner) return "its agent (pid " + std::to_string(pid) + ") is not running";
  if (*owner != ::geteuid())
    return "pid " + std::to_string(pid) + " belongs to uid " + std::to_string(*owner) + ", not to this user";
  char exe[4096];
  const ssize_t n = ::readlink(("/proc/" + std::to_string(pid) + "/exe").c_str(), exe, sizeof exe - 1);
  std::string name = n > 0 ? fs::path(std::string(exe, static_cast<size_t>(n))).filename().string() : "";
  if (name.size() > 10 && name.compare(name.size() - 10, 10, " (deleted)") == 0) name.resize(name.size() - 10);
  if (name != "ddprun") return "pid " + std::to_string(pid) + " is not a ddprun agent (it runs " + name + ")";
  return "";
}

// The workers that are live children of the agent and this user's; the others are named in
// *skipped.
std::vector<StackTarget> live_workers(const RunWorkers& w, std::vector<std::string>* skipped) {
  std::vector<StackTarget> out;
  for (const auto& t : w.ranks) {
    const auto owner = process_owner(t.pid);
    const auto parent = parent_of(t.pid);
    if (owner && *owner == ::geteuid() && parent && *parent == w.agent_pid) {
      out.push_back(t);
      continue;
    }
    skipped->push_back("r" + std::to_string(t.global_rank) + " (pid " + std::to_string(t.pid) +
                       ") is not a live worker of agent " + std::to_string(w.agent_pid) + " of this user: skipped");
  }
  return out;
}

// The interpreter the live worker `pid` runs, as its command line names it (a venv's
// bin/python, whose directory may hold py-spy): only when that path is the very file the
// process executes.
std::string live_interpreter(pid_t pid) {
  const std::string proc = "/proc/" + std::to_string(pid);
  const auto cmdline = read_small(proc + "/cmdline", 4096);
  if (!cmdline || cmdline->empty()) return "";
  const std::string argv0 = cmdline->substr(0, cmdline->find('\0'));
  struct stat named {
  }, running{};
  if (argv0.empty() || argv0[0] != '/' || ::stat(argv0.c_str(), &named) != 0 ||
      ::stat((proc + "/exe").c_str(), &running) != 0)
    return "";
  return named.st_dev == running.st_dev && named.st_ino == running.st_ino ? argv0 : "";
}

// The job of the run directory `dir`: nullopt and *why; *quiet when it simply is not running
// (no `workers` file yet or any more, its agent gone).
std::optional<Found> load_job(const std::string& dir, std::string* why, bool* quiet) {
  *quiet = false;
  UniqueFd fd = open_own_dir_at(AT_FDCWD, dir, dir, why);
  if (!fd) return std::nullopt;
  bool missing = false;
  const std::string file = (fs::path(dir) / "workers").string();
  auto text = read_own_file_at(fd.get(), "workers", file, kRunWorkersMaxBytes, why, &missing);
  if (!text) {
    if (missing) *why = dir + " has no 'workers' file (no running job there)";
    *quiet = missing;
    return std::nullopt;
  }
  auto w = parse_run_workers(*text);
  if (!w) {
    *why = file + " names no agent";
    return std::nullopt;
  }
  *why = agent_problem(w->agent_pid);
  *quiet = !alive(w->agent_pid);
  if (!why->empty()) return std::nullopt;
  struct stat st {};
  if (::fstat(fd.get(), &st) != 0) st.st_mtim = timespec{};  // only orders the jobs
  return Found{dir, *w, st.st_mtim};
}

// The running jobs of the runs directory, newest first; entries that are not this user's are
// named in *skipped. *refused when the runs directory itself is not used.
std::vector<Found> running_jobs(const EnvMap& env, std::string* refused, std::vector<std::string>* skipped) {
  std::vector<Found> all;
  std::string real;
  const DirState state = check_runs_dir(env, &real, refused);
  if (state != DirState::ok) {
    if (state == DirState::missing) refused->clear();
    return all;
  }
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(real, ec)) {
    std::error_code ec2;
    const std::string name = e.path().filename().string();
    if (!e.is_symlink(ec2) || name.find_first_not_of("0123456789") != std::string::npos) continue;
    const fs::path target = fs::read_symlink(e.path(), ec2);
    if (ec2 || !target.is_absolute()) continue;
    std::string why;
    bool quiet = false;
    auto job = load_job(target.string(), &why, &quiet);
    if (job && std::to_string(job->workers.agent_pid) == name) all.push_back(std::move(*job));
    else if (!job && !quiet) skipped->push_back(e.path().string() + " -> " + target.string() + ": " + why);
  }
  std::sort(all.begin(), all.end(), [](const Found& a, const Found& b) {
    return std::tie(a.mtime.tv_sec, a.mtime.tv_nsec) > std::tie(b.mtime.tv_sec, b.mtime.tv_nsec);
  });
  return all;
}

std::string stamp() {
  const std::time_t tt = std::time(nullptr);
  std::tm tm{};
  ::gmtime_r(&tt, &tm);
  char buf[32];
  std::strftime(buf, sizeof buf, "%Y%m%d-%H%M%S", &tm);
  return buf;
}

// The job RUN names (or the newest one); nullopt after saying why on stderr.
std::optional<Found> find_job(const std::optional<std::string>& run, const EnvMap& env) {
  std::error_code ec;
  const auto given = run ? fs::symlink_status(*run, ec) : fs::file_status();
  if (run && (fs::is_directory(given) || fs::is_symlink(given))) {
    // A link typed on the command line is followed; where it leads must be the caller's.
    const fs::path real = fs::weakly_canonical(*run, ec);
    std::string why;
    bool quiet = false;
    auto job = load_job(ec ? *run : real.string(), &why, &quiet);
    if (!job)
      std::fprintf(stderr, "ddprun dump: error: %s is not the log directory of a running job of this user: %s\n",
                   run->c_str(), why.c_str());
    return job;
  }
  std::string refused;
  std::vector<std::string> skipped;
  const auto jobs = running_jobs(env, &refused, &skipped);
  const std::string runs = runs_dir(env);
  for (const auto& s : skipped) std::fprintf(stderr, "ddprun dump: warning: not read: %s\n", s.c_str());
  if (!refused.empty()) {
    std::fprintf(stderr, "ddprun dump: error: %s\n", refused.c_str());
    return std::nullopt;
  }
  for (const auto& j : jobs) {
    const std::string name = fs::path(j.run_dir).filename().string();
    if (!run || name == *run || j.workers.run_id == *run || name.rfind(*run + "_", 0) == 0) return j;
  }
  if (run)
    std::fprintf(stderr,
                 "ddprun dump: error: no running job of this user on this host is named %s; give its log "
                 "directory (<log_dir>/<run_id>_<unique>) or its run id (%zu running job(s) in %s)\n",
                 run->c_str(), jobs.size(), runs.c_str());
  else
    std::fprintf(stderr,
                 "ddprun dump: error: no running ddprun job of this user on this host (none in %s); start one, "
                 "or give a run's log directory: ddprun dump <log_dir>/<run_id>_<unique>\n",
                 runs.c_str());
  return std::nullopt;
}

int dump_job(const Found& job, const EnvMap& env) {
  std::vector<std::string> skipped;
  const auto targets = live_workers(job.workers, &skipped);
  for (const auto& s : skipped) std::fprintf(stderr, "ddprun dump: warning: %s\n", s.c_str());
  if (targets.empty()) {
    std::fprintf(stderr, "ddprun dump: error: run %s (agent pid %d) has no running workers now\n", job.run_dir.c_str(),
                 job.workers.agent_pid);
    return 1;
  }
  const auto path = env.find("PATH");
  const StackTools tools = find_stack_tools(job.workers.python ? live_interpreter(targets.front().pid) : "",
                                            path != env.end() ? path->second : "/usr/bin:/bin");
  if (!tools.refused.empty()) std::fprintf(stderr, "ddprun dump: warning: %s\n", tools.refused.c_str());
  StackDir out;
  std::vector<StackDump> dumps;
  try {
    out = make_stack_dir(job.run_dir, "dump_" + stamp());
    dumps = dump_stacks(targets, tools, out, kStackDumpTimeoutS);
    close_stack_dir(out);
  } catch (const std::exception& e) {
    close_stack_dir(out);
    std::fprintf(stderr, "ddprun dump: error: %s\n", e.what());
    return 1;
  }
  for (const auto& d : dumps) {
    std::printf("==== r%d (local rank %d, pid %d): %s%s\n%s\n", d.target.global_rank, d.target.local_rank, d.target.pid,
                d.tool.empty() ? "no stack tool" : d.tool.c_str(), d.timed_out ? " (timed out)" : "", d.text.c_str());
  }
  std::printf("[ddprun] stacks of run %s (attempt %d, %zu workers) saved in %s, by %s\n", job.workers.run_id.c_str(),
              job.workers.attempt, dumps.size(), out.path.c_str(), describe_stack_tools(dumps, tools).c_str());
  return 0;
}

}  // namespace

int run_dump(const std::vector<std::string>& args, const EnvMap& env) {
  const auto parsed = parse_dump_args(args);
  if (!parsed.args) {
    if (parsed.exit_code == 0) std::fputs(parsed.message.c_str(), stdout);
    else std::fprintf(stderr, "ddprun dump: error: %s\n%s", parsed.message.c_str(), kDumpUsage);
    return parsed.exit_code;
  }
  const std::optional<std::string>& run = parsed.args->run;
  const auto job = find_job(run, env);
  return job ? dump_job(*job, env) : 1;
}

}  // namespace ddprun::launcher
