#include "ddprun/worker/store.h"

#include "ddprun/client/store_client.h"
#include "ddprun/worker/checks.h"
#include "store_impl.h"

namespace ddprun::worker {

Store::~Store() = default;

namespace {

// The store client's own exceptions are internal types: callers of the public API see
// CommError (recoverable: restart the group), with the client's message.
template <class F>
auto translated(const char* what, F&& f) -> decltype(f()) {
  try {
    return f();
  } catch (const client::StoreError& e) {
    throw CommError(std::string("store ") + what + ": " + e.what());
  }
}

}  // namespace

ClientStore::ClientStore(const client::StoreClientOptions& options)
    : client_(translated("connect", [&] { return std::make_unique<client::StoreClient>(options); })) {}
ClientStore::~ClientStore() = default;

void ClientStore::set(const std::string& key, const std::string& value) {
  translated("set", [&] { client_->set(key, value); });
}
std::string ClientStore::get(const std::string& key, std::chrono::milliseconds timeout) {
  return translated("get", [&] { return client_->get(key, timeout); });
}
void ClientStore::wait(const std::vector<std::string>& keys, std::chrono::milliseconds timeout) {
  translated("wait", [&] { client_->wait(keys, timeout); });
}
int64_t ClientStore::add(const std::string& key, int64_t delta) {
  return translated("add", [&] { return client_->add(key, delta); });
}

void MemoryStore::set(const std::string& key, const std::string& value) {
  {
    std::lock_guard<std::mutex> lk(mu_);
    kv_[key] = value;
  }
  cv_.notify_all();
}
std::string MemoryStore::get(const std::string& key, std::chrono::milliseconds timeout) {
  wait({key}, timeout);
  std::lock_guard<std::mutex> lk(mu_);
  return kv_.at(key);
}
void MemoryStore::wait(const std::vector<std::string>& keys, std::chrono::milliseconds timeout) {
  std::unique_lock<std::mutex> lk(mu_);
  const bool ok = cv_.wait_for(lk, timeout, [&] {
    for (const auto& k : keys)
      if (!kv_.count(k)) return false;
    return true;
  });
  if (!ok) throw CommError("in-process store: keys not set within " + std::to_string(timeout.count()) + " ms");
}
int64_t MemoryStore::add(const std::string& key, int64_t delta) {
  int64_t v = 0;
  {
    std::lock_guard<std::mutex> lk(mu_);
    auto it = kv_.find(key);
    if (it != kv_.end()) v = std::stoll(it->second);
    v += delta;
    kv_[key] = std::to_string(v);
  }
  cv_.notify_all();
  return v;
}

std::unique_ptr<Store> connect_store(const StoreOptions& options) {
  client::StoreClientOptions so;
  so.host = options.host;
  so.port = options.port;
  so.connect_timeout = options.connect_timeout;
  so.pytorch_key_prefix = options.pytorch_key_prefix;
  return std::make_unique<ClientStore>(so);
}

}  // namespace ddprun::worker
