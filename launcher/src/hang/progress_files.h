// The progress files (layout in ddprun/launcher/hang.h): created by the agent for each rank of
// every attempt; with --hang_timeout mapped read-only and their counters read about once a
// second; the step statistics read once, when the worker is reaped.
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

// Creates (or empties) the progress file at `path`: kProgressFileBytes, the magic, counter 0.
// Throws std::system_error naming the path.
void create_progress_file(const std::string& path);

// A read-only mapping of one progress file. ticks(): nullopt when it could not be mapped.
class ProgressMap {
 public:
  explicit ProgressMap(const std::string& path);
  ~ProgressMap();
  ProgressMap(const ProgressMap&) = delete;
  ProgressMap& operator=(const ProgressMap&) = delete;
  std::optional<uint64_t> ticks() const;

 private:
  void* page_ = nullptr;
};

// The step statistics in the progress file at `path` (one read); nullopt when it cannot be
// read or holds none (parse_step_stats).
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

// The agent's side of the watch: the pure HangWatch over the mapped files, and the wall times
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
  std::vector<std::unique_ptr<ProgressMap>> maps_;
};

}  // namespace ddprun::launcher
