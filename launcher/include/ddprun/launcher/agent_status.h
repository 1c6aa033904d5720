// What `ddprun status` shows (launcher/README.md, "ddprun status"), pure: one agent's status
// snapshot, its JSON (the schema in the README), the table, CPU % from two samples, and NVML's
// per-device answers turned into per-rank GPU values. The I/O (the agent's socket, /proc, NVML,
// the command) lives in src/status/.
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "ddprun/launcher/agent_metrics.h"

namespace ddprun::launcher {

// The version of the JSON schema; a reader refuses another major version.
inline constexpr int kStatusSchemaVersion = 1;

struct RankStatus {
  int rank = 0;  // global rank
  int local_rank = 0;
  pid_t pid = -1;
  std::string state;                  // running, succeeded, failed
  double uptime_s = 0;                // since it started (to its end once it ended)
  std::optional<double> cpu_percent;  // of one core, over the interval since the previous sample
  std::optional<uint64_t> rss_bytes;
  std::optional<int> gpu_index;
  std::optional<double> gpu_utilization_percent;
  std::optional<uint64_t> gpu_memory_bytes;
};

struct AgentStatus {
  std::string run_id;
  std::string host;
  int node_rank = 0;
  int num_nodes = 1;
  pid_t agent_pid = -1;
  std::string state;  // rendezvous, running, stopping
  int attempt = 0;    // restarts of the job so far (0 = the first attempt)
  int max_restarts = 0;
  double uptime_s = 0;                   // since the agent started
  std::optional<int> last_failure_rank;  // global rank of the last failure this node saw
  std::string last_failure;              // "exit code 1 (attempt 0)", "" when none
  std::vector<RankStatus> ranks;

  int restarts_left() const { return max_restarts > attempt ? max_restarts - attempt : 0; }
};

// One agent as a JSON object (one line, no newline).
std::string status_to_json(const AgentStatus& s);
// The document `ddprun status --json` prints: {"version": 1, "agents": [...]}.
std::string status_document_json(const std::vector<AgentStatus>& agents);
// An agent object back (what the socket answers); nullopt and *error when it is not one.
std::optional<AgentStatus> status_from_json(const std::string& text, std::string* error);
// A JSON array of agent objects (what the rendezvous server answers for a job); the entries
// that are not agent objects are left out, and *error says why for the first of them.
std::vector<AgentStatus> statuses_from_json_array(const std::string& text, std::string* error);

// The table, one row per rank, agents in the order given (the caller sorts: by job, then node).
// GPU columns only when some rank has a GPU value. Ends with a newline.
std::string format_status_table(const std::vector<AgentStatus>& agents);

// CPU % of one core between two samples of a process's CPU seconds `wall_s` apart; nullopt
// when the interval is shorter than kMinCpuWindowS (a rate over a few milliseconds says nothing)
// or the counter went back (another process with that pid).
inline constexpr double kMinCpuWindowS = 1.0;
std::optional<double> cpu_percent(double cpu_s_before, double cpu_s_now, double wall_s);

// The window of a worker's first CPU sample: since its process started (`process_age_s`, from
// /proc), not since it became a rank. A spare's process ran (imported its modules) long before it
// took over a rank; its CPU seconds count from then. The rank's uptime when the age is unknown.
double first_cpu_window_s(double rank_uptime_s, std::optional<double> process_age_s);

// One GPU as NVML saw it.
struct GpuDeviceSample {
  int index = 0;
  std::optional<unsigned> utilization_percent;
  struct Process {
    pid_t pid = 0;
    uint64_t used_bytes = 0;
  };
  std::vector<Process> processes;
};

// Fills the GPU fields of each rank whose process group (the worker leads its own: its pid)
// has a process on a GPU: that GPU's index and utilisation, and the memory its processes use
// there. `process_group_of(pid)` answers a pid's process group (nullopt when it is gone). A
// rank on several GPUs gets the one where it uses the most memory.
void assign_gpu_samples(std::vector<RankSample>& ranks, const std::vector<GpuDeviceSample>& devices,
                        const std::function<std::optional<pid_t>(pid_t)>& process_group_of);

}  // namespace ddprun::launcher
