// The seam between the agent and the rest of the job (torchelastic's next_rendezvous, made
// event-driven): the agent joins a round and learns this node's layout for the attempt, reports
// its group's failure or success, and hears the job's decisions as notices, read when fd() is
// readable (the agent's epoll loop watches it). Restart budget, progress and the
// "deterministic failure" rule are the round's (rdzv::RoundState), never the agent's.
//
// Two implementations, one behaviour:
//   - local:  one node. An in-process rdzv::RoundState over the agent's own store server: the
//             workers' store is its main keyspace on its fixed port, emptied for every attempt.
//   - remote: many nodes. The rendezvous client (rdzv::RendezvousClient) of a server hosted by
//             one of the agents or a standing ddprund. Against a standing one it offers a
//             store server of its own with every JOIN and, as node rank 0, hosts the round's
//             workers' store there (so it outlives a restart of the daemon), reporting its
//             progress; it reconnects to a daemon that went away without blocking the agent's
//             loop (take_notices() makes one bounded attempt when fd() says one is due), and
//             a failure or success reported meanwhile is carried by the re-join.
//
// Thread-safety: one owner (the agent's loop thread).
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include "ddprun/launcher/worker_env.h"
#include "ddprun/rdzv/agent_auth.h"
#include "ddprun/rdzv/agent_protocol.h"

namespace ddprun::server {
class StoreServer;
}

namespace ddprun::launcher {

// The coordinator is gone (the rendezvous server closed the connection, a bad message).
class CoordinatorError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};
// A blocking step (the remote one's connect) was abandoned because a stop signal arrived.
class CoordinatorInterrupted : public CoordinatorError {
 public:
  using CoordinatorError::CoordinatorError;
};

struct Notice {
  enum class Kind {
    Round,      // the round this node joined is complete: `layout` (its restart_count is the
                // attempt), `round`, `max_restarts`
    Restart,    // stop the local group (if running) and join the next round: `restart`
    JobDone,    // every node succeeded
    JobFailed,  // the job ended: `failed` (an ERROR from the server becomes one too)
  };
  Kind kind = Kind::JobDone;
  GroupLayout layout;
  int64_t round = 0;
  int max_restarts = 0;
  rdzv::Restart restart;
  rdzv::JobFailed failed;
};

class Coordinator {
 public:
  virtual ~Coordinator() = default;
  // Asks for a place in the next round (non-blocking): a Round or JobFailed notice follows.
  virtual void join() = 0;
  // The local group failed in the current round (`f.round` is filled in here).
  virtual void report_failure(rdzv::Failure f) = 0;
  // Every local worker of the current round exited 0.
  virtual void report_success() = 0;
  // Readable when take_notices() has something. Both implementations answer only through
  // it, never within the call that asked (the local round's answers wait behind an eventfd),
  // so the agent's loop is never re-entered.
  virtual int fd() const = 0;
  // The notices that arrived, in order (non-blocking). Throws CoordinatorError when the
  // coordinator is gone.
  virtual std::vector<Notice> take_notices() = 0;
  // The agent is leaving (finished or failed for good). Never throws.
  virtual void leave() = 0;
  // The address this node advertises to the others (the interface that reaches the
  // rendezvous; the local one: the store's host).
  virtual std::string node_address() const = 0;
};

// `settings`: the JOIN this agent sends (rendezvous_plan.h); `store` hosts the workers' store
// at `store_host`, and must outlive the coordinator.
std::unique_ptr<Coordinator> make_local_coordinator(server::StoreServer& store, rdzv::Join settings,
                                                    std::string store_host);

// What the remote coordinator (the rendezvous client) is given.
struct RemoteCoordinatorOptions {
  std::string host;  // the rendezvous server
  uint16_t port = 0;
  rdzv::Join settings;  // the JOIN this agent sends (rendezvous_plan.h)
  std::string advertise;  // this node's address for the others ("" = the connection's local address)
  std::chrono::milliseconds connect_timeout{600000};  // retrying until then
  std::chrono::milliseconds heartbeat_interval{1000};
  // Asked at least every 100 ms while connecting: yes gives up (CoordinatorInterrupted).
  std::function<bool()> interrupted;
  // The token or munge credentials (none = open) proven to the server, which must prove them
  // back (rdzv/agent_auth.h).
  rdzv::AgentCredentials token;
  // The agent's status snapshot, sent with a heartbeat when it gives one ("" = not now): what
  // `ddprun status --rdzv_endpoint` reads back from the server. Called on the heartbeat thread.
  std::function<std::string()> status_source;
};

// Connects to the rendezvous server. Throws CoordinatorError when the endpoint cannot be
// reached.
std::unique_ptr<Coordinator> make_remote_coordinator(RemoteCoordinatorOptions options);

// The notice a server message means to an agent with `settings` whose workers' store lives at
// `store_host` (shared by both implementations; exposed for tests). Messages that are no
// notice (a heartbeat) give nothing.
std::optional<Notice> notice_of(const rdzv::Message& m, const rdzv::Join& settings, const std::string& store_host);

}  // namespace ddprun::launcher
