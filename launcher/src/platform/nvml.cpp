#include "platform/nvml.h"

#include <dlfcn.h>

namespace ddprun::launcher::platform {

namespace {
// NVML's C ABI, as far as ddprun uses it (nvml.h of any driver since 11.x).
using nvmlReturn_t = int;
using nvmlDevice_t = struct nvmlDevice_st*;
struct nvmlMemory_t {
  unsigned long long total, free, used;
};
struct nvmlUtilization_t {
  unsigned int gpu, memory;
};
// nvmlProcessInfo_v1_t: the layout nvmlDeviceGetComputeRunningProcesses (unversioned) fills.
struct nvmlProcessInfo_v1_t {
  unsigned int pid;
  unsigned long long usedGpuMemory;
};
constexpr nvmlReturn_t kSuccess = 0;
constexpr nvmlReturn_t kInsufficientSize = 7;
constexpr unsigned long long kNotAvailable = ~0ULL;  // NVML_VALUE_NOT_AVAILABLE

using InitFn = nvmlReturn_t (*)();
using ShutdownFn = nvmlReturn_t (*)();
using ErrorStringFn = const char* (*)(nvmlReturn_t);
using CountFn = nvmlReturn_t (*)(unsigned int*);
using CudaVersionFn = nvmlReturn_t (*)(int*);
using HandleFn = nvmlReturn_t (*)(unsigned int, nvmlDevice_t*);
using StringFn = nvmlReturn_t (*)(nvmlDevice_t, char*, unsigned int);
using ModeFn = nvmlReturn_t (*)(nvmlDevice_t, int*);
using MemoryFn = nvmlReturn_t (*)(nvmlDevice_t, nvmlMemory_t*);
using UtilizationFn = nvmlReturn_t (*)(nvmlDevice_t, nvmlUtilization_t*);
using ProcessesFn = nvmlReturn_t (*)(nvmlDevice_t, unsigned int*, nvmlProcessInfo_v1_t*);
}  // namespace

struct Nvml::Api {
  void* lib = nullptr;
  ShutdownFn shutdown = nullptr;
  ErrorStringFn error_string = nullptr;
  CountFn count = nullptr;
  CudaVersionFn cuda_version = nullptr;
  HandleFn handle = nullptr;
  StringFn name = nullptr;
  StringFn uuid = nullptr;
  ModeFn mode = nullptr;
  MemoryFn memory = nullptr;
  ProcessesFn processes = nullptr;
  UtilizationFn utilization = nullptr;
};

const char* compute_mode_name(ComputeMode mode) {
  switch (mode) {
    case ComputeMode::Default: return "DEFAULT";
    case ComputeMode::ExclusiveThread: return "EXCLUSIVE_THREAD";
    case ComputeMode::Prohibited: return "PROHIBITED";
    case ComputeMode::ExclusiveProcess: return "EXCLUSIVE_PROCESS";
    case ComputeMode::Unknown: break;
  }
  return "UNKNOWN";
}

std::unique_ptr<Nvml> Nvml::load(std::string* why) {
  void* lib = ::dlopen("libnvidia-ml.so.1", RTLD_NOW | RTLD_LOCAL);
  if (!lib) {
    const char* e = ::dlerror();
    *why = e ? e : "libnvidia-ml.so.1: cannot be loaded";
    return nullptr;
  }
  auto api = std::make_unique<Api>();
  api->lib = lib;
  auto sym = [lib](const char* name) { return ::dlsym(lib, name); };
  auto init = reinterpret_cast<InitFn>(sym("nvmlInit_v2"));
  api->shutdown = reinterpret_cast<ShutdownFn>(sym("nvmlShutdown"));
  api->error_string = reinterpret_cast<ErrorStringFn>(sym("nvmlErrorString"));
  api->count = reinterpret_cast<CountFn>(sym("nvmlDeviceGetCount_v2"));
  api->cuda_version = reinterpret_cast<CudaVersionFn>(sym("nvmlSystemGetCudaDriverVersion_v2"));
  api->handle = reinterpret_cast<HandleFn>(sym("nvmlDeviceGetHandleByIndex_v2"));
  api->name = reinterpret_cast<StringFn>(sym("nvmlDeviceGetName"));
  api->uuid = reinterpret_cast<StringFn>(sym("nvmlDeviceGetUUID"));
  api->mode = reinterpret_cast<ModeFn>(sym("nvmlDeviceGetComputeMode"));
  api->memory = reinterpret_cast<MemoryFn>(sym("nvmlDeviceGetMemoryInfo"));
  api->processes = reinterpret_cast<ProcessesFn>(sym("nvmlDeviceGetComputeRunningProcesses"));
  api->utilization = reinterpret_cast<UtilizationFn>(sym("nvmlDeviceGetUtilizationRates"));
  if (!init || !api->shutdown || !api->count || !api->handle) {
    *why = "libnvidia-ml.so.1 lacks nvmlInit_v2 or nvmlDeviceGetCount_v2 (a driver older than 2016?)";
    ::dlclose(lib);
    return nullptr;
  }
  const nvmlReturn_t rc = init();
  if (rc != kSuccess) {
    *why = std::string("nvmlInit failed: ") + (api->error_string ? api->error_string(rc) : std::to_string(rc).c_str());
    ::dlclose(lib);
    return nullptr;
  }
  return std::unique_ptr<Nvml>(new Nvml(std::move(api)));
}

Nvml::Nvml(std::unique_ptr<Api> api) : api_(std::move(api)) {}

Nvml::~Nvml() {
  api_->shutdown();
  ::dlclose(api_->lib);
}

bool Nvml::check(int rc, const char* what) {
  if (rc == kSuccess) return true;
  last_error_ = std::string(what) + ": " + (api_->error_string ? api_->error_string(rc) : std::to_string(rc));
  return false;
}

void* Nvml::device(int index) {
  nvmlDevice_t d = nullptr;
  if (!check(api_->handle(static_cast<unsigned>(index), &d), "nvmlDeviceGetHandleByIndex")) return nullptr;
  return d;
}

std::optional<int> Nvml::device_count() {
  unsigned n = 0;
  if (!check(api_->count(&n), "nvmlDeviceGetCount")) return std::nullopt;
  return static_cast<int>(n);
}

std::optional<int> Nvml::driver_cuda_version() {
  int v = 0;
  if (!api_->cuda_version) {
    last_error_ = "nvmlSystemGetCudaDriverVersion_v2: not in this driver";
    return std::nullopt;
  }
  if (!check(api_->cuda_version(&v), "nvmlSystemGetCudaDriverVersion_v2")) return std::nullopt;
  return v;
}

namespace {
template <class Fn, class Check>
std::optional<std::string> read_string(Fn fn, void* dev, Check check, const char* what) {
  char buf[96] = {};
  if (!fn || !dev || !check(fn(static_cast<nvmlDevice_t>(dev), buf, sizeof buf), what)) return std::nullopt;
  return std::string(buf);
}
}  // namespace

std::optional<std::string> Nvml::name(int index) {
  return read_string(
      api_->name, device(index), [this](int rc, const char* w) { return check(rc, w); }, "nvmlDeviceGetName");
}

std::optional<std::string> Nvml::uuid(int index) {
  return read_string(
      api_->uuid, device(index), [this](int rc, const char* w) { return check(rc, w); }, "nvmlDeviceGetUUID");
}

std::optional<ComputeMode> Nvml::compute_mode(int index) {
  void* d = device(index);
  int m = 0;
  if (!api_->mode || !d || !check(api_->mode(static_cast<nvmlDevice_t>(d), &m), "nvmlDeviceGetComputeMode"))
    return std::nullopt;
  return m >= 0 && m <= 3 ? static_cast<ComputeMode>(m) : ComputeMode::Unknown;
}

std::optional<uint64_t> Nvml::memory_used(int index) {
  void* d = device(index);
  nvmlMemory_t mem{};
  if (!api_->memory || !d || !check(api_->memory(static_cast<nvmlDevice_t>(d), &mem), "nvmlDeviceGetMemoryInfo"))
    return std::nullopt;
  return mem.used;
}

std::optional<unsigned> Nvml::utilization(int index) {
  void* d = device(index);
  nvmlUtilization_t u{};
  if (!api_->utilization || !d ||
      !check(api_->utilization(static_cast<nvmlDevice_t>(d), &u), "nvmlDeviceGetUtilizationRates"))
    return std::nullopt;
  return u.gpu;
}

std::optional<std::vector<GpuProcess>> Nvml::compute_processes(int index) {
  void* d = device(index);
  if (!api_->processes || !d) return std::nullopt;
  unsigned n = 64;
  std::vector<nvmlProcessInfo_v1_t> infos(n);
  int rc = api_->processes(static_cast<nvmlDevice_t>(d), &n, infos.data());
  if (rc == kInsufficientSize) {
    infos.resize(n + 16);
    n = static_cast<unsigned>(infos.size());
    rc = api_->processes(static_cast<nvmlDevice_t>(d), &n, infos.data());
  }
  if (!check(rc, "nvmlDeviceGetComputeRunningProcesses")) return std::nullopt;
  std::vector<GpuProcess> out;
  for (unsigned i = 0; i < n && i < infos.size(); ++i)
    out.push_back({infos[i].pid, infos[i].usedGpuMemory == kNotAvailable ? 0 : infos[i].usedGpuMemory});
  return out;
}

}  // namespace ddprun::launcher::platform
