// The progress files (layout in ddprun/launcher/hang.h): created by the agent for each rank of
// every attempt; with --hang_timeout opened once per attempt and their counters read (pread)
// about once a second; the step statistics read once, when the worker is reaped. The worker
// maps its file and may do anything to it (truncate it, replace it: worker_files.h): the agent
// never maps it, so nothing the worker does to the file can fault the agent.
// The Python module `ddprun` (launcher/python/ddprun/_progress.py) is written next to the run's
// logs for workers that cannot import an installed one.
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <filesystem>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "ddprun/launcher/env_map.h"
#include "ddprun/launcher/hang.h"

namespace ddprun::launcher {

// Creates the progress file at `path` anew (whatever was there is removed first):
// kProgressFileBytes, the magic, counter 0. Throws std::system_error naming the path.
void create_progress_file(const std::string& path);

// One progress file, opened once (open_worker_file: no link followed, regular files only).
// ticks(): the counter now; nullopt when the file could not be opened (missing, a link, not a
// regular file). Once the file is cut short (truncated by the worker), the last counter read
// (0 before any): a rank that broke its own file counts as making no progress, and the watch
// still sees it stall.
class ProgressReader {
 public:
  explicit ProgressReader(const std::string& path);
  ~ProgressReader();
  ProgressReader(const ProgressReader&) = delete;
  ProgressReader& operator=(const ProgressReader&) = delete;
  std::optional<uint64_t> ticks();

 private:
  int fd_ = -1;
  std::optional<uint64_t> last_;
};

// The step statistics in the progress file at `path` (one bounded read, read_worker_file);
// nullopt when it cannot be read or holds none (parse_step_stats).
std::optional<StepStats> read_step_stats(const std::string& path);

// A worker's progress environment: DDPRUN_PROGRESS_FILE (the file beside `error_file`, created
// here; none for an empty `error_file`: a warm spare's start, which gets its rank's at launch)
// and, when `module_dir` is not empty (--hang_timeout), PYTHONPATH with it appended (after the
// user's entries, which win).
void add_progress_env(EnvMap& env, const std::string& error_file, const std::string& module_dir);

// Writes the pure-Python module `ddprun` (progress() only) as `<dir>/ddprun/__init__.py` and
// returns `dir`. Throws std::system_error.
std::string write_progress_module(const std::filesystem::path& dir);

// What the watch needs of one worker of the running attempt.
struct WatchedRank {
  int local_rank = 0;
  int global_rank = 0;
  pid_t pid = -1;
  std::string progress_file;
};

// The agent's side of the watch: the pure HangWatch over the progress files, and the wall times
// the messages need.
class HangMonitor {
 public:
  explicit HangMonitor(double timeout_s) : watch_(timeout_s) {}
  void attempt_started(int attempt, const std::vector<WatchedRank>& ranks);
  // Reads every live rank's counter (`alive[local_rank]`) now.
  HangVerdict poll(const std::vector<bool>& alive);
  int attempt() const { return attempt_; }
  const std::vector<WatchedRank>& ranks() const { return ranks_; }
  // Identities for format_hang_message, "since" from each rank's last move.
  std::vector<RankIdentity> identities(const HangVerdict& v) const;
  double timeout_s() const { return watch_.timeout_s(); }

 private:
  HangWatch watch_;
  int attempt_ = 0;
  std::vector<WatchedRank> ranks_;
  std::vector<std::unique_ptr<ProgressReader>> readers_;
};

}  // namespace ddprun::launcher
