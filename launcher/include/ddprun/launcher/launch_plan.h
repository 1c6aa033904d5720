// Everything the agent needs to run this launch, resolved once, before the agent exists, and
// never changed afterwards: the option sections (options.h), how this node takes part in the
// rendezvous with the token loaded (rendezvous_plan.h), and the spawn template every worker
// is started from (the command, the interpreter, the early exit watch, the NUMA CPU sets).
// Each part of the agent is handed only its own section.
//
// What is left to the agent is what exists only while it runs: descriptors, the worker
// environment's per-attempt variables, and the outcome of binding the store's port.
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "ddprun/launcher/options.h"
#include "ddprun/launcher/process.h"
#include "ddprun/launcher/rendezvous_plan.h"

namespace ddprun::launcher {

struct LaunchPlan {
  LaunchOptions options;
  // With `rendezvous.credential` resolved for a multi-node job: the token (--rdzv_token_file,
  // else DDPRUN_RDZV_TOKEN); without one, inside an srun step, munge; else none.
  RendezvousPlan rendezvous;
  // The executable, argv, exit watch and CPU sets of every worker; the agent adds what
  // exists only while it runs (stdin, the environment per attempt, signals to reset).
  SpawnTemplate spawn;
  // The interpreter of Python workers (entrypoint.h's describe_interpreter), else "".
  std::string interpreter;
  // Warm spares are on for this run (spare_plan.h's spares_enabled).
  bool spares = false;
};

// What make_launch_plan asks the machine; each has a default that asks the real one (tests
// give fixed answers).
struct PlanProbes {
  std::function<bool(const std::string&)> is_local_host;          // an address of this host?
  std::function<bool()> kernel_reports_exit_early;                // process.h
  std::function<bool(const std::string&, uint16_t)> port_served;  // does something listen there?
  // libmunge on this host, talking to munged at `socket` ("" = its default); nullptr and `why`
  // when it cannot be used (rdzv::MungeClient::open).
  std::function<std::shared_ptr<const rdzv::MungeClient>(const std::string& socket, std::string& why)> open_munge;
};

// Resolves `options` into the plan. Throws UsageError for input the user must fix (a bad
// token file, an entry point that cannot run, bad --rdzv_conf values) and NumaError when
// --numa_binding cannot bind on this machine; nothing has been started then.
LaunchPlan make_launch_plan(LaunchOptions options, const EnvMap& env, const PlanProbes& probes = {});

}  // namespace ddprun::launcher
