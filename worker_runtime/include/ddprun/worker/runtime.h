// One-call initialisation of a worker: environment, store, communicator.
//
//   auto rt = ddprun::worker::init();               // reads RANK/WORLD_SIZE/... or SLURM_*
//   ddprun::worker::Reducer reducer(rt->comm(), grads, DType::F32);
//
// Tunables (each with its default here, overridable by the environment variable named):
//   timeout           10 min    DDPRUN_COLLECTIVE_TIMEOUT_S  NCCL init, every collective (NCCL
//                                                            and Gloo) and Gloo's connect, as
//                                                            PyTorch's defaults; a dead peer is
//                                                            seen at once regardless (closed
//                                                            sockets, NCCL's async error)
//   store_timeout       300 s   DDPRUN_STORE_TIMEOUT_S       wait/get on the store during init
//   device             auto     DDPRUN_DEVICE                cpu | cuda | auto (cuda when every
//                                                            local rank can have its own GPU)
//   shared memory        on     DDPRUN_SHM=0 disables        CPU all-reduce through /dev/shm
//                                                            when all ranks share the host
#pragma once

#include <chrono>
#include <exception>
#include <functional>
#include <memory>
#include <string>

#include "ddprun/worker/communicator.h"
#include "ddprun/worker/env.h"
#include "ddprun/worker/export.h"
#include "ddprun/worker/stop.h"
#include "ddprun/worker/store.h"

namespace ddprun::worker {

enum class DeviceKind { Auto, Cpu, Cuda };

struct RuntimeOptions {
  DeviceKind device = DeviceKind::Auto;
  std::chrono::milliseconds timeout{std::chrono::minutes(10)};
  std::chrono::milliseconds store_timeout{std::chrono::seconds(300)};
  bool apply_env_overrides = true;  // read the DDPRUN_* variables above
  // World size 1 on the CPU: build a real (1-rank Gloo) communicator instead of the no-op one,
  // so that collectives forced at world size 1 (ReducerOptions::force_collective) run through
  // the machinery they measure. Without it a lone CPU rank gets a communicator whose
  // collectives return at once.
  bool real_communicator_at_world_size_1 = false;
};

// True when this build has the CUDA/NCCL backend, a GPU is visible and NCCL loads.
DDPRUN_WORKER_API bool cuda_available();

class DDPRUN_WORKER_API Runtime {
 public:
  virtual ~Runtime() = default;
  virtual const WorkerEnv& env() const = 0;
  virtual Communicator& comm() = 0;
  // The store connection (nullptr for a standalone 1-rank run without launcher variables).
  // Keys the runtime itself uses live under "ddprun/"; keep yours elsewhere.
  virtual Store* store() = 0;
  virtual bool on_cuda() const = 0;
  virtual int cuda_device() const = 0;  // LOCAL_RANK when on_cuda()
  int rank() const { return env().rank; }
  int world_size() const { return env().world_size; }
  // stop.h, for this runtime's communicator: whether this rank was asked to stop, and the
  // collective agreement of every rank on stopping now (call it at the same point on every rank).
  bool stop_requested() const { return worker::stop_requested(); }
  bool agree_stop() { return worker::agree_stop(comm()); }
};

// Reads the environment, connects to the store at MASTER_ADDR:MASTER_PORT as a
// PyTorch-compatible client (keys prefixed by '/') — hosted by rank 0 itself unless
// TORCHELASTIC_USE_AGENT_STORE=True (srun-started or hand-set ranks) — and builds the communicator: NCCL when
// running on CUDA (rank 0 publishes the unique id), Gloo otherwise. A 1-rank run without
// launcher variables needs no store. Throws WorkerError (bad env) or CommError (store/peers
// unreachable within the timeouts).
DDPRUN_WORKER_API std::unique_ptr<Runtime> init(RuntimeOptions options = {});

// Last-resort error path of a worker: logs `e`, writes TORCHELASTIC_ERROR_FILE in PyTorch's
// format and returns the exit code (kExitCommFailure for CommError, kExitConfig for ConfigError,
// kExitError otherwise).
DDPRUN_WORKER_API int report_fatal(const std::exception& e, const std::string& where = "");

// Runs body() and turns any exception into report_fatal()'s exit code: the usual main().
DDPRUN_WORKER_API int run_worker_main(const std::function<int()>& body);

}  // namespace ddprun::worker
