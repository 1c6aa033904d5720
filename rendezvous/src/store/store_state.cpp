#include "ddprun/store/store_state.h"

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <string_view>
#include <utility>

namespace ddprun::store {

using wire::Op;

namespace {

// C `stoll` rules, as PyTorch's servers parse an ADD target: leading whitespace and a sign
// are allowed, trailing garbage is ignored; no digits or overflow is an error.
bool parse_integer(const std::string& text, int64_t& out) {
  errno = 0;
  const char* begin = text.c_str();
  char* end = nullptr;
  long long v = std::strtoll(begin, &end, 10);
  if (end == begin || errno == ERANGE) return false;
  out = v;
  return true;
}

void erase_conn(std::vector<ConnId>& v, ConnId c) { v.erase(std::remove(v.begin(), v.end(), c), v.end()); }

Reply status(uint8_t byte) {
  Reply r;
  r.u8(byte);
  return r;
}

}  // namespace

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
  auto it = kv_.find(key);
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
      if (wt == waiters_.end()) continue;
      if (--wt->second.remaining == 0) {
        waiters_.erase(wt);
        others.push_back({c, status(wire::kWaitStop)});
      }
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

void StoreState::on_queue_push(const std::string& key, std::vector<Outgoing>& others) {
  // A push wakes one waiter on that name: only one value can be popped.
  auto w = waiting_on_.find(key);
  if (w == waiting_on_.end()) return;
  while (!w->second.empty()) {
    ConnId c = w->second.front();
    w->second.erase(w->second.begin());
    auto wt = waiters_.find(c);
    if (wt == waiters_.end()) continue;
    if (--wt->second.remaining == 0) {
      waiters_.erase(wt);
      others.push_back({c, status(wire::kWaitStop)});
    }
    break;
  }
  if (w->second.empty()) waiting_on_.erase(w);
}

void StoreState::remove_waiter(ConnId conn) {
  auto wt = waiters_.find(conn);
  if (wt != waiters_.end()) {
    for (const auto& k : wt->second.keys) {
      auto w = waiting_on_.find(k);
      if (w == waiting_on_.end()) continue;
      erase_conn(w->second, conn);
      if (w->second.empty()) waiting_on_.erase(w);
    }
    waiters_.erase(wt);
  }
  if (auto b = barrier_of_.find(conn); b != barrier_of_.end()) {
    auto bw = barrier_waiting_.find(b->second);
    if (bw != barrier_waiting_.end()) {
      erase_conn(bw->second, conn);
      if (bw->second.empty()) barrier_waiting_.erase(bw);
    }
    barrier_of_.erase(b);
  }
}

void StoreState::disconnect(ConnId conn) {
  remove_waiter(conn);
  if (auto w = watched_by_.find(conn); w != watched_by_.end()) {
    for (const auto& k : w->second) {
      auto ws = watchers_.find(k);
      if (ws == watchers_.end()) continue;
      ws->second.erase(conn);
      if (ws->second.empty()) watchers_.erase(ws);
    }
    watched_by_.erase(w);
  }
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
  bytes_ = 0;
}

ApplyResult StoreState::apply(ConnId conn, wire::Dialect d, wire::Request& req, Reply& reply,
                              std::vector<Outgoing>& others) {
  (void)d;
  Reply& w = reply;
  // Room for storing `value` under `key` (replacing what is there).
  auto room_for = [&](const std::string& key, size_t value_size) -> std::optional<std::string> {
    auto it = kv_.find(key);
    if (it == kv_.end()) return over_limit(1, key.size() + value_size);
    return over_limit(0, value_size > it->second->size() ? value_size - it->second->size() : 0);
  };
  auto refuse = [](const std::string& why) { return ApplyResult{true, why}; };
  switch (req.op) {
    case Op::Validate:
      return {true, "VALIDATE after the connection was already validated"};
    case Op::Ping:
      w.u32(req.u32);
      return {};
    case Op::Set:
      if (auto why = room_for(req.keys[0], req.values[0].size())) return refuse(*why);
      set_value(req.keys[0], make_value(std::move(req.values[0])), others);
      return {};
    case Op::CompareSet: {
      const std::string& key = req.keys[0];
      std::string& expected = req.values[0];
      if (auto why = room_for(key, req.values[1].size())) return refuse(*why);
      auto store_desired = [&] {
        Value desired = make_value(std::move(req.values[1]));
        set_value(key, desired, others);
        w.blob(desired);
      };
      auto it = kv_.find(key);
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
    case Op::Get: {
      auto it = kv_.find(req.keys[0]);
      w.blob(it == kv_.end() ? Value() : it->second);
      return {};
    }
    case Op::Add: {
      int64_t current = 0;
      auto it = kv_.find(req.keys[0]);
      if (it != kv_.end() && !parse_integer(*it->second, current))
        return {true, "ADD on key whose value is not an integer"};
      if (auto why = room_for(req.keys[0], 20)) return refuse(*why);
      // Two's-complement wrap, as the int64 arithmetic of PyTorch's servers.
      int64_t next = static_cast<int64_t>(static_cast<uint64_t>(current) + static_cast<uint64_t>(req.number));
      set_value(req.keys[0], make_value(std::to_string(next)), others);
      w.i64(next);
      return {};
    }
    case Op::Check: {
      bool ready = std::all_of(req.keys.begin(), req.keys.end(), [&](const std::string& k) { return exists(k); });
      w.u8(ready ? wire::kCheckReady : wire::kCheckNotReady);
      return {};
    }
    case Op::Wait: {
      // Duplicates removed with a hash set: O(keys) (a linear search per key made a WAIT of
      // 64 Ki keys hold the lock for 42 s).
      Waiter waiter;
      std::unordered_set<std::string_view> seen;
      seen.reserve(req.keys.size());
      for (const auto& k : req.keys) {
        if (exists(k) || !seen.insert(k).second) continue;
        waiter.keys.push_back(k);
      }
      if (waiter.keys.empty()) {
        w.u8(wire::kWaitStop);
        return {};
      }
      remove_waiter(conn);  // a client never has two WAITs outstanding; be safe anyway
      waiter.remaining = waiter.keys.size();
      for (const auto& k : waiter.keys) waiting_on_[k].push_back(conn);
      waiters_.emplace(conn, std::move(waiter));
      return {};  // deferred
    }
    case Op::GetNumKeys:
      w.i64(static_cast<int64_t>(kv_.size()));
      return {};
    case Op::DeleteKey: {
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
    case Op::Append: {
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
    case Op::MultiGet: {
      // The reply references each value (memory O(keys)); its wire size is still bounded, so a
      // small request cannot make the server send a terabyte.
      // One lookup per key: the values found (shared references) size the reply, then fill it.
      std::vector<Value> found;
      found.reserve(req.keys.size());
      uint64_t size = 0;
      for (const auto& k : req.keys) {
        auto it = kv_.find(k);
        found.push_back(it == kv_.end() ? Value() : it->second);
        size += 8 + (found.back() ? found.back()->size() : 0);
      }
      if (size > limits_.max_reply_bytes)
        return refuse("the reply would be " + std::to_string(size) + " bytes, past the limit of " +
                      std::to_string(limits_.max_reply_bytes) + " (ddprund --max-reply-bytes)");
      for (const auto& v : found) w.blob(v);
      return {};
    }
    case Op::MultiSet: {
      uint64_t new_keys = 0, more = 0;
      for (size_t i = 0; i < req.keys.size(); ++i) {
        if (!kv_.count(req.keys[i])) ++new_keys;
        more += req.keys[i].size() + req.values[i].size();  // an upper bound: replaced values not subtracted
      }
      if (auto why = over_limit(new_keys, more)) return refuse(*why);
      for (size_t i = 0; i < req.keys.size(); ++i) set_value(req.keys[i], make_value(std::move(req.values[i])), others);
      return {};
    }
    case Op::CancelWait:
      remove_waiter(conn);
      w.u8(wire::kWaitCanceled);
      return {};
    case Op::QueuePush: {
      const bool fresh = !queues_.count(req.keys[0]);
      const uint64_t more = req.values[0].size() + (fresh ? req.keys[0].size() : 0);
      if (auto why = over_limit(fresh ? 1 : 0, more)) return refuse(*why);
      bytes_ += more;
      queues_[req.keys[0]].push_back(std::move(req.values[0]));
      on_queue_push(req.keys[0], others);
      return {};
    }
    case Op::QueuePop: {
      auto q = queues_.find(req.keys[0]);
      int64_t len = q == queues_.end() ? 0 : static_cast<int64_t>(q->second.size());
      w.i64(len);
      if (len > 0) {
        std::string& item = q->second.front();
        bytes_ -= item.size();
        if (item.size() <= kInlineValueBytes) w.blob(item);
        else w.blob(make_value(std::move(item)));
        q->second.pop_front();
        if (q->second.empty()) {
          bytes_ -= q->first.size();
          queues_.erase(q);
        }
      }
      return {};
    }
    case Op::QueueLen: {
      auto q = queues_.find(req.keys[0]);
      w.i64(q == queues_.end() ? 0 : static_cast<int64_t>(q->second.size()));
      return {};
    }
    case Op::ListKeys: {
      uint64_t size = 8;
      for (const auto& [k, _] : kv_) size += 8 + k.size();
      if (size > limits_.max_reply_bytes)
        return refuse("the reply would be " + std::to_string(size) + " bytes, past the limit of " +
                      std::to_string(limits_.max_reply_bytes) + " (ddprund --max-reply-bytes)");
      w.i64(static_cast<int64_t>(kv_.size()));
      for (const auto& [k, _] : kv_) w.blob(k);
      return {};
    }
    case Op::Barrier: {
      const std::string& key = req.keys[0];
      int64_t count = 0;
      auto it = kv_.find(key);
      if (it != kv_.end() && !parse_integer(*it->second, count))
        return {true, "BARRIER on key whose value is not an integer"};
      ++count;
      if (auto why = room_for(key, 20)) return refuse(*why);
      set_value(key, make_value(std::to_string(count)), others);
      if (count >= req.number) {
        w.u8(wire::kWaitStop);
        if (auto bw = barrier_waiting_.find(key); bw != barrier_waiting_.end()) {
          for (ConnId c : bw->second) {
            others.push_back({c, status(wire::kWaitStop)});
            barrier_of_.erase(c);
          }
          barrier_waiting_.erase(bw);
        }
      } else {
        remove_waiter(conn);
        barrier_waiting_[key].push_back(conn);
        barrier_of_[conn] = key;
      }
      return {};
    }
    case Op::WatchKey:
      watchers_[req.keys[0]].insert(conn);
      watched_by_[conn].push_back(req.keys[0]);
      w.u8(wire::kWatchCallbackRegistered);
      return {};
  }
  return {true, "unhandled operation"};
}

}  // namespace ddprun::store
