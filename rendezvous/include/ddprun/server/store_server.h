// The TCPStore-compatible server: a thin Boost.Asio layer over the pure codec
// (ddprun/wire/codec.h), the pure store state (ddprun/store/store_state.h) and the pure
// rendezvous rounds (ddprun/rdzv/round_state.h), all on one port.
//
// Threads: `io_threads` I/O threads, each with its own io_context; a connection lives on one
// of them (round-robin at accept) and its socket is read and written only there, so the
// system calls of different connections run in parallel. The store state and the rounds sit
// behind one mutex, held only while a request is applied: every request is atomic with
// respect to every other, as on PyTorch's one-thread server. Bytes owed to a connection (its
// own reply, a WAIT wake-up, a barrier release, a ROUND) are appended to its outbox under
// that mutex, so they reach the wire in the order the state produced them, whichever thread
// caused them; the owning thread writes them.
//
// Bad bytes close only the connection that sent them (and are logged, at most one line per
// second per kind with a count of the ones left out); the server and every other client go on.
// No exception leaves a handler: one thrown while serving a connection closes that connection.
// Running out of descriptors (EMFILE/ENFILE) pauses accepting briefly; the server keeps serving.
//
// Parts (private, rendezvous/src/server/): a listener per keyspace, the connections (framing,
// outbox, back-pressure), admission (token handshake, stranger filter, connection limit),
// the keyspaces (the main one and each round's workers' store) and the dispatch of requests
// to the store states and the rounds.
//
// Resource limits (each a ddprund flag, docs/PROTOCOL.md "Limits"): total connections, jobs,
// per-request lengths (wire::Limits), what one keyspace holds and one reply carries
// (store::StoreLimits), bytes buffered per connection and in all. Past one, the offending
// connection is closed (an agent first gets an ERROR saying which limit), never the server.
//
// Thread-safety: every public method may be called from any thread.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <iterator>
#include <memory>
#include <string>
#include <vector>

#include "ddprun/rdzv/munge_auth.h"
#include "ddprun/store/store_state.h"
#include "ddprun/wire/codec.h"

namespace ddprun::server {

inline constexpr uint64_t kDefaultMaxConnections = 65536;
inline constexpr uint64_t kDefaultMaxJobs = 1024;
inline constexpr uint64_t kDefaultMaxConnectionBufferedBytes = 256ull * 1024 * 1024;
inline constexpr uint64_t kDefaultMaxBufferedBytes = 1ull << 30;
inline constexpr uint64_t kDefaultMaxMemory = 4ull << 30;
inline constexpr int kDefaultSocketBufferBytes = 128 * 1024;
inline constexpr std::chrono::milliseconds kDefaultFirstBytesTimeout{30000};
inline constexpr std::chrono::milliseconds kDefaultHandshakeTimeout{5000};

struct StoreServerOptions {
  std::string host = "";       // "" = dual-stack any address (falls back to 0.0.0.0)
  uint16_t port = 29500;       // 0 = ephemeral; port() tells which
  int backlog = 0;             // 0 = the system maximum (SOMAXCONN)
  wire::Limits limits{};       // per-request limits; a request over them closes its connection
  store::StoreLimits store{};  // per keyspace (a job's round store, the main store) and per reply
  // Open connections of every keyspace together; past it (or past the descriptor limit less a
  // reserve) a new connection is closed at once.
  uint64_t max_connections = kDefaultMaxConnections;
  // Connections from addresses that are neither loopback nor the host of an admitted agent
  // (nor a store peer), open at once; 0 = half of max_connections. Past it a stranger's new
  // connection takes the slot of the stranger's oldest unproven connection, or is closed at once
  // (admission.h "Slots"), so admitted agents' hosts (members) always find slots.
  uint64_t max_stranger_connections = 0;
  // A connection that has not sent enough to tell its protocol, or a TCPStore client that has
  // made no request after VALIDATE, this long after it connected is closed; so is an agent that
  // has not finished the token handshake within handshake_timeout of announcing itself.
  // 0 = no deadline.
  std::chrono::milliseconds first_bytes_timeout = kDefaultFirstBytesTimeout;
  std::chrono::milliseconds handshake_timeout = kDefaultHandshakeTimeout;
  // Rendezvous jobs at once; a JOIN that would create one more gets an ERROR.
  uint64_t max_jobs = kDefaultMaxJobs;
  // Bytes one connection may have queued for sending (its peer does not read): past it, closed.
  uint64_t max_connection_buffered_bytes = kDefaultMaxConnectionBufferedBytes;
  // Bytes of partly received requests of every connection together: a connection whose request
  // would grow past it is closed.
  uint64_t max_buffered_bytes = kDefaultMaxBufferedBytes;
  // One budget for the whole server (memory_budget.h): stored data of every keyspace, the keys
  // waiters and watchers name, replies and events queued for every connection (by wire size),
  // and partly received requests. A request that would pass it is refused (its connection
  // closed with a warning naming --max-memory; agents' small messages are always served). A
  // connection whose queued replies stay small may use a reserve of an eighth past it, so
  // clients that read their replies stay served.
  uint64_t max_memory = kDefaultMaxMemory;
  // SO_SNDBUF and SO_RCVBUF of every connection (the kernel doubles them for its bookkeeping):
  // what the kernel holds for one peer is bounded (its autotuning goes to 4 MiB sent and 32 MiB
  // received per connection on common settings), outside the budget. 0: the kernel's autotuning.
  int socket_buffer_bytes = kDefaultSocketBufferBytes;
  // Meaning of the legacy codes 7 and 8 (TCPSTORE §6.2): D0 (1.13/2.0) or D1 (2.1).
  wire::Dialect legacy_dialect = wire::Dialect::D0;
  // Serve the agents' rendezvous rounds (docs/RENDEZVOUS.md) on the same port. Each round
  // gets a fresh workers' store on its own ephemeral port of the same address, unless its node
  // rank 0's agent hosts it (rdzv/round_state.h "Agent-hosted stores").
  bool enable_rendezvous = true;
  // The rendezvous token (rdzv/agent_auth.h): "" = the rendezvous is open to anyone who can
  // connect. With one, an agent must prove it holds the same token before its messages reach
  // the rounds; one that cannot is refused and changes nothing.
  std::string rdzv_token;
  // Without a token: when set, only agents whose munge credential it accepts are admitted
  // (rdzv/munge_auth.h; the launcher inside a Slurm step).
  rdzv::MungeCredentialCheck rdzv_munge;
  // TCPStore clients of the main keyspace (not agents) must come from loopback, from the
  // address of an agent in a job's current round, or from set_store_peers(), as for the
  // rounds' own stores (always so restricted when enable_rendezvous). For the launcher hosting
  // a multi-node job or a round's workers' store, whose main keyspace is the workers' store; a
  // standing ddprund sets it when it has a rendezvous token (unless --store-from-any-address).
  bool restrict_main_store = false;
  // A standing daemon (ddprund), not an agent hosting its job: agents that lose it reconnect
  // and re-join their running round (round_state.h "Resume"); told in the handshake.
  bool standing = false;
  // start() binds the port (port() tells it) but takes no connection until accept_clients():
  // a client connecting before then is refused (ECONNREFUSED), which TCPStore clients retry.
  // For an agent that offers its store to a round before it knows whom the store must admit.
  bool accept_later = false;
  // I/O threads; 0 = one per core, at most kMaxAutoIoThreads. The launcher's in-process store
  // (a handful of local workers) uses 1; ddprund defaults to 0.
  int io_threads = 1;
  // Where warnings about peers go (bad bytes, limits, strangers, accept errors), already limited
  // to one line per second per kind. Empty: spdlog's warning level (ddprund's own console). The
  // launcher hosting a job passes its own, so that strangers cannot fill the job's console.
  std::function<void(const std::string&)> peer_warning;
  // Put before every line the server logs (warnings and its spdlog lines), e.g. "[ddprund] ".
  std::string log_prefix;
  // The state lock spins briefly before sleeping (an adaptive mutex); false: a plain mutex,
  // to compare in benchmarks (ddprund reads DDPRUN_STORE_LOCK for it).
  bool adaptive_lock = true;
  // Count requests by operation and time each one (StoreServer::metrics()): a few relaxed
  // per-thread counters and one clock read per request. Off: nothing of it on the request path.
  bool collect_metrics = false;
};

inline constexpr int kMaxAutoIoThreads = 8;

struct StoreServerStats {
  uint64_t connections_accepted = 0;
  uint64_t connections_open = 0;
  uint64_t connections_closed_for_bad_input = 0;
  uint64_t requests = 0;
  uint64_t agents_connected = 0;                 // connections speaking the agents' rendezvous protocol
  uint64_t connections_refused_over_limit = 0;   // closed at accept: --max-connections or descriptors
  uint64_t accept_errors = 0;                    // EMFILE and the like
  uint64_t agents_refused = 0;                   // agents refused by the token handshake
  uint64_t store_clients_refused = 0;            // workers' store connections from strangers' addresses
  uint64_t connections_closed_for_deadline = 0;  // silent, or an agent not through the handshake in time
  uint64_t strangers_refused = 0;                // closed at accept: --max-stranger-connections
  uint64_t longest_lock_hold_us = 0;             // the longest any operation held a state lock
  // What held it: the operation and its count, e.g. "round completion, 16000 agents".
  std::string longest_lock_holder;
  // Each operation's longest hold (lock_holds.h in the server), longest first.
  struct LockHold {
    std::string site;  // "round completion", "HEARTBEAT", "store requests", ...
    std::string what;  // with its count: "round completion, 16000 agents"
    uint64_t longest_us = 0;
    uint64_t count = 0;  // the agents the rounds knew (a batch's requests for "store requests")
  };
  std::vector<LockHold> lock_holds;
  uint64_t round_stores_retained = 0;  // rounds' stores that ended and are not freed yet
  // Store relays' connections among connections_open, and the clients' channels over them (each
  // served as a connection of its own, without a descriptor).
  uint64_t relay_connections_open = 0;
  uint64_t relay_sessions_open = 0;
};

// What StoreServer::metrics() reads: the stats, plus what ddprund exports to Prometheus
// (rendezvous/src/metrics/store_metrics.h turns it into metric families).
struct StoreServerMetrics {
  // Operations counted: every wire::Op, then the agents' rendezvous messages (kAgentOp).
  static constexpr size_t kOps = 21;
  static constexpr size_t kAgentOp = kOps - 1;
  // Upper bounds of the request-duration histogram's buckets, in nanoseconds (+Inf after them).
  static constexpr uint64_t kBucketNs[] = {1'000,     2'500,     5'000,      10'000,      25'000,
                                           50'000,    100'000,   250'000,    500'000,     1'000'000,
                                           2'500'000, 5'000'000, 10'000'000, 100'000'000, 1'000'000'000};
  static constexpr size_t kBuckets = std::size(kBucketNs) + 1;
  StoreServerStats stats;
  bool collected = false;  // StoreServerOptions::collect_metrics: requests and durations below
  uint64_t requests_by_op[kOps] = {};
  uint64_t duration_buckets[kBuckets] = {};  // not cumulative; the last is past every bound
  uint64_t duration_sum_ns = 0;
  uint64_t keys = 0;                // keys (and queues) of every store: the main one, each round's
  uint64_t stored_bytes = 0;        // bytes of their keys and values (and the keys waiters name)
  uint64_t keyspaces = 0;           // the main store and each round's (live or retiring)
  uint64_t jobs = 0;                // rendezvous jobs
  uint64_t agents = 0;              // agents in those jobs
  uint64_t refused_jobs = 0;        // --max-jobs
  uint64_t closed_for_memory = 0;   // --max-memory
  uint64_t closed_for_buffers = 0;  // --max-connection-buffered-bytes, --max-buffered-bytes
};

// The least request limit that fits a SET (or MULTI_SET of one) of the longest key and value.
uint64_t min_request_bytes(const wire::Limits& l);

// Raises this process's soft descriptor limit to its hard limit (thousands of clients need
// thousands of descriptors); returns the soft limit now in force.
uint64_t raise_fd_limit();

class ServerCore;

class StoreServer {
 public:
  explicit StoreServer(StoreServerOptions options);
  ~StoreServer();  // stops and joins
  StoreServer(const StoreServer&) = delete;
  StoreServer& operator=(const StoreServer&) = delete;

  // Checks that the limits agree (throws std::invalid_argument saying which flag to change,
  // e.g. a request limit too small for a SET of the longest value), binds and listens (throws
  // std::system_error with the address on failure, e.g. EADDRINUSE), then serves on background threads until stop() or
  // destruction.
  void start();
  // Closes every connection and joins the threads. Idempotent.
  void stop();
  int io_threads() const;
  uint16_t port() const;

  // With accept_later: starts taking connections (once; otherwise nothing). Throws
  // std::system_error when the bound port cannot be listened on.
  void accept_clients();

  // Addresses whose TCPStore clients the main keyspace admits besides loopback and the agents
  // of the rounds (with restrict_main_store), replacing the previous ones; it decides at a
  // connection's first request. Returns the entries that are no IP address (not admitted).
  std::vector<std::string> set_store_peers(const std::vector<std::string>& addresses);

  // Empties the main key/value space and queues and closes its TCPStore connections: used by the
  // launcher so that each restart attempt starts from a fresh worker keyspace. When it
  // returns, no request of an old connection can reach the fresh keyspace (their sockets are
  // closed by their threads right after).
  void reset_keyspace();

  // The integer value of `key` in the main keyspace (e.g. "init/", which every PyTorch client
  // increments on connect), or -1 when absent or not a number.
  int64_t counter(const std::string& key);

  StoreServerStats stats() const;
  // The stats and the metrics (keys and bytes: each store's lock taken briefly in turn).
  StoreServerMetrics metrics() const;

 private:
  std::unique_ptr<ServerCore> impl_;
};

}  // namespace ddprun::server
