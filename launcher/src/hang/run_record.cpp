#include "hang/run_record.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <sstream>
#include <system_error>

#include <spdlog/spdlog.h>

#include "ddprun/common/knobs.h"
#include "ddprun/launcher/worker_files.h"
#include "platform/private_files.h"

namespace ddprun::launcher {
namespace fs = std::filesystem;

std::string runs_dir(const EnvMap& env) {
  if (auto d = knobs::get(knobs::kRunsDir, env)) return *d;
  return runtime_dir(env) + "/runs";
}

DirState check_runs_dir(const EnvMap& env, std::string* real, std::string* why) {
  if (auto d = knobs::get(knobs::kRunsDir, env)) return check_private_dir(*d, real, why);
  std::string top;
  const DirState s = check_private_dir(runtime_dir(env), &top, why);
  return s == DirState::ok ? check_private_dir(top + "/runs", real, why) : s;
}

namespace {

// Makes the runs directory (and the runtime directory above it) when missing, 0700, and checks
// them (private_files.h); *real is its path with the links above it resolved.
bool ensure_runs_dir(const EnvMap& env, std::string* real, std::string* why) {
  if (auto d = knobs::get(knobs::kRunsDir, env)) return ensure_private_dir(*d, /*make_parents=*/true, real, why);
  std::string top;
  return ensure_private_dir(runtime_dir(env), false, &top, why) && ensure_private_dir(top + "/runs", false, real, why);
}

void write_all(int fd, const std::string& text) {
  size_t off = 0;
  while (off < text.size()) {
    const ssize_t n = ::write(fd, text.data() + off, text.size() - off);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) throw std::system_error(errno, std::generic_category(), "write");
    off += static_cast<size_t>(n);
  }
}

}  // namespace

RunRecord::RunRecord(fs::path run_dir, std::string run_id, std::string python, const EnvMap& env) noexcept
    : run_dir_(std::move(run_dir)), run_id_(std::move(run_id)), python_(std::move(python)) {
  try {
    std::string dir, why;
    if (!ensure_runs_dir(env, &dir, &why)) {
      spdlog::warn("`ddprun dump` without an argument will not find this run: {}", why);
      return;
    }
    const fs::path link = fs::path(dir) / std::to_string(::getpid());
    std::error_code ec;
    fs::remove(link, ec);  // a pid reused after an agent that was killed
    fs::create_symlink(fs::absolute(run_dir_), link, ec);
    if (ec)
      spdlog::warn("`ddprun dump` without an argument will not find this run: {}: {}", link.string(), ec.message());
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
  const fs::path tmp = run_dir_ / "workers.tmp";
  try {
    std::ostringstream out;
    out << "agent_pid " << ::getpid() << "\nrun_id " << run_id_ << "\nattempt " << attempt << "\npython " << python_
        << "\n";
    for (const auto& r : ranks) out << "rank " << r.local_rank << " " << r.global_rank << " " << r.pid << "\n";
    // In the run's log directory, which the workers can write: made anew, never opened as found.
    const int fd = create_worker_file(tmp.string(), O_WRONLY, 0600);
    if (fd < 0) throw std::system_error(errno, std::generic_category(), "open " + tmp.string());
    try {
      write_all(fd, out.str());
    } catch (...) {
      ::close(fd);
      throw;
    }
    ::close(fd);
    fs::rename(tmp, run_dir_ / "workers");
  } catch (const std::exception& e) {
    spdlog::debug("cannot write {}: {}", (run_dir_ / "workers").string(), e.what());
  }
}

std::optional<RunWorkers> parse_run_workers(const std::string& text) {
  std::istringstream in(text);
  RunWorkers w;
  std::string line;
  while (std::getline(in, line)) {
    std::istringstream ls(line);
    std::string key;
    ls >> key;
    if (key == "agent_pid") ls >> w.agent_pid;
    else if (key == "run_id") ls >> w.run_id;
    else if (key == "attempt") ls >> w.attempt;
    else if (key == "python") {
      std::string path;
      std::getline(ls >> std::ws, path);
      w.python = !path.empty();
    } else if (key == "rank") {
      StackTarget t;
      ls >> t.local_rank >> t.global_rank >> t.pid;
      if (ls && t.pid > 0) w.ranks.push_back(t);
    }
  }
  if (w.agent_pid <= 0) return std::nullopt;
  for (auto& t : w.ranks) t.python = w.python;
  return w;
}

}  // namespace ddprun::launcher
