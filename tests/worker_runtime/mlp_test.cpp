#include <catch2/catch.hpp>
#include <cmath>
#include <stdexcept>
#include <vector>

#include "mlp/gemm.h"
#include "mlp/mlp.h"
#include "ddprun/worker/hash.h"

using namespace ddprun::worker;
using namespace ddprun::example;

namespace {
std::vector<float> random_vec(size_t n, uint64_t seed) {
  Rng r{seed};
  std::vector<float> v(n);
  for (auto& x : v) x = r.next_unit() * 2.f - 1.f;
  return v;
}
}  // namespace

// Every GEMM test runs for each implementation this build has, and restores the default.
std::vector<GemmImpl> impls() {
  std::vector<GemmImpl> v{GemmImpl::Builtin};
  if (gemm_blas_available()) v.push_back(GemmImpl::Blas);
  return v;
}
struct ImplGuard {
  GemmImpl prev = gemm_impl();
  explicit ImplGuard(GemmImpl i) { set_gemm_impl(i); }
  ~ImplGuard() { set_gemm_impl(prev); }
};

TEST_CASE("Gemm: matches the reference for every transpose and odd shapes", "[mlp]") {
  for (GemmImpl impl : impls()) {
  ImplGuard g(impl);
  INFO("implementation " << gemm_impl_name());
  for (bool ta : {false, true})
    for (bool tb : {false, true})
      for (auto [M, N, K] : {std::tuple{1, 1, 1}, {7, 19, 5}, {13, 33, 300}, {97, 130, 257}, {64, 1024, 1024}}) {
        const auto A = random_vec(static_cast<size_t>(M) * K, 1), B = random_vec(static_cast<size_t>(K) * N, 2);
        std::vector<float> C(static_cast<size_t>(M) * N, 0.5f), R = C;
        const int lda = ta ? M : K, ldb = tb ? K : N;
        for (bool acc : {false, true}) {
          sgemm(ta, tb, M, N, K, A.data(), lda, B.data(), ldb, C.data(), N, acc);
          sgemm_reference(ta, tb, M, N, K, A.data(), lda, B.data(), ldb, R.data(), N, acc);
          for (size_t i = 0; i < C.size(); ++i) REQUIRE(C[i] == Approx(R[i]).margin(1e-4 * std::sqrt(K)));
        }
      }
  }
}

TEST_CASE("Gemm: K = 0 writes zeros (or leaves C) in every implementation", "[mlp]") {
  for (GemmImpl impl : impls()) {
    ImplGuard g(impl);
    std::vector<float> C(6, 3.f);
    const float a = 1.f, b = 1.f;
    sgemm(false, false, 2, 3, 0, &a, 1, &b, 3, C.data(), 3, true);
    REQUIRE(C == std::vector<float>(6, 3.f));
    sgemm(false, false, 2, 3, 0, &a, 1, &b, 3, C.data(), 3, false);
    REQUIRE(C == std::vector<float>(6, 0.f));
  }
}

TEST_CASE("Gemm: the auto rule keeps the builtin GEMM only where OpenBLAS fell back to an old core", "[mlp]") {
  REQUIRE(gemm_auto_choice(false, true, "Haswell") == GemmImpl::Builtin);
  REQUIRE(gemm_auto_choice(false, false, "none") == GemmImpl::Builtin);
  REQUIRE(gemm_auto_choice(true, false, "Prescott") == GemmImpl::Blas);
  REQUIRE(gemm_auto_choice(true, true, "Prescott") == GemmImpl::Builtin);
  REQUIRE(gemm_auto_choice(true, true, "Haswell") == GemmImpl::Blas);
  REQUIRE(gemm_auto_choice(true, true, "SKYLAKEX") == GemmImpl::Blas);
  REQUIRE(gemm_auto_choice(true, true, "Cooperlake") == GemmImpl::Blas);
  REQUIRE(gemm_auto_choice(true, true, "Zen") == GemmImpl::Blas);
}

TEST_CASE("Gemm: the default follows the auto rule for this CPU and build", "[mlp]") {
  REQUIRE(gemm_impl() == gemm_auto_choice(gemm_blas_available(), sgemm_uses_avx2(), gemm_blas_core()));
  if (!gemm_blas_available()) REQUIRE_THROWS_AS(set_gemm_impl(GemmImpl::Blas), std::invalid_argument);
}

TEST_CASE("Mlp: parameter layout follows PyTorch's parameters() order", "[mlp]") {
  MlpShape s{10, 50, 0, 1};
  auto t = mlp_param_tensors(s);
  REQUIRE(t.size() == 4);
  REQUIRE(t[0].count == 500);
  REQUIRE(t[1].count == 50);
  REQUIRE(t[2].count == 50);
  REQUIRE(t[3].count == 1);
  REQUIRE(mlp_num_params(s) == 601);
  REQUIRE(mlp_num_params({10, 1024, 4, 1}) == 4210689);  // the CPU benchmark model: 4.2 M
}

TEST_CASE("Mlp: gradient matches finite differences", "[mlp]") {
  MlpShape s{6, 9, 2, 1};
  CpuMlp m(s);
  const size_t n = mlp_num_params(s);
  std::vector<float> p(n), g(n);
  mlp_init(s, 3, p.data());
  const int batch = 5;
  auto x = random_vec(static_cast<size_t>(batch) * s.in, 11), y = random_vec(batch, 12);
  std::vector<size_t> order;
  m.forward_backward(p.data(), x.data(), y.data(), batch, g.data(), false, [&](size_t t) { order.push_back(t); });
  REQUIRE(order == std::vector<size_t>{7, 6, 5, 4, 3, 2, 1, 0});  // last layer first
  const float h = 1e-3f;
  int checked = 0;
  for (size_t i = 0; i < n; i += 3) {
    auto pp = p, pm = p;
    pp[i] += h;
    pm[i] -= h;
    const double fd = (static_cast<double>(m.loss(pp.data(), x.data(), y.data(), batch)) -
                       m.loss(pm.data(), x.data(), y.data(), batch)) / (2.0 * h);
    INFO("param " << i << " analytic " << g[i] << " numeric " << fd);
    REQUIRE(std::abs(fd - g[i]) <= 1e-3 + 2e-2 * std::abs(g[i]));
    ++checked;
  }
  REQUIRE(checked > 20);
}

TEST_CASE("Mlp: accumulate adds to existing gradients", "[mlp]") {
  MlpShape s{4, 8, 1, 1};
  CpuMlp m(s);
  const size_t n = mlp_num_params(s);
  std::vector<float> p(n), g1(n), g2(n);
  mlp_init(s, 1, p.data());
  auto x = random_vec(12, 5), y = random_vec(3, 6);
  m.forward_backward(p.data(), x.data(), y.data(), 3, g1.data(), false, {});
  g2 = g1;
  m.forward_backward(p.data(), x.data(), y.data(), 3, g2.data(), true, {});
  for (size_t i = 0; i < n; ++i) REQUIRE(g2[i] == Approx(2 * g1[i]).margin(1e-7));
}

TEST_CASE("Sgd: plain and momentum updates like torch.optim.SGD", "[mlp]") {
  std::vector<float> p{1.f, 2.f}, g{0.5f, -1.f}, buf(2);
  sgd_step(p.data(), g.data(), nullptr, 2, 0.1f, 0.f, true);
  REQUIRE(p[0] == Approx(0.95f));
  sgd_step(p.data(), g.data(), buf.data(), 2, 0.1f, 0.9f, true);  // buf = g
  REQUIRE(buf[1] == Approx(-1.f));
  sgd_step(p.data(), g.data(), buf.data(), 2, 0.1f, 0.9f, false);  // buf = 0.9 buf + g
  REQUIRE(buf[1] == Approx(-1.9f));
  REQUIRE(p[1] == Approx(2.f + 0.1f + 0.1f + 0.19f));
}

TEST_CASE("Gemm: bit-identical results for any thread count", "[mlp]") {
  const GemmImpl impl = GENERATE(GemmImpl::Builtin, GemmImpl::Blas);
  if (impl == GemmImpl::Blas && !gemm_blas_available()) return;
  ImplGuard g(impl);
  INFO("implementation " << gemm_impl_name());
  const int M = 64, N = 300, K = 515;
  const auto A = random_vec(static_cast<size_t>(M) * K, 3), B = random_vec(static_cast<size_t>(K) * N, 4);
  std::vector<float> C1(static_cast<size_t>(M) * N), C3 = C1;
  set_gemm_threads(1);
  sgemm(false, true, M, N, K, A.data(), K, B.data(), K, C1.data(), N, false);
  set_gemm_threads(3);
  REQUIRE(gemm_threads() == 3);
  sgemm(false, true, M, N, K, A.data(), K, B.data(), K, C3.data(), N, false);
  set_gemm_threads(1);
  REQUIRE(C1 == C3);
}
