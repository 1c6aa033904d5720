// How large requests are cut into slices (ApplyResult::more): by keys and by bytes of keys, and
// CHECK too. Each slice is a turn of the server's I/O thread, so its size bounds what the
// thread's other connections wait.
#include <catch2/catch.hpp>
#include <algorithm>
#include <string>
#include <vector>

#include "ddprun/store/store_state.h"

using namespace ddprun;
using wire::Op;

namespace {
// Applies `r` from connection 1 slice by slice; returns the number of apply() calls, the reply in `out`.
int slices(store::StoreState& s, wire::Request r, std::string& out) {
  store::Reply reply;
  std::vector<store::Outgoing> others;
  int calls = 0;
  store::ApplyResult res;
  out.clear();
  do {
    reply.clear();
    res = s.apply(1, wire::Dialect::D2, r, reply, others);
    out += reply.flatten();
    ++calls;
    REQUIRE(!res.close);
  } while (res.more);
  return calls;
}

std::vector<std::string> keys(size_t n, size_t len) {
  std::vector<std::string> k;
  for (size_t i = 0; i < n; ++i) {
    std::string key = "/k/" + std::to_string(i) + "/";
    key.resize(std::max(len, key.size()), 'x');
    k.push_back(std::move(key));
  }
  return k;
}
}  // namespace

TEST_CASE("ASliceEndsAtItsKeyCountOrItsBytesOfKeys", "[store][slices]") {
  store::StoreState s;
  std::string out;
  wire::Request mset{.op = Op::MultiSet, .keys = keys(600, 1024), .values = std::vector<std::string>(600, "v")};
  // 600 keys of 1 KiB: 256 per slice by bytes; checked in 3 slices, then stored in 3.
  CHECK(slices(s, mset, out) == 6);
  CHECK(s.num_keys() == 600);
  wire::Request get{.op = Op::MultiGet, .keys = keys(600, 1024)};
  CHECK(slices(s, get, out) == 3);  // looked up in 3; the last also writes the 600 values
  CHECK(out.size() == 600 * 9);
  wire::Request small{.op = Op::MultiGet, .keys = keys(600, 16)};
  CHECK(slices(s, small, out) == 1);  // 600 short keys: one slice, atomic
  wire::Request wait{.op = Op::Wait, .keys = keys(600, 1024)};
  CHECK(slices(s, wait, out) == 3);
  CHECK(out == std::string(1, static_cast<char>(wire::kWaitStop)));
}

TEST_CASE("ALargeCheckIsAppliedInSlicesAndStopsAtAMissingKey", "[store][slices]") {
  store::StoreState s;
  std::string out;
  const auto k = keys(5000, 16);
  wire::Request mset{.op = Op::MultiSet, .keys = k, .values = std::vector<std::string>(k.size(), "v")};
  slices(s, mset, out);
  wire::Request check{.op = Op::Check, .keys = k};
  CHECK(slices(s, check, out) == 3);  // 2048 + 2048 + 904
  CHECK(out == std::string(1, static_cast<char>(wire::kCheckReady)));
  check.keys[3000] = "/absent";
  CHECK(slices(s, check, out) == 2);  // not ready at the slice that found it missing
  CHECK(out == std::string(1, static_cast<char>(wire::kCheckNotReady)));
  wire::Request few{.op = Op::Check, .keys = {k[0], "/absent"}};
  CHECK(slices(s, few, out) == 1);
  CHECK(out == std::string(1, static_cast<char>(wire::kCheckNotReady)));
}

TEST_CASE("ALargeWaiterIsForgottenASliceAtATime", "[store][slices]") {
  // Its connection closing, a CANCEL_WAIT or a new WAIT: a slice of its keys per call, during
  // which nothing wakes it; then it is gone and a SET of its keys answers nobody.
  for (const Op op : {Op::CancelWait, Op::Wait}) {
    store::StoreState s;
    std::string out;
    const auto k = keys(5000, 16);
    CHECK(slices(s, wire::Request{.op = Op::Wait, .keys = k}, out) == 3);
    CHECK(out.empty());  // deferred
    CHECK(s.num_waiting_connections() == 1);
    const auto missing = keys(1, 30);
    const int calls =
        slices(s, wire::Request{.op = op, .keys = op == Op::Wait ? missing : std::vector<std::string>{}}, out);
    CHECK(calls >= 3);  // 2048 + 2048 + 904 keys forgotten, then the request itself
    CHECK(out == (op == Op::Wait ? "" : std::string(1, static_cast<char>(wire::kWaitCanceled))));
    store::Reply reply;
    std::vector<store::Outgoing> others;
    wire::Request set{.op = Op::Set, .keys = {k[4999]}, .values = {"v"}};
    s.apply(2, wire::Dialect::D2, set, reply, others);
    CHECK(others.empty());
  }
  store::StoreState s;
  std::string out;
  slices(s, wire::Request{.op = Op::Wait, .keys = keys(5000, 16)}, out);
  int calls = 1;
  while (s.disconnect(1)) ++calls;
  CHECK(calls == 3);
  CHECK(s.num_waiting_connections() == 0);
  CHECK(s.memory() == 0);
}

TEST_CASE("AnAnsweredLargeWaiterHandsItsKeysBackToBeFreedInSteps", "[store][slices]") {
  // Freed at once, the copies of 128 Ki keys took 26 ms of the turn that stored the last key.
  store::StoreState s;
  std::string out;
  const auto k = keys(5000, 16);
  slices(s, wire::Request{.op = Op::Wait, .keys = k}, out);
  wire::Request rest{.op = Op::MultiSet, .keys = k, .values = std::vector<std::string>(k.size(), "v")};
  rest.keys.pop_back();
  rest.values.pop_back();
  slices(s, rest, out);
  store::Reply reply;
  std::vector<store::Outgoing> others;
  wire::Request last{.op = Op::Set, .keys = {k.back()}, .values = {"v"}};
  s.apply(2, wire::Dialect::D2, last, reply, others);
  REQUIRE(others.size() == 1);
  CHECK(others[0].conn == 1);
  CHECK(others[0].dropped.size() == k.size());  // the waiter's copies, for the caller to free
  CHECK(s.num_waiting_connections() == 0);
  // Its keys stored while its slices ran: its own last slice answers it, and the copies go
  // with the request (which a server frees in steps too).
  const auto later = keys(5000, 20);
  wire::Request wait{.op = Op::Wait, .keys = later};
  reply.clear();
  REQUIRE(s.apply(1, wire::Dialect::D2, wait, reply, others).more);
  REQUIRE(s.apply(1, wire::Dialect::D2, wait, reply, others).more);  // 4096 registered
  wire::Request all{.op = Op::MultiSet, .keys = later, .values = std::vector<std::string>(later.size(), "v")};
  slices(s, all, out);
  others.clear();
  CHECK_FALSE(s.apply(1, wire::Dialect::D2, wait, reply, others).more);
  CHECK(reply.flatten() == std::string(1, static_cast<char>(wire::kWaitStop)));
  CHECK(wait.values.size() == 4096);
  CHECK(others.empty());
  // A small waiter's keys are freed at once.
  others.clear();
  slices(s, wire::Request{.op = Op::Wait, .keys = {"/small"}}, out);
  wire::Request small{.op = Op::Set, .keys = {"/small"}, .values = {"v"}};
  s.apply(2, wire::Dialect::D2, small, reply, others);
  REQUIRE(others.size() == 1);
  CHECK(others[0].dropped.empty());
}
