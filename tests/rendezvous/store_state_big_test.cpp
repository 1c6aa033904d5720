// Store state: large requests (linear cost, slices, amortised appends) and their limits.
#include "store_state_harness.h"

TEST_CASE("WaitOfManyKeysIsLinear: 64 Ki keys with duplicates in well under a second", "[state][cost]") {
  // A linear search per key made this O(n^2): 42 s under the lock every client shares.
  store::StoreState s(store::StoreLimits{});
  Harness h(std::move(s));
  std::vector<std::string> keys;
  for (int i = 0; i < 64 * 1024; ++i) keys.push_back("/key/" + std::to_string(i % (48 * 1024)));
  const auto t0 = std::chrono::steady_clock::now();
  CHECK(h.call(2, Op::Wait, keys).empty());  // deferred
  const auto held = std::chrono::steady_clock::now() - t0;
  CHECK(held < std::chrono::milliseconds(500));
  CHECK(h.state.num_waiting_connections() == 1);
  // Every distinct key counts once: the last one set releases it, not before.
  for (int i = 0; i + 1 < 48 * 1024; ++i) h.call(1, Op::Set, {"/key/" + std::to_string(i)}, {"v"});
  CHECK(h.others.empty());
  h.call(1, Op::Set, {"/key/" + std::to_string(48 * 1024 - 1)}, {"v"});
  REQUIRE(h.others.size() == 1);
  CHECK(h.others[0].conn == 2);
}

TEST_CASE("A WAIT of many keys is registered in slices and answers once, after its last slice", "[state][cost]") {
  Harness h;
  const size_t n = 3 * store::kWaitSlice + 5;
  wire::Request wait;
  wait.op = Op::Wait;
  for (size_t i = 0; i < n; ++i) wait.keys.push_back("/k/" + std::to_string(i % (n - 10)));  // 10 repeats
  h.call(1, Op::Set, {"/k/0"}, {"v"});  // there already
  store::Reply r;
  std::vector<store::Outgoing> others;
  auto slice = [&] {
    r.clear();
    return h.state.apply(2, wire::Dialect::D2, wait, r, others);
  };
  int slices = 1;
  auto res = slice();
  // Between slices (the server lets its lock go there), every other key appears, one of them a
  // key the WAIT already registered and one it has yet to see; nothing answers the WAIT yet.
  while (res.more) {
    CHECK(r.empty());
    for (size_t i = 1; i < n - 10; ++i) h.call(3, Op::Set, {"/k/" + std::to_string(i)}, {"v"});
    for (const auto& o : h.others) CHECK(o.conn != 2);
    res = slice();
    ++slices;
  }
  CHECK(slices == 4);
  CHECK(others.empty());
  // Every key existed by the last slice: the WAIT is answered by its own reply, once.
  CHECK(r.flatten() == std::string(1, static_cast<char>(wire::kWaitStop)));
  CHECK(h.state.num_waiting_connections() == 0);
  h.call(3, Op::Set, {"/k/1"}, {"again"});
  CHECK(h.others.empty());
  CHECK(h.state.memory() == h.state.bytes());  // the keys it named are no longer counted
}

TEST_CASE("A WAIT in slices that some key still lacks is answered by the SET of that key", "[state]") {
  Harness h;
  std::vector<std::string> keys;
  for (size_t i = 0; i < 2 * store::kWaitSlice; ++i) keys.push_back("/w/" + std::to_string(i));
  CHECK(h.call(2, Op::Wait, keys).empty());  // all slices: deferred
  for (size_t i = 0; i + 1 < keys.size(); ++i) h.call(1, Op::Set, {keys[i]}, {"v"});
  CHECK(h.others.empty());
  h.call(1, Op::Set, {keys.back()}, {"v"});
  REQUIRE(h.others.size() == 1);
  CHECK(h.others[0].conn == 2);
  CHECK(h.state.num_waiting_connections() == 0);
}

TEST_CASE("AppendIsAmortisedLinear: 15,000 appends grow the value in place", "[state][cost]") {
  // Copying the whole value on each APPEND made this quadratic (seconds under the lock).
  Harness h;
  const std::string piece(512, 'a');
  const auto t0 = std::chrono::steady_clock::now();
  for (int i = 0; i < 15000; ++i) h.call(1, Op::Append, {"/log"}, {piece});
  CHECK(std::chrono::steady_clock::now() - t0 < std::chrono::milliseconds(1000));
  REQUIRE_FALSE(h.last.close);
  CHECK(h.state.bytes() == 4 + 15000 * piece.size());
  CHECK(h.call(1, Op::Get, {"/log"}).size() == 8 + 15000 * piece.size());
}

TEST_CASE("AppendCopiesAValueThatAReplyInFlightHolds", "[state]") {
  Harness h;
  h.call(1, Op::Set, {"k"}, {std::string(1000, 'x')});
  store::Reply held;
  std::vector<store::Outgoing> others;
  wire::Request get;
  get.op = Op::Get;
  get.keys = {"k"};
  h.state.apply(2, wire::Dialect::D2, get, held, others);
  const std::string before = held.flatten();
  h.call(1, Op::Append, {"k"}, {"tail"});
  REQUIRE_FALSE(h.last.close);
  CHECK(held.flatten() == before);  // the reply still carries the bytes it was built with
  CHECK(h.call(1, Op::Get, {"k"}) == blob(std::string(1000, 'x') + "tail"));
  // Nothing holds the new value: the next APPEND grows it, and GET sees every byte.
  held = store::Reply();
  h.call(1, Op::Append, {"k"}, {"more"});
  CHECK(h.call(1, Op::Get, {"k"}) == blob(std::string(1000, 'x') + "tailmore"));
}

TEST_CASE("WatchKeyIsBoundedPerConnectionAndARepeatRegistersOnce", "[state][limits]") {
  store::StoreLimits limits;
  limits.max_watches_per_connection = 3;
  Harness h{store::StoreState(limits)};
  const uint64_t empty = h.state.memory();
  for (int i = 0; i < 1000; ++i) CHECK(h.call(1, Op::WatchKey, {"/same"}) == std::string(1, '\3'));
  const uint64_t one = h.state.memory();
  CHECK(one > empty);
  h.call(1, Op::WatchKey, {"/b"});
  h.call(1, Op::WatchKey, {"/c"});
  REQUIRE_FALSE(h.last.close);
  h.call(1, Op::WatchKey, {"/d"});
  CHECK(h.last.close);
  CHECK(h.last.error.find("--max-watches-per-connection") != std::string::npos);
  // One event per watcher, however often it asked.
  h.call(2, Op::Set, {"/same"}, {"v"});
  CHECK(h.others.size() == 1);
  h.state.disconnect(1);
  CHECK(h.state.memory() == h.state.bytes());
}

TEST_CASE("MemoryCountsTheKeysWaitersName", "[state][limits]") {
  Harness h;
  CHECK(h.call(1, Op::Wait, {std::string(1000, 'a'), std::string(1000, 'b')}).empty());
  CHECK(h.state.memory() >= h.state.bytes() + 2000);
  h.call(1, Op::CancelWait);
  CHECK(h.state.memory() == h.state.bytes());
  h.call(1, Op::Wait, {"k"});
  h.call(2, Op::Set, {"k"}, {"v"});  // released: its keys no longer held
  CHECK(h.state.memory() == h.state.bytes());
}

TEST_CASE("ALargeReplyIsRefusedBeforeItIsBuiltWhenTheCallerHasNoRoom", "[state][limits]") {
  Harness h;
  for (int i = 0; i < 100; ++i) h.call(1, Op::Set, {"/k/" + std::to_string(i)}, {std::string(100, 'v')});
  wire::Request r;
  r.op = Op::ListKeys;
  store::Reply reply;
  std::vector<store::Outgoing> others;
  auto refused = h.state.apply(2, wire::Dialect::D2, r, reply, others, 100);
  CHECK(refused.close);
  CHECK(refused.error.find("--max-memory") != std::string::npos);
  CHECK(reply.empty());
  r.op = Op::MultiGet;
  r.keys = {"/k/1", "/k/2"};
  CHECK(h.state.apply(2, wire::Dialect::D2, r, reply, others, 100).close);
  CHECK(reply.empty());
  CHECK_FALSE(h.state.apply(2, wire::Dialect::D2, r, reply, others, 1000).close);
  CHECK(reply.wire_size() == 2 * (8 + 100));
}

namespace {
// Applies `r` for `conn` one slice at a time, calling `between` where the server lets its lock
// go; returns the reply of all slices and counts them.
std::string sliced(store::StoreState& st, store::ConnId conn, wire::Request& r, int& slices,
                   const std::function<void()>& between = {}) {
  store::Reply reply;
  std::vector<store::Outgoing> others;
  std::string out;
  slices = 0;
  store::ApplyResult res;
  do {
    if (slices && between) between();
    reply.clear();
    res = st.apply(conn, wire::Dialect::D2, r, reply, others);
    REQUIRE_FALSE(res.close);
    out += reply.flatten();
    ++slices;
  } while (res.more);
  return out;
}
}  // namespace

TEST_CASE("A MULTI_GET of many keys is answered in slices, each value in request order", "[state][cost]") {
  Harness h;
  const size_t n = 3 * store::kWaitSlice + 7;
  wire::Request get;
  get.op = Op::MultiGet;
  std::string expected;
  for (size_t i = 0; i < n; ++i) {
    const std::string k = "/g/" + std::to_string(i);
    get.keys.push_back(k);
    if (i % 3) {
      const std::string v = i % 5 ? "v" + std::to_string(i) : std::string(100 + i % 200, 'x');  // inline and referenced
      h.call(1, Op::Set, {k}, {v});
      expected += blob(v);
    } else {
      expected += blob("");
    }
  }
  int slices = 0;
  CHECK(sliced(h.state, 2, get, slices) == expected);
  CHECK(slices > 3);  // looked up in slices, then written in slices
  CHECK(h.state.memory() == h.state.bytes());  // nothing of it held afterwards
  // At most kWaitSlice keys: one call, as before.
  get.keys.resize(store::kWaitSlice);
  sliced(h.state, 2, get, slices);
  CHECK(slices == 1);
}

TEST_CASE("A MULTI_SET of many keys is stored in slices; other clients run between them", "[state][cost]") {
  Harness h;
  const size_t n = 2 * store::kWaitSlice + 3;
  wire::Request set;
  set.op = Op::MultiSet;
  for (size_t i = 0; i < n; ++i) {
    set.keys.push_back("/s/" + std::to_string(i));
    set.values.push_back(std::to_string(i));
  }
  // A WAIT on the last key, from another connection, is answered when the last slice stores it.
  CHECK(h.call(3, Op::Wait, {set.keys.back()}).empty());
  int slices = 0;
  std::vector<std::string> seen_between;
  sliced(h.state, 2, set, slices, [&] { seen_between.push_back(h.call(4, Op::GetNumKeys)); });
  CHECK(slices == 6);  // 3 slices checking the limits, 3 storing
  REQUIRE(seen_between.size() == 5);
  CHECK(seen_between[2] == i64(0));  // checked: nothing stored yet
  CHECK(seen_between[3] == i64(store::kWaitSlice));  // the first slice's keys, visible between slices
  CHECK(h.state.num_keys() == n);
  CHECK(h.call(4, Op::Get, {"/s/4000"}) == blob("4000"));
  CHECK(h.state.num_waiting_connections() == 0);
  CHECK(h.state.memory() == h.state.bytes());
  // Past the key limit: refused before any key is stored.
  store::StoreLimits lim;
  lim.max_keys = n - 1;
  Harness small{store::StoreState(lim)};
  wire::Request again = set;
  for (size_t i = 0; i < n; ++i) again.values[i] = "x";
  store::Reply r;
  std::vector<store::Outgoing> o;
  store::ApplyResult res;
  do res = small.state.apply(2, wire::Dialect::D2, again, r, o);
  while (res.more && small.state.num_keys() == 0);
  CHECK(res.close);
  CHECK(res.error.find("--max-store-keys") != std::string::npos);
  CHECK(small.state.num_keys() == 0);
}

TEST_CASE("A LIST_KEYS of a large keyspace walks it in slices and lists every key once", "[state][cost]") {
  Harness h;
  const size_t n = 20000;
  for (size_t i = 0; i < n; ++i) h.call(1, Op::Set, {"/l/" + std::to_string(i)}, {"v"});
  wire::Request list;
  list.op = Op::ListKeys;
  int slices = 0;
  // Between slices other clients add keys (enough to rehash the table once) and delete some:
  // every key present throughout is listed exactly once.
  size_t added = 0;
  std::string r = sliced(h.state, 2, list, slices, [&] {
    for (int j = 0; j < 8000; ++j) h.call(3, Op::Set, {"/new/" + std::to_string(added++)}, {"v"});
    h.call(3, Op::DeleteKey, {"/l/" + std::to_string(n - 1)});
  });
  CHECK(slices > 1);
  REQUIRE(r.size() >= 8);
  int64_t count = 0;
  std::memcpy(&count, r.data(), 8);
  std::map<std::string, int> listed;
  size_t at = 8;
  while (at < r.size()) {
    uint64_t len = 0;
    std::memcpy(&len, r.data() + at, 8);
    listed[r.substr(at + 8, len)]++;
    at += 8 + len;
  }
  CHECK(at == r.size());
  size_t total = 0;
  for (auto& [k, c] : listed) {
    CHECK(c == 1);
    total += c;
  }
  CHECK(static_cast<size_t>(count) == total);
  for (size_t i = 0; i + 1 < n; ++i) CHECK(listed.count("/l/" + std::to_string(i)) == 1);
  CHECK(h.state.memory() == h.state.bytes());
}
