// The keyspaces: the main one (TCPStore clients and the agents' rendezvous, on the server's
// port) and one per rendezvous round for that round's workers, on its own listener, so every
// attempt starts empty and no worker of an old attempt can reach the new one's keys. As
// rdzv::WorkerStores, it opens and closes the rounds' stores for the rounds.
//
// Locking: each keyspace has its own lock (`Keyspace::mu`) over its state, its connections
// and their `revoked` flags, so one job's store requests never wait for another's, nor the
// rounds for any of them. The methods here are called under the server's rounds lock (the
// rounds call the WorkerStores methods from inside on_message/on_tick) and take a keyspace's
// lock inside it where they touch its state: the order is rounds lock, then keyspace lock.
#pragma once

#include <atomic>
#include <map>
#include <optional>
#include <mutex>
#include <unordered_map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "ddprun/rdzv/fixed_port_stores.h"
#include "ddprun/rdzv/round_state.h"
#include "ddprun/server/store_server.h"
#include "connection.h"
#include "ddprun/store/store_state.h"
#include "listener.h"
#include "state_lock.h"

namespace ddprun::server {

struct Keyspace {
  Keyspace(const store::StoreLimits& limits, bool adaptive_lock) : mu(adaptive_lock), state(limits) {}
  std::unique_ptr<Listener> listener;
  StateLock mu;  // guards state, conns and their connections' `revoked`
  store::StoreState state;
  std::unordered_map<store::ConnId, ConnPtr> conns;  // its connections (agents too, on the main one)
  uint64_t charged = 0;  // what its state is counted for in the memory budget (under mu)
  std::string name;
  std::string run_id;      // a round's store: its job ("" for the main keyspace)
  std::atomic<bool> discarded{false};  // its round is over (or the server stops): refuse new connections
};

// What the keyspaces need of the server.
class KeyspaceHost {
 public:
  virtual ~KeyspaceHost() = default;
  // Every TCPStore connection of `ks` stops touching state now and is closed by its thread.
  virtual void revoke_locked(const Keyspace* ks) = 0;
  // A listener for a new keyspace (not bound yet).
  virtual std::unique_ptr<Listener> make_listener(const std::string& name) = 0;
  // Starts accepting ks's connections.
  virtual void start_accepting(Keyspace* ks) = 0;
  // Jobs the rounds run now.
  virtual size_t num_jobs_locked() const = 0;
  // Under the rounds lock: whether `n` more descriptors fit the connection limit (connections
  // and listeners count), once unproven connections made room (Admission); else why not.
  virtual std::optional<std::string> no_descriptors_for(size_t n) = 0;
};

class Keyspaces final : public rdzv::WorkerStores {
 public:
  Keyspaces(const StoreServerOptions& options, KeyspaceHost& host, MemoryBudget& budget);
  Keyspace& main() { return *main_; }
  bool is_main(const Keyspace* ks) const { return ks == main_.get(); }
  // Empties the main keyspace and revokes its TCPStore connections.
  void reset_main_locked();
  // The server stops: no keyspace takes new connections.
  void discard_all_locked();
  // Drops every keyspace (the server is going; its threads have stopped).
  void destroy();
  // fn(Keyspace&) for each keyspace, live and retired (under the rounds lock).
  template <class F>
  void for_each(F&& fn) {
    fn(*main_);
    for (auto& [_, ks] : rounds_) fn(*ks);
    for (auto& ks : retired_) fn(*ks);
  }
  // Frees the retired keyspaces that nothing names any more (under the rounds lock).
  void reap_retired_locked();
  size_t retained() const { return retained_.load(std::memory_order_relaxed); }
  std::string jobs_limit_message() const;
  // Descriptors of the listeners of every live keyspace.
  uint64_t listener_descriptors() const { return listener_fds_; }
  void main_listening() { listener_fds_ += main_->listener->sockets(); }

  uint16_t open(const std::string& run_id, int64_t round, bool fixed_port) override;
  uint16_t reopen(const std::string& run_id, int64_t round, bool fixed_port, uint16_t port) override;
  void resumed(const std::string& run_id, int64_t round, bool agent_hosted) override;
  void close(const std::string& run_id, int64_t round) override;
  bool progressed(const std::string& run_id, int64_t round, int64_t world_size) override;

 private:
  uint16_t open_on(const std::string& run_id, int64_t round, bool fixed_port, uint16_t want);

  // The main keyspace as the rounds whose workers' store it is see it.
  struct MainView final : rdzv::MainKeyspace {
    explicit MainView(Keyspaces& k) : ks(k) {}
    void reset() override { ks.reset_main_locked(); }
    std::optional<int64_t> integer(const std::string& key) override {
      std::lock_guard lock(ks.main_->mu);
      return ks.main_->state.integer(key);
    }
    uint16_t port() const override { return ks.main_->listener ? ks.main_->listener->port() : 0; }
    Keyspaces& ks;
  };

  const StoreServerOptions& options_;
  KeyspaceHost& host_;
  MemoryBudget& budget_;
  std::atomic<uint64_t> listener_fds_{0};
  std::unique_ptr<Keyspace> main_;
  std::map<std::pair<std::string, int64_t>, std::unique_ptr<Keyspace>> rounds_;
  // Rounds that ended: emptied and closed, kept until nothing names them (reap_retired_locked:
  // pending accept handlers, connections not yet closed by their threads).
  std::vector<std::unique_ptr<Keyspace>> retired_;
  std::atomic<size_t> retained_{0};  // retired_.size(), for stats without the lock
  MainView main_view_{*this};
  // Rounds whose workers' store is the main keyspace (Join::fixed_store_port), by the rule
  // shared with the launcher's in-process rounds.
  rdzv::FixedPortStores main_rounds_{main_view_};
};

}  // namespace ddprun::server
