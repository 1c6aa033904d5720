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
// Bad bytes close only the connection that sent them (and are logged); the server and every
// other client go on.
//
// Thread-safety: every public method may be called from any thread.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "ddprun/store/store_state.h"
#include "ddprun/wire/codec.h"

namespace ddprun::server {

struct StoreServerOptions {
  std::string host = "";      // "" = dual-stack any address (falls back to 0.0.0.0)
  uint16_t port = 29500;      // 0 = ephemeral; port() tells which
  int backlog = 0;            // 0 = the system maximum (SOMAXCONN)
  wire::Limits limits{};      // per-request limits; a request over them closes its connection
  // Meaning of the legacy codes 7 and 8 (TCPSTORE §6.2): D0 (1.13/2.0) or D1 (2.1).
  wire::Dialect legacy_dialect = wire::Dialect::D0;
  // Serve the agents' rendezvous rounds (docs/RENDEZVOUS.md) on the same port. Each round
  // gets a fresh workers' store on its own ephemeral port of the same address.
  bool enable_rendezvous = true;
  // I/O threads; 0 = one per core, at most kMaxAutoIoThreads. The launcher's in-process store
  // (a handful of local workers) uses 1; ddprund defaults to 0.
  int io_threads = 1;
};

inline constexpr int kMaxAutoIoThreads = 8;

struct StoreServerStats {
  uint64_t connections_accepted = 0;
  uint64_t connections_open = 0;
  uint64_t connections_closed_for_bad_input = 0;
  uint64_t requests = 0;
  uint64_t agents_connected = 0;  // connections speaking the agents' rendezvous protocol
};

class StoreServer {
 public:
  explicit StoreServer(StoreServerOptions options);
  ~StoreServer();  // stops and joins
  StoreServer(const StoreServer&) = delete;
  StoreServer& operator=(const StoreServer&) = delete;

  // Binds and listens (throws std::system_error with the address on failure, e.g.
  // EADDRINUSE), then serves on background threads until stop() or destruction.
  void start();
  // Closes every connection and joins the threads. Idempotent.
  void stop();
  int io_threads() const;
  uint16_t port() const;

  // Empties the main key/value space and queues and closes its TCPStore connections: used by the
  // launcher so that each restart attempt starts from a fresh worker keyspace. When it
  // returns, no request of an old connection can reach the fresh keyspace (their sockets are
  // closed by their threads right after).
  void reset_keyspace();

  // The integer value of `key` in the main keyspace (e.g. "init/", which every PyTorch client
  // increments on connect), or -1 when absent or not a number.
  int64_t counter(const std::string& key);

  StoreServerStats stats() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace ddprun::server
