#include "ddprun/store/store_state.h"

#include <algorithm>
#include <cerrno>
#include <cstdlib>

namespace ddprun::store {

using wire::Op;
using wire::Writer;

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

}  // namespace

std::optional<int64_t> StoreState::integer(const std::string& key) const {
  auto it = kv_.find(key);
  int64_t v = 0;
  if (it == kv_.end() || !parse_integer(it->second, v)) return std::nullopt;
  return v;
}

bool StoreState::exists(const std::string& key) const {
  if (kv_.count(key)) return true;
  auto q = queues_.find(key);
  return q != queues_.end() && !q->second.empty();
}

void StoreState::set_value(const std::string& key, std::string value, std::vector<Outgoing>& others) {
  auto it = kv_.find(key);
  if (it == kv_.end()) {
    auto [ins, _] = kv_.emplace(key, std::move(value));
    on_stored(key, nullptr, ins->second, others);
  } else if (watchers_.empty()) {
    it->second = std::move(value);
    on_stored(key, nullptr, it->second, others);
  } else {
    std::string old = std::move(it->second);
    it->second = std::move(value);
    on_stored(key, &old, it->second, others);
  }
}

void StoreState::on_stored(const std::string& key, const std::string* old_value, const std::string& new_value,
                           std::vector<Outgoing>& others) {
  if (auto w = waiting_on_.find(key); w != waiting_on_.end()) {
    std::vector<ConnId> conns = std::move(w->second);
    waiting_on_.erase(w);
    for (ConnId c : conns) {
      auto wt = waiters_.find(c);
      if (wt == waiters_.end()) continue;
      if (--wt->second.remaining == 0) {
        waiters_.erase(wt);
        others.push_back({c, std::string(1, static_cast<char>(wire::kWaitStop))});
      }
    }
  }
  if (auto ws = watchers_.find(key); ws != watchers_.end()) {
    for (ConnId c : ws->second) {
      std::string ev;
      Writer(ev)
          .u8(old_value ? wire::kWatchKeyUpdated : wire::kWatchKeyCreated)
          .blob(key)
          .blob(old_value ? *old_value : std::string())
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
      others.push_back({c, std::string(1, static_cast<char>(wire::kWaitStop))});
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
}

ApplyResult StoreState::apply(ConnId conn, wire::Dialect d, const wire::Request& req, std::string& reply,
                              std::vector<Outgoing>& others) {
  (void)d;
  Writer w(reply);
  switch (req.op) {
    case Op::Validate:
      return {true, "VALIDATE after the connection was already validated"};
    case Op::Ping:
      w.u32(req.u32);
      return {};
    case Op::Set:
      set_value(req.keys[0], req.values[0], others);
      return {};
    case Op::CompareSet: {
      const std::string& key = req.keys[0];
      const std::string& expected = req.values[0];
      const std::string& desired = req.values[1];
      auto it = kv_.find(key);
      if (it == kv_.end()) {
        if (expected.empty()) {
          set_value(key, desired, others);
          w.blob(desired);
        } else {
          w.blob(expected);  // PyTorch's servers "pretend": nothing stored, expected echoed
        }
      } else if (it->second == expected) {
        set_value(key, desired, others);
        w.blob(desired);
      } else {
        w.blob(it->second);
      }
      return {};
    }
    case Op::Get: {
      auto it = kv_.find(req.keys[0]);
      w.blob(it == kv_.end() ? std::string_view() : std::string_view(it->second));
      return {};
    }
    case Op::Add: {
      int64_t current = 0;
      auto it = kv_.find(req.keys[0]);
      if (it != kv_.end() && !parse_integer(it->second, current))
        return {true, "ADD on key whose value is not an integer"};
      // Two's-complement wrap, as the int64 arithmetic of PyTorch's servers.
      int64_t next = static_cast<int64_t>(static_cast<uint64_t>(current) + static_cast<uint64_t>(req.number));
      set_value(req.keys[0], std::to_string(next), others);
      w.i64(next);
      return {};
    }
    case Op::Check: {
      bool ready = std::all_of(req.keys.begin(), req.keys.end(), [&](const std::string& k) { return exists(k); });
      w.u8(ready ? wire::kCheckReady : wire::kCheckNotReady);
      return {};
    }
    case Op::Wait: {
      Waiter waiter;
      for (const auto& k : req.keys) {
        if (exists(k)) continue;
        if (std::find(waiter.keys.begin(), waiter.keys.end(), k) != waiter.keys.end()) continue;
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
            std::string ev;
            Writer(ev).u8(wire::kWatchKeyDeleted).blob(req.keys[0]).blob(it->second).blob("");
            others.push_back({c, std::move(ev)});
          }
        }
        kv_.erase(it);
      }
      w.i64(removed ? 1 : 0);
      return {};
    }
    case Op::Append: {
      auto it = kv_.find(req.keys[0]);
      std::string v = it == kv_.end() ? req.values[0] : it->second + req.values[0];
      set_value(req.keys[0], std::move(v), others);
      return {};
    }
    case Op::MultiGet:
      for (const auto& k : req.keys) {
        auto it = kv_.find(k);
        w.blob(it == kv_.end() ? std::string_view() : std::string_view(it->second));
      }
      return {};
    case Op::MultiSet:
      for (size_t i = 0; i < req.keys.size(); ++i) set_value(req.keys[i], req.values[i], others);
      return {};
    case Op::CancelWait:
      remove_waiter(conn);
      w.u8(wire::kWaitCanceled);
      return {};
    case Op::QueuePush:
      queues_[req.keys[0]].push_back(req.values[0]);
      on_queue_push(req.keys[0], others);
      return {};
    case Op::QueuePop: {
      auto q = queues_.find(req.keys[0]);
      int64_t len = q == queues_.end() ? 0 : static_cast<int64_t>(q->second.size());
      w.i64(len);
      if (len > 0) {
        w.blob(q->second.front());
        q->second.pop_front();
        if (q->second.empty()) queues_.erase(q);
      }
      return {};
    }
    case Op::QueueLen: {
      auto q = queues_.find(req.keys[0]);
      w.i64(q == queues_.end() ? 0 : static_cast<int64_t>(q->second.size()));
      return {};
    }
    case Op::ListKeys:
      w.i64(static_cast<int64_t>(kv_.size()));
      for (const auto& [k, _] : kv_) w.blob(k);
      return {};
    case Op::Barrier: {
      const std::string& key = req.keys[0];
      int64_t count = 0;
      auto it = kv_.find(key);
      if (it != kv_.end() && !parse_integer(it->second, count))
        return {true, "BARRIER on key whose value is not an integer"};
      ++count;
      set_value(key, std::to_string(count), others);
      if (count >= req.number) {
        w.u8(wire::kWaitStop);
        if (auto bw = barrier_waiting_.find(key); bw != barrier_waiting_.end()) {
          for (ConnId c : bw->second) {
            others.push_back({c, std::string(1, static_cast<char>(wire::kWaitStop))});
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
