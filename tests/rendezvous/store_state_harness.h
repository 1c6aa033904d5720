// The store state tests' helpers (store_state_test.cpp, store_state_slices_test.cpp).
#pragma once

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
