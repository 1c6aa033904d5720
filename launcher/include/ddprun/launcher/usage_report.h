// How efficiently the workers ran: the table at the end of a run (wall time, CPU time, peak
// memory and, where GPUs were sampled, GPU-seconds and mean utilisation per rank) and the
// low-utilisation warning. Pure: agent.cpp gathers the numbers (wait4's rusage at each reap,
// the GPU sampler) and prints what this returns.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace ddprun::launcher {

// One worker over its life.
struct RankUsage {
  int global_rank = 0;
  int local_rank = 0;
  int attempt = 0;
  double wall_s = 0;             // from its start to its exit
  double cpu_s = 0;              // user + system time of its process and the children it reaped
  uint64_t peak_rss_bytes = 0;   // its largest resident set
  std::optional<int> gpu_index;  // the GPU it used, where sampled
  std::optional<double> gpu_seconds;    // integral of its GPU's utilisation over time
  std::optional<double> gpu_util_mean;  // 0..1, over the time sampled
};

struct UsageReport {
  std::vector<RankUsage> ranks;  // the last attempt's workers of this node
  std::string host;
  // Workers of earlier attempts (ended by failures and restarts): how many, their CPU time.
  int earlier_workers = 0;
  double earlier_cpu_s = 0;
  double gpu_util_warn = 0.85;  // --gpu_util_warn: warn below this mean (0: never)
};

// The table, one line per rank, as text lines (no trailing newline on the last); "" when no
// worker ran.
std::string format_usage_table(const UsageReport& r);
// "mean GPU utilisation below 85% (--gpu_util_warn=0.85): r1 41%, r3 60%; ..." or "" when every
// sampled rank is at or above the threshold (or none was sampled).
std::string low_gpu_utilisation_warning(const UsageReport& r);

// "1.5 KiB", "412 MiB", "2.3 GiB".
std::string human_bytes(uint64_t bytes);

}  // namespace ddprun::launcher
