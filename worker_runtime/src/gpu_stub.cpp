#include "ddprun/worker/checks.h"
#include "gpu_backend.h"

namespace ddprun::worker {

bool gpu_backend_available() { return false; }
std::string gpu_backend_problem() {
  return "this is a CPU-only build of libddprun_worker (built without CUDA); install a CUDA build of ddprun";
}
int gpu_device_count() { return 0; }
std::string gpu_no_device_reason() { return "a CPU-only build"; }
void gpu_set_device(int) { throw WorkerError("this build of libddprun_worker has no CUDA support"); }
std::unique_ptr<Communicator> make_nccl_communicator(Store*, int, int, int, std::chrono::milliseconds,
                                                     const std::string&, const std::string&) {
  throw WorkerError("this build of libddprun_worker has no NCCL support");
}

}  // namespace ddprun::worker
