// StoreState's queues, barriers and watches: the requests that park a connection or wake
// others by name (QUEUE_PUSH/POP, BARRIER, WATCH_KEY). The rest: store_state.cpp and
// store_slices.cpp.
#include <string>

#include "ddprun/store/store_state.h"
#include "store_state_detail.h"

namespace ddprun::store {

using namespace detail;

void StoreState::on_queue_push(const std::string& key, std::vector<Outgoing>& others) {
  // A push wakes one waiter on that name: only one value can be popped.
  auto w = waiting_on_.find(key);
  if (w == waiting_on_.end()) return;
  while (!w->second.empty()) {
    ConnId c = w->second.front();
    w->second.erase(w->second.begin());
    auto wt = waiters_.find(c);
    if (wt == waiters_.end() || wt->second.removing) continue;
    if (--wt->second.remaining == 0) others.push_back({c, status(wire::kWaitStop), finish_waiter(wt)});
    break;
  }
  if (w->second.empty()) waiting_on_.erase(w);
}

ApplyResult StoreState::op_queue_push(ConnId conn, wire::Request& req, Reply& w, std::vector<Outgoing>& others) {
  (void)conn, (void)w;
  const bool fresh = !queues_.count(req.keys[0]);
  const uint64_t more = req.values[0].size() + (fresh ? req.keys[0].size() : 0);
  if (auto why = over_limit(fresh ? 1 : 0, more)) return refuse(*why);
  bytes_ += more;
  queues_[req.keys[0]].push_back(std::move(req.values[0]));
  on_queue_push(req.keys[0], others);
  return {};
}

ApplyResult StoreState::op_queue_pop(ConnId conn, wire::Request& req, Reply& w, std::vector<Outgoing>& others) {
  (void)conn, (void)others;
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

ApplyResult StoreState::op_barrier(ConnId conn, wire::Request& req, Reply& w, std::vector<Outgoing>& others) {
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

ApplyResult StoreState::op_watch_key(ConnId conn, wire::Request& req, Reply& w, std::vector<Outgoing>& others) {
  (void)others;
  // Each distinct key once per connection (a repeat registered it again), and a bounded number.
  const std::string& key = req.keys[0];
  auto ws = watchers_.find(key);
  if (ws == watchers_.end() || !ws->second.count(conn)) {
    auto& mine = watched_by_[conn];
    if (mine.size() >= limits_.max_watches_per_connection)
      return refuse("the connection watches " + std::to_string(mine.size()) + " keys, the limit (ddprund " +
                    "--max-watches-per-connection)");
    watchers_[key].insert(conn);
    mine.push_back(key);
    aux_bytes_ += entry_bytes(key);
  }
  w.u8(wire::kWatchCallbackRegistered);
  return {};
}

}  // namespace ddprun::store
