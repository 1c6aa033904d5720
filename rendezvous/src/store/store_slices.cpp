// StoreState's requests that are applied in slices when they are large (CHECK, MULTI_GET,
// MULTI_SET, LIST_KEYS: ApplyResult::more), with the lock let go between slices. The rest:
// store_state.cpp and store_queues.cpp.
#include <algorithm>
#include <string>
#include <utility>

#include "ddprun/store/store_state.h"
#include "store_state_detail.h"

namespace ddprun::store {

using wire::Op;
using namespace detail;

// The slicing state of `conn`'s request, a new one unless its previous slice was of `op`.
StoreState::Sliced& StoreState::slicing(ConnId conn, wire::Op op, bool& fresh) {
  auto it = sliced_.find(conn);
  fresh = it == sliced_.end() || it->second.op != op;
  if (!fresh) return it->second;
  if (it != sliced_.end()) end_slicing(conn);
  Sliced& s = sliced_[conn];
  s.op = op;
  return s;
}

void StoreState::end_slicing(ConnId conn) {
  auto it = sliced_.find(conn);
  if (it == sliced_.end()) return;
  aux_bytes_ -= it->second.bytes;
  sliced_.erase(it);
}

void StoreState::charge(Sliced& s, uint64_t bytes) {
  s.bytes += bytes;
  aux_bytes_ += bytes;
}

ApplyResult StoreState::op_check(ConnId conn, wire::Request& req, Reply& w) {
  // Many keys: looked up in slices; ready when each key existed when its slice ran (as
  // separate CHECKs would say), not ready at the first one missing.
  const size_t n = req.keys.size();
  bool fresh = false;
  Sliced* s = slice_end(req.keys, 0) == n ? nullptr : &slicing(conn, Op::Check, fresh);
  const size_t from = s ? s->next : 0, end = s ? slice_end(req.keys, from) : n;
  const bool missing =
      std::any_of(req.keys.begin() + from, req.keys.begin() + end, [&](const std::string& k) { return !exists(k); });
  if (s && !missing && end < n) {
    s->next = end;
    return {.more = true};
  }
  if (s) end_slicing(conn);
  w.u8(missing ? wire::kCheckNotReady : wire::kCheckReady);
  return {};
}

ApplyResult StoreState::op_multi_get(ConnId conn, wire::Request& req, Reply& w, std::vector<Outgoing>& others) {
  (void)others;
  // The reply references each value (memory O(keys)); its wire size is still bounded, so a
  // small request cannot make the server send a terabyte. One lookup per key: the values found
  // (shared references) size the reply, then fill it. Many keys: both steps in slices, so the
  // values of a large MULTI_GET are each read at its own moment, as separate GETs would be.
  const size_t n = req.keys.size();
  if (slice_end(req.keys, 0) == n) {
    std::vector<Value> found;
    found.reserve(n);
    uint64_t size = 0;
    for (const auto& k : req.keys) {
      auto it = kv_.find(k);
      found.push_back(it == kv_.end() ? Value() : it->second);
      size += 8 + (found.back() ? found.back()->size() : 0);
    }
    if (auto why = reply_too_large(size)) return refuse(*why);
    for (const auto& v : found) w.blob(v);
    return {};
  }
  bool fresh = false;
  Sliced& s = slicing(conn, Op::MultiGet, fresh);
  if (fresh) s.found.reserve(n);
  if (!s.emitting) {
    const size_t end = slice_end(req.keys, s.next);
    for (size_t i = s.next; i < end; ++i) {
      auto it = kv_.find(req.keys[i]);
      s.found.push_back(it == kv_.end() ? Value() : it->second);
      s.size += 8 + (s.found.back() ? s.found.back()->size() : 0);
    }
    charge(s, (end - s.next) * sizeof(Value));
    s.next = end;
    if (end < n) return {.more = true};
    if (auto why = reply_too_large(s.size)) {
      end_slicing(conn);
      return refuse(*why);
    }
    s.emitting = true;
    s.next = 0;
  }
  const size_t end = std::min(n, s.next + kWaitSlice);
  for (size_t i = s.next; i < end; ++i) w.blob(s.found[i]);
  s.next = end;
  if (end < n) return {.more = true};
  end_slicing(conn);
  return {};
}

ApplyResult StoreState::op_multi_set(ConnId conn, wire::Request& req, Reply& w, std::vector<Outgoing>& others) {
  (void)w;
  // The limits are checked for the whole request before its first key is stored. Many keys:
  // both the check and the stores in slices (each key's SET atomic, the request as a whole not,
  // as separate SETs would be).
  const size_t n = req.keys.size();
  auto check = [&](size_t from, size_t to, uint64_t& new_keys, uint64_t& more) {
    for (size_t i = from; i < to; ++i) {
      if (!kv_.count(req.keys[i])) ++new_keys;
      more += req.keys[i].size() + req.values[i].size();  // an upper bound: replaced values not subtracted
    }
  };
  if (slice_end(req.keys, 0) == n) {
    uint64_t new_keys = 0, more = 0;
    check(0, n, new_keys, more);
    if (auto why = over_limit(new_keys, more)) return refuse(*why);
    for (size_t i = 0; i < n; ++i) set_value(req.keys[i], make_value(std::move(req.values[i])), others);
    return {};
  }
  bool fresh = false;
  Sliced& s = slicing(conn, Op::MultiSet, fresh);
  const size_t end = slice_end(req.keys, s.next);
  if (!s.emitting) {  // counting the keys it adds
    check(s.next, end, s.count, s.size);
    s.next = end;
    if (end < n) return {.more = true};
    if (auto why = over_limit(s.count, s.size)) {
      end_slicing(conn);
      return refuse(*why);
    }
    kv_.reserve(kv_.size() + s.count);  // one rehash now, not one in a slice of the stores
    s.emitting = true;
    s.next = 0;
    return {.more = true};
  }
  for (size_t i = s.next; i < end; ++i) set_value(req.keys[i], make_value(std::move(req.values[i])), others);
  s.next = end;
  if (end < n) return {.more = true};
  end_slicing(conn);
  return {};
}

ApplyResult StoreState::op_list_keys(ConnId conn, wire::Request& req, Reply& w, std::vector<Outgoing>& others) {
  (void)req, (void)others;
  // The keys are copied into one buffer (the reply references it), walking the keyspace's hash
  // buckets kListSliceBuckets at a time. A key stored or removed between slices may or may not
  // be listed; every key present throughout is listed once. A rehash between slices starts the
  // walk again (the table only doubles, so that happens a few times at most).
  if (kv_.bucket_count() <= kListSliceBuckets) {
    uint64_t size = 8;
    for (const auto& [k, _] : kv_) size += 8 + k.size();
    if (auto why = reply_too_large(size)) return refuse(*why);
    w.reserve(static_cast<size_t>(size));  // one allocation, not a doubling cascade of copies
    w.i64(static_cast<int64_t>(kv_.size()));
    for (const auto& [k, _] : kv_) w.blob(k);
    return {};
  }
  bool fresh = false;
  Sliced& s = slicing(conn, Op::ListKeys, fresh);
  if (fresh || s.buckets != kv_.bucket_count()) {
    aux_bytes_ -= s.bytes;  // a rehash: what was listed is dropped
    s.bytes = 0;
    s.listed = std::string();
    s.next = s.count = 0;
    s.size = 8;
    s.buckets = kv_.bucket_count();
  }
  const size_t end = std::min(s.buckets, s.next + kListSliceBuckets);
  const size_t held = s.listed.capacity();
  for (size_t b = s.next; b < end; ++b) {
    for (auto it = kv_.begin(b); it != kv_.end(b); ++it) {
      wire::Writer(s.listed).blob(it->first);
      ++s.count;
    }
  }
  s.size = 8 + s.listed.size();
  charge(s, s.listed.capacity() - held);
  s.next = end;
  if (auto why = reply_too_large(s.size)) {
    end_slicing(conn);
    return refuse(*why);
  }
  if (end < s.buckets) return {.more = true};
  w.i64(static_cast<int64_t>(s.count));
  w.raw(make_value(std::move(s.listed)));
  end_slicing(conn);
  return {};
}

}  // namespace ddprun::store
