// The key-value store ranks bootstrap through (PyTorch's c10d Store, reduced to what a
// communicator needs). init() connects one (Runtime::store()); connect_store() opens another
// connection to a TCPStore-protocol server (ddprun's, ddprund, or PyTorch's own TCPStore); a
// program may also implement Store itself, e.g. in memory for ranks that are threads of one
// process.
//
// Contract for implementations: thread-safe (a communicator's set-up and the program may use
// one store from several threads); get()/wait() block until the keys exist or the timeout
// passes; every failure (timeout, lost connection) throws CommError.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "ddprun/worker/export.h"

namespace ddprun::worker {

class DDPRUN_WORKER_API Store {
 public:
  virtual ~Store();
  // Sets `key` to `value`, replacing any previous value.
  virtual void set(const std::string& key, const std::string& value) = 0;
  // Waits (at most `timeout`) until `key` exists, then returns its value.
  virtual std::string get(const std::string& key, std::chrono::milliseconds timeout) = 0;
  // Waits (at most `timeout`) until every key exists.
  virtual void wait(const std::vector<std::string>& keys, std::chrono::milliseconds timeout) = 0;
  // Atomically adds `delta` to the decimal integer stored at `key` (absent = 0); returns the
  // new value.
  virtual int64_t add(const std::string& key, int64_t delta) = 0;
};

struct StoreOptions {
  std::string host = "127.0.0.1";
  uint16_t port = 29500;
  // How long to keep retrying the connection while the server is not up yet.
  std::chrono::milliseconds connect_timeout{std::chrono::seconds(60)};
  // Prefix every key with '/' like PyTorch's TCPStore client, so Python peers see the same keys.
  bool pytorch_key_prefix = true;
};

// A client of a TCPStore-protocol server at options.host:options.port. Throws CommError when
// it cannot be reached within options.connect_timeout.
DDPRUN_WORKER_API std::unique_ptr<Store> connect_store(const StoreOptions& options);

}  // namespace ddprun::worker
