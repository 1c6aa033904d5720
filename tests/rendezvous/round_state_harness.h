// The round state tests' fake workers' stores and harness (round_state_test.cpp,
// round_state_resume_test.cpp).
#pragma once

#include <catch2/catch.hpp>

#include <algorithm>
#include <cstdio>
#include <functional>

#include "ddprun/rdzv/fixed_port_stores.h"
#include "ddprun/rdzv/round_state.h"
#include "ddprun/rdzv/validate.h"

using namespace ddprun::rdzv;
using namespace std::chrono_literals;

namespace {

struct FakeStores : WorkerStores {
  uint16_t next_port = 40000;
  std::map<std::pair<std::string, int64_t>, uint16_t> open_stores;
  bool progress = true;
  bool fixed = false;  // what the last open() was asked for
  uint16_t open(const std::string& run, int64_t round, bool fixed_port) override {
    fixed = fixed_port;
    return open_stores[{run, round}] = fixed_port ? 29500 : next_port++;
  }
  void close(const std::string& run, int64_t round) override { open_stores.erase({run, round}); }
  bool progressed(const std::string&, int64_t, int64_t) override { return progress; }
};

struct Harness {
  FakeStores stores;
  RoundState state{stores};
  Clock::time_point now = Clock::time_point{} + 1000s;
  std::vector<Outbound> out;

  Message join_msg(const std::string& host, int64_t nproc = 2, int64_t min = 2, int64_t max = 2, int64_t restarts = 3) {
    Message m;
    m.type = MsgType::Join;
    m.set("run_id", "job").set("node_id", host + "_1").set("host", host).set("local_world_size", nproc);
    m.set("min_nodes", min).set("max_nodes", max).set("max_restarts", restarts);
    m.set("last_call_ms", 3000).set("join_timeout_ms", 60000).set("heartbeat_timeout_ms", 5000);
    return m;
  }
  void send(ConnId c, const Message& m) {
    out.clear();
    state.on_message(c, m, now, out);
  }
  void join(ConnId c, const std::string& host, int64_t nproc = 2, int64_t min = 2, int64_t max = 2) {
    send(c, join_msg(host, nproc, min, max));
  }
  void fail(ConnId c, int64_t round) {
    Message m;
    m.type = MsgType::Failure;
    m.set("round", round).set("global_rank", 3).set("exit_code", 1);
    send(c, m);
  }
  void tick(std::chrono::milliseconds dt) {
    now += dt;
    out.clear();
    state.on_tick(now, out);
  }
  const Outbound* to(ConnId c, MsgType t) const {
    for (const auto& o : out)
      if (o.conn == c && o.msg.type == t) return &o;
    return nullptr;
  }
  void heartbeat_all(std::initializer_list<ConnId> cs) {
    for (ConnId c : cs) {
      Message m;
      m.type = MsgType::Heartbeat;
      out.clear();
      state.on_message(c, m, now, out);
    }
  }
};

}  // namespace
