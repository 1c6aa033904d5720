// The TCPStore-compatible server: a thin Boost.Asio layer over the pure codec
// (ddprun/wire/codec.h), the pure store state (ddprun/store/store_state.h) and the pure
// rendezvous rounds (ddprun/rdzv/round_state.h), all on one port.
//
// One io_context on one thread, like PyTorch's server, so every request is atomic with
// respect to every other. Bad bytes close only the connection that sent them (and are
// logged); the server and every other client go on.
//
// Thread-safety: start()/stop()/port()/reset_keyspace()/stats() may be called from any
// thread; the state is only touched on the server thread.
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
};

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
  // EADDRINUSE), then serves on a background thread.
  void start();
  // Serves on the calling thread until stop() (used by ddprund).
  void run();
  void stop();
  uint16_t port() const;

  // Empties the main key/value space and queues and closes its TCPStore connections: used by the
  // launcher so that each restart attempt starts from a fresh worker keyspace. Blocks until
  // done on the server thread.
  void reset_keyspace();

  // The integer value of `key` in the main keyspace (e.g. "init/", which every PyTorch client
  // increments on connect), or -1 when absent or not a number. Blocks until the server
  // thread answered.
  int64_t counter(const std::string& key);

  StoreServerStats stats() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace ddprun::server
