// Internal seam between the host runtime and the optional CUDA/NCCL backend. Without CUDA
// (src/gpu_stub.cpp) every query says "no GPU" and the factories throw.
#pragma once

#include <chrono>
#include <memory>
#include <string>

#include "ddprun/worker/communicator.h"
#include "ddprun/worker/store.h"

namespace ddprun::worker {

// True when this build has the backend and its libraries load (NCCL is loaded at run time:
// gpu/gpu_libs.h); gpu_backend_problem() says why not, in a line that says what to install.
bool gpu_backend_available();
std::string gpu_backend_problem();
int gpu_device_count();
// Why gpu_device_count() is 0 (the CUDA runtime's error: no driver, no device).
std::string gpu_no_device_reason();
void gpu_set_device(int device);
// NCCL communicator: rank 0 creates the unique id and SETs it in the store, the others
// WAIT+GET it; ncclCommInitRank; a watchdog polls ncclCommGetAsyncError and the age of the
// oldest unfinished collective, and on error/timeout aborts the communicator, writes the
// error file and exits the process with kExitCommFailure. `store` may be null for size 1.
// The unique id goes under `key_prefix` + "unique_id".
std::unique_ptr<Communicator> make_nccl_communicator(Store* store, int rank, int size, int device,
                                                     std::chrono::milliseconds timeout, const std::string& error_file,
                                                     const std::string& key_prefix);

}  // namespace ddprun::worker
