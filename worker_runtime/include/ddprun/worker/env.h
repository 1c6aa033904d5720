// The worker environment, as torchrun / ddprun / srun set it.
#pragma once

#include <cstdint>
#include <functional>
#include <string>

#include "ddprun/worker/export.h"

namespace ddprun::worker {

struct WorkerEnv {
  int rank = 0;
  int world_size = 1;
  int local_rank = 0;
  int local_world_size = 1;
  int group_rank = 0;                 // node rank (GROUP_RANK / SLURM_NODEID)
  std::string master_addr = "127.0.0.1";
  uint16_t master_port = 29500;
  int restart_count = 0;              // TORCHELASTIC_RESTART_COUNT (attempt number)
  int max_restarts = 0;               // TORCHELASTIC_MAX_RESTARTS
  std::string error_file;             // TORCHELASTIC_ERROR_FILE ("" = none)
  std::string run_id;                 // TORCHELASTIC_RUN_ID
  bool from_slurm = false;            // ranks came from SLURM_* (srun started us directly)
  bool standalone = true;             // no launcher variables at all: a 1-rank run, no store
  // TORCHELASTIC_USE_AGENT_STORE=True: the launcher hosts the store. Otherwise (srun, or the
  // variables set by hand) rank 0 hosts it at MASTER_ADDR:MASTER_PORT, like PyTorch's env://.
  bool use_agent_store = false;
};

using GetEnvFn = std::function<const char*(const char*)>;

// Reads RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, GROUP_RANK, MASTER_ADDR, MASTER_PORT,
// TORCHELASTIC_RESTART_COUNT, TORCHELASTIC_MAX_RESTARTS, TORCHELASTIC_ERROR_FILE,
// TORCHELASTIC_RUN_ID, TORCHELASTIC_USE_AGENT_STORE; when RANK/WORLD_SIZE are absent, SLURM_PROCID, SLURM_LOCALID,
// SLURM_NTASKS, SLURM_NTASKS_PER_NODE / SLURM_STEP_TASKS_PER_NODE, SLURM_NODEID and
// SLURM_LAUNCH_NODE_IPADDR (master address) instead.
// Throws WorkerError naming the variable when a value is malformed or out of range
// (e.g. RANK >= WORLD_SIZE). Pure: reads only through `get`.
DDPRUN_WORKER_API WorkerEnv read_worker_env(const GetEnvFn& get);
DDPRUN_WORKER_API WorkerEnv read_worker_env();  // from the process environment

}  // namespace ddprun::worker
