#include "gpu_libs.h"

#include <dlfcn.h>
#include <unistd.h>

#include <mutex>

#include "ddprun/worker/checks.h"

#ifndef DDPRUN_CUDA_MAJOR
#error "DDPRUN_CUDA_MAJOR (the CUDA toolkit's major version) must be defined by the build"
#endif
#define DDPRUN_STR2(x) #x
#define DDPRUN_STR(x) DDPRUN_STR2(x)

namespace ddprun::worker::detail {
namespace {

constexpr const char* kCudaMajor = DDPRUN_STR(DDPRUN_CUDA_MAJOR);

// Folders of the nvidia-* wheels (CUDA 13's cu13/ holds cuBLAS; CUDA 12 had one per library).
constexpr const char* kWheelDirs[] = {"nvidia/nccl/lib", "nvidia/cu" DDPRUN_STR(DDPRUN_CUDA_MAJOR) "/lib",
                                      "nvidia/cublas/lib"};

// What packaging tools look for to tell the files that load these libraries at run time
// (scripts/build_wheel.sh: their RUNPATH to the nvidia-* wheels, and the wheel's variant).
[[gnu::used]] constexpr char kLoadsGpuLibsMarker[] =
    "ddprun-loads-gpu-libs: libnccl.so.2 libcublas.so." DDPRUN_STR(DDPRUN_CUDA_MAJOR);

struct Loaded {
  std::once_flag once;
  std::vector<void*> handles;  // in gpu_lib_sonames() order; empty when loading failed
  std::string error;
};

Loaded& slot(GpuLib lib) {
  static Loaded nccl, cublas;
  return lib == GpuLib::Nccl ? nccl : cublas;
}

// The folder of the file this code is linked into (libddprun_worker or train).
std::string module_dir() {
  Dl_info info{};
  std::string path;
  if (dladdr(reinterpret_cast<void*>(&module_dir), &info) != 0 && info.dli_fname) path = info.dli_fname;
  if (path.find('/') == std::string::npos) {  // the main program: dladdr may give argv[0]
    char buf[4096];
    const ssize_t n = ::readlink("/proc/self/exe", buf, sizeof buf - 1);
    path = n > 0 ? std::string(buf, static_cast<size_t>(n)) : std::string();
  }
  const auto slash = path.rfind('/');
  return slash == std::string::npos ? std::string(".") : path.substr(0, slash);
}

void* open_one(const std::string& soname, const std::string& dir, std::string& first_error) {
  // Already in the process (e.g. LibTorch's): use that one, never a second copy.
  if (void* h = ::dlopen(soname.c_str(), RTLD_NOW | RTLD_LOCAL | RTLD_NOLOAD)) return h;
  for (const std::string& file : gpu_lib_candidates(soname, dir)) {
    if (file.find('/') != std::string::npos && ::access(file.c_str(), F_OK) != 0) continue;
    if (void* h = ::dlopen(file.c_str(), RTLD_NOW | RTLD_LOCAL)) return h;
    if (first_error.empty()) {
      const char* e = ::dlerror();
      first_error = e ? e : soname + ": not found";
    }
  }
  return nullptr;
}

void load(GpuLib lib, Loaded& l) {
  const std::string dir = module_dir();
  for (const std::string& soname : gpu_lib_sonames(lib)) {
    std::string err;
    void* h = open_one(soname, dir, err);
    if (!h) {
      for (void* o : l.handles) ::dlclose(o);
      l.handles.clear();
      l.error = gpu_lib_missing_message(lib, soname, err);
      return;
    }
    l.handles.push_back(h);
  }
}

Loaded& loaded(GpuLib lib) {
  Loaded& l = slot(lib);
  std::call_once(l.once, [&] { load(lib, l); });
  return l;
}

}  // namespace

std::vector<std::string> gpu_lib_sonames(GpuLib lib) {
  if (lib == GpuLib::Nccl) return {"libnccl.so.2"};
  // libcublas needs libcublasLt of the same release: its own RUNPATH ($ORIGIN in the wheels) or
  // the same search finds it, so the pair never mixes two installs.
  return {std::string("libcublas.so.") + kCudaMajor};
}

std::vector<std::string> gpu_lib_candidates(const std::string& soname, const std::string& dir) {
  std::vector<std::string> out{soname};
  for (const char* w : kWheelDirs) out.push_back(dir + "/../../" + w + "/" + soname);
  return out;
}

std::string gpu_lib_missing_message(GpuLib lib, const std::string& soname, const std::string& why) {
  const char* what = lib == GpuLib::Nccl ? "NCCL" : "cuBLAS";
  const std::string files = lib == GpuLib::Nccl ? soname : soname + " with libcublasLt.so." + kCudaMajor;
  return std::string(what) + " (" + files + ") was not found, and the GPU path needs it: install it with " +
         "pip install 'ddprun[cuda" + kCudaMajor + "]' (or the nvidia-* wheels of PyTorch's CUDA " + kCudaMajor +
         " build), or the system's CUDA " + kCudaMajor + " " + what + ", or put its folder on LD_LIBRARY_PATH; " +
         "the CPU path (--device cpu, DDPRUN_DEVICE=cpu) needs none (" + why + ")";
}

void require_gpu_lib(GpuLib lib) {
  Loaded& l = loaded(lib);
  if (l.handles.empty()) throw WorkerError(l.error);
}

bool gpu_lib_loadable(GpuLib lib) noexcept {
  try {
    return !loaded(lib).handles.empty();
  } catch (...) {
    return false;
  }
}

void* gpu_lib_symbol(GpuLib lib, const char* name) {
  require_gpu_lib(lib);
  for (void* h : loaded(lib).handles)
    if (void* f = ::dlsym(h, name)) return f;
  throw WorkerError(std::string("the loaded ") + gpu_lib_sonames(lib).back() + " has no function " + name +
                    ": it is older than the one this build was made with; install a newer one");
}

}  // namespace ddprun::worker::detail
