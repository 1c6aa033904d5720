// Where the CUDA build looks for NCCL and cuBLAS at run time, and what it says when they are
// missing (worker_runtime/src/gpu/gpu_libs.h); the package.wheel.cuda_* tests load them for real.
#include <catch2/catch.hpp>
#include <string>

#include "gpu_libs.h"

namespace dd = ddprun::worker::detail;

TEST_CASE("GPU libraries: the sonames of the CUDA major version built with", "[gpu_libs]") {
  CHECK(dd::gpu_lib_sonames(dd::GpuLib::Nccl) == std::vector<std::string>{"libnccl.so.2"});
  CHECK(dd::gpu_lib_sonames(dd::GpuLib::Cublas) == std::vector<std::string>{"libcublas.so.13"});
}

TEST_CASE("GPU libraries: the dynamic linker's search first, then the nvidia-* wheels beside the package",
          "[gpu_libs]") {
  const std::string dir = "/venv/lib/python3.11/site-packages/ddprun/lib";
  const auto c = dd::gpu_lib_candidates("libnccl.so.2", dir);
  REQUIRE(c.size() == 4);
  CHECK(c[0] == "libnccl.so.2");  // LD_LIBRARY_PATH, the caller's RUNPATH, ldconfig
  CHECK(c[1] == dir + "/../../nvidia/nccl/lib/libnccl.so.2");
  CHECK(c[2] == dir + "/../../nvidia/cu13/lib/libnccl.so.2");
  CHECK(c[3] == dir + "/../../nvidia/cublas/lib/libnccl.so.2");
}

TEST_CASE("GPU libraries: a missing one gets one line that names it and says what to install", "[gpu_libs]") {
  const std::string why = "libcublas.so.13: cannot open shared object file: No such file or directory";
  const std::string m = dd::gpu_lib_missing_message(dd::GpuLib::Cublas, "libcublas.so.13", why);
  CHECK(m.find('\n') == std::string::npos);
  CHECK(m.rfind("cuBLAS (libcublas.so.13 with libcublasLt.so.13) was not found", 0) == 0);
  CHECK(m.find("pip install 'ddprun[cuda13]'") != std::string::npos);
  CHECK(m.find("--device cpu") != std::string::npos);
  CHECK(m.find(why) != std::string::npos);
  const std::string n = dd::gpu_lib_missing_message(dd::GpuLib::Nccl, "libnccl.so.2", "x");
  CHECK(n.rfind("NCCL (libnccl.so.2) was not found", 0) == 0);
}
