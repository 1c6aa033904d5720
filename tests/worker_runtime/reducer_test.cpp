#include <catch2/catch.hpp>
#include <numeric>
#include <thread>

#include "ddprun/worker/reducer.h"
#include "fake_communicator.h"

using namespace ddprun::worker;
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
  for (int r = 0; r < n; ++r) ts.emplace_back([&, r] {
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
