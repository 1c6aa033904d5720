// The seam between the agent and the rendezvous: before each attempt the agent asks for this
// node's place in the job (node rank, world layout, attempt number, where the workers' store
// is). Single node today (StaticSingleNodeRendezvous); a multi-node implementation over the
// rendezvous server plugs in here without touching the agent.
#pragma once

#include <cstdint>
#include <stdexcept>
#include <string>

#include "ddprun/launcher/worker_env.h"

namespace ddprun::launcher {

class RendezvousError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

class Rendezvous {
 public:
  virtual ~Rendezvous() = default;
  // Joins the round for attempt `restart_count` (the job-wide restart count) and returns this
  // node's layout. Blocks (bounded by the implementation's timeouts); throws RendezvousError.
  virtual GroupLayout next_round(int restart_count) = 0;
  // The local group failed in `restart_count`: tell the other nodes (no-op on one node).
  virtual void report_local_failure(int restart_count) { (void)restart_count; }
  // The agent is leaving (finished or failed for good).
  virtual void leave() {}
};

// One node, rank 0: the layout follows from the options; the store is the agent's own.
class StaticSingleNodeRendezvous final : public Rendezvous {
 public:
  StaticSingleNodeRendezvous(int nproc_per_node, std::string run_id, std::string store_host,
                             uint16_t store_port)
      : nproc_(nproc_per_node),
        run_id_(std::move(run_id)),
        store_host_(std::move(store_host)),
        store_port_(store_port) {}

  GroupLayout next_round(int restart_count) override {
    GroupLayout g;
    g.node_rank = 0;
    g.num_nodes = 1;
    g.local_world_size = nproc_;
    g.world_size = nproc_;
    g.global_rank_base = 0;
    g.store_host = store_host_;
    g.store_port = store_port_;
    g.run_id = run_id_;
    g.restart_count = restart_count;
    return g;
  }

 private:
  int nproc_;
  std::string run_id_;
  std::string store_host_;
  uint16_t store_port_;
};

}  // namespace ddprun::launcher
