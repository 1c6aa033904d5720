// How this agent takes part in a job, resolved once from the nodes and rendezvous sections: whether the round runs
// in this process (one node) or on a rendezvous server (many), whether this process hosts the
// server and on which port, where the workers' store is, and the job-wide settings sent in
// every JOIN. The agent reads the plan; it never re-interprets --rdzv_backend or the endpoint.
//
// Pure apart from the `is_local_host` question, which the caller answers (client::is_local_address
// in the agent, a fixed answer in tests).
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <string>
#include <variant>

#include "ddprun/launcher/options.h"
#include "ddprun/rdzv/agent_auth.h"
#include "ddprun/rdzv/agent_protocol.h"
#include "ddprun/rdzv/munge_auth.h"

namespace ddprun::launcher {

inline constexpr uint16_t kDefaultMasterPort = 29500;

// Who may join a multi-node rendezvous, decided once by the launch plan (the token file read,
// munge loaded) and handed on as one value.
struct TokenCredential {  // the same token on every node (--rdzv_token_file, else DDPRUN_RDZV_TOKEN)
  std::string token;
};
struct MungeCredential {  // no token, inside an srun step: munge proves membership
  rdzv::MungeScope scope;
  rdzv::MungeCredentialMaker make;   // this agent's credential, per connection
  rdzv::MungeCredentialCheck check;  // the hosting agent's check of every agent's
};
struct NoCredential {        // open to anyone who can reach it
  std::string why_no_munge;  // inside an srun step: why munge could not be used
};
using RendezvousCredential = std::variant<NoCredential, TokenCredential, MungeCredential>;

// What the agent's connections prove with, and what a hosting server requires.
rdzv::AgentCredentials agent_credentials(const RendezvousCredential& c);
std::string server_token(const RendezvousCredential& c);  // "" unless a token
rdzv::MungeCredentialCheck server_munge_check(const RendezvousCredential& c);

struct RendezvousPlan {
  // One node: the round runs in-process (LocalCoordinator) on this agent's own store.
  // Otherwise the agent is a client of the rendezvous server at endpoint_host:endpoint_port.
  bool local = true;
  // Run a store server in this process: always for one node; for many, when this node hosts
  // the rendezvous (static: node rank 0; c10d: the endpoint is an address of this host, or
  // --rdzv_conf is_host says so).
  bool host_server = true;
  // The hosting was asked for explicitly (static node 0, is_host=1): a taken port is an error.
  // Otherwise (c10d, endpoint on this host) a taken port means someone already serves the
  // rendezvous there (a standing ddprund, another agent): join it as a client.
  bool host_explicit = false;
  // host_server: the address to listen on ("" = every address). One node whose workers reach
  // the store over loopback listens on loopback only: nobody else has business there.
  std::string listen_host;
  uint16_t listen_port = 0;         // host_server: where to listen (0 = a free port)
  bool free_port_fallback = false;  // listen_port taken: use a free port instead (no port given)
  int server_io_threads = 1;        // 1 for one node's few workers; 0 (one per core) for a job
  bool serve_rendezvous = false;    // the server answers the agents' protocol (many nodes only)
  std::string endpoint_host;        // !local: the rendezvous server
  uint16_t endpoint_port = 0;
  // local: the workers' MASTER_ADDR (their store is ours). Remote: the endpoint's host.
  std::string store_host = "127.0.0.1";
  // Job-wide settings and this node's wishes, as sent in JOIN (node_id and host are filled in
  // once connected).
  rdzv::Join join;
  // Who may join. Resolving it is I/O, so resolve_plan leaves it open; the launch plan
  // (launch_plan.h) resolves it for a multi-node job.
  RendezvousCredential credential;
  std::chrono::milliseconds connect_timeout{600000};  // = join_timeout
  std::chrono::milliseconds heartbeat_interval{1000};
  // The port came from --rdzv_endpoint (c10d) rather than --master_port: for the wording of
  // bind failures only.
  bool port_from_endpoint = false;
};

// What the agent does when its store server cannot listen on plan.listen_port.
struct BindFallback {
  enum class Kind {
    UseFreePort,   // listen on a free port instead (one node, no port given)
    JoinAsClient,  // someone serves the rendezvous there already: join it (plan changed)
    Fail,          // a usage-level error: `message` says what to change
  };
  Kind kind = Kind::Fail;
  std::string message;  // UseFreePort / JoinAsClient: the info line; Fail: the error
  RendezvousPlan plan;  // the plan to go on with (JoinAsClient: no hosting, no rank-0 wish)
};

// The decision and its wording for "plan.listen_port could not be bound: `why`". Pure.
BindFallback on_bind_failure(const RendezvousPlan& plan, const std::string& why);

// Throws UsageError for bad --rdzv_conf values or an endpoint that does not parse.
// `env` supplies DDPRUN_DEFAULT_STORE_PORT (a test seam: the port tried first when none is
// given, which tests hold to force the fallback). `port_served` (may be empty) answers whether
// something already listens on host:port; a one-node c10d job joins it as a client.
RendezvousPlan resolve_plan(const NodeOptions& nodes, const RendezvousOptions& rendezvous, int max_restarts,
                            const EnvMap& env, const std::function<bool(const std::string&)>& is_local_host,
                            const std::function<bool(const std::string&, uint16_t)>& port_served = {});

}  // namespace ddprun::launcher
