// StoreState: keys and values, WAIT, and the dispatch of every request (apply). Requests
// applied in slices: store_slices.cpp; queues, barriers and watches: store_queues.cpp.
#include "ddprun/store/store_state.h"

#include "store_state_detail.h"

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <string_view>
#include <utility>

namespace ddprun::store {

using wire::Op;
using namespace detail;

std::optional<int64_t> StoreState::integer(const std::string& key) const {
  auto it = kv_.find(key);
  int64_t v = 0;
  if (it == kv_.end() || !parse_integer(*it->second, v)) return std::nullopt;
  return v;
}

bool StoreState::exists(const std::string& key) const {
  if (kv_.count(key)) return true;
  auto q = queues_.find(key);
  return q != queues_.end() && !q->second.empty();
}

std::optional<std::string> StoreState::over_limit(uint64_t new_keys, uint64_t more_bytes) const {
  const uint64_t keys = kv_.size() + queues_.size();
  if (keys + new_keys > limits_.max_keys)
    return "the store holds " + std::to_string(keys) + " keys; the limit is " + std::to_string(limits_.max_keys) +
           " (ddprund --max-store-keys)";
  if (bytes_ + more_bytes > limits_.max_bytes)
    return "the store holds " + std::to_string(bytes_) + " bytes; " + std::to_string(more_bytes) +
           " more would pass the limit of " + std::to_string(limits_.max_bytes) + " (ddprund --max-store-bytes)";
  return std::nullopt;
}

void StoreState::set_value(const std::string& key, Value value, std::vector<Outgoing>& others) {
  set_value_at(kv_.find(key), key, std::move(value), others);
}

void StoreState::set_value_at(KvEntry it, const std::string& key, Value value, std::vector<Outgoing>& others) {
  if (it == kv_.end()) {
    bytes_ += key.size() + value->size();
    auto [ins, _] = kv_.emplace(key, std::move(value));
    on_stored(key, nullptr, ins->second, others);
  } else {
    // The old value is replaced, never written over: replies in flight still hold it.
    bytes_ = bytes_ - it->second->size() + value->size();
    Value old = std::exchange(it->second, std::move(value));
    on_stored(key, &old, it->second, others);
  }
}

void StoreState::on_stored(const std::string& key, const Value* old_value, const Value& new_value,
                           std::vector<Outgoing>& others) {
  if (auto w = waiting_on_.find(key); w != waiting_on_.end()) {
    std::vector<ConnId> conns = std::move(w->second);
    waiting_on_.erase(w);
    for (ConnId c : conns) {
      auto wt = waiters_.find(c);
      if (wt == waiters_.end() || wt->second.removing) continue;
      if (--wt->second.remaining == 0 && !wt->second.registering)
        others.push_back({c, status(wire::kWaitStop), finish_waiter(wt)});
    }
  }
  if (auto ws = watchers_.find(key); ws != watchers_.end()) {
    for (ConnId c : ws->second) {
      Reply ev;
      ev.u8(old_value ? wire::kWatchKeyUpdated : wire::kWatchKeyCreated)
          .blob(key)
          .blob(old_value ? *old_value : Value())
          .blob(new_value);
      others.push_back({c, std::move(ev)});
    }
  }
}

void StoreState::erase_waiter(std::unordered_map<ConnId, Waiter>::iterator it) {
  aux_bytes_ -= it->second.bytes;
  waiters_.erase(it);
}

std::vector<std::string> StoreState::finish_waiter(std::unordered_map<ConnId, Waiter>::iterator it) {
  std::vector<std::string> keys;
  if (it->second.keys.size() > kWaitSlice) keys = std::move(it->second.keys);  // 128 Ki took 26 ms to free
  erase_waiter(it);
  return keys;
}

void StoreState::remove_waiter(ConnId conn) {
  while (remove_waiter_step(conn)) {
  }
  leave_barrier(conn);
}

// Forgets a slice of conn's waiter (slice_end of its keys): true while some of it is left.
bool StoreState::remove_waiter_step(ConnId conn) {
  auto wt = waiters_.find(conn);
  if (wt == waiters_.end()) return false;
  Waiter& w = wt->second;
  w.removing = true;
  const size_t end = slice_end(w.keys, w.removed);
  for (size_t i = w.removed; i < end; ++i) {
    if (auto on = waiting_on_.find(w.keys[i]); on != waiting_on_.end()) {
      erase_conn(on->second, conn);
      if (on->second.empty()) waiting_on_.erase(on);
    }
    std::string().swap(w.keys[i]);  // its memory goes with its slice
  }
  w.removed = end;
  if (end < w.keys.size()) return true;
  erase_waiter(wt);
  return false;
}

void StoreState::leave_barrier(ConnId conn) {
  if (auto b = barrier_of_.find(conn); b != barrier_of_.end()) {
    auto bw = barrier_waiting_.find(b->second);
    if (bw != barrier_waiting_.end()) {
      erase_conn(bw->second, conn);
      if (bw->second.empty()) barrier_waiting_.erase(bw);
    }
    barrier_of_.erase(b);
  }
}

bool StoreState::disconnect(ConnId conn) {
  if (remove_waiter_step(conn)) return true;
  leave_barrier(conn);
  end_slicing(conn);
  if (auto w = watched_by_.find(conn); w != watched_by_.end()) {
    for (const auto& k : w->second) {
      aux_bytes_ -= entry_bytes(k);
      auto ws = watchers_.find(k);
      if (ws == watchers_.end()) continue;
      ws->second.erase(conn);
      if (ws->second.empty()) watchers_.erase(ws);
    }
    watched_by_.erase(w);
  }
  return false;
}

void StoreState::clear() {
  kv_.clear();
  queues_.clear();
  waiters_.clear();
  waiting_on_.clear();
  barrier_waiting_.clear();
  barrier_of_.clear();
  watchers_.clear();
  watched_by_.clear();
  sliced_.clear();
  bytes_ = 0;
  aux_bytes_ = 0;
}

// Whether a reply of `size` wire bytes may be built (checked before it is): the per-reply limit
// and the room the caller has for it now.
std::optional<std::string> StoreState::reply_too_large(uint64_t size) const {
  if (size > limits_.max_reply_bytes)
    return "the reply would be " + std::to_string(size) + " bytes, past the limit of " +
           std::to_string(limits_.max_reply_bytes) + " (ddprund --max-reply-bytes)";
  if (size > reply_room_)
    return "the reply would be " + std::to_string(size) + " bytes; the server's memory has room for " +
           std::to_string(reply_room_) + " more now (ddprund --max-memory)";
  return std::nullopt;
}

// Room for storing a value of `value_size` bytes under `key` (replacing what is there).
std::optional<std::string> StoreState::room_for(const std::string& key, size_t value_size) const {
  return room_at(kv_.find(key), key, value_size);
}

std::optional<std::string> StoreState::room_at(std::unordered_map<std::string, Value>::const_iterator it,
                                               const std::string& key, size_t value_size) const {
  if (it == kv_.end()) return over_limit(1, key.size() + value_size);
  return over_limit(0, value_size > it->second->size() ? value_size - it->second->size() : 0);
}

ApplyResult StoreState::op_compare_set(ConnId conn, wire::Request& req, Reply& w, std::vector<Outgoing>& others) {
  (void)conn;
  const std::string& key = req.keys[0];
  std::string& expected = req.values[0];
  auto it = kv_.find(key);
  if (auto why = room_at(it, key, req.values[1].size())) return refuse(*why);
  auto store_desired = [&] {
    Value desired = make_value(std::move(req.values[1]));
    set_value_at(it, key, desired, others);
    w.blob(desired);
  };
  if (it == kv_.end()) {
    if (expected.empty()) store_desired();
    else w.blob(make_value(std::move(expected)));  // PyTorch's servers "pretend": nothing stored, expected echoed
  } else if (*it->second == expected) {
    store_desired();
  } else {
    w.blob(it->second);
  }
  return {};
}

ApplyResult StoreState::op_add(ConnId conn, wire::Request& req, Reply& w, std::vector<Outgoing>& others) {
  (void)conn;
  int64_t current = 0;
  auto it = kv_.find(req.keys[0]);
  if (it != kv_.end() && !parse_integer(*it->second, current))
    return {true, "ADD on key whose value is not an integer"};
  if (auto why = room_at(it, req.keys[0], 20)) return refuse(*why);
  // Two's-complement wrap, as the int64 arithmetic of PyTorch's servers.
  int64_t next = static_cast<int64_t>(static_cast<uint64_t>(current) + static_cast<uint64_t>(req.number));
  set_value_at(it, req.keys[0], make_value(std::to_string(next)), others);
  w.i64(next);
  return {};
}

// A WAIT of a few keys (PyTorch's get() waits on one): one pass, duplicates found by a search
// of the keys kept so far, no hash set; nothing registered when every key is there.
ApplyResult StoreState::small_wait(ConnId conn, wire::Request& req, Reply& w, bool had_waiter) {
  if (had_waiter || !barrier_of_.empty()) remove_waiter(conn);  // a client never has two WAITs outstanding
  const auto first_missing =
      std::find_if(req.keys.begin(), req.keys.end(), [&](const std::string& k) { return !exists(k); });
  if (first_missing == req.keys.end()) {
    w.u8(wire::kWaitStop);
    return {};
  }
  Waiter waiter;
  waiter.keys.push_back(std::move(*first_missing));  // the request is not read after it is applied
  for (auto k = first_missing + 1; k != req.keys.end(); ++k) {
    if (exists(*k) || std::find(waiter.keys.begin(), waiter.keys.end(), *k) != waiter.keys.end()) continue;
    waiter.keys.push_back(std::move(*k));
  }
  for (const auto& k : waiter.keys) {
    waiting_on_[k].push_back(conn);
    waiter.bytes += entry_bytes(k);
  }
  waiter.remaining = waiter.keys.size();
  aux_bytes_ += waiter.bytes;
  waiters_.emplace(conn, std::move(waiter));
  return {};  // deferred
}

ApplyResult StoreState::op_wait(ConnId conn, wire::Request& req, Reply& w, std::vector<Outgoing>& others) {
  (void)others;
  // Registered kWaitSlice keys per call (ApplyResult::more), duplicates dropped with a hash
  // set: O(keys) in all, a few milliseconds per call (a linear search per key made a WAIT of
  // 64 Ki keys hold the lock for 42 s; one pass over them, for 60 ms).
  auto it = waiters_.find(conn);
  if (it != waiters_.end() && !it->second.registering) {  // an earlier WAIT's (a client never has two)
    if (remove_waiter_step(conn)) return {.more = true};  // a large one: a slice per call
    it = waiters_.end();
  }
  const bool first = it == waiters_.end();
  if (first && req.keys.size() <= kSmallWait) return small_wait(conn, req, w, false);
  if (first) {
    remove_waiter(conn);  // a client never has two WAITs outstanding; be safe anyway
    it = waiters_.emplace(conn, Waiter{}).first;
    it->second.registering = true;
    it->second.seen = std::make_unique<SeenKeys>();
    // Both tables sized once, now: grown while the slices ran, a rehash of them all took one
    // slice 54 ms.
    it->second.seen->keys.reserve(req.keys.size());
    waiting_on_.reserve(waiting_on_.size() + req.keys.size());
  }
  Waiter& waiter = it->second;
  const size_t end = slice_end(req.keys, waiter.next);
  uint64_t bytes = 0;
  for (size_t i = waiter.next; i < end; ++i) {
    const std::string& k = req.keys[i];
    if (exists(k)) continue;
    if (!waiter.seen->keys.insert(k).second) continue;
    waiting_on_[k].push_back(conn);
    waiter.keys.push_back(k);
    ++waiter.remaining;
    bytes += entry_bytes(k);
  }
  waiter.bytes += bytes;
  aux_bytes_ += bytes;
  waiter.next = end;
  if (end < req.keys.size()) return {.more = true};
  waiter.registering = false;
  waiter.seen.reset();               // its views end with the request
  if (waiter.remaining == 0) {       // every key there (or stored while the slices ran)
    req.values = finish_waiter(it);  // freed with the request (a WAIT has no values)
    w.u8(wire::kWaitStop);
  }
  return {};  // else deferred
}

ApplyResult StoreState::op_delete_key(ConnId conn, wire::Request& req, Reply& w, std::vector<Outgoing>& others) {
  (void)conn;
  auto it = kv_.find(req.keys[0]);
  bool removed = it != kv_.end();
  if (removed) {
    if (auto ws = watchers_.find(req.keys[0]); ws != watchers_.end()) {
      for (ConnId c : ws->second) {
        Reply ev;
        ev.u8(wire::kWatchKeyDeleted).blob(req.keys[0]).blob(it->second).blob(std::string_view());
        others.push_back({c, std::move(ev)});
      }
    }
    bytes_ -= it->first.size() + it->second->size();
    kv_.erase(it);
  }
  w.i64(removed ? 1 : 0);
  return {};
}

ApplyResult StoreState::op_append(ConnId conn, wire::Request& req, Reply& w, std::vector<Outgoing>& others) {
  (void)conn, (void)w;
  auto it = kv_.find(req.keys[0]);
  const uint64_t len = (it == kv_.end() ? 0 : it->second->size()) + req.values[0].size();
  if (len > limits_.max_value_len)
    return refuse("the value would grow to " + std::to_string(len) + " bytes, past the limit of " +
                  std::to_string(limits_.max_value_len) + " (ddprund --max-value-len)");
  if (auto why = room_for(req.keys[0], len)) return refuse(*why);
  // Grown in place when nothing else holds the value and no watcher needs the old bytes:
  // amortised O(appended bytes). A reply in flight that holds it gets a new value instead.
  if (it != kv_.end() && !watchers_.count(req.keys[0]) && grow_in_place(it->second, req.values[0])) {
    bytes_ += req.values[0].size();
    on_stored(req.keys[0], &it->second, it->second, others);
    return {};
  }
  std::string v;
  if (it == kv_.end()) {
    v = std::move(req.values[0]);
  } else {
    v.reserve(len);
    v.append(*it->second).append(req.values[0]);
  }
  set_value(req.keys[0], make_value(std::move(v)), others);
  return {};
}

ApplyResult StoreState::apply(ConnId conn, wire::Dialect d, wire::Request& req, Reply& reply,
                              std::vector<Outgoing>& others, uint64_t reply_room) {
  (void)d;
  reply_room_ = reply_room;
  // CANCEL_WAIT and BARRIER (and WAIT: op_wait) replace conn's waiter: a large one is forgotten
  // slice by slice first.
  if ((req.op == Op::CancelWait || req.op == Op::Barrier) && !waiters_.empty() && remove_waiter_step(conn))
    return {.more = true};
  Reply& w = reply;
  switch (req.op) {
    case Op::Validate: return {true, "VALIDATE after the connection was already validated"};
    case Op::Ping: w.u32(req.u32); return {};
    case Op::Set: {
      const auto it = kv_.find(req.keys[0]);
      if (auto why = room_at(it, req.keys[0], req.values[0].size())) return refuse(*why);
      set_value_at(it, req.keys[0], make_value(std::move(req.values[0])), others);
      return {};
    }
    case Op::CompareSet: return op_compare_set(conn, req, w, others);
    case Op::Get: {
      auto it = kv_.find(req.keys[0]);
      w.blob(it == kv_.end() ? Value() : it->second);
      return {};
    }
    case Op::Add: return op_add(conn, req, w, others);
    case Op::Check: return op_check(conn, req, w);
    case Op::Wait: return op_wait(conn, req, w, others);
    case Op::GetNumKeys: w.i64(static_cast<int64_t>(kv_.size())); return {};
    case Op::DeleteKey: return op_delete_key(conn, req, w, others);
    case Op::Append: return op_append(conn, req, w, others);
    case Op::MultiGet: return op_multi_get(conn, req, w, others);
    case Op::MultiSet: return op_multi_set(conn, req, w, others);
    case Op::CancelWait:
      remove_waiter(conn);
      w.u8(wire::kWaitCanceled);
      return {};
    case Op::QueuePush: return op_queue_push(conn, req, w, others);
    case Op::QueuePop: return op_queue_pop(conn, req, w, others);
    case Op::QueueLen: {
      auto q = queues_.find(req.keys[0]);
      w.i64(q == queues_.end() ? 0 : static_cast<int64_t>(q->second.size()));
      return {};
    }
    case Op::ListKeys: return op_list_keys(conn, req, w, others);
    case Op::Barrier: return op_barrier(conn, req, w, others);
    case Op::WatchKey: return op_watch_key(conn, req, w, others);
  }
  return {true, "unhandled operation"};
}

}  // namespace ddprun::store
