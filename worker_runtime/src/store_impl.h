// Internal stores behind the public Store interface: a TCPStore-protocol client (what init()
// and connect_store() hand out) and an in-process one (a lone rank without a launcher, whose
// real communicator still needs a rendezvous).
#pragma once

#include <condition_variable>
#include <map>
#include <memory>
#include <mutex>

#include "ddprun/worker/store.h"

namespace ddprun::client {
class StoreClient;
struct StoreClientOptions;
}  // namespace ddprun::client

namespace ddprun::worker {

// Owns a StoreClient; its StoreError/StoreTimeout surface as CommError.
class ClientStore final : public Store {
 public:
  // Connects; throws CommError when the server cannot be reached.
  explicit ClientStore(const client::StoreClientOptions& options);
  ~ClientStore() override;
  void set(const std::string& key, const std::string& value) override;
  std::string get(const std::string& key, std::chrono::milliseconds timeout) override;
  void wait(const std::vector<std::string>& keys, std::chrono::milliseconds timeout) override;
  int64_t add(const std::string& key, int64_t delta) override;

 private:
  std::unique_ptr<client::StoreClient> client_;
};

// Keys in this process's memory.
class MemoryStore final : public Store {
 public:
  void set(const std::string& key, const std::string& value) override;
  std::string get(const std::string& key, std::chrono::milliseconds timeout) override;
  void wait(const std::vector<std::string>& keys, std::chrono::milliseconds timeout) override;
  int64_t add(const std::string& key, int64_t delta) override;

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  std::map<std::string, std::string> kv_;
};

}  // namespace ddprun::worker
