// A node's store relay: its workers' TCPStore connections reach the store over ONE connection
// (wire/mux.h), so the store sees a connection per node, not per worker. It listens on
// 127.0.0.1 (an ephemeral port, loopback clients only), and copies bytes both ways without
// parsing them: the store parses each channel as the connection of a client of its own, so
// TCPStore's semantics (every dialect, WAIT, ADD's values, timeouts) are the store's own.
//
// The upstream connection is retried while refused (a store not up yet), as TCPStore clients
// do. When it is lost, every worker connection is closed (their clients fail as on a lost
// store) and so is any later one. Runs on a thread of its own.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>

namespace ddprun::relay {

struct StoreRelayOptions {
  std::string upstream_host;  // the workers' store
  uint16_t upstream_port = 0;
  std::string listen_host = "127.0.0.1";
  // Connecting to the store is retried every connect_retry until connect_timeout has passed.
  std::chrono::milliseconds connect_retry{100};
  std::chrono::milliseconds connect_timeout{std::chrono::minutes(30)};
  // Bytes queued towards one worker that does not read them: past it that worker's connection
  // is dropped (its channel closed), the others go on.
  size_t max_client_buffered = 64u << 20;
  // Bytes queued towards the store: past it the store is treated as lost.
  size_t max_upstream_buffered = 512u << 20;
};

struct StoreRelayStats {
  uint64_t accepted = 0;         // worker connections that became channels
  uint64_t sessions_open = 0;
  uint64_t refused = 0;          // connections closed at accept (not loopback, too many, store lost)
  uint64_t dropped_slow = 0;     // workers dropped for not reading (max_client_buffered)
  bool upstream_connected = false;
  bool upstream_lost = false;
};

class StoreRelay {
 public:
  explicit StoreRelay(StoreRelayOptions options);
  ~StoreRelay();  // stop()
  StoreRelay(const StoreRelay&) = delete;
  StoreRelay& operator=(const StoreRelay&) = delete;

  // Listens and starts its thread; returns the port. Throws std::runtime_error when it cannot
  // listen.
  uint16_t start();
  // Closes everything and joins its thread (idempotent).
  void stop();
  uint16_t port() const { return port_; }
  StoreRelayStats stats() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
  uint16_t port_ = 0;
};

}  // namespace ddprun::relay
