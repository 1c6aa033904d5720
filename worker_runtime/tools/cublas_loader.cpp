// The cuBLAS functions train's GPU half calls, defined here with cublas_api.h's signatures and
// forwarded to the libcublas that gpu_libs.h loads at run time, so train starts (and trains on
// the CPU) where cuBLAS is not installed. train::require_cublas() runs before the GPU path.
#include <cublas_api.h>

#include "gpu_libs.h"
#include "train_common.h"

namespace {

using ddprun::worker::detail::GpuLib;

template <class F>
F cublas_fn(const char* name) {
  return reinterpret_cast<F>(ddprun::worker::detail::gpu_lib_symbol(GpuLib::Cublas, name));
}

}  // namespace

namespace train {
void require_cublas() { ddprun::worker::detail::require_gpu_lib(GpuLib::Cublas); }
}  // namespace train

#define DDPRUN_CUBLAS_FORWARD(ret, name, params, args)   \
  extern "C" ret name params {                           \
    static const auto f = cublas_fn<ret(*) params>(#name); \
    return f args;                                       \
  }

DDPRUN_CUBLAS_FORWARD(cublasStatus_t, cublasCreate_v2, (cublasHandle_t * h), (h))
DDPRUN_CUBLAS_FORWARD(cublasStatus_t, cublasDestroy_v2, (cublasHandle_t h), (h))
DDPRUN_CUBLAS_FORWARD(cublasStatus_t, cublasSetStream_v2, (cublasHandle_t h, cudaStream_t s), (h, s))
DDPRUN_CUBLAS_FORWARD(cublasStatus_t, cublasGemmEx,
                      (cublasHandle_t h, cublasOperation_t ta, cublasOperation_t tb, int m, int n, int k,
                       const void* alpha, const void* A, cudaDataType at, int lda, const void* B, cudaDataType bt,
                       int ldb, const void* beta, void* C, cudaDataType ct, int ldc, cublasComputeType_t comp,
                       cublasGemmAlgo_t algo),
                      (h, ta, tb, m, n, k, alpha, A, at, lda, B, bt, ldb, beta, C, ct, ldc, comp, algo))

// Error strings: asked for on error paths, where cuBLAS may be missing; they never throw.
extern "C" const char* cublasGetStatusName(cublasStatus_t s) {
  if (!ddprun::worker::detail::gpu_lib_loadable(GpuLib::Cublas)) return "cuBLAS not loaded";
  static const auto f = cublas_fn<const char* (*)(cublasStatus_t)>("cublasGetStatusName");
  return f(s);
}
extern "C" const char* cublasGetStatusString(cublasStatus_t s) {
  if (!ddprun::worker::detail::gpu_lib_loadable(GpuLib::Cublas)) return "";
  static const auto f = cublas_fn<const char* (*)(cublasStatus_t)>("cublasGetStatusString");
  return f(s);
}
