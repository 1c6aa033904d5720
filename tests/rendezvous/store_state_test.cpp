#include <catch2/catch.hpp>
#include <chrono>
#include <cstring>
#include <functional>
#include <map>

#include "ddprun/store/store_state.h"

using namespace ddprun;
using wire::Op;

namespace {
struct Harness {
  Harness() = default;
  explicit Harness(store::StoreState s) : state(std::move(s)) {}
  store::StoreState state;
  std::vector<store::Outgoing> others;
  store::Reply reply;
  store::ApplyResult last;

  std::string call(store::ConnId c, Op op, std::vector<std::string> keys = {}, std::vector<std::string> values = {},
                   int64_t number = 0) {
    wire::Request r;
    r.op = op;
    r.keys = std::move(keys);
    r.values = std::move(values);
    r.number = number;
    reply.clear();
    others.clear();
    last = state.apply(c, wire::Dialect::D2, r, reply, others);
    // A request applied in slices (ApplyResult::more) is continued, as the server does; each
    // slice may add to the reply.
    std::string out = reply.flatten();
    while (last.more) {
      reply.clear();
      last = state.apply(c, wire::Dialect::D2, r, reply, others);
      out += reply.flatten();
    }
    return out;
  }
};
std::string blob(const std::string& s) {
  std::string out;
  wire::Writer(out).blob(s);
  return out;
}
std::string i64(int64_t v) {
  std::string out;
  wire::Writer(out).i64(v);
  return out;
}
}  // namespace

TEST_CASE("CompareSetMatrix", "[state]") {
  Harness h;
  // missing key, empty expected: stored
  CHECK(h.call(1, Op::CompareSet, {"k"}, {"", "a"}) == blob("a"));
  CHECK(h.state.contains("k"));
  // present, matching: stored
  CHECK(h.call(1, Op::CompareSet, {"k"}, {"a", "b"}) == blob("b"));
  // present, mismatching: current value returned, nothing stored
  CHECK(h.call(1, Op::CompareSet, {"k"}, {"zz", "c"}) == blob("b"));
  CHECK(h.call(1, Op::Get, {"k"}) == blob("b"));
  // missing key, non-empty expected: the server pretends, echoes expected, stores nothing
  CHECK(h.call(1, Op::CompareSet, {"m"}, {"x", "y"}) == blob("x"));
  CHECK_FALSE(h.state.contains("m"));
  // present, matching, empty desired: stored empty
  CHECK(h.call(1, Op::CompareSet, {"k"}, {"b", ""}) == blob(""));
  CHECK(h.state.contains("k"));
}

TEST_CASE("AddStoresDecimalTextAndParsesLikeStoll", "[state]") {
  Harness h;
  CHECK(h.call(1, Op::Add, {"c"}, {}, 5) == i64(5));
  CHECK(h.call(1, Op::Add, {"c"}, {}, -8) == i64(-3));
  CHECK(h.call(1, Op::Get, {"c"}) == blob("-3"));
  h.call(1, Op::Set, {"s"}, {" 12 trailing"});
  CHECK(h.call(1, Op::Add, {"s"}, {}, 1) == i64(13));
}

TEST_CASE("AddOnNonNumericValueClosesAndChangesNothing", "[state]") {
  Harness h;
  h.call(1, Op::Set, {"s"}, {"abc"});
  h.call(1, Op::Add, {"s"}, {}, 1);
  CHECK(h.last.close);
  CHECK(h.call(1, Op::Get, {"s"}) == blob("abc"));
  h.call(1, Op::Set, {"e"}, {""});
  h.call(1, Op::Add, {"e"}, {}, 1);
  CHECK(h.last.close);
  h.call(1, Op::Set, {"big"}, {"99999999999999999999999"});
  h.call(1, Op::Add, {"big"}, {}, 1);
  CHECK(h.last.close);
}

TEST_CASE("WaitIsDeferredUntilEveryKeyExists", "[state]") {
  Harness h;
  h.call(1, Op::Set, {"a"}, {"1"});
  CHECK(h.call(2, Op::Wait, {"a", "b", "c", "b"}).empty());  // deferred
  CHECK(h.state.num_waiting_connections() == 1);
  h.call(3, Op::Set, {"b"}, {"1"});
  CHECK(h.others.empty());
  h.call(3, Op::Add, {"c"}, {}, 1);
  REQUIRE(h.others.size() == 1);
  CHECK(h.others[0].conn == 2);
  CHECK(h.others[0].reply.flatten() == std::string(1, '\0'));
  CHECK(h.state.num_waiting_connections() == 0);
  // Present keys answer at once; an empty list too.
  CHECK(h.call(2, Op::Wait, {"a"}) == std::string(1, '\0'));
  CHECK(h.call(2, Op::Wait, {}) == std::string(1, '\0'));
}

TEST_CASE("A WAIT whose keys are all there answers at once, registers nothing and drops an earlier wait", "[state]") {
  Harness h;
  h.call(1, Op::Set, {"a"}, {"1"});
  const uint64_t before = h.state.memory();
  CHECK(h.call(2, Op::Wait, {"a", "a"}) == std::string(1, '\0'));
  CHECK(h.state.num_waiting_connections() == 0);
  CHECK(h.state.memory() == before);
  // An earlier WAIT of the same connection still pending: replaced, as by any WAIT.
  CHECK(h.call(2, Op::Wait, {"b"}).empty());
  CHECK(h.state.num_waiting_connections() == 1);
  CHECK(h.call(2, Op::Wait, {"a"}) == std::string(1, '\0'));
  CHECK(h.state.num_waiting_connections() == 0);
  CHECK(h.state.memory() == before);
  h.call(1, Op::Set, {"b"}, {"1"});
  CHECK(h.others.empty());  // no stray 00 for the replaced wait
}

TEST_CASE("EveryWritingOpWakesWaiters", "[state]") {
  for (Op op : {Op::Set, Op::Add, Op::Append, Op::MultiSet, Op::CompareSet}) {
    Harness h;
    h.call(2, Op::Wait, {"k"});
    if (op == Op::CompareSet) h.call(1, op, {"k"}, {"", "v"});
    else h.call(1, op, {"k"}, {"1"}, 1);
    INFO(wire::op_name(op));
    REQUIRE(h.others.size() == 1);
    CHECK(h.others[0].conn == 2);
  }
}

TEST_CASE("CancelWaitRemovesTheWaiterAndAlwaysRepliesOne", "[state]") {
  Harness h;
  h.call(2, Op::Wait, {"k"});
  CHECK(h.call(2, Op::CancelWait) == std::string(1, '\1'));
  h.call(1, Op::Set, {"k"}, {"v"});
  CHECK(h.others.empty());  // no stray 00 after a cancel
  CHECK(h.call(2, Op::CancelWait) == std::string(1, '\1'));  // nothing pending: still 01
}

TEST_CASE("DisconnectDropsTheWaiter", "[state]") {
  Harness h;
  h.call(2, Op::Wait, {"k"});
  h.state.disconnect(2);
  h.call(1, Op::Set, {"k"}, {"v"});
  CHECK(h.others.empty());
}

TEST_CASE("DeleteDoesNotWakeAndReportsRemoval", "[state]") {
  Harness h;
  h.call(1, Op::Set, {"k"}, {"v"});
  CHECK(h.call(1, Op::DeleteKey, {"k"}) == i64(1));
  CHECK(h.call(1, Op::DeleteKey, {"k"}) == i64(0));
  CHECK(h.call(1, Op::GetNumKeys) == i64(0));
}

TEST_CASE("GetOfMissingKeyIsEmptyBlob", "[state]") {
  Harness h;
  CHECK(h.call(1, Op::Get, {"nope"}) == blob(""));
  h.call(1, Op::Set, {"a"}, {"1"});
  CHECK(h.call(1, Op::MultiGet, {"a", "nope"}) == blob("1") + blob(""));
}

TEST_CASE("AppendConcatenatesOrCreates", "[state]") {
  Harness h;
  h.call(1, Op::Append, {"k"}, {"ab"});
  h.call(1, Op::Append, {"k"}, {"cd"});
  CHECK(h.call(1, Op::Get, {"k"}) == blob("abcd"));
}

TEST_CASE("QueuesAreFifoAndSeparateFromKeys", "[state]") {
  Harness h;
  h.call(2, Op::Wait, {"q"});
  h.call(3, Op::Wait, {"q"});
  h.call(1, Op::QueuePush, {"q"}, {"one"});
  REQUIRE(h.others.size() == 1);  // a push wakes exactly one waiter
  CHECK(h.others[0].conn == 2);
  h.call(1, Op::QueuePush, {"q"}, {"two"});
  REQUIRE(h.others.size() == 1);
  CHECK(h.others[0].conn == 3);
  CHECK(h.call(1, Op::QueueLen, {"q"}) == i64(2));
  CHECK(h.call(1, Op::Check, {"q"}) == std::string(1, '\0'));
  CHECK(h.call(1, Op::QueuePop, {"q"}) == i64(2) + blob("one"));
  CHECK(h.call(1, Op::QueuePop, {"q"}) == i64(1) + blob("two"));
  CHECK(h.call(1, Op::QueuePop, {"q"}) == i64(0));
  CHECK(h.call(1, Op::GetNumKeys) == i64(0));
}

TEST_CASE("ListKeysReturnsRawKeys", "[state]") {
  Harness h;
  h.call(1, Op::Set, {"/a"}, {"1"});
  h.call(1, Op::Add, {"init/"}, {}, 1);
  std::string r = h.call(1, Op::ListKeys);
  CHECK(r.substr(0, 8) == i64(2));
  CHECK(r.find(blob("/a")) != std::string::npos);
  CHECK(r.find(blob("init/")) != std::string::npos);
}

TEST_CASE("BarrierReleasesEveryoneAtWorldSize", "[state]") {
  Harness h;
  CHECK(h.call(1, Op::Barrier, {"b"}, {}, 3).empty());
  CHECK(h.call(2, Op::Barrier, {"b"}, {}, 3).empty());
  CHECK(h.call(3, Op::Barrier, {"b"}, {}, 3) == std::string(1, '\0'));
  REQUIRE(h.others.size() == 2);
}

TEST_CASE("WatchKeySendsEventsOnChange", "[state]") {
  Harness h;
  CHECK(h.call(5, Op::WatchKey, {"w"}) == std::string(1, '\3'));
  h.call(1, Op::Set, {"w"}, {"v1"});
  REQUIRE(h.others.size() == 1);
  std::string created;
  wire::Writer(created).u8(wire::kWatchKeyCreated).blob("w").blob("").blob("v1");
  CHECK(h.others[0].reply.flatten() == created);
  h.call(1, Op::DeleteKey, {"w"});
  REQUIRE(h.others.size() == 1);
  CHECK(h.others[0].reply.flatten()[0] == wire::kWatchKeyDeleted);
}

TEST_CASE("SecondValidateCloses", "[state]") {
  Harness h;
  h.call(1, Op::Validate);
  CHECK(h.last.close);
}

TEST_CASE("ClearEmptiesEverything", "[state]") {
  Harness h;
  h.call(1, Op::Set, {"a"}, {"1"});
  h.call(2, Op::Wait, {"b"});
  h.state.clear();
  CHECK(h.state.num_keys() == 0);
  CHECK(h.state.num_waiting_connections() == 0);
}

TEST_CASE("IntegerReadsCountersLikeAdd", "[state]") {
  Harness h;
  CHECK_FALSE(h.state.integer("init/").has_value());
  h.call(1, Op::Add, {"init/"}, {}, 2);
  CHECK(h.state.integer("init/") == 2);
  h.call(1, Op::Set, {"txt"}, {"abc"});
  CHECK_FALSE(h.state.integer("txt").has_value());
}

TEST_CASE("StoreLimitsRefuseWithoutChangingAnything", "[state][limits]") {
  store::StoreLimits lim;
  lim.max_keys = 3;
  lim.max_bytes = 100;
  lim.max_reply_bytes = 64;
  lim.max_value_len = 40;
  Harness h{store::StoreState(lim)};
  h.call(1, Op::Set, {"a"}, {std::string(30, 'x')});
  REQUIRE_FALSE(h.last.close);
  CHECK(h.state.bytes() == 31);
  // A MULTI_GET naming one value often enough to pass the reply limit: refused, not built.
  h.call(1, Op::MultiGet, {"a", "a", "a"});
  CHECK(h.last.close);
  CHECK(h.last.error.find("--max-reply-bytes") != std::string::npos);
  CHECK(h.reply.empty());
  h.call(1, Op::MultiGet, {"a"});
  CHECK_FALSE(h.last.close);
  // APPEND past the value limit.
  h.call(1, Op::Append, {"a"}, {std::string(20, 'y')});
  CHECK(h.last.close);
  CHECK(h.state.bytes() == 31);
  // Bytes per store.
  h.call(1, Op::Set, {"b"}, {std::string(40, 'x')});
  REQUIRE_FALSE(h.last.close);
  h.call(1, Op::Set, {"c"}, {std::string(40, 'x')});
  CHECK(h.last.close);
  CHECK(h.last.error.find("--max-store-bytes") != std::string::npos);
  CHECK_FALSE(h.state.contains("c"));
  // Replacing a value by a smaller one is always allowed; deleting frees its bytes.
  h.call(1, Op::Set, {"b"}, {"small"});
  CHECK_FALSE(h.last.close);
  h.call(1, Op::DeleteKey, {"b"});
  CHECK(h.state.bytes() == 31);
  // Keys (and queues) per store.
  h.call(1, Op::Set, {"d"}, {"1"});
  h.call(1, Op::QueuePush, {"q"}, {"item"});
  REQUIRE_FALSE(h.last.close);
  h.call(1, Op::Add, {"e"}, {}, 1);
  CHECK(h.last.close);
  CHECK(h.last.error.find("--max-store-keys") != std::string::npos);
  h.call(1, Op::QueuePop, {"q"});
  CHECK_FALSE(h.last.close);
  CHECK(h.state.bytes() == 31 + 2);
  h.call(1, Op::Add, {"e"}, {}, 1);
  CHECK_FALSE(h.last.close);
  h.state.clear();
  CHECK(h.state.bytes() == 0);
}

namespace {
// A value whose bytes say where they are, so a misplaced or torn piece shows.
std::string patterned(size_t n, uint8_t seed) {
  std::string v(n, '\0');
  for (size_t i = 0; i < n; ++i) v[i] = static_cast<char>((i * 131 + seed) & 0xff);
  return v;
}
// Whether `r`'s pieces, in order, are exactly `expected` (built piece by piece, never flattened).
bool pieces_match(const store::Reply& r, const std::vector<std::string_view>& expected) {
  size_t part = 0, at = 0;
  bool ok = true;
  r.for_each_piece([&](std::string_view p) {
    while (ok && !p.empty()) {
      if (part == expected.size()) { ok = false; return; }
      const size_t n = std::min(p.size(), expected[part].size() - at);
      if (p.substr(0, n) != expected[part].substr(at, n)) ok = false;
      p.remove_prefix(n);
      at += n;
      if (at == expected[part].size()) { ++part; at = 0; }
    }
  });
  return ok && part == expected.size() && at == 0;
}
}  // namespace

TEST_CASE("MultiGetReferencesAValueNamedManyTimesInsteadOfCopyingIt", "[state][limits]") {
  store::StoreLimits lim;
  lim.max_reply_bytes = 1ull << 30;
  Harness h{store::StoreState(lim)};
  const std::string value = patterned(8 << 20, 7);
  h.call(1, Op::Set, {"/big"}, {value});
  REQUIRE_FALSE(h.last.close);
  wire::Request r;
  r.op = Op::MultiGet;
  r.keys.assign(100, "/big");
  store::Reply reply;
  std::vector<store::Outgoing> others;
  REQUIRE_FALSE(h.state.apply(2, wire::Dialect::D2, r, reply, others).close);
  CHECK(reply.wire_size() == 100 * (8 + value.size()));
  // Memory O(keys): its own bytes are the length prefixes and one reference per occurrence.
  CHECK(reply.owned_bytes() < 64 * 1024);
  CHECK(reply.shared_bytes() == value.size());
  CHECK(reply.num_refs() == 100);
  const std::string prefix = i64(static_cast<int64_t>(value.size()));
  std::vector<std::string_view> expected;
  for (int i = 0; i < 100; ++i) {
    expected.push_back(prefix);
    expected.push_back(value);
  }
  CHECK(pieces_match(reply, expected));
  // Writing the key while the reply waits to be sent changes the store, not the reply.
  h.call(1, Op::Set, {"/big"}, {patterned((8 << 20) - 4, 99)});
  h.call(1, Op::Append, {"/big"}, {"tail"});
  REQUIRE_FALSE(h.last.close);
  CHECK(pieces_match(reply, expected));
  CHECK(h.state.bytes() == 4 + (8 << 20));
  // Past the reply limit (wire bytes) it is still refused before anything is built.
  r.keys.assign(129, "/big");
  reply.clear();
  auto refused = h.state.apply(2, wire::Dialect::D2, r, reply, others);
  CHECK(refused.close);
  CHECK(refused.error.find("--max-reply-bytes") != std::string::npos);
  CHECK(reply.empty());
}

TEST_CASE("RepliesCarryingValuesAreByteForByteTheWireFormat", "[state]") {
  // Sizes around the copy-or-reference threshold: the wire bytes must not depend on it.
  for (size_t n : {size_t{0}, size_t{1}, store::kInlineValueBytes, store::kInlineValueBytes + 1, size_t{5000}}) {
    INFO("value size " << n);
    Harness h;
    const std::string v = patterned(n, 3), w = patterned(n + 1, 5);
    CHECK(h.call(5, Op::WatchKey, {"k"}) == std::string(1, '\3'));
    h.call(1, Op::Set, {"k"}, {v});
    std::string created;
    wire::Writer(created).u8(wire::kWatchKeyCreated).blob("k").blob("").blob(v);
    REQUIRE(h.others.size() == 1);
    CHECK(h.others[0].reply.flatten() == created);
    CHECK(h.call(1, Op::Get, {"k"}) == blob(v));
    CHECK(h.call(1, Op::MultiGet, {"k", "none", "k"}) == blob(v) + blob("") + blob(v));
    // COMPARE_SET: mismatch answers the current value; match stores and answers the desired.
    CHECK(h.call(1, Op::CompareSet, {"k"}, {v + "x", w}) == blob(v));
    CHECK(h.call(1, Op::CompareSet, {"k"}, {v, w}) == blob(w));
    std::string updated;
    wire::Writer(updated).u8(wire::kWatchKeyUpdated).blob("k").blob(v).blob(w);
    REQUIRE(h.others.size() == 1);
    CHECK(h.others[0].reply.flatten() == updated);
    CHECK(h.call(1, Op::CompareSet, {"missing"}, {w, v}) == blob(w));  // echoed, nothing stored
    h.call(1, Op::QueuePush, {"q"}, {v});
    CHECK(h.call(1, Op::QueuePop, {"q"}) == i64(1) + blob(v));
    std::string deleted;
    wire::Writer(deleted).u8(wire::kWatchKeyDeleted).blob("k").blob(w).blob("");
    CHECK(h.call(1, Op::DeleteKey, {"k"}) == i64(1));
    REQUIRE(h.others.size() == 1);
    CHECK(h.others[0].reply.flatten() == deleted);
  }
}

TEST_CASE("OutboxSendsWhatWasQueuedInOrderAcrossPartialSends", "[state]") {
  store::Outbox box;
  const auto big = store::make_value(patterned(1000, 1));
  store::Reply a;
  a.u8(9).blob(big).blob("short").blob(big);
  box.append(a);
  box.append(std::string_view("raw"));
  store::Reply b;
  b.i64(-1).blob(big);
  box.append(b);
  std::string expected = a.flatten() + "raw" + b.flatten();
  REQUIRE(box.wire_bytes() == expected.size());
  std::string sent;
  // Sends of odd sizes, each taking from at most 3 pieces (a short writev); more is queued
  // while the first is partly sent (as a wake-up sent from another thread leaves it).
  int round = 0;
  for (size_t step = 1; !box.empty(); step = step * 7 % 1301 + 1) {
    if (++round == 4) {
      box.append(std::string_view("more"));
      box.append(a);
      expected += "more" + a.flatten();
    }
    std::string window;
    box.front_pieces(3, [&](const char* p, size_t n) { window.append(p, n); });
    REQUIRE_FALSE(window.empty());
    const size_t n = std::min(step, window.size());
    sent.append(window, 0, n);
    box.consume(n);
    CHECK(box.wire_bytes() == expected.size() - sent.size());
  }
  CHECK(sent == expected);
  // The value stays alive while queued even when nothing else holds it.
  store::Outbox held;
  {
    store::Reply c;
    c.blob(store::make_value(patterned(500, 2)));
    held.append(c);
  }
  std::string got;
  held.front_pieces(8, [&](const char* p, size_t n) { got.append(p, n); });
  CHECK(got == blob(patterned(500, 2)));
}

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
