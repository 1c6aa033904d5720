// The agent: hosts the workers' store, starts the local worker group, forwards signals,
// stops and restarts the group on failure, relays worker output, and reports.
//
// One thread (plus the store server's): a single epoll loop over a signalfd (SIGCHLD and
// --signals_to_handle), the workers' stdout/stderr pipes and one timerfd. No polling
// interval: a worker's exit is seen the moment the kernel reports it. Decisions are made by
// AgentState (agent_state.h); this file only performs them.
#pragma once

#include "ddprun/launcher/options.h"

namespace ddprun::launcher {

// Runs the job and returns the process exit code: 0 when every worker succeeded; otherwise the
// first failing worker's exit code (128 + signal when killed), 128 + signal when the agent
// was signalled, 1 for an agent-side error. The failure summary is the last thing written to
// stderr. Must be called from the main thread (the workers' parent-death signal follows the
// thread that forked them).
int run(const LaunchOptions& opts, const EnvMap& env);

}  // namespace ddprun::launcher
