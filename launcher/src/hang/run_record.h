// How `ddprun dump` finds a running job and its workers. Each agent keeps, for as long as it
// runs:
//   - `<run dir>/workers`: its pid, the run id, the attempt, the workers' Python interpreter
//     (empty for programs) and one line per worker of the running attempt:
//         agent_pid 4242
//         run_id job7
//         attempt 1
//         python /venv/bin/python3
//         rank <local rank> <global rank> <pid>
//     rewritten (write + rename) when an attempt starts;
//   - a link `<runs dir>/<agent pid>` -> `<run dir>`, where the runs dir is $DDPRUN_RUNS_DIR,
//     else /tmp/ddprun-<uid>/runs (created 0700; a directory another user owns is not used).
#pragma once

#include <sys/types.h>

#include <filesystem>
#include <optional>
#include <string>
#include <vector>

#include "ddprun/launcher/hang.h"
#include "hang/stack_dump.h"

namespace ddprun::launcher {

struct RunWorkers {
  pid_t agent_pid = -1;
  std::string run_id;
  int attempt = 0;
  std::string python;
  std::vector<StackTarget> ranks;
};

// The runs directory for this user (not created).
std::filesystem::path runs_dir();

// The agent's side. Failures are warnings (a job runs without `ddprun dump` rather than not at
// all): every method is noexcept.
class RunRecord {
 public:
  RunRecord(std::filesystem::path run_dir, std::string run_id, std::string python) noexcept;
  ~RunRecord();  // removes the link
  RunRecord(const RunRecord&) = delete;
  RunRecord& operator=(const RunRecord&) = delete;
  void attempt_started(int attempt, const std::vector<StackTarget>& ranks) noexcept;

 private:
  std::filesystem::path run_dir_, link_;
  std::string run_id_, python_;
};

// Reads `<run_dir>/workers`; nullopt when absent or unreadable.
std::optional<RunWorkers> read_run_workers(const std::filesystem::path& run_dir);

// `ddprun dump [RUN]` (declared in hang.h): RUN is a run's log directory, its name
// (`<run_id>_<unique>`) or its run id; none: the newest running job of this user on this host.

}  // namespace ddprun::launcher
