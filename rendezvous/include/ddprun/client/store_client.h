// A blocking client for PyTorch's TCPStore wire protocol (see docs/PROTOCOL.md).
//
// Works against ddprund / the store ddprun hosts, and against PyTorch's own TCPStore servers
// (1.13 legacy dialect D0, 2.1 D1, 2.2+ D2 with or without PING).
//
// Thread-safety: a StoreClient is safe to share between threads; operations are serialised
// with an internal mutex (the protocol allows one outstanding request per connection).
// Errors: every method throws StoreError (a std::runtime_error) on I/O failure or when the
// server closes the connection; wait() and get() throw StoreTimeout when the timeout passes
// (the connection stays usable on D1/D2 servers thanks to CANCEL_WAIT). Nothing is retried
// silently except the initial connect, which retries until connect_timeout.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include "ddprun/wire/codec.h"

namespace ddprun::client {

class StoreError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

class StoreTimeout : public StoreError {
 public:
  using StoreError::StoreError;
};

struct StoreClientOptions {
  std::string host = "127.0.0.1";
  uint16_t port = 29500;
  // Overall time to keep retrying the connect (ECONNREFUSED while the server starts).
  std::chrono::milliseconds connect_timeout{std::chrono::seconds(60)};
  // Default timeout of wait()/get(); the store owns it, like c10d's Store.
  std::chrono::milliseconds timeout{std::chrono::seconds(300)};
  // Dialect to speak: D2 = PyTorch >= 2.2 servers and ddprund; D1 = 2.1; D0 = 1.13/2.0.
  wire::Dialect dialect = wire::Dialect::D2;
  // Send PING after VALIDATE (2.5+/ddprund). Ignored for legacy dialects.
  bool ping_on_connect = true;
  // Prepend '/' to every key, exactly like PyTorch's TCPStore client, so Python peers see
  // the same keys. Off = keys go on the wire verbatim.
  bool pytorch_key_prefix = true;
  // Like PyTorch's TCPStore(world_size=N): on connect, add 1 to the unprefixed `init/` key.
  // The rendezvous server reads it as "every worker of the round got this far" (progress).
  std::optional<int> world_size;
};

class StoreClient {
 public:
  // Connects (retrying on refusal until connect_timeout) and performs the dialect handshake.
  // Throws StoreError when the server cannot be reached in time.
  explicit StoreClient(StoreClientOptions options);
  ~StoreClient();
  StoreClient(const StoreClient&) = delete;
  StoreClient& operator=(const StoreClient&) = delete;

  void set(const std::string& key, const std::string& value);
  // WAIT for the key (store timeout), then GET it.
  std::string get(const std::string& key);
  std::string get(const std::string& key, std::chrono::milliseconds timeout);
  // GET without waiting: std::nullopt... not distinguishable on the wire; returns "" if missing.
  std::string get_nowait(const std::string& key);
  int64_t add(const std::string& key, int64_t delta);
  // Returns what the server replied (see the COMPARE_SET matrix): `desired` on success.
  std::string compare_set(const std::string& key, const std::string& expected, const std::string& desired);
  bool check(const std::vector<std::string>& keys);
  void wait(const std::vector<std::string>& keys);
  void wait(const std::vector<std::string>& keys, std::chrono::milliseconds timeout);
  int64_t num_keys();
  bool delete_key(const std::string& key);
  void append(const std::string& key, const std::string& value);
  std::vector<std::string> multi_get(const std::vector<std::string>& keys);
  void multi_set(const std::vector<std::string>& keys, const std::vector<std::string>& values);
  void queue_push(const std::string& key, const std::string& value);
  // Blocking pop: WAIT on the queue then QUEUE_POP. Throws StoreTimeout.
  std::string queue_pop(const std::string& key, std::chrono::milliseconds timeout);
  int64_t queue_len(const std::string& key);
  // Keys as PyTorch returns them: leading '/' stripped, keys without '/' dropped
  // (raw wire keys when pytorch_key_prefix is off).
  std::vector<std::string> list_keys();
  // Round-trip a nonce; returns the elapsed time.
  std::chrono::nanoseconds ping();

  wire::Dialect dialect() const { return dialect_; }
  const StoreClientOptions& options() const { return options_; }

 private:
  std::string wire_key(const std::string& key) const;
  void send_all(const std::string& bytes);
  void recv_exact(void* dst, size_t n);
  // Returns false if the deadline passed with no byte available.
  bool wait_readable(std::chrono::steady_clock::time_point deadline);
  uint8_t recv_u8();
  int64_t recv_i64();
  std::string recv_blob();
  void connect_and_handshake();
  void wait_locked(const std::vector<std::string>& wire_keys, std::chrono::milliseconds timeout);

  StoreClientOptions options_;
  wire::Dialect dialect_;
  int fd_ = -1;
  std::mutex mu_;
};

}  // namespace ddprun::client
