// The store's state: key/value map, FIFO queues, waiters, barriers and D0 watchers.
// Pure: no sockets, no threads, no clock. The server feeds it parsed requests and sends
// what it returns; tests drive it directly.
//
// Thread-safety: none; the owner serialises calls (the server holds its state lock).
#pragma once

#include <cstdint>
#include <deque>
#include <optional>
#include <string>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "ddprun/wire/codec.h"

namespace ddprun::store {

using ConnId = uint64_t;

// Bytes to send to another connection as a consequence of a request (a deferred WAIT
// reply, a barrier release, a watch event).
struct Outgoing {
  ConnId conn;
  std::string bytes;
};

struct ApplyResult {
  bool close = false;  // protocol error: close the requesting connection, nothing changed
  std::string error;   // why, for the log
};

class StoreState {
 public:
  // Applies `req` from `conn` (whose dialect is `d`, for reply and event formats). Appends the
  // reply for `conn` to `reply` (nothing when deferred, e.g. a WAIT on missing keys) and
  // anything owed to other connections to `others`.
  ApplyResult apply(ConnId conn, wire::Dialect d, const wire::Request& req, std::string& reply,
                    std::vector<Outgoing>& others);

  // The connection went away: forget its waiter, barrier wait and watches.
  void disconnect(ConnId conn);

  // Drops every key, queue, waiter and watch (a fresh keyspace).
  void clear();

  size_t num_keys() const { return kv_.size(); }
  size_t num_waiting_connections() const { return waiters_.size(); }
  bool contains(const std::string& key) const { return kv_.count(key) != 0; }
  // The value of `key` read as ADD reads it (decimal text), or nullopt when absent or not a
  // number. For counters such as `init/`.
  std::optional<int64_t> integer(const std::string& key) const;

 private:
  struct Waiter {
    std::vector<std::string> keys;  // the distinct keys still missing
    size_t remaining = 0;
  };
  bool exists(const std::string& key) const;
  // A value for `key` was stored (SET/ADD/APPEND/...): wake waiters and notify watchers.
  void on_stored(const std::string& key, const std::string* old_value, const std::string& new_value,
                 std::vector<Outgoing>& others);
  void on_queue_push(const std::string& key, std::vector<Outgoing>& others);
  void remove_waiter(ConnId conn);
  void set_value(const std::string& key, std::string value, std::vector<Outgoing>& others);

  std::unordered_map<std::string, std::string> kv_;
  std::unordered_map<std::string, std::deque<std::string>> queues_;
  std::unordered_map<ConnId, Waiter> waiters_;                        // one WAIT per connection
  std::unordered_map<std::string, std::vector<ConnId>> waiting_on_;   // key -> connections
  std::unordered_map<std::string, std::vector<ConnId>> barrier_waiting_;
  std::unordered_map<ConnId, std::string> barrier_of_;                // conn -> barrier key
  std::unordered_map<std::string, std::unordered_set<ConnId>> watchers_;  // D0 WATCH_KEY
  std::unordered_map<ConnId, std::vector<std::string>> watched_by_;
};

}  // namespace ddprun::store
