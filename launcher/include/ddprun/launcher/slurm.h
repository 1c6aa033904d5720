// Slurm detection: inside `srun ... ddprun ...` the settings every torchrun user writes by hand
// (node count, node rank, rendezvous host, run id, GPUs per node) come from the SLURM_*
// environment instead. Pure: environment in, flag values out.
//
// The result is a set of flag values in the same string form as the command line, used only
// for flags the user did not give (on the command line or as PET_<FLAG>): explicit flags win.
// finalize_options() (options.h) applies them unless --no_slurm (PET_NO_SLURM=1) is given.
//
// What counts as a Slurm step: SLURM_JOB_ID and a step id (SLURM_STEP_ID or SLURM_STEPID),
// i.e. a process started by srun. A batch script or an salloc shell has no step id: nothing is
// derived there (a warning says so when the allocation spans several nodes, since ddprun would
// then run on the first node only).
//
// Derived inside a step, each only when not given:
//   --nnodes          SLURM_STEP_NUM_NODES, else SLURM_NNODES, else SLURM_JOB_NUM_NODES
//   --nproc_per_node  the GPUs Slurm gave the task, when it gave any (see below)
//   --rdzv_id         slurm-<job id>.<step id>
//   several nodes (the final --nnodes, derived or given, allows more than one):
//     first host      first name of SLURM_STEP_NODELIST, else SLURM_JOB_NODELIST, else
//                     SLURM_NODELIST (hostlist.h; no scontrol)
//     port            20000 + a hash of "<job id>.<step id>" mod 10000: the same on every node
//                     of the step, and two steps or jobs sharing a node rarely meet
//     --nnodes=N      static rendezvous: --node_rank=SLURM_NODEID, --master_addr=first host,
//                     --master_port=port
//     --nnodes=MIN:MAX  --rdzv_backend=c10d, --rdzv_endpoint=first host:port (elastic: the
//                     first node hosts the rendezvous), and --rdzv_conf=is_host=1 on the node
//                     whose SLURMD_NODENAME is the first host, is_host=0 elsewhere (unless
//                     --rdzv_conf or --rdzv_endpoint is given)
// GPUs: Slurm gave the task GPUs when SLURM_STEP_GPUS, SLURM_GPUS_ON_NODE or SLURM_JOB_GPUS
// says so; their count is CUDA_VISIBLE_DEVICES's entries when set (what the workers will see),
// else the Slurm variable's. That count also answers --nproc_per_node=gpu|auto.
//
// A step with more tasks than nodes (ddprun runs one agent per node) is a usage error unless
// --nnodes is given: it would start several independent worlds.
#pragma once

#include <map>
#include <optional>
#include <string>
#include <vector>

#include "ddprun/launcher/env_map.h"

namespace ddprun::launcher {

struct SlurmDerivation {
  bool in_step = false;  // a Slurm step was detected
  // Flag name (canonical, as in RawOptions) -> value, only for flags absent from `given`.
  std::map<std::string, std::string> flags;
  std::optional<int> gpu_count;  // GPUs Slurm gave this task, when it said
  // One line for the console: what was derived and from where ("" when not in a step).
  std::string summary;
  std::vector<std::string> warnings;
};

// `given`: the flags the user set (command line merged with PET_<FLAG>), canonical names.
// Throws UsageError for SLURM_* values that do not parse (naming the variable and --no_slurm)
// and for a step with more tasks than nodes.
SlurmDerivation derive_from_slurm(const EnvMap& env, const std::map<std::string, std::string>& given);

// The rendezvous port of a step: 20000 + FNV-1a("<job>.<step>") % 10000.
uint16_t slurm_step_port(const std::string& job_id, const std::string& step_id);

}  // namespace ddprun::launcher
