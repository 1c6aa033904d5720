// The CUDA libraries the GPU paths load at run time: NCCL (the communicator) and cuBLAS (the
// train harness). The CUDA runtime is linked statically (it finds the driver, libcuda.so.1,
// itself), so libddprun_worker and train start, and run their CPU paths, on a machine without
// any of them; asking for the GPU path there fails with one line that says what is missing and
// how to get it. This is the one place that knows the libraries' names and where to look.
#pragma once

#include <string>
#include <vector>

namespace ddprun::worker::detail {

enum class GpuLib { Nccl, Cublas };

// The sonames loaded for `lib`, in load order (cuBLAS: libcublas, which brings its libcublasLt).
std::vector<std::string> gpu_lib_sonames(GpuLib lib);

// The files tried for `soname`, in order, by code in an object whose file is in `module_dir`:
// the bare soname first (LD_LIBRARY_PATH, the object's RUNPATH, the ldconfig cache: what linking
// it would have found), then the nvidia-* wheels' folders of the Python environment the object
// is installed in (a wheel's site-packages/ddprun/{lib,bin} -> site-packages/nvidia/*/lib), in
// case a RUNPATH did not survive packaging.
std::vector<std::string> gpu_lib_candidates(const std::string& soname, const std::string& module_dir);

// The one-line error for a library none of the candidates could load (`why`: dlerror's text).
std::string gpu_lib_missing_message(GpuLib lib, const std::string& soname, const std::string& why);

// Loads `lib` once per process (later calls return at once) or throws WorkerError with
// gpu_lib_missing_message().
void require_gpu_lib(GpuLib lib);
// True when `lib` loads (it stays loaded); never throws.
bool gpu_lib_loadable(GpuLib lib) noexcept;
// A function of the loaded `lib` (require_gpu_lib first); throws WorkerError when it lacks it.
void* gpu_lib_symbol(GpuLib lib, const char* name);

}  // namespace ddprun::worker::detail
