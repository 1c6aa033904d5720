// The NCCL functions libddprun_worker calls, defined here with nccl.h's signatures and
// forwarded to the libnccl.so.2 that gpu_libs.h loads at run time: the communicator's code calls
// NCCL as if linked to it, while the library itself does not need NCCL to load. They are
// hidden (the library's visibility and version script), so they never stand in for another
// object's NCCL. make_nccl_communicator() calls require_gpu_lib(GpuLib::Nccl) before any of them.
#include <nccl.h>

#include "gpu_libs.h"

namespace {

using ddprun::worker::detail::GpuLib;

template <class F>
F nccl_fn(const char* name) {
  return reinterpret_cast<F>(ddprun::worker::detail::gpu_lib_symbol(GpuLib::Nccl, name));
}

}  // namespace

// One forwarder per function: the pointer is looked up on the first call.
#define DDPRUN_NCCL_FORWARD(ret, name, params, args)                 \
  extern "C" ret name params {                                       \
    static const auto f = nccl_fn<ret(*) params>(#name);             \
    return f args;                                                   \
  }

DDPRUN_NCCL_FORWARD(ncclResult_t, ncclGetUniqueId, (ncclUniqueId * id), (id))
DDPRUN_NCCL_FORWARD(ncclResult_t, ncclCommInitRankConfig,
                    (ncclComm_t * comm, int nranks, ncclUniqueId id, int rank, ncclConfig_t* config),
                    (comm, nranks, id, rank, config))
DDPRUN_NCCL_FORWARD(ncclResult_t, ncclCommFinalize, (ncclComm_t comm), (comm))
DDPRUN_NCCL_FORWARD(ncclResult_t, ncclCommDestroy, (ncclComm_t comm), (comm))
DDPRUN_NCCL_FORWARD(ncclResult_t, ncclCommAbort, (ncclComm_t comm), (comm))
DDPRUN_NCCL_FORWARD(ncclResult_t, ncclCommGetAsyncError, (ncclComm_t comm, ncclResult_t* err), (comm, err))
DDPRUN_NCCL_FORWARD(ncclResult_t, ncclAllReduce,
                    (const void* s, void* r, size_t n, ncclDataType_t t, ncclRedOp_t op, ncclComm_t c, cudaStream_t st),
                    (s, r, n, t, op, c, st))
DDPRUN_NCCL_FORWARD(ncclResult_t, ncclAllGather,
                    (const void* s, void* r, size_t n, ncclDataType_t t, ncclComm_t c, cudaStream_t st),
                    (s, r, n, t, c, st))
DDPRUN_NCCL_FORWARD(ncclResult_t, ncclReduceScatter,
                    (const void* s, void* r, size_t n, ncclDataType_t t, ncclRedOp_t op, ncclComm_t c, cudaStream_t st),
                    (s, r, n, t, op, c, st))
DDPRUN_NCCL_FORWARD(ncclResult_t, ncclBroadcast,
                    (const void* s, void* r, size_t n, ncclDataType_t t, int root, ncclComm_t c, cudaStream_t st),
                    (s, r, n, t, root, c, st))

// The error strings are asked for on error paths only, where NCCL may be missing: they never throw.
extern "C" const char* ncclGetErrorString(ncclResult_t result) {
  if (!ddprun::worker::detail::gpu_lib_loadable(GpuLib::Nccl)) return "NCCL is not loaded";
  static const auto f = nccl_fn<const char* (*)(ncclResult_t)>("ncclGetErrorString");
  return f(result);
}
extern "C" const char* ncclGetLastError(ncclComm_t comm) {
  if (!ddprun::worker::detail::gpu_lib_loadable(GpuLib::Nccl)) return "";
  static const auto f = nccl_fn<const char* (*)(ncclComm_t)>("ncclGetLastError");
  return f(comm);
}
