// The DDP invariant, exactly: N ranks (threads, each with its own store connection and a real
// Gloo communicator over a real in-process StoreServer) training with the Reducer give, after
// every step, the same averaged gradient and parameters as one process over the global batch.
#include <catch2/catch.hpp>
#include <cmath>
#include <thread>

#include "ddprun/client/store_client.h"
#include "ddprun/server/store_server.h"
#include "ddprun/worker/checks.h"
#include "ddprun/worker/communicator.h"
#include "ddprun/worker/cpu/mlp.h"
#include "ddprun/worker/reducer.h"

using namespace ddprun::worker;
using namespace ddprun::worker::cpu;

namespace {

constexpr int kSteps = 6;
constexpr int kBatch = 8;  // per rank
const MlpShape kShape{10, 64, 2, 1};

void sample(int64_t i, float* x, float* y) {
  for (int j = 0; j < kShape.in; ++j) x[j] = std::sin(0.37f * static_cast<float>(i * kShape.in + j));
  y[0] = std::cos(0.11f * static_cast<float>(i));
}

struct Trace {
  std::vector<std::vector<float>> grads, params;
};

// One rank's run (world = 1 means: the single process over the global batch of N * kBatch).
Trace run(Communicator* comm, int rank, int world, int global_world, bool small_buckets, bool shared_grads = false) {
  CpuMlp m(kShape);
  const size_t n = mlp_num_params(kShape);
  std::vector<float> p(n), g_storage(n);
  float* g = g_storage.data();
  if (comm && shared_grads) {
    g = static_cast<float*>(comm->alloc_shared(n * sizeof(float)));
    REQUIRE(g != nullptr);
  }
  mlp_init(kShape, 99, p.data());
  if (comm && rank != 0) std::fill(p.begin(), p.end(), 0.f);  // must be fixed by the broadcast
  if (comm) comm->broadcast(p.data(), n * sizeof(float), 0);
  std::vector<GradView> views;
  for (const auto& t : m.tensors()) views.push_back({g + t.offset, t.count});
  ReducerOptions ro;
  if (small_buckets) {
    ro.first_bucket_cap_bytes = 2048;
    ro.bucket_cap_bytes = 8192;
  }
  std::unique_ptr<Reducer> red;
  if (comm) red = std::make_unique<Reducer>(*comm, views, DType::F32, ro);
  const int b = world == 1 ? kBatch * global_world : kBatch;
  Trace tr;
  std::vector<float> x(static_cast<size_t>(b) * kShape.in), y(static_cast<size_t>(b));
  for (int s = 0; s < kSteps; ++s) {
    const int64_t first = static_cast<int64_t>(s) * kBatch * global_world + (world == 1 ? 0 : rank * kBatch);
    for (int i = 0; i < b; ++i) sample(first + i, &x[static_cast<size_t>(i) * kShape.in], &y[static_cast<size_t>(i)]);
    if (red) red->prepare_for_backward();
    m.forward_backward(p.data(), x.data(), y.data(), b, g, false, [&](size_t t) {
      if (red) red->mark_ready(t);
    });
    if (red) {
      red->finalize();
      REQUIRE(red->buckets_launched_early() == red->buckets().size());
      if (small_buckets) REQUIRE(red->buckets().size() > 2);
    }
    sgd_step(p.data(), g, nullptr, n, 0.05f, 0.f, true);
    tr.grads.emplace_back(g, g + n);
    tr.params.push_back(p);
  }
  return tr;
}

double rel_l2(const std::vector<float>& a, const std::vector<float>& b) {
  double num = 0, den = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    num += (static_cast<double>(a[i]) - b[i]) * (static_cast<double>(a[i]) - b[i]);
    den += static_cast<double>(b[i]) * b[i];
  }
  return std::sqrt(num / den);
}
// Largest element difference relative to the largest element (the inf-norm relative error).
double max_rel(const std::vector<float>& a, const std::vector<float>& b) {
  double m = 0, scale = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    m = std::max(m, std::abs(static_cast<double>(a[i]) - b[i]));
    scale = std::max(scale, std::abs(static_cast<double>(b[i])));
  }
  return m / scale;
}

void check_invariant(int world, bool small_buckets, bool shared_memory, bool shared_grads = false) {
  ddprun::server::StoreServerOptions so;
  so.host = "127.0.0.1";
  so.port = 0;
  ddprun::server::StoreServer server(so);
  server.start();
  std::vector<Trace> traces(static_cast<size_t>(world));
  std::vector<std::string> errors(static_cast<size_t>(world));
  std::vector<std::thread> ts;
  for (int r = 0; r < world; ++r)
    ts.emplace_back([&, r] {
      try {
        ddprun::client::StoreClientOptions co;
        co.host = "127.0.0.1";
        co.port = server.port();
        co.timeout = std::chrono::seconds(20);
        ddprun::client::StoreClient store(co);
        GlooOptions go;
        go.hostname = "127.0.0.1";
        go.timeout = std::chrono::seconds(20);
        go.shared_memory = shared_memory;
        auto comm = make_gloo_communicator(store, r, world, go);
        traces[static_cast<size_t>(r)] = run(comm.get(), r, world, world, small_buckets, shared_grads);
      } catch (const std::exception& e) {
        errors[static_cast<size_t>(r)] = e.what();
      }
    });
  for (auto& t : ts) t.join();
  for (const auto& e : errors) REQUIRE(e.empty());
  const Trace single = run(nullptr, 0, 1, world, small_buckets);
  for (int s = 0; s < kSteps; ++s) {
    for (int r = 0; r < world; ++r) {
      // Every rank holds exactly the same averaged gradient and parameters.
      REQUIRE(traces[static_cast<size_t>(r)].params[static_cast<size_t>(s)] == traces[0].params[static_cast<size_t>(s)]);
      REQUIRE(traces[static_cast<size_t>(r)].grads[static_cast<size_t>(s)] == traces[0].grads[static_cast<size_t>(s)]);
    }
    const double g_err = rel_l2(traces[0].grads[static_cast<size_t>(s)], single.grads[static_cast<size_t>(s)]);
    const double p_err = max_rel(traces[0].params[static_cast<size_t>(s)], single.params[static_cast<size_t>(s)]);
    const double p_l2 = rel_l2(traces[0].params[static_cast<size_t>(s)], single.params[static_cast<size_t>(s)]);
    const double g_max = max_rel(traces[0].grads[static_cast<size_t>(s)], single.grads[static_cast<size_t>(s)]);
    INFO("world " << world << " step " << s << " grad rel L2 " << g_err << " grad rel max " << g_max
                  << " param rel L2 " << p_l2 << " param rel max " << p_err);
    REQUIRE(g_err <= 1e-6);
    REQUIRE(g_max <= 1e-6);
    REQUIRE(p_l2 <= 1e-6);
    REQUIRE(p_err <= 1e-6);
  }
}

}  // namespace

TEST_CASE("DDP invariant: 2 ranks over Gloo TCP equal one process on the global batch", "[ddp]") {
  check_invariant(2, true, false);
}

TEST_CASE("DDP invariant: 3 ranks over Gloo TCP, default buckets", "[ddp]") { check_invariant(3, false, false); }

TEST_CASE("DDP invariant: 2 ranks over the shared-memory path", "[ddp]") { check_invariant(2, true, true); }

TEST_CASE("DDP invariant: 3 ranks over the shared-memory path, default buckets", "[ddp]") {
  check_invariant(3, false, true);
}

TEST_CASE("Gloo: a rank that never arrives fails the collective within the timeout", "[ddp]") {
  ddprun::server::StoreServerOptions so;
  so.host = "127.0.0.1";
  so.port = 0;
  ddprun::server::StoreServer server(so);
  server.start();
  ddprun::client::StoreClientOptions co;
  co.host = "127.0.0.1";
  co.port = server.port();
  ddprun::client::StoreClient store(co);
  GlooOptions go;
  go.hostname = "127.0.0.1";
  go.timeout = std::chrono::milliseconds(1500);
  const auto t0 = std::chrono::steady_clock::now();
  REQUIRE_THROWS_AS(make_gloo_communicator(store, 0, 2, go), std::exception);
  REQUIRE(std::chrono::steady_clock::now() - t0 < std::chrono::seconds(10));
}

TEST_CASE("DDP invariant: gradients in alloc_shared memory (zero-copy shm path), 2 and 3 ranks", "[ddp]") {
  check_invariant(2, true, true, true);
  check_invariant(3, false, true, true);
}
