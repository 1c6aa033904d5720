// NVML (the NVIDIA driver's management library) loaded at run time: ddprun links no NVIDIA
// library, so a machine without a driver runs it as well. Only the few calls ddprun uses are
// declared here (opaque handles, function pointer types); nvml.h is not needed to build.
//
// Nvml::load() dlopens libnvidia-ml.so.1 and calls nvmlInit_v2; the destructor calls
// nvmlShutdown and dlcloses. Not thread-safe: one thread uses an instance at a time.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace ddprun::launcher::platform {

// nvmlComputeMode_t's values.
enum class ComputeMode : int { Default = 0, ExclusiveThread = 1, Prohibited = 2, ExclusiveProcess = 3, Unknown = -1 };
const char* compute_mode_name(ComputeMode mode);

struct GpuProcess {
  unsigned pid = 0;
  uint64_t used_bytes = 0;  // 0 when NVML cannot tell (no permission, MIG)
};

class Nvml {
 public:
  // nullptr and *why ("libnvidia-ml.so.1: cannot open shared object file ...") when there is no
  // driver or its init fails.
  static std::unique_ptr<Nvml> load(std::string* why);
  ~Nvml();
  Nvml(const Nvml&) = delete;
  Nvml& operator=(const Nvml&) = delete;

  // Every call below returns nullopt (and leaves the reason in last_error()) when NVML fails.
  std::optional<int> device_count();
  // The driver's CUDA version as NVML encodes it: 1000 * major + 10 * minor (12040 = 12.4).
  std::optional<int> driver_cuda_version();
  std::optional<std::string> name(int index);
  std::optional<std::string> uuid(int index);
  std::optional<ComputeMode> compute_mode(int index);
  std::optional<uint64_t> memory_used(int index);
  // Percent of the last sample period (1/6 s to 1 s, by product) in which a kernel ran.
  std::optional<unsigned> utilization(int index);
  std::optional<std::vector<GpuProcess>> compute_processes(int index);
  const std::string& last_error() const { return last_error_; }

 private:
  struct Api;
  explicit Nvml(std::unique_ptr<Api> api);
  bool check(int rc, const char* what);
  void* device(int index);
  std::unique_ptr<Api> api_;
  std::string last_error_;
};

}  // namespace ddprun::launcher::platform
