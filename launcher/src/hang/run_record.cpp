#include "hang/run_record.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <fstream>
#include <sstream>
#include <system_error>

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include "ddprun/common/knobs.h"
#include "ddprun/launcher/hang.h"
#include "ddprun/launcher/worker_files.h"

namespace ddprun::launcher {
namespace fs = std::filesystem;

fs::path runs_dir() {
  if (auto d = knobs::get(knobs::kRunsDir)) return *d;
  return fs::path("/tmp") / ("ddprun-" + std::to_string(::getuid())) / "runs";
}

namespace {

// Creates the runs directory when missing (the default one and its parent 0700: the links name
// this user's jobs); false when it is not a directory of ours. Existing directories keep their
// mode: DDPRUN_RUNS_DIR may name any directory of this user.
bool ensure_runs_dir(const fs::path& dir, std::string& why) {
  std::error_code ec;
  if (!knobs::get(knobs::kRunsDir)) {
    ::mkdir(dir.parent_path().c_str(), 0700);
    ::mkdir(dir.c_str(), 0700);
  } else {
    fs::create_directories(dir, ec);
  }
  struct stat st {};
  if (!knobs::get(knobs::kRunsDir) &&
      (::lstat(dir.parent_path().c_str(), &st) != 0 || !S_ISDIR(st.st_mode) || st.st_uid != ::getuid())) {
    why = dir.parent_path().string() + " is not a directory of this user (set DDPRUN_RUNS_DIR)";
    return false;
  }
  if (::lstat(dir.c_str(), &st) != 0 || !S_ISDIR(st.st_mode)) {
    why = dir.string() + " is not a directory";
    return false;
  }
  if (st.st_uid != ::getuid()) {
    why = dir.string() + " belongs to another user (set DDPRUN_RUNS_DIR)";
    return false;
  }
  return true;
}

bool alive(pid_t pid) { return pid > 0 && (::kill(pid, 0) == 0 || errno == EPERM); }

}  // namespace

RunRecord::RunRecord(fs::path run_dir, std::string run_id, std::string python) noexcept
    : run_dir_(std::move(run_dir)), run_id_(std::move(run_id)), python_(std::move(python)) {
  try {
    const fs::path dir = runs_dir();
    std::string why;
    if (!ensure_runs_dir(dir, why)) {
      spdlog::warn("`ddprun dump` without an argument will not find this run: {}", why);
      return;
    }
    const fs::path link = dir / std::to_string(::getpid());
    std::error_code ec;
    fs::remove(link, ec);  // a pid reused after an agent that was killed
    fs::create_symlink(fs::absolute(run_dir_), link, ec);
    if (ec) spdlog::warn("`ddprun dump` without an argument will not find this run: {}: {}", link.string(), ec.message());
    else link_ = link;
  } catch (const std::exception& e) {
    spdlog::warn("`ddprun dump` without an argument will not find this run: {}", e.what());
  }
}

RunRecord::~RunRecord() {
  std::error_code ec;
  if (!link_.empty()) fs::remove(link_, ec);
  fs::remove(run_dir_ / "workers", ec);
}

void RunRecord::attempt_started(int attempt, const std::vector<StackTarget>& ranks) noexcept {
  try {
    const fs::path tmp = run_dir_ / "workers.tmp";
    std::ostringstream out;
    out << "agent_pid " << ::getpid() << "\nrun_id " << run_id_ << "\nattempt " << attempt << "\npython " << python_
        << "\n";
    for (const auto& r : ranks) out << "rank " << r.local_rank << " " << r.global_rank << " " << r.pid << "\n";
    // In the run's log directory, which the workers can write: made anew, never opened as found.
    const int fd = create_worker_file(tmp.string(), O_WRONLY, 0600);
    if (fd < 0) throw std::system_error(errno, std::generic_category(), tmp.string());
    const std::string text = out.str();
    const bool ok = ::write(fd, text.data(), text.size()) == static_cast<ssize_t>(text.size());
    ::close(fd);
    if (!ok) throw std::system_error(EIO, std::generic_category(), tmp.string());
    fs::rename(tmp, run_dir_ / "workers");
  } catch (const std::exception& e) {
    spdlog::debug("cannot write {}: {}", (run_dir_ / "workers").string(), e.what());
  }
}

std::optional<RunWorkers> read_run_workers(const fs::path& run_dir) {
  std::ifstream in(run_dir / "workers");
  if (!in) return std::nullopt;
  RunWorkers w;
  std::string line;
  while (std::getline(in, line)) {
    std::istringstream ls(line);
    std::string key;
    ls >> key;
    if (key == "agent_pid") ls >> w.agent_pid;
    else if (key == "run_id") ls >> w.run_id;
    else if (key == "attempt") ls >> w.attempt;
    else if (key == "python") std::getline(ls >> std::ws, w.python);
    else if (key == "rank") {
      StackTarget t;
      ls >> t.local_rank >> t.global_rank >> t.pid;
      if (ls) w.ranks.push_back(t);
    }
  }
  if (w.agent_pid <= 0) return std::nullopt;
  for (auto& t : w.ranks) t.python = !w.python.empty();
  return w;
}

namespace {

struct Found {
  fs::path run_dir;
  RunWorkers workers;
};

// The running jobs of the runs directory, newest first.
std::vector<Found> running_jobs() {
  std::vector<std::pair<fs::file_time_type, Found>> all;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(runs_dir(), ec)) {
    std::error_code ec2;
    if (!e.is_symlink(ec2)) continue;
    const fs::path target = fs::read_symlink(e.path(), ec2);
    if (ec2) continue;
    auto w = read_run_workers(target);
    if (!w || !alive(w->agent_pid) || std::to_string(w->agent_pid) != e.path().filename().string()) continue;
    const auto t = fs::last_write_time(target, ec2);
    all.push_back({t, Found{target, *w}});
  }
  std::sort(all.begin(), all.end(), [](const auto& a, const auto& b) { return a.first > b.first; });
  std::vector<Found> out;
  for (auto& [t, f] : all) out.push_back(std::move(f));
  return out;
}

std::string stamp() {
  const std::time_t tt = std::time(nullptr);
  std::tm tm{};
  ::gmtime_r(&tt, &tm);
  char buf[32];
  std::strftime(buf, sizeof buf, "%Y%m%d-%H%M%S", &tm);
  return buf;
}

constexpr const char* kDumpUsage =
    "usage: ddprun dump [RUN]\n"
    "  prints the stack of every worker of a running ddprun job on this host and saves them in\n"
    "  <run dir>/stacks/dump_<time>/ (py-spy for Python workers when installed, else eu-stack or gdb);\n"
    "  nothing is stopped. RUN: the run's log directory (<log_dir>/<run_id>_<unique>), its name, or\n"
    "  its run id; none: the newest running job of this user on this host.\n";

}  // namespace

int run_dump(const std::vector<std::string>& args) {
  std::optional<std::string> run;
  for (const auto& a : args) {
    if (a == "-h" || a == "--help") {
      std::fputs(kDumpUsage, stdout);
      return 0;
    }
    if (!a.empty() && a[0] == '-') {
      std::fprintf(stderr, "ddprun dump: error: unknown option %s\n%s", a.c_str(), kDumpUsage);
      return 2;
    }
    if (run) {
      std::fprintf(stderr, "ddprun dump: error: one RUN at most (got %s and %s)\n%s", run->c_str(), a.c_str(), kDumpUsage);
      return 2;
    }
    run = a;
  }
  std::optional<Found> job;
  std::error_code ec;
  if (run && fs::is_directory(*run, ec)) {
    auto w = read_run_workers(*run);
    if (!w || !alive(w->agent_pid)) {
      std::fprintf(stderr,
                   "ddprun dump: error: %s is not the log directory of a running job (no live agent in its "
                   "'workers' file); the running jobs are listed in %s\n",
                   run->c_str(), runs_dir().c_str());
      return 1;
    }
    job = Found{*run, *w};
  } else {
    const auto jobs = running_jobs();
    for (const auto& j : jobs) {
      const std::string name = j.run_dir.filename().string();
      if (!run || name == *run || j.workers.run_id == *run || name.rfind(*run + "_", 0) == 0) {
        job = j;
        break;
      }
    }
    if (!job) {
      if (run)
        std::fprintf(stderr,
                     "ddprun dump: error: no running job of this user on this host is named %s; give its log "
                     "directory (<log_dir>/<run_id>_<unique>) or its run id (%zu running job(s) in %s)\n",
                     run->c_str(), jobs.size(), runs_dir().c_str());
      else
        std::fprintf(stderr,
                     "ddprun dump: error: no running ddprun job of this user on this host (none in %s); start one, "
                     "or give a run's log directory: ddprun dump <log_dir>/<run_id>_<unique>\n",
                     runs_dir().c_str());
      return 1;
    }
  }
  if (job->workers.ranks.empty()) {
    std::fprintf(stderr, "ddprun dump: error: run %s (agent pid %d) has no running workers now\n",
                 job->run_dir.c_str(), job->workers.agent_pid);
    return 1;
  }
  const char* path = std::getenv("PATH");
  const StackTools tools = find_stack_tools(job->workers.python, path ? path : "/usr/bin:/bin");
  const fs::path out = job->run_dir / "stacks" / ("dump_" + stamp());
  std::vector<StackDump> dumps;
  try {
    dumps = dump_stacks(job->workers.ranks, tools, out, kStackDumpTimeoutS);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "ddprun dump: error: %s\n", e.what());
    return 1;
  }
  for (const auto& d : dumps) {
    std::printf("==== r%d (local rank %d, pid %d): %s%s\n%s\n", d.target.global_rank, d.target.local_rank, d.target.pid,
                d.tool.empty() ? "no stack tool" : d.tool.c_str(), d.timed_out ? " (timed out)" : "", d.text.c_str());
  }
  std::printf("[ddprun] stacks of run %s (attempt %d, %zu workers) saved in %s, by %s\n", job->workers.run_id.c_str(),
              job->workers.attempt, dumps.size(), out.c_str(), describe_stack_tools(dumps, tools).c_str());
  return 0;
}

}  // namespace ddprun::launcher
