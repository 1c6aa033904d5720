// The one place that hosts a store server in the agent's process (internal to launcher/src):
// one node's store and rendezvous (Agent::host_server) and the workers' store a node offers a
// standing rendezvous server with every JOIN (the remote coordinator).
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "ddprun/server/store_server.h"

namespace ddprun::launcher {

struct StoreHosting {
  std::string listen_host;  // "" = every address
  uint16_t port = 0;        // 0 = a free port
  int io_threads = 1;       // 0 = one per core
  bool serve_rendezvous = false;
  std::string rdzv_token;         // "" = none
  rdzv::MungeCredentialCheck rdzv_munge;  // Slurm's munge, when the agents prove membership with it
  bool restrict_main_store = false;  // only loopback and the round's peers (server options)
  bool accept_later = false;         // bound, accepting once accept_clients() is called
  // Set before the server starts (set_store_peers): the only addresses its main store accepts
  // besides loopback.
  std::optional<std::vector<std::string>> store_peers;
};

// Raises the descriptor limit (each connection costs the server one), starts the server, and
// gives it the console policy for strangers: one line on the job's console, the rest with -v.
// Throws what StoreServer throws (a port that cannot be bound).
std::unique_ptr<server::StoreServer> host_store(const StoreHosting& h);

}  // namespace ddprun::launcher
