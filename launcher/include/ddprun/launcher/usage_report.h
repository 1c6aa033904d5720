// How efficiently the workers ran: the table at the end of a run (wall time, CPU time, peak
// memory, where GPUs were sampled GPU-seconds and mean utilisation, and for workers that train
// with libddprun_worker the all-reduce's share of the step and how much of it backward hid, per
// rank) and the low-utilisation warning. Pure: agent.cpp gathers the numbers (wait4's rusage at
// each reap, the GPU sampler, the step statistics in each rank's progress file) and prints what
// this returns.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "ddprun/launcher/hang.h"

namespace ddprun::launcher {

// One worker over its life.
struct RankUsage {
  int global_rank = 0;
  int local_rank = 0;
  int attempt = 0;
  double wall_s = 0;                    // from its start to its exit
  double cpu_s = 0;                     // user + system time of its process and the children it reaped
  uint64_t peak_rss_bytes = 0;          // its largest resident set
  std::optional<int> gpu_index;         // the GPU it used, where sampled
  std::optional<double> gpu_seconds;    // integral of its GPU's utilisation over time
  std::optional<double> gpu_util_mean;  // 0..1, over the time sampled
  // From the worker's step statistics (hang.h's StepStats), where it wrote them: the time in
  // gradient collectives over the steps' wall time, and the part of that time hidden behind
  // backward, both 0..1 (hidden: none when no collective time was measured).
  std::optional<double> allreduce_share;
  std::optional<double> allreduce_hidden;
  // false: the worker was never reaped (stuck in the kernel): no numbers, "-" in the table.
  bool measured = true;
  // How it failed ("exit code 1", "SIGKILL", "hung") when it is the attempt's failed rank, else "".
  std::string failure;
  std::optional<double> gpu_sampled_s;  // how long its GPU was sampled (the time gpu_util_mean covers)
};

// Sets allreduce_share / allreduce_hidden from a worker's statistics; leaves them unset when
// it counted no step (or no step time).
void add_step_stats(RankUsage& u, const StepStats& s);

struct UsageReport {
  std::vector<RankUsage> ranks;  // every worker of this node's last attempt
  std::string host;
  // Workers of earlier attempts (ended by failures and restarts): how many, their CPU time.
  int earlier_workers = 0;
  double earlier_cpu_s = 0;
  double gpu_util_warn = 0.85;  // --gpu_util_warn: warn below this mean (0: never)
};

// The table, one line per rank, as text lines (no trailing newline on the last); "" when no
// worker ran. The GPU columns appear when some rank was sampled, the all-reduce columns when
// some rank wrote step statistics; a rank without the values shows "-" there. A failed rank's
// row ends with "<- failed: exit code 1".
std::string format_usage_table(const UsageReport& r);
// "mean GPU utilisation below 85% (--gpu_util_warn=0.85): r1 41%, r3 60%; ..." or "" when every
// sampled rank is at or above the threshold (or none was sampled). A rank counts only when its
// GPU was sampled for kMinGpuJudgeS or more: a shorter run is mostly start-up (CUDA context,
// loading, the first compiled steps), and its mean says nothing about training.
inline constexpr double kMinGpuJudgeS = 60;
std::string low_gpu_utilisation_warning(const UsageReport& r);

// "1.5 KiB", "412 MiB", "2.3 GiB".
std::string human_bytes(uint64_t bytes);

}  // namespace ddprun::launcher
