#include "store_state_harness.h"

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
