// Where a run's log files go: torchrun's DefaultLogsSpecs layout,
//   <log_dir>/<run_id>_<unique>/attempt_<n>/<local_rank>/{stdout.log,stderr.log,error.json}
//   <log_dir>/<run_id>_<unique>/attempt_<n>/filtered_{stdout,stderr}.log
// The unique suffix (mkdtemp's, like torchrun's tempfile.mkdtemp) means a second run with the
// same --log_dir and run id never overwrites the first run's logs.
#pragma once

#include <filesystem>
#include <string>

namespace ddprun::launcher {

// The mkdtemp template of a run's directory: "<log_dir>/<run_id>_XXXXXX". A '/' in the run id
// becomes '_' (it names one directory).
std::string run_log_dir_template(const std::string& log_dir, const std::string& run_id);

// Creates `log_dir` (and its parents) when missing, then a fresh run directory in it; returns
// its path. Throws std::system_error naming the path (e.g. log_dir is a file).
std::filesystem::path make_run_log_dir(const std::string& log_dir, const std::string& run_id);

// "<run_dir>/attempt_<attempt>".
std::filesystem::path attempt_log_dir(const std::filesystem::path& run_dir, int attempt);

// The directory for a new start of `attempt`'s workers that no earlier start used:
// attempt_<attempt>, or, for a later round of the same attempt (an elastic scale-up restarts
// the workers without spending a restart), attempt_<attempt>.<k> with the first free k >= 1.
// Nothing an earlier round wrote is ever truncated.
std::filesystem::path fresh_attempt_log_dir(const std::filesystem::path& run_dir, int attempt);

}  // namespace ddprun::launcher
