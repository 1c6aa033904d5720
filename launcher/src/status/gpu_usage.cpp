#include "status/gpu_usage.h"

#include <chrono>
#include <utility>

namespace ddprun::launcher {

GpuUsageRecorder::GpuUsageRecorder(std::shared_ptr<RankSampler> sampler, double interval_s)
    : sampler_(std::move(sampler)), interval_s_(interval_s), thread_([this] { run(); }) {}

GpuUsageRecorder::~GpuUsageRecorder() {
  {
    std::lock_guard lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  thread_.join();
}

void GpuUsageRecorder::set_workers(const std::vector<RankSample>& workers) {
  std::lock_guard lock(mu_);
  workers_ = workers;
}

std::optional<GpuUse> GpuUsageRecorder::take(pid_t pid) {
  std::lock_guard lock(mu_);
  auto it = use_.find(pid);
  if (it == use_.end()) return std::nullopt;
  GpuUse u = it->second;
  use_.erase(it);
  return u;
}

// NVML is loaded here, on this thread, at the first sample (an interval after the start): never
// on the launch path, and a job that ends sooner never loads it (nor waits for it at exit).
void GpuUsageRecorder::run() {
  using Clock = std::chrono::steady_clock;
  auto last = Clock::now();
  std::unique_lock lock(mu_);
  while (!stop_) {
    cv_.wait_for(lock, std::chrono::duration<double>(interval_s_), [this] { return stop_; });
    if (stop_) break;
    std::vector<RankSample> ranks = workers_;
    lock.unlock();
    if (!sampler_->nvml_available()) return;  // no driver: nothing to record, ever
    sampler_->sample_gpus(ranks);             // NVML calls outside the lock
    const auto now = Clock::now();
    const double dt = std::chrono::duration<double>(now - last).count();
    last = now;
    lock.lock();
    for (const auto& r : ranks) {
      if (!r.gpu_utilization || r.pid <= 0) continue;
      GpuUse& u = use_[r.pid];
      u.gpu_index = r.gpu_index;
      u.gpu_seconds += *r.gpu_utilization * dt;
      u.sampled_s += dt;
    }
  }
}

}  // namespace ddprun::launcher
