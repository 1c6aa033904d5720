// The agent: takes part in the job's rendezvous (coordinator.h: an in-process round for one
// node, the rendezvous server for many), starts the local worker group for each round, forwards
// signals, reports failures and success, follows the round's restarts, relays worker output,
// and prints the failure summary.
//
// Threads: the loop's (the caller's) plus those of the store server when this process hosts
// one, and the rendezvous client's heartbeat thread on many nodes. The loop is one epoll set
// over a signalfd (SIGCHLD and --signals_to_handle), the coordinator's descriptor, the workers'
// stdout/stderr pipes and exit watches, and two timerfds (the running attempt's grace/kill
// wait; the earliest deadline of the retiring groups). No polling interval: a worker's exit
// is seen the moment the kernel reports it. Decisions are made by AgentState (agent_state.h)
// and the round (rdzv::RoundState); agent.cpp only performs them.
#pragma once

#include "ddprun/launcher/launch_plan.h"

namespace ddprun::launcher {

// Runs the job the plan describes (launch_plan.h: resolved before the agent exists) and returns the process exit code:
// 0 when every worker succeeded; otherwise the first failing worker's exit code (128 + signal when killed), 128 +
// signal when the agent was signalled (also while connecting to the rendezvous), 2 for bad usage, 1 for an agent-side
// error. The failure summary is the last thing written to stderr. Must be called from the main thread (the workers'
// parent-death signal follows the thread that forked them).
int run(const LaunchPlan& plan, const EnvMap& env);

}  // namespace ddprun::launcher
