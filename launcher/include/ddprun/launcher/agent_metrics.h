// The agent's metrics (launcher/README.md "Metrics"), pure: what the agent records (an
// AgentSnapshot), the per-rank samples read from /proc at scrape time, and both as Prometheus
// metric families. The I/O (reading /proc, the HTTP endpoint) is metrics/agent_exporter.h.
#pragma once

#include <prometheus/metric_family.h>
#include <sys/types.h>

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace ddprun::launcher {

// One worker at scrape time. The GPU fields stay empty unless a GPU sampler fills them
// (AgentExporter::set_gpu_sampler); empty fields give no series.
struct RankSample {
  int local_rank = 0;
  int global_rank = 0;
  pid_t pid = -1;
  std::optional<double> cpu_seconds;       // user + system time of the worker's process
  std::optional<uint64_t> rss_bytes;       // its resident set
  std::optional<int> gpu_index;            // NVML's index of the GPU its process group uses
  std::optional<double> gpu_utilization;   // 0..1, of its GPU
  std::optional<uint64_t> gpu_memory_bytes;  // GPU memory its process uses
};

// Upper bounds of the rendezvous-duration histogram, seconds (+Inf after them).
inline constexpr double kRendezvousBuckets[] = {0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300};

struct AgentSnapshot {
  int attempt = 0;  // restarts of the worker group so far (0 = the first attempt)
  // Workers of the current attempt by state: running, succeeded, failed.
  std::map<std::string, int> workers_by_state;
  std::map<std::string, uint64_t> restarts_by_cause;  // worker_failure, peer_restart
  std::map<std::string, uint64_t> failures_by_cause;  // exit_code, signal, config_error, hang
  uint64_t rendezvous_buckets[std::size(kRendezvousBuckets) + 1] = {};
  double rendezvous_seconds_sum = 0;
  double last_rendezvous_seconds = 0;
  std::vector<RankSample> ranks;
};

// Adds one rendezvous duration to the snapshot's histogram.
void observe_rendezvous(AgentSnapshot& s, double seconds);

// User + system seconds from the text of /proc/<pid>/stat (fields 14 and 15, counted after
// the command name in parentheses, which may hold spaces and parentheses).
std::optional<double> parse_proc_stat_cpu_seconds(std::string_view stat, long ticks_per_second);
// The resident set in bytes from the text of /proc/<pid>/status (its "VmRSS: N kB" line).
std::optional<uint64_t> parse_proc_status_rss_bytes(std::string_view status);

std::vector<prometheus::MetricFamily> agent_metric_families(const AgentSnapshot& s);

}  // namespace ddprun::launcher
