// What each rank uses, read when someone asks (a status request, a metrics scrape): CPU seconds
// and resident memory from /proc/<pid>, and its GPU from NVML. NVML is loaded at the first GPU
// sample, never before; a machine without a driver tries once and has no GPU values.
//
// Thread-safe: the status socket's thread and the metrics endpoint's thread share one sampler.
#pragma once

#include <sys/types.h>

#include <memory>
#include <mutex>
#include <optional>
#include <vector>

#include "ddprun/launcher/agent_metrics.h"
#include "platform/nvml.h"

namespace ddprun::launcher {

class RankSampler {
 public:
  RankSampler();
  ~RankSampler();
  // Fills cpu_seconds and rss_bytes of each rank that has a pid (nothing for one that is gone).
  static void sample_proc(std::vector<RankSample>& ranks);
  // Fills the GPU fields (assign_gpu_samples) of the ranks with a process on a GPU.
  void sample_gpus(std::vector<RankSample>& ranks);
  // Whether NVML could be loaded (loads it on the first call).
  bool nvml_available();
  // The process group of `pid` from /proc/<pid>/stat; nullopt when it is gone.
  static std::optional<pid_t> process_group_of(pid_t pid);
  // Seconds since `pid` started (/proc/<pid>/stat's start time against /proc/uptime); nullopt
  // when it is gone.
  static std::optional<double> process_age_s(pid_t pid);

 private:
  std::mutex mu_;
  bool tried_nvml_ = false;
  std::unique_ptr<platform::Nvml> nvml_;
};

}  // namespace ddprun::launcher
