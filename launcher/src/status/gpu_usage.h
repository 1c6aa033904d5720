// Each worker's GPU use over its life, for the end-of-run table (usage_report.h): a thread that,
// where NVML loads, samples the running workers' GPUs every few seconds and integrates each
// one's utilisation over time. NVML is loaded on that thread at the first sample, one interval
// after the start: a job shorter than that never loads it. Without NVML (no driver) the thread
// ends at its first sample and records nothing.
#pragma once

#include <sys/types.h>

#include <condition_variable>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <thread>
#include <vector>

#include "status/rank_sampler.h"

namespace ddprun::launcher {

struct GpuUse {
  std::optional<int> gpu_index;  // the GPU it was last seen on
  double gpu_seconds = 0;        // utilisation integrated over the sampled time
  double sampled_s = 0;          // time covered by samples while it was on a GPU
};

class GpuUsageRecorder {
 public:
  GpuUsageRecorder(std::shared_ptr<RankSampler> sampler, double interval_s);
  ~GpuUsageRecorder();  // stops the thread
  GpuUsageRecorder(const GpuUsageRecorder&) = delete;
  GpuUsageRecorder& operator=(const GpuUsageRecorder&) = delete;

  // The workers to sample from now on (an attempt started).
  void set_workers(const std::vector<RankSample>& workers);
  // The worker's use so far (it ended); nullopt when it was never seen on a GPU.
  std::optional<GpuUse> take(pid_t pid);

 private:
  void run();

  std::shared_ptr<RankSampler> sampler_;
  double interval_s_;
  std::mutex mu_;
  std::condition_variable cv_;
  bool stop_ = false;
  std::vector<RankSample> workers_;
  std::map<pid_t, GpuUse> use_;
  std::thread thread_;
};

}  // namespace ddprun::launcher
