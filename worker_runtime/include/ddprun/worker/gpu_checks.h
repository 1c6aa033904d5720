// Check macros for CUDA, NCCL and cuBLAS calls: file:line, the expression and the library's
// own error string, thrown as WorkerError (or CommError for NCCL). Include only from code
// compiled against the CUDA toolkit.
#pragma once

#include <cuda_runtime_api.h>

#include <string>

#include "ddprun/worker/checks.h"

#define DDPRUN_CUDA_CHECK(expr)                                                                   \
  do {                                                                                            \
    cudaError_t ddprun_e_ = (expr);                                                               \
    if (ddprun_e_ != cudaSuccess)                                                                 \
      throw ::ddprun::worker::WorkerError(std::string(__FILE__) + ":" + std::to_string(__LINE__) + \
                                          ": " #expr ": " + cudaGetErrorName(ddprun_e_) + ": " +  \
                                          cudaGetErrorString(ddprun_e_));                         \
  } while (0)

#ifdef NCCL_H_
#define DDPRUN_NCCL_CHECK(expr)                                                                    \
  do {                                                                                             \
    ncclResult_t ddprun_r_ = (expr);                                                               \
    if (ddprun_r_ != ncclSuccess && ddprun_r_ != ncclInProgress)                                   \
      throw ::ddprun::worker::CommError(std::string(__FILE__) + ":" + std::to_string(__LINE__) +    \
                                        ": " #expr ": " + ncclGetErrorString(ddprun_r_) + " (" +   \
                                        ncclGetLastError(nullptr) + ")");                          \
  } while (0)
#endif

#ifdef CUBLAS_API_H_
#define DDPRUN_CUBLAS_CHECK(expr)                                                                  \
  do {                                                                                             \
    cublasStatus_t ddprun_s_ = (expr);                                                             \
    if (ddprun_s_ != CUBLAS_STATUS_SUCCESS)                                                        \
      throw ::ddprun::worker::WorkerError(std::string(__FILE__) + ":" + std::to_string(__LINE__) +  \
                                          ": " #expr ": " + cublasGetStatusName(ddprun_s_) + ": " + \
                                          cublasGetStatusString(ddprun_s_));                       \
  } while (0)
#endif
