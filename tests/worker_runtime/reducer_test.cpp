#include <catch2/catch.hpp>
#include <cmath>
#include <numeric>
#include <stdexcept>
#include <thread>

#include "mlp/mlp.h"
#include "ddprun/worker/reducer.h"
#include "fake_communicator.h"

using namespace ddprun::worker;
using ddprun::example::sgd_step;
using ddprun::example::SgdStep;
using ddprun::worker::testing::FakeCommunicator;
using ddprun::worker::testing::FakeGroup;

TEST_CASE("BucketPlan: reverse order, small first bucket, caps", "[buckets]") {
  // params of 400, 400, 400, 2000, 100 bytes; first cap 500, cap 1000
  auto plan = plan_buckets({400, 400, 400, 2000, 100}, 500, 1000);
  REQUIRE(plan.size() == 2);
  REQUIRE(plan[0] == std::vector<size_t>{4, 3});     // 100 < 500; +2000 closes it
  REQUIRE(plan[1] == std::vector<size_t>{2, 1, 0});  // 800 < 1000; +400 closes it
  auto three = plan_buckets({400, 400, 400, 2000, 100}, 50, 700);
  REQUIRE(three == std::vector<std::vector<size_t>>{{4}, {3}, {2, 1}, {0}});
  auto big = plan_buckets({10, 5000, 10}, 100, 1000);
  REQUIRE(big.size() == 2);
  REQUIRE(big[0] == std::vector<size_t>{2, 1});
  REQUIRE(big[1] == std::vector<size_t>{0});
}

TEST_CASE("BucketPlan: PyTorch defaults on the 1024x4 MLP", "[buckets]") {
  std::vector<size_t> bytes;
  bytes.push_back(1024 * 10 * 4);
  bytes.push_back(1024 * 4);
  for (int i = 0; i < 4; ++i) {
    bytes.push_back(1024 * 1024 * 4);
    bytes.push_back(1024 * 4);
  }
  bytes.push_back(1024 * 4);
  bytes.push_back(4);
  auto plan = plan_buckets(bytes, 1u << 20, 25u << 20);
  REQUIRE(plan.size() == 2);
  REQUIRE(plan[0].front() == bytes.size() - 1);
  size_t total = 0;
  for (auto& b : plan) total += b.size();
  REQUIRE(total == bytes.size());
}

namespace {
// Runs `body(rank, comm)` on n threads over one fake group.
template <class F>
void on_threads(int n, F body) {
  FakeGroup g(n);
  std::vector<std::thread> ts;
  for (int r = 0; r < n; ++r)
    ts.emplace_back([&, r] {
      FakeCommunicator c(g, r);
      body(r, c);
    });
  for (auto& t : ts) t.join();
}
}  // namespace

TEST_CASE("Reducer: averages every gradient, buckets launched during backward", "[reducer]") {
  const int n = 3;
  std::vector<std::vector<float>> results(n);
  std::vector<size_t> early(n);
  on_threads(n, [&](int r, FakeCommunicator& c) {
    std::vector<float> flat(1000);
    std::vector<GradView> views{{flat.data(), 100}, {flat.data() + 100, 300}, {flat.data() + 400, 600}};
    ReducerOptions o;
    o.first_bucket_cap_bytes = 1000;
    o.bucket_cap_bytes = 1200;
    Reducer red(c, views, DType::F32, o);
    REQUIRE(red.buckets().size() == 3);
    for (size_t i = 0; i < flat.size(); ++i) flat[i] = static_cast<float>(r * 1000 + i);
    red.prepare_for_backward();
    for (size_t k = 3; k-- > 0;) red.mark_ready(k);
    red.finalize();
    early[static_cast<size_t>(r)] = red.buckets_launched_early();
    results[static_cast<size_t>(r)] = flat;
  });
  for (int r = 0; r < n; ++r) {
    REQUIRE(early[static_cast<size_t>(r)] == 3);
    for (size_t i = 0; i < 1000; ++i) REQUIRE(results[static_cast<size_t>(r)][i] == Approx(1000.0 + i));
  }
}

TEST_CASE("Reducer: non-contiguous gradients are staged", "[reducer]") {
  on_threads(2, [&](int r, FakeCommunicator& c) {
    std::vector<float> a(10, static_cast<float>(r)), b(20, static_cast<float>(2 * r));
    Reducer red(c, {{a.data(), 10}, {b.data(), 20}}, DType::F32, {});
    red.prepare_for_backward();
    red.mark_ready(1);
    red.mark_ready(0);
    red.finalize();
    REQUIRE(a[3] == 0.5f);
    REQUIRE(b[19] == 1.0f);
  });
}

TEST_CASE("Reducer: average = false sums over ranks (the caller divides), staged buckets too", "[reducer]") {
  on_threads(3, [&](int r, FakeCommunicator& c) {
    std::vector<float> flat(30), apart(5);
    for (size_t i = 0; i < flat.size(); ++i) flat[i] = static_cast<float>(r + 1);
    for (auto& v : apart) v = static_cast<float>(10 * (r + 1));
    ReducerOptions o;
    o.average = false;
    o.first_bucket_cap_bytes = 80;  // buckets {apart, flat[10..30]} (staged) and {flat[0..10]} (in place)
    Reducer red(c, {{flat.data(), 10}, {flat.data() + 10, 20}, {apart.data(), 5}}, DType::F32, o);
    REQUIRE(red.buckets().size() == 2);
    red.prepare_for_backward();
    for (size_t k = 3; k-- > 0;) red.mark_ready(k);
    red.finalize();
    for (float v : flat) REQUIRE(v == 6.f);  // 1 + 2 + 3, not their average 2
    for (float v : apart) REQUIRE(v == 60.f);
    // The fused CPU step always averages: it refuses a summing reducer.
    REQUIRE_THROWS_AS(red.set_step_arrays(flat.data(), {flat.data()}), std::logic_error);
  });
}

TEST_CASE("Reducer: out-of-order readiness still launches buckets in order", "[reducer]") {
  on_threads(2, [&](int r, FakeCommunicator& c) {
    std::vector<float> flat(300, static_cast<float>(r));
    ReducerOptions o;
    o.first_bucket_cap_bytes = 4;
    o.bucket_cap_bytes = 4;  // one parameter per bucket
    Reducer red(c, {{flat.data(), 100}, {flat.data() + 100, 100}, {flat.data() + 200, 100}}, DType::F32, o);
    red.prepare_for_backward();
    red.mark_ready(0);  // bucket 2 ready first: must wait for buckets 0 and 1
    REQUIRE(red.buckets_launched_early() == 0);
    red.mark_ready(2);
    REQUIRE(red.buckets_launched_early() == 1);
    red.mark_ready(1);
    red.finalize();
    REQUIRE(c.allreduce_counts == std::vector<size_t>{100, 100, 100});
    for (float v : flat) REQUIRE(v == 0.5f);
  });
}

TEST_CASE("Reducer: no_sync accumulates locally without communication", "[reducer]") {
  on_threads(2, [&](int r, FakeCommunicator& c) {
    std::vector<float> g(8, 0.f);
    Reducer red(c, {{g.data(), 8}}, DType::F32, {});
    {
      auto guard = red.no_sync();
      red.prepare_for_backward();
      for (auto& v : g) v += static_cast<float>(r + 1);  // micro-batch 1
      red.mark_ready(0);
      red.finalize();
    }
    REQUIRE(c.allreduce_calls == 0);
    REQUIRE(g[0] == static_cast<float>(r + 1));
    red.prepare_for_backward();
    for (auto& v : g) v += static_cast<float>(r + 1);  // micro-batch 2, synced
    red.mark_ready(0);
    red.finalize();
    REQUIRE(c.allreduce_calls == 1);
    REQUIRE(g[0] == 3.0f);  // ((1+1) + (2+2)) / 2
  });
}

TEST_CASE("Reducer: a failed all-reduce surfaces as CommError from finalize", "[reducer]") {
  FakeGroup g(2);
  FakeCommunicator c(g, 0);  // rank 1 never shows up
  std::vector<float> grad(4, 1.f);
  Reducer red(c, {{grad.data(), 4}}, DType::F32, {});
  red.prepare_for_backward();
  red.mark_ready(0);
  std::thread killer([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    c.abort();
  });
  REQUIRE_THROWS_AS(red.finalize(), CommError);
  killer.join();
}

// ---- finalize_and_step ---------------------------------------------------------------------

namespace {
// Three gradients (100, 300, 600) in one flat buffer, back to back or (gaps) 50 apart; the
// caps give one bucket each.
struct StepFixture {
  explicit StepFixture(bool with_gaps = false) : gaps(with_gaps) {}
  bool gaps;
  size_t size() const { return gaps ? 1100 : 1000; }
  std::vector<float> grads = std::vector<float>(size()), params = std::vector<float>(size()),
                     momentum = std::vector<float>(size());
  std::vector<GradView> views() {
    const size_t g = gaps ? 50 : 0;
    return {{grads.data(), 100}, {grads.data() + 100 + g, 300}, {grads.data() + 400 + 2 * g, 600}};
  }
  static ReducerOptions options() {
    ReducerOptions o;
    o.first_bucket_cap_bytes = 1000;
    o.bucket_cap_bytes = 1200;
    return o;
  }
  void fill(int rank, int step) {
    for (size_t i = 0; i < grads.size(); ++i)
      grads[i] = std::sin(0.1f * static_cast<float>(i) + static_cast<float>(rank * 7 + step)) / 3.f;
  }
  void backward(Reducer& red, int rank, int step) {
    red.prepare_for_backward();
    fill(rank, step);
    for (size_t k = 3; k-- > 0;) red.mark_ready(k);
  }
};

void init_params(std::vector<float>& p) {
  for (size_t i = 0; i < p.size(); ++i) p[i] = std::cos(0.03f * static_cast<float>(i));
}
}  // namespace

TEST_CASE("Reducer: finalize_and_step without a fused path is finalize() then the step, bit for bit", "[reducer]") {
  on_threads(3, [&](int r, FakeCommunicator& c) {
    StepFixture a, b;  // a: finalize + sgd_step; b: finalize_and_step
    init_params(a.params);
    init_params(b.params);
    Reducer ra(c, a.views(), DType::F32, StepFixture::options());
    Reducer rb(c, b.views(), DType::F32, StepFixture::options());
    rb.set_step_arrays(b.grads.data(), {b.params.data(), b.momentum.data()});
    for (int s = 0; s < 3; ++s) {
      a.backward(ra, r, s);
      ra.finalize();
      sgd_step(a.params.data(), a.grads.data(), a.momentum.data(), 1000, 0.1f, 0.9f, s == 0);
      b.backward(rb, r, s);
      REQUIRE(rb.finalize_and_step(SgdStep(0.1f, 0.9f, s == 0)));
      REQUIRE(rb.buckets_fused() == 0);
      REQUIRE(rb.buckets_launched_early() == 3);  // nothing to fuse: overlap as usual
      REQUIRE(b.params == a.params);
      REQUIRE(b.momentum == a.momentum);
    }
    REQUIRE(c.allreduce_step_counts.empty());
    REQUIRE(a.params != std::vector<float>(1000, a.params[0]));  // it did train something
  });
}

TEST_CASE("Reducer: fusable buckets wait for finalize_and_step, adjacent ones go as one collective", "[reducer]") {
  // gaps: the buckets are not adjacent in memory, one collective each, in bucket order.
  // mixed: adjacent on rank 0 only, so the ranks must agree not to join them.
  const int layout = GENERATE(0, 1, 2);  // adjacent, gaps, mixed
  INFO("layout " << layout);
  on_threads(2, [&](int r, FakeCommunicator& c) {
    c.claim_fused_step = true;
    const bool gaps = layout == 1 || (layout == 2 && r == 1);
    StepFixture f(gaps), ref(gaps);
    init_params(f.params);
    init_params(ref.params);
    Reducer red(c, f.views(), DType::F32, StepFixture::options());
    Reducer plain(c, ref.views(), DType::F32, StepFixture::options());
    red.set_step_arrays(f.grads.data(), {f.params.data()});
    f.backward(red, r, 0);
    // Every gradient is ready, but the step must not have run: a peer may still be in
    // backward, reading its parameters.
    REQUIRE(red.buckets_launched_early() == 0);
    REQUIRE(c.allreduce_step_counts.empty());
    std::vector<float> before(f.size());
    init_params(before);
    REQUIRE(f.params == before);
    REQUIRE(red.finalize_and_step(SgdStep(0.5f, 0.f, true)));
    REQUIRE(red.buckets_fused() == 3);
    if (layout == 0) {
      REQUIRE(red.fused_collectives() == 1);
      REQUIRE(c.allreduce_step_counts == std::vector<size_t>{1000});
    } else {  // in launch order: the last gradient (600) first
      REQUIRE(red.fused_collectives() == 3);
      REQUIRE(c.allreduce_step_counts == std::vector<size_t>{600, 300, 100});
    }
    ref.backward(plain, r, 0);
    plain.finalize();
    for (const auto& v : ref.views()) {
      const auto off = static_cast<size_t>(static_cast<float*>(v.ptr) - ref.grads.data());
      sgd_step(ref.params.data() + off, ref.grads.data() + off, nullptr, v.count, 0.5f, 0.f, true);
    }
    REQUIRE(f.params == ref.params);  // the gaps untouched on both
  });
}

TEST_CASE("Reducer: when ranks disagree on fusing, no bucket is fused", "[reducer]") {
  on_threads(2, [&](int r, FakeCommunicator& c) {
    c.claim_fused_step = r == 0;
    StepFixture f;
    Reducer red(c, f.views(), DType::F32, StepFixture::options());
    red.set_step_arrays(f.grads.data(), {f.params.data()});
    f.backward(red, r, 0);
    REQUIRE(red.buckets_launched_early() == 3);
    REQUIRE(red.finalize_and_step(SgdStep(1.f, 0.f, true)));
    REQUIRE(red.buckets_fused() == 0);
    REQUIRE(c.allreduce_step_counts.empty());
    // params = 0 - average gradient
    StepFixture f0, f1;
    f0.fill(0, 0);
    f1.fill(1, 0);
    for (size_t i = 0; i < 1000; ++i) REQUIRE(f.params[i] == -((f0.grads[i] + f1.grads[i]) / 2.f));
  });
}

TEST_CASE("Reducer: no_sync: finalize_and_step neither communicates nor steps", "[reducer]") {
  on_threads(2, [&](int r, FakeCommunicator& c) {
    c.claim_fused_step = true;
    std::vector<float> g(8, 0.f), p(8, 1.f);
    Reducer red(c, {{g.data(), 8}}, DType::F32, {});
    red.set_step_arrays(g.data(), {p.data()});
    const size_t calls = c.allreduce_calls;  // set_step_arrays agreed on fusing: one all-reduce
    {
      auto guard = red.no_sync();
      red.prepare_for_backward();
      for (auto& v : g) v += static_cast<float>(r + 1);
      red.mark_ready(0);
      REQUIRE_FALSE(red.finalize_and_step(SgdStep(1.f, 0.f, true)));
    }
    REQUIRE(c.allreduce_calls == calls);
    REQUIRE(p == std::vector<float>(8, 1.f));
    red.prepare_for_backward();
    for (auto& v : g) v += static_cast<float>(r + 1);
    red.mark_ready(0);
    REQUIRE(red.finalize_and_step(SgdStep(1.f, 0.f, true)));
    REQUIRE(red.buckets_fused() == 1);
    REQUIRE(p[0] == 1.f - 3.f);  // average of the accumulated (2, 4)
    // No second step for one backward: a second finalize is misuse, and changes nothing.
    REQUIRE_THROWS_AS(red.finalize_and_step(SgdStep(1.f, 0.f, true)), WorkerError);
    REQUIRE(p[0] == -2.f);
  });
}

TEST_CASE("Reducer: finalize_and_step on a staged bucket and on one rank", "[reducer]") {
  SECTION("staged (non-contiguous) bucket") {
    on_threads(2, [&](int r, FakeCommunicator& c) {
      c.claim_fused_step = true;  // a staged bucket is never fused: the comm never sees the gradient
      std::vector<float> flat(30, 0.f), p(30, 0.f);
      Reducer red(c, {{flat.data(), 10}, {flat.data() + 20, 10}}, DType::F32, {});
      REQUIRE(red.buckets().size() == 1);
      red.set_step_arrays(flat.data(), {p.data()});
      red.prepare_for_backward();
      for (auto& v : flat) v = static_cast<float>(r + 1);
      red.mark_ready(1);
      red.mark_ready(0);
      REQUIRE(red.finalize_and_step(SgdStep(1.f, 0.f, true)));
      REQUIRE(red.buckets_fused() == 0);
      for (size_t i = 0; i < 30; ++i) REQUIRE(p[i] == (i >= 10 && i < 20 ? 0.f : -1.5f));  // the gap untouched
    });
  }
  SECTION("world of one: steps locally, no communication") {
    on_threads(1, [&](int, FakeCommunicator& c) {
      StepFixture f;
      Reducer red(c, f.views(), DType::F32, StepFixture::options());
      red.set_step_arrays(f.grads.data(), {f.params.data(), f.momentum.data()});
      f.backward(red, 0, 0);
      REQUIRE(red.finalize_and_step(SgdStep(0.1f, 0.9f, true)));
      REQUIRE(c.allreduce_calls == 0);
      std::vector<float> want(1000, 0.f), buf(1000);
      sgd_step(want.data(), f.grads.data(), buf.data(), 1000, 0.1f, 0.9f, true);
      REQUIRE(f.params == want);
      REQUIRE(f.momentum == buf);
    });
  }
}

TEST_CASE("Reducer: set_step_arrays and finalize_and_step reject misuse", "[reducer]") {
  on_threads(1, [&](int, FakeCommunicator& c) {
    StepFixture f;
    Reducer red(c, f.views(), DType::F32, StepFixture::options());
    REQUIRE_THROWS_AS(red.finalize_and_step(SgdStep(0.1f, 0.f, true)), std::logic_error);  // nothing registered
    REQUIRE_THROWS_AS(red.set_step_arrays(f.grads.data() + 1, {f.params.data()}),
                      std::logic_error);  // grad 0 below base
    REQUIRE_THROWS_AS(red.set_step_arrays(f.grads.data(), {}), std::logic_error);
    red.set_step_arrays(f.grads.data(), {f.params.data()});
    f.backward(red, 0, 0);
    REQUIRE_THROWS_AS(red.finalize_and_step(SgdStep(0.1f, 0.9f, true)), std::logic_error);  // 2 arrays, 1 registered
  });
}

// ---- misuse is an error naming the rank, the call and what was expected ----------------------

namespace {
// The message of the WorkerError `f` throws ("" when it throws nothing or something else).
template <class F>
std::string worker_error_of(F f) {
  try {
    f();
  } catch (const WorkerError& e) {
    return e.what();
  } catch (...) {
    return "(another exception)";
  }
  return "";
}
bool has(const std::string& s, const char* part) { return s.find(part) != std::string::npos; }

// Rank 1 of a 2-rank group whose rank 0 never communicates: every check must fire before any
// collective (a forgotten prepare_for_backward on one rank used to skip synchronisation).
struct MisuseFixture {
  FakeGroup g{2};
  FakeCommunicator c{g, 1};
  std::vector<float> flat = std::vector<float>(30, 1.f);
  std::vector<GradView> views{{flat.data(), 10}, {flat.data() + 10, 10}, {flat.data() + 20, 10}};
  static ReducerOptions opts() {
    ReducerOptions o;
    o.first_bucket_cap_bytes = 1u << 20;  // one bucket: nothing launches before all are ready
    o.param_name = [](size_t i) { return "layer" + std::to_string(i) + ".weight"; };
    return o;
  }
};
}  // namespace

TEST_CASE("Reducer misuse: mark_ready or finalize without prepare_for_backward is an error", "[reducer_safety]") {
  MisuseFixture f;
  Reducer red(f.c, f.views, DType::F32, MisuseFixture::opts());
  std::string e = worker_error_of([&] { red.mark_ready(2); });
  INFO(e);
  REQUIRE(has(e, "rank 1"));
  REQUIRE(has(e, "mark_ready(2)"));
  REQUIRE(has(e, "layer2.weight"));
  REQUIRE(has(e, "expected prepare_for_backward()"));
  e = worker_error_of([&] { red.finalize(); });
  INFO(e);
  REQUIRE(has(e, "rank 1"));
  REQUIRE(has(e, "finalize()"));
  REQUIRE(has(e, "without prepare_for_backward()"));
  REQUIRE(f.c.allreduce_calls == 0);
  // The same after a completed pass (the pass is closed by finalize).
  FakeGroup solo_group(1);
  FakeCommunicator solo(solo_group, 0);
  Reducer one(solo, f.views, DType::F32, MisuseFixture::opts());
  one.prepare_for_backward();
  for (size_t k = 3; k-- > 0;) one.mark_ready(k);
  one.finalize();
  REQUIRE(has(worker_error_of([&] { one.mark_ready(0); }), "outside a backward pass"));
  REQUIRE(has(worker_error_of([&] { one.finalize(); }), "without prepare_for_backward()"));
}

TEST_CASE("Reducer misuse: finalize_and_step without prepare, prepare twice, a gradient marked twice",
          "[reducer_safety]") {
  MisuseFixture f;
  std::vector<float> params(30, 0.f);
  Reducer red(f.c, f.views, DType::F32, MisuseFixture::opts());
  // set_step_arrays is collective: give it a fake peer so the vote completes.
  std::thread peer([&] {
    FakeCommunicator c0(f.g, 0);
    // The same vote as set_step_arrays' (reducer.cpp): two per bucket (one bucket here) and
    // the split-step vote. A shorter one made the fake read past it (ASan).
    std::vector<float> votes(2 * 1 + 1, 0.f);
    c0.allreduce(votes.data(), votes.size(), DType::F32, ReduceOp::Sum);
  });
  red.set_step_arrays(f.flat.data(), {params.data()});
  peer.join();
  std::string e = worker_error_of([&] { red.finalize_and_step(SgdStep(0.1f, 0.f, true)); });
  INFO(e);
  REQUIRE(has(e, "rank 1"));
  REQUIRE(has(e, "finalize_and_step()"));
  REQUIRE(has(e, "without prepare_for_backward()"));
  REQUIRE(params == std::vector<float>(30, 0.f));
  red.prepare_for_backward();
  e = worker_error_of([&] { red.prepare_for_backward(); });
  INFO(e);
  REQUIRE(has(e, "rank 1"));
  REQUIRE(has(e, "prepare_for_backward()"));
  REQUIRE(has(e, "expected finalize()"));
  red.mark_ready(1);
  e = worker_error_of([&] { red.mark_ready(1); });
  INFO(e);
  REQUIRE(has(e, "rank 1"));
  REQUIRE(has(e, "mark_ready(1)"));
  REQUIRE(has(e, "layer1.weight"));
  REQUIRE(has(e, "already marked ready"));
  REQUIRE(has(worker_error_of([&] { red.mark_ready(3); }), "index out of range"));
}

TEST_CASE("Reducer misuse: finalize with gradients never marked names them (also on one rank)", "[reducer_safety]") {
  for (int world : {1, 2}) {
    MisuseFixture f;
    FakeGroup g1(1);
    FakeCommunicator c1(g1, 0);
    Communicator& c = world == 1 ? static_cast<Communicator&>(c1) : f.c;
    Reducer red(c, f.views, DType::F32, MisuseFixture::opts());
    red.prepare_for_backward();
    red.mark_ready(2);
    const std::string e = worker_error_of([&] { red.finalize(); });
    INFO(e);
    REQUIRE(has(e, world == 1 ? "rank 0" : "rank 1"));
    REQUIRE(has(e, "2 of 3 gradients were never marked ready"));
    REQUIRE(has(e, "parameter 0 (layer0.weight)"));
    REQUIRE(has(e, "parameter 1 (layer1.weight)"));
    REQUIRE_FALSE(has(e, "parameter 2"));
    REQUIRE(has(e, "find_unused_parameters"));
    REQUIRE(has(e, "mark_unused()"));
    // The pass is closed: the next one starts cleanly.
    red.prepare_for_backward();
  }
}

TEST_CASE("Reducer: an unused parameter is zero-filled and averaged (mark_unused, find_unused_parameters)",
          "[reducer_safety]") {
  for (bool automatic : {false, true}) {
    std::vector<std::vector<float>> out(2);
    std::vector<size_t> early(2);
    on_threads(2, [&](int r, FakeCommunicator& c) {
      std::vector<float> flat(30, static_cast<float>(10 * (r + 1)));  // stale values from an earlier step
      ReducerOptions o;
      o.first_bucket_cap_bytes = 40;  // one parameter per bucket
      o.bucket_cap_bytes = 40;
      o.find_unused_parameters = automatic;
      Reducer red(c, {{flat.data(), 10}, {flat.data() + 10, 10}, {flat.data() + 20, 10}}, DType::F32, o);
      red.prepare_for_backward();
      for (size_t i = 0; i < 30; ++i) flat[i] = static_cast<float>(r + 1);
      red.mark_ready(2);
      if (r == 1) {
        flat[10] = 99.f;  // parameter 1 is unused on rank 1: what the buffer holds must not count
        if (!automatic) red.mark_unused(1);
      } else {
        red.mark_ready(1);
      }
      red.mark_ready(0);
      red.finalize();
      out[static_cast<size_t>(r)] = flat;
      early[static_cast<size_t>(r)] = red.buckets_launched_early();
    });
    // Rank 1: parameter 1's bucket (and the one after it) could start only in finalize.
    REQUIRE(early[0] == 3);
    REQUIRE(early[1] == (automatic ? 1u : 3u));
    for (int r = 0; r < 2; ++r) {
      const auto& v = out[static_cast<size_t>(r)];
      REQUIRE(v[0] == 1.5f);
      REQUIRE(v[10] == 0.5f);  // (1 + 0) / 2
      REQUIRE(v[19] == 0.5f);
      REQUIRE(v[25] == 1.5f);
    }
  }
}

TEST_CASE("Reducer: mark_unused keeps a gradient accumulated under no_sync", "[reducer_safety]") {
  on_threads(2, [&](int r, FakeCommunicator& c) {
    std::vector<float> g(8, 0.f);
    Reducer red(c, {{g.data(), 8}}, DType::F32, {});
    {
      auto guard = red.no_sync();
      red.prepare_for_backward();
      for (auto& v : g) v += static_cast<float>(r + 1);
      red.mark_ready(0);
      red.finalize();
    }
    red.prepare_for_backward();
    red.mark_unused(0);  // unused in the synced micro-batch: the accumulated value still counts
    red.finalize();
    REQUIRE(g[0] == 1.5f);
    red.prepare_for_backward();
    g[0] = 7.f;
    red.mark_unused(0);  // nothing accumulated since the last sync: zero
    red.finalize();
    REQUIRE(g[0] == 0.f);
  });
}
