// The one home of two round-store rules shared by the store server (ddprund and a hosting
// agent) and the launcher's in-process coordinator:
//  - progress: a round's workers made progress once all of them joined its store, which every
//    worker store client shows by adding 1 to kWorkerJoinKey when it connects (read by whoever
//    hosts the store: the server, or node rank 0's agent, which reports it: rdzv::Progress);
//  - fixed port (Join::fixed_store_port): a round's store is the server's main keyspace,
//    emptied (its TCPStore connections closed) when the round opens and when it closes, so
//    every round has the server's own port and no retiring worker reaches the next round's keys.
// Header-only and pure: the keyspace itself is reached through MainKeyspace.
#pragma once

#include <cstdint>
#include <optional>
#include <set>
#include <string>
#include <utility>

namespace ddprun::rdzv {

// The counter that PyTorch's TCPStore clients (1.13-2.11) and libddprun_worker's client add 1
// to when they connect.
inline constexpr const char* kWorkerJoinKey = "init/";

// Whether all `world_size` workers joined a store whose kWorkerJoinKey holds `joined`.
inline bool all_workers_joined(std::optional<int64_t> joined, int64_t world_size) {
  return joined.value_or(0) >= world_size;
}

// A store server's main keyspace, as the fixed-port rule needs it.
class MainKeyspace {
 public:
  virtual ~MainKeyspace() = default;
  // Empties it and closes its TCPStore connections; when it returns no old request reaches it.
  virtual void reset() = 0;
  virtual std::optional<int64_t> integer(const std::string& key) = 0;
  virtual uint16_t port() const = 0;
};

// WorkerStores' fixed-port half, over one main keyspace. Not thread-safe: the caller serialises
// (the server calls it under its mutex; the in-process coordinator from the agent's thread).
class FixedPortStores {
 public:
  explicit FixedPortStores(MainKeyspace& ks) : ks_(ks) {}

  uint16_t open(const std::string& run_id, int64_t round) {
    ks_.reset();
    rounds_.insert({run_id, round});
    return ks_.port();
  }
  // False when (run_id, round) is not one of its rounds (nothing done).
  bool close(const std::string& run_id, int64_t round) {
    if (!rounds_.erase({run_id, round})) return false;
    ks_.reset();
    return true;
  }
  // nullopt when (run_id, round) is not one of its rounds.
  std::optional<bool> progressed(const std::string& run_id, int64_t round, int64_t world_size) {
    if (!rounds_.count({run_id, round})) return std::nullopt;
    return all_workers_joined(ks_.integer(kWorkerJoinKey), world_size);
  }

 private:
  MainKeyspace& ks_;
  std::set<std::pair<std::string, int64_t>> rounds_;
};

}  // namespace ddprun::rdzv
