// The store's state: key/value map, FIFO queues, waiters, barriers and D0 watchers.
// Pure: no sockets, no threads, no clock. The server feeds it parsed requests and sends
// what it returns; tests drive it directly.
//
// Thread-safety: none; the owner serialises calls (the server holds its state lock).
#pragma once

#include <cstdint>
#include <deque>
#include <memory>
#include <memory_resource>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "ddprun/store/reply.h"
#include "ddprun/wire/codec.h"

namespace ddprun::store {

using ConnId = uint64_t;

// Bytes to send to another connection as a consequence of a request (a deferred WAIT
// reply, a barrier release, a watch event).
struct Outgoing {
  ConnId conn;
  Reply reply;
  // What the state let go of in producing it (the keys of a large waiter it answers): for the
  // caller to free at its own pace (a server: a slice per turn of its thread).
  std::vector<std::string> dropped = {};
};

// What one keyspace (a job's round store, or ddprund's main store) may hold and answer. A
// request past a limit changes nothing and closes its connection (TCPStore has no error reply);
// PyTorch's rendezvous and collectives stay far below every default.
inline constexpr uint64_t kDefaultMaxKeysPerStore = 1 << 20;              // keys + queues
inline constexpr uint64_t kDefaultMaxBytesPerStore = 1ull << 30;          // keys + values + queued items
// Wire bytes of one reply (MULTI_GET, LIST_KEYS). A reply references stored values instead of
// copying them, so its memory is O(keys) whatever this allows; the limit stops a small request
// from asking the server to send (and a per-connection outbox to account) a terabyte.
inline constexpr uint64_t kDefaultMaxReplyBytes = 64ull * 1024 * 1024;
// Distinct keys one connection may watch (WATCH_KEY of PyTorch 1.13): a repeated WATCH_KEY grew
// without end.
inline constexpr uint64_t kDefaultMaxWatchesPerConnection = 4096;
struct StoreLimits {
  uint64_t max_keys = kDefaultMaxKeysPerStore;
  uint64_t max_bytes = kDefaultMaxBytesPerStore;
  uint64_t max_reply_bytes = kDefaultMaxReplyBytes;
  uint64_t max_value_len = wire::Limits{}.max_value_len;  // APPEND may not grow a value past it
  uint64_t max_watches_per_connection = kDefaultMaxWatchesPerConnection;
};

struct ApplyResult {
  bool close = false;  // protocol error: close the requesting connection, nothing changed
  std::string error;   // why, for the log
  // Partly applied (a CHECK, WAIT, MULTI_GET or MULTI_SET of more than one slice, a LIST_KEYS
  // of a large store): call apply() again with the same request, untouched, until this is false.
  // The caller may release its lock in between, so one request never holds it long; nothing of
  // the connection may run in between. A slice may already have appended part of the reply.
  bool more = false;
};

// Keys of a CHECK, WAIT, MULTI_GET or MULTI_SET handled per apply() call (a slice: about a
// millisecond of work), and the most bytes of keys a slice looks up (2048 keys of 480 bytes
// took 9-17 ms on a loaded 2-core machine). A request that fits one slice is applied at once
// (atomic, as in PyTorch's servers); a larger one in slices, between which other clients'
// requests may run.
inline constexpr size_t kWaitSlice = 2048;
inline constexpr size_t kSliceBytes = 256 * 1024;
// A WAIT of at most this many keys drops its duplicates without a hash set (the common case:
// PyTorch's get() waits on one key).
inline constexpr size_t kSmallWait = 8;
// Hash buckets of the keyspace a LIST_KEYS walks per apply() call.
inline constexpr size_t kListSliceBuckets = 4096;

class StoreState {
 public:
  StoreState() = default;
  explicit StoreState(StoreLimits limits) : limits_(limits) {}

  // Applies `req` from `conn` (whose dialect is `d`, for reply and event formats). Appends the
  // reply for `conn` to `reply` (nothing when deferred, e.g. a WAIT on missing keys) and
  // anything owed to other connections to `others`. Values may be moved out of `req`.
  // Replies and events reference stored values (see reply.h): they stay valid, with the bytes
  // of the moment they were built, however the store changes afterwards.
  // `reply_room`: the most wire bytes the caller can take for a reply now (a server's memory
  // budget); a MULTI_GET or LIST_KEYS whose reply would be larger is refused before it is built.
  ApplyResult apply(ConnId conn, wire::Dialect d, wire::Request& req, Reply& reply, std::vector<Outgoing>& others,
                    uint64_t reply_room = UINT64_MAX);

  // The connection went away: forget its waiter, barrier wait and watches. A waiter of more
  // than one slice of keys is forgotten one slice per call: true while some is left (call
  // again; nothing wakes it meanwhile).
  bool disconnect(ConnId conn);

  // Drops every key, queue, waiter and watch (a fresh keyspace).
  void clear();

  size_t num_keys() const { return kv_.size(); }
  // Bytes of keys, values and queued items held (what StoreLimits::max_bytes bounds).
  uint64_t bytes() const { return bytes_; }
  // Memory it holds, about: bytes() plus the keys its waiters and watchers name (copies and
  // table entries). What a server's memory budget counts for it.
  uint64_t memory() const { return bytes_ + aux_bytes_; }
  size_t num_waiting_connections() const { return waiters_.size(); }
  bool contains(const std::string& key) const { return kv_.count(key) != 0; }
  // The value of `key` read as ADD reads it (decimal text), or nullopt when absent or not a
  // number. For counters such as `init/`.
  std::optional<int64_t> integer(const std::string& key) const;

 private:
  // The distinct keys of a WAIT being registered, in an arena: freed at once (not one node at
  // a time: 128 Ki of them took tens of milliseconds).
  struct SeenKeys {
    std::pmr::monotonic_buffer_resource arena;
    std::pmr::unordered_set<std::string_view> keys{&arena};
  };
  struct Waiter {
    std::vector<std::string> keys;  // the distinct keys still missing
    size_t remaining = 0;
    uint64_t bytes = 0;  // counted in aux_bytes_
    // While its WAIT is registered slice by slice: the next key to look at, and the keys seen
    // (views into the request, which the caller keeps until the last slice). A key stored
    // meanwhile counts down `remaining`, but only the last slice may answer.
    bool registering = false;
    size_t next = 0;
    // Being forgotten a slice at a time (remove_waiter_step): keys before `removed` are.
    bool removing = false;
    size_t removed = 0;
    std::unique_ptr<SeenKeys> seen;
  };
  // A CHECK, MULTI_GET, MULTI_SET or LIST_KEYS being applied slice by slice (one per connection).
  struct Sliced {
    wire::Op op{};
    bool emitting = false;  // MULTI_GET: every value found, the reply being written; MULTI_SET: checked, storing
    size_t next = 0;        // the next key (MULTI_*), bucket (LIST_KEYS) or value to write
    size_t buckets = 0;     // LIST_KEYS: the keyspace's bucket count when the walk began
    uint64_t size = 0;      // reply bytes so far (MULTI_SET: bytes it adds)
    uint64_t count = 0;     // LIST_KEYS: keys listed; MULTI_SET: keys it adds
    std::vector<Value> found;  // MULTI_GET: the values, in request order
    std::string listed;        // LIST_KEYS: the keys, as the reply's blobs
    uint64_t bytes = 0;        // what it holds, counted in aux_bytes_
  };
  bool exists(const std::string& key) const;
  Sliced& slicing(ConnId conn, wire::Op op, bool& fresh);
  void end_slicing(ConnId conn);
  void charge(Sliced& s, uint64_t bytes);
  // A value for `key` was stored (SET/ADD/APPEND/...): wake waiters and notify watchers.
  void on_stored(const std::string& key, const Value* old_value, const Value& new_value,
                 std::vector<Outgoing>& others);
  void on_queue_push(const std::string& key, std::vector<Outgoing>& others);
  void remove_waiter(ConnId conn);
  bool remove_waiter_step(ConnId conn);
  void leave_barrier(ConnId conn);
  void erase_waiter(std::unordered_map<ConnId, Waiter>::iterator it);
  // A waiter answered: erased; a large one's keys are returned, not freed (Outgoing::dropped).
  std::vector<std::string> finish_waiter(std::unordered_map<ConnId, Waiter>::iterator it);
  using KvEntry = std::unordered_map<std::string, Value>::iterator;
  void set_value(const std::string& key, Value value, std::vector<Outgoing>& others);
  // The same, where `it` is kv_.find(key), already looked up (one hash of the key per request).
  void set_value_at(KvEntry it, const std::string& key, Value value, std::vector<Outgoing>& others);
  std::optional<std::string> room_for(const std::string& key, size_t value_size) const;
  std::optional<std::string> room_at(std::unordered_map<std::string, Value>::const_iterator it, const std::string& key,
                                     size_t value_size) const;
  std::optional<std::string> reply_too_large(uint64_t size) const;
  // One operation each (apply() dispatches): reply to `w`, events for others to `others`.
  ApplyResult op_compare_set(ConnId conn, wire::Request& req, Reply& w, std::vector<Outgoing>& others);
  ApplyResult op_add(ConnId conn, wire::Request& req, Reply& w, std::vector<Outgoing>& others);
  ApplyResult op_check(ConnId conn, wire::Request& req, Reply& w);
  ApplyResult op_wait(ConnId conn, wire::Request& req, Reply& w, std::vector<Outgoing>& others);
  ApplyResult small_wait(ConnId conn, wire::Request& req, Reply& w, bool had_waiter);
  ApplyResult op_delete_key(ConnId conn, wire::Request& req, Reply& w, std::vector<Outgoing>& others);
  ApplyResult op_append(ConnId conn, wire::Request& req, Reply& w, std::vector<Outgoing>& others);
  ApplyResult op_multi_get(ConnId conn, wire::Request& req, Reply& w, std::vector<Outgoing>& others);
  ApplyResult op_multi_set(ConnId conn, wire::Request& req, Reply& w, std::vector<Outgoing>& others);
  ApplyResult op_queue_push(ConnId conn, wire::Request& req, Reply& w, std::vector<Outgoing>& others);
  ApplyResult op_queue_pop(ConnId conn, wire::Request& req, Reply& w, std::vector<Outgoing>& others);
  ApplyResult op_list_keys(ConnId conn, wire::Request& req, Reply& w, std::vector<Outgoing>& others);
  ApplyResult op_barrier(ConnId conn, wire::Request& req, Reply& w, std::vector<Outgoing>& others);
  ApplyResult op_watch_key(ConnId conn, wire::Request& req, Reply& w, std::vector<Outgoing>& others);
  // Whether `new_keys` more keys and `more_bytes` more bytes fit; else why not.
  std::optional<std::string> over_limit(uint64_t new_keys, uint64_t more_bytes) const;

  StoreLimits limits_{};
  uint64_t bytes_ = 0;
  uint64_t aux_bytes_ = 0;  // waiters' and watchers' keys
  uint64_t reply_room_ = UINT64_MAX;  // of the request being applied

  std::unordered_map<std::string, Value> kv_;  // never null
  std::unordered_map<std::string, std::deque<std::string>> queues_;
  std::unordered_map<ConnId, Waiter> waiters_;                        // one WAIT per connection
  std::unordered_map<std::string, std::vector<ConnId>> waiting_on_;   // key -> connections
  std::unordered_map<std::string, std::vector<ConnId>> barrier_waiting_;
  std::unordered_map<ConnId, std::string> barrier_of_;                // conn -> barrier key
  std::unordered_map<std::string, std::unordered_set<ConnId>> watchers_;  // D0 WATCH_KEY
  std::unordered_map<ConnId, std::vector<std::string>> watched_by_;
  std::unordered_map<ConnId, Sliced> sliced_;
};

}  // namespace ddprun::store
