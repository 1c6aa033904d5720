// How `ddprun dump` finds a running job and its workers. Each agent keeps, for as long as it
// runs:
//   - `<run dir>/workers` (mode 0600): its pid, the run id, the attempt, whether the workers run
//     Python ("python" and the interpreter's path, empty for programs) and one line per worker of
//     the running attempt:
//         agent_pid 4242
//         run_id job7
//         attempt 1
//         python /venv/bin/python3
//         rank <local rank> <global rank> <pid>
//     rewritten (write + rename) when an attempt starts;
//   - a link `<runs dir>/<agent pid>` -> `<run dir>`, where the runs dir is $DDPRUN_RUNS_DIR,
//     else `<runtime dir>/runs` (runtime_dir.h: $XDG_RUNTIME_DIR/ddprun or /tmp/ddprun-<uid>):
//     a private directory of this user (0700), made when missing; one another user made is not
//     used.
// `ddprun dump` (dump_command.cpp) reads them only from directories of its own user and runs
// nothing named there (the interpreter's path is not used: the stack tools come from PATH or
// from beside the interpreter the live worker runs).
#pragma once

#include <sys/types.h>

#include <filesystem>
#include <optional>
#include <string>
#include <vector>

#include "ddprun/launcher/env_map.h"
#include "ddprun/launcher/hang.h"
#include "hang/stack_dump.h"
#include "platform/private_files.h"

namespace ddprun::launcher {

struct RunWorkers {
  pid_t agent_pid = -1;
  std::string run_id;
  int attempt = 0;
  bool python = false;  // the workers run Python (py-spy can read them)
  std::vector<StackTarget> ranks;
};

// The runs directory for this user and environment (not created): $DDPRUN_RUNS_DIR, else
// <runtime dir>/runs. The agents and `ddprun dump` both ask here.
std::string runs_dir(const EnvMap& env);

// For `ddprun dump`: whether the runs directory (and, by default, the runtime directory above
// it) is a private directory of this user (check_private_dir, platform/private_files.h).
DirState check_runs_dir(const EnvMap& env, std::string* real, std::string* why);

// The agent's side. Failures are warnings (a job runs without `ddprun dump` rather than not at
// all): every method is noexcept.
class RunRecord {
 public:
  RunRecord(std::filesystem::path run_dir, std::string run_id, std::string python, const EnvMap& env) noexcept;
  ~RunRecord();  // removes the link
  RunRecord(const RunRecord&) = delete;
  RunRecord& operator=(const RunRecord&) = delete;
  void attempt_started(int attempt, const std::vector<StackTarget>& ranks) noexcept;

 private:
  std::filesystem::path run_dir_, link_;
  std::string run_id_, python_;
};

// The largest `workers` file read.
inline constexpr size_t kRunWorkersMaxBytes = 1 << 20;

// A `workers` file's text; nullopt without a valid agent pid.
std::optional<RunWorkers> parse_run_workers(const std::string& text);

}  // namespace ddprun::launcher
