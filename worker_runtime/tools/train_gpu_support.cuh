// The GPU path's host-side helpers (train_gpu.cu): device buffers, the per-phase profile
// (DDPRUN_TRAIN_PROFILE=1) and the checkpoint's configuration fingerprint. Private to
// train_gpu.cu (its one includer), hence the unnamed namespace.
#pragma once

#include <cuda_runtime.h>

#include <cstdio>
#include <cstdlib>
#include <string>
#include <utility>
#include <vector>

#include "ddprun/worker/gpu_checks.h"
#include "train_common.h"

namespace train {
namespace {

template <class T>
struct DeviceBuf {
  T* p = nullptr;
  size_t n = 0;
  explicit DeviceBuf(size_t count = 0) { resize(count); }
  void resize(size_t count) {
    if (count == n) return;
    if (p) cudaFree(p);
    p = nullptr;
    n = count;
    if (count) DDPRUN_CUDA_CHECK(cudaMalloc(&p, count * sizeof(T)));
  }
  ~DeviceBuf() {
    if (p) cudaFree(p);
  }
  DeviceBuf(const DeviceBuf&) = delete;
  DeviceBuf& operator=(const DeviceBuf&) = delete;
};

// DDPRUN_TRAIN_PROFILE=1 (a diagnostic of the harness): GPU time per phase of the step, from
// events recorded on the compute stream after each phase (time between consecutive events is
// charged to the later phase), averaged over the timed steps (at most kMaxSteps), and the host's
// time per step issuing work and waiting. The events add small gaps between kernels, so the
// phases add up to a little more than an unprofiled step.
class PhaseProfile {
 public:
  static constexpr size_t kMaxSteps = 200;
  PhaseProfile(cudaStream_t s) : stream_(s) {
    const char* v = std::getenv("DDPRUN_TRAIN_PROFILE");
    on_ = v && std::string(v) == "1";
  }
  ~PhaseProfile() {
    for (auto& st : steps_)
      for (auto& m : st) cudaEventDestroy(m.second);
  }
  void begin_step(bool timed) {
    active_ = on_ && timed && steps_.size() < kMaxSteps;
    if (!active_) return;
    steps_.emplace_back();
    mark("start");
  }
  void mark(const char* name) {
    if (!active_) return;
    cudaEvent_t e;
    DDPRUN_CUDA_CHECK(cudaEventCreate(&e));
    DDPRUN_CUDA_CHECK(cudaEventRecord(e, stream_));
    steps_.back().emplace_back(name, e);
  }
  void host(const char* name, double ms) {
    if (!active_) return;
    add(host_, name, ms);
  }
  // After the stream is synchronised.
  void report() const {
    if (!on_ || steps_.empty()) return;
    std::vector<std::pair<std::string, double>> gpu;
    double total = 0;
    for (const auto& st : steps_)
      for (size_t k = 1; k < st.size(); ++k) {
        float ms = 0;
        DDPRUN_CUDA_CHECK(cudaEventElapsedTime(&ms, st[k - 1].second, st[k].second));
        add(gpu, st[k].first, ms);
        total += ms;
      }
    const double n = static_cast<double>(steps_.size());
    std::printf("profile: %zu steps, GPU ms per step by phase (sum %.3f):\n", steps_.size(), total / n);
    for (const auto& [name, ms] : gpu) std::printf("profile_gpu %-12s %8.3f\n", name.c_str(), ms / n);
    for (const auto& [name, ms] : host_) std::printf("profile_host %-12s %8.3f\n", name.c_str(), ms / n);
  }

 private:
  static void add(std::vector<std::pair<std::string, double>>& v, const char* name, double ms) {
    for (auto& e : v)
      if (e.first == name) {
        e.second += ms;
        return;
      }
    v.emplace_back(name, ms);
  }
  cudaStream_t stream_;
  bool on_ = false, active_ = false;
  std::vector<std::vector<std::pair<const char*, cudaEvent_t>>> steps_;
  std::vector<std::pair<std::string, double>> host_;
};

std::string config_fingerprint(const Options& o) {
  return "in=" + std::to_string(o.in) + " width=" + std::to_string(o.width) + " depth=" + std::to_string(o.depth) +
         " samples=" + std::to_string(o.samples) + " batch=" + std::to_string(o.batch);
}

}  // namespace
}  // namespace train
