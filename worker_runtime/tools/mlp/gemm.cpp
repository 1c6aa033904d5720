#include "mlp/gemm.h"

#include <cctype>
#include <string>

#include <immintrin.h>
#ifdef DDPRUN_EXAMPLE_OPENBLAS
#include <cblas.h>
#endif

#include <algorithm>
#include <condition_variable>
#include <cstring>
#include <functional>
#include <stdexcept>
#include <mutex>
#include <thread>
#include <vector>

namespace ddprun::example {
namespace {

constexpr int MR = 6, NR = 16;
constexpr int KC = 256, MC = 96, NC = 2048;  // A block 96 KiB (L2), B block <= 2 MiB (L3)

inline float at_a(bool t, const float* A, int lda, int i, int p) { return t ? A[p * lda + i] : A[i * lda + p]; }

// Packs op(A)[i0:i0+mc, p0:p0+kc] into MR-row panels: panel r holds kc groups of MR values.
void pack_a(bool t, const float* A, int lda, int i0, int mc, int p0, int kc, float* dst) {
  for (int ir = 0; ir < mc; ir += MR) {
    const int m = std::min(MR, mc - ir);
    float* d = dst + ir * kc;
    if (!t) {
      for (int r = 0; r < MR; ++r) {
        if (r < m) {
          const float* src = A + (i0 + ir + r) * lda + p0;
          for (int p = 0; p < kc; ++p) d[p * MR + r] = src[p];
        } else {
          for (int p = 0; p < kc; ++p) d[p * MR + r] = 0.f;
        }
      }
    } else {
      for (int p = 0; p < kc; ++p) {
        const float* src = A + (p0 + p) * lda + i0 + ir;
        for (int r = 0; r < MR; ++r) d[p * MR + r] = r < m ? src[r] : 0.f;
      }
    }
  }
}

// Packs op(B)[p0:p0+kc, j0:j0+nc] into NR-column panels.
void pack_b(bool t, const float* B, int ldb, int p0, int kc, int j0, int nc, float* dst) {
  for (int jr = 0; jr < nc; jr += NR) {
    const int n = std::min(NR, nc - jr);
    float* d = dst + jr * kc;
    if (!t) {
      for (int p = 0; p < kc; ++p) {
        const float* src = B + (p0 + p) * ldb + j0 + jr;
        if (n == NR) {
          std::memcpy(d + p * NR, src, NR * sizeof(float));
        } else {
          for (int j = 0; j < NR; ++j) d[p * NR + j] = j < n ? src[j] : 0.f;
        }
      }
    } else {
      for (int j = 0; j < NR; ++j) {
        if (j < n) {
          const float* src = B + (j0 + jr + j) * ldb + p0;
          for (int p = 0; p < kc; ++p) d[p * NR + j] = src[p];
        } else {
          for (int p = 0; p < kc; ++p) d[p * NR + j] = 0.f;
        }
      }
    }
  }
}

// acc[MR][NR] = sum_p a[p][r] * b[p][j]; then C (m x n valid) = acc (+ C).
__attribute__((target("avx2,fma"))) void kernel_avx2(int kc, const float* a, const float* b, float* C, int ldc, int m,
                                                     int n, bool add) {
  __m256 c00 = _mm256_setzero_ps(), c01 = _mm256_setzero_ps(), c10 = _mm256_setzero_ps(), c11 = _mm256_setzero_ps();
  __m256 c20 = _mm256_setzero_ps(), c21 = _mm256_setzero_ps(), c30 = _mm256_setzero_ps(), c31 = _mm256_setzero_ps();
  __m256 c40 = _mm256_setzero_ps(), c41 = _mm256_setzero_ps(), c50 = _mm256_setzero_ps(), c51 = _mm256_setzero_ps();
  for (int p = 0; p < kc; ++p) {
    const __m256 b0 = _mm256_load_ps(b + p * NR), b1 = _mm256_load_ps(b + p * NR + 8);
    const float* ap = a + p * MR;
    __m256 av = _mm256_broadcast_ss(ap + 0);
    c00 = _mm256_fmadd_ps(av, b0, c00);
    c01 = _mm256_fmadd_ps(av, b1, c01);
    av = _mm256_broadcast_ss(ap + 1);
    c10 = _mm256_fmadd_ps(av, b0, c10);
    c11 = _mm256_fmadd_ps(av, b1, c11);
    av = _mm256_broadcast_ss(ap + 2);
    c20 = _mm256_fmadd_ps(av, b0, c20);
    c21 = _mm256_fmadd_ps(av, b1, c21);
    av = _mm256_broadcast_ss(ap + 3);
    c30 = _mm256_fmadd_ps(av, b0, c30);
    c31 = _mm256_fmadd_ps(av, b1, c31);
    av = _mm256_broadcast_ss(ap + 4);
    c40 = _mm256_fmadd_ps(av, b0, c40);
    c41 = _mm256_fmadd_ps(av, b1, c41);
    av = _mm256_broadcast_ss(ap + 5);
    c50 = _mm256_fmadd_ps(av, b0, c50);
    c51 = _mm256_fmadd_ps(av, b1, c51);
  }
  alignas(32) float acc[MR][NR];
  _mm256_store_ps(acc[0], c00);
  _mm256_store_ps(acc[0] + 8, c01);
  _mm256_store_ps(acc[1], c10);
  _mm256_store_ps(acc[1] + 8, c11);
  _mm256_store_ps(acc[2], c20);
  _mm256_store_ps(acc[2] + 8, c21);
  _mm256_store_ps(acc[3], c30);
  _mm256_store_ps(acc[3] + 8, c31);
  _mm256_store_ps(acc[4], c40);
  _mm256_store_ps(acc[4] + 8, c41);
  _mm256_store_ps(acc[5], c50);
  _mm256_store_ps(acc[5] + 8, c51);
  if (n == NR) {
    for (int r = 0; r < m; ++r) {
      float* c = C + r * ldc;
      __m256 v0 = _mm256_load_ps(acc[r]), v1 = _mm256_load_ps(acc[r] + 8);
      if (add) {
        v0 = _mm256_add_ps(v0, _mm256_loadu_ps(c));
        v1 = _mm256_add_ps(v1, _mm256_loadu_ps(c + 8));
      }
      _mm256_storeu_ps(c, v0);
      _mm256_storeu_ps(c + 8, v1);
    }
  } else {
    for (int r = 0; r < m; ++r)
      for (int j = 0; j < n; ++j) C[r * ldc + j] = add ? C[r * ldc + j] + acc[r][j] : acc[r][j];
  }
}

void kernel_generic(int kc, const float* a, const float* b, float* C, int ldc, int m, int n, bool add) {
  float acc[MR][NR] = {};
  for (int p = 0; p < kc; ++p)
    for (int r = 0; r < MR; ++r)
      for (int j = 0; j < NR; ++j) acc[r][j] += a[p * MR + r] * b[p * NR + j];
  for (int r = 0; r < m; ++r)
    for (int j = 0; j < n; ++j) C[r * ldc + j] = add ? C[r * ldc + j] + acc[r][j] : acc[r][j];
}

using KernelFn = void (*)(int, const float*, const float*, float*, int, int, int, bool);

bool detect_avx2() {
  __builtin_cpu_init();
  return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
}
const bool kHaveAvx2 = detect_avx2();

struct AlignedBuf {
  float* p = nullptr;
  size_t n = 0;
  float* get(size_t need) {
    if (need > n) {
      std::free(p);
      p = static_cast<float*>(std::aligned_alloc(64, ((need * sizeof(float) + 63) / 64) * 64));
      n = need;
    }
    return p;
  }
  ~AlignedBuf() { std::free(p); }
};

// Fork-join pool: run(n, fn) calls fn(0..n-1) spread over the workers and the caller.
class Pool {
 public:
  ~Pool() { resize(1); }
  int size() const { return static_cast<int>(workers_.size()) + 1; }
  void resize(int n) {
    {
      std::lock_guard<std::mutex> lk(mu_);
      stop_ = true;
      ++gen_;
    }
    cv_.notify_all();
    for (auto& t : workers_) t.join();
    workers_.clear();
    uint64_t start = 0;
    {
      std::lock_guard<std::mutex> lk(mu_);
      stop_ = false;
      start = gen_;
    }
    // A new worker waits for the next run(), not the generation that stopped its predecessors
    // (it would run a stale fn_).
    for (int i = 1; i < n; ++i) workers_.emplace_back([this, i, start] { loop(i, start); });
  }
  void run(int n, const std::function<void(int)>& fn) {
    const int parts = size();
    if (parts == 1 || n <= 1) {
      for (int i = 0; i < n; ++i) fn(i);
      return;
    }
    {
      std::lock_guard<std::mutex> lk(mu_);
      fn_ = &fn;
      tasks_ = n;
      parts_ = parts;
      pending_ = parts - 1;
      ++gen_;
    }
    cv_.notify_all();
    for (int i = 0; i < n; i += parts) fn(i);  // the caller is part 0
    std::unique_lock<std::mutex> lk(mu_);
    done_cv_.wait(lk, [&] { return pending_ == 0; });
  }

 private:
  void loop(int part, uint64_t seen) {
    for (;;) {
      std::unique_lock<std::mutex> lk(mu_);
      cv_.wait(lk, [&] { return gen_ != seen; });
      seen = gen_;
      if (stop_) return;
      const auto* fn = fn_;
      const int n = tasks_, parts = parts_;  // read under the lock: resize() changes workers_
      lk.unlock();
      for (int i = part; i < n; i += parts) (*fn)(i);
      lk.lock();
      if (--pending_ == 0) done_cv_.notify_all();
    }
  }
  std::vector<std::thread> workers_;
  std::mutex mu_;
  std::condition_variable cv_, done_cv_;
  const std::function<void(int)>* fn_ = nullptr;
  int tasks_ = 0, parts_ = 1, pending_ = 0;
  uint64_t gen_ = 0;
  bool stop_ = false;
};

Pool& pool() {
  static Pool p;
  return p;
}

}  // namespace

bool sgemm_uses_avx2() { return kHaveAvx2; }

namespace {
#ifdef DDPRUN_EXAMPLE_OPENBLAS
constexpr bool kHaveBlas = true;
#else
constexpr bool kHaveBlas = false;
#endif
// `auto`: see gemm_auto_choice (gemm.h).
GemmImpl default_impl() {
#ifdef DDPRUN_EXAMPLE_OPENBLAS
  return gemm_auto_choice(kHaveBlas, kHaveAvx2, openblas_get_corename());
#else
  return GemmImpl::Builtin;
#endif
}
GemmImpl g_impl = default_impl();
int g_threads = 1;
}  // namespace

GemmImpl gemm_auto_choice(bool have_blas, bool have_avx2, const std::string& blas_core) {
  if (!have_blas) return GemmImpl::Builtin;
  if (!have_avx2) return GemmImpl::Blas;
  std::string core = blas_core;
  for (auto& c : core) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  for (const char* modern : {"haswell", "zen", "skylakex", "cooperlake", "sapphirerapids"})
    if (core.find(modern) != std::string::npos) return GemmImpl::Blas;
  return GemmImpl::Builtin;
}

bool gemm_blas_available() { return kHaveBlas; }
std::string gemm_blas_core() {
#ifdef DDPRUN_EXAMPLE_OPENBLAS
  return openblas_get_corename();
#else
  return "none";
#endif
}
void set_gemm_impl(GemmImpl impl) {
  if (impl == GemmImpl::Blas && !kHaveBlas)
    throw std::invalid_argument("this build of train has no BLAS (install libopenblas64-pthread-dev and reconfigure)");
  g_impl = impl;
}
GemmImpl gemm_impl() { return g_impl; }
const char* gemm_impl_name() { return g_impl == GemmImpl::Blas ? "openblas" : "builtin"; }

void set_gemm_threads(int n) {
  g_threads = std::max(1, n);
  pool().resize(g_threads);
}
int gemm_threads() { return g_threads; }

void sgemm(bool trans_a, bool trans_b, int M, int N, int K, const float* A, int lda, const float* B, int ldb, float* C,
           int ldc, bool accumulate) {
#ifdef DDPRUN_EXAMPLE_OPENBLAS
  if (g_impl == GemmImpl::Blas) {
    // OpenBLAS runs single-threaded, one cblas call per fixed block of C's columns over the
    // whole K; our pool hands contiguous runs of blocks to its threads. Every element is
    // computed by the same call shape whatever the thread count, so results are
    // bit-identical (OpenBLAS's own threading, or blocks that depend on the thread count,
    // change the bits: its edge and small-matrix kernels sum in another order).
    static const bool single = (openblas_set_num_threads(1), true);
    (void)single;
    if (M <= 0 || N <= 0) return;
    constexpr int kCols = 128;  // block width: whole register tiles on every OpenBLAS core
    const auto block = [&](int b) {
      const int j0 = b * kCols, j1 = std::min(N, j0 + kCols);
      // beta = 0 overwrites C without reading it, like the builtin path (K = 0 included).
      cblas_sgemm(CblasRowMajor, trans_a ? CblasTrans : CblasNoTrans, trans_b ? CblasTrans : CblasNoTrans, M, j1 - j0,
                  K, 1.f, A, lda, trans_b ? B + static_cast<size_t>(j0) * ldb : B + j0, ldb, accumulate ? 1.f : 0.f,
                  C + j0, ldc);
    };
    const int blocks = (N + kCols - 1) / kCols;
    const int groups = std::min(blocks, pool().size());
    if (groups <= 1) {
      for (int b = 0; b < blocks; ++b) block(b);
    } else {
      pool().run(groups, [&](int g) {
        for (int b = blocks * g / groups; b < blocks * (g + 1) / groups; ++b) block(b);
      });
    }
    return;
  }
#endif
  sgemm_builtin(trans_a, trans_b, M, N, K, A, lda, B, ldb, C, ldc, accumulate);
}

void sgemm_builtin(bool trans_a, bool trans_b, int M, int N, int K, const float* A, int lda, const float* B, int ldb,
                   float* C, int ldc, bool accumulate) {
  if (M <= 0 || N <= 0) return;
  if (K <= 0) {
    if (!accumulate)
      for (int i = 0; i < M; ++i) std::fill(C + i * ldc, C + i * ldc + N, 0.f);
    return;
  }
  thread_local AlignedBuf abuf, bbuf;
  const KernelFn kernel = kHaveAvx2 ? kernel_avx2 : kernel_generic;
  float* ap = abuf.get(static_cast<size_t>(MC + MR) * KC);
  float* bp = bbuf.get(static_cast<size_t>(KC) * (NC + NR));
  for (int jc = 0; jc < N; jc += NC) {
    const int nc = std::min(NC, N - jc);
    for (int pc = 0; pc < K; pc += KC) {
      const int kc = std::min(KC, K - pc);
      const bool add = accumulate || pc > 0;
      pack_b(trans_b, B, ldb, pc, kc, jc, nc, bp);
      for (int ic = 0; ic < M; ic += MC) {
        const int mc = std::min(MC, M - ic);
        pack_a(trans_a, A, lda, ic, mc, pc, kc, ap);
        // Column panels are independent: split them over the pool in contiguous groups.
        const int panels = (nc + NR - 1) / NR;
        const int groups = std::min(panels, pool().size());
        pool().run(groups, [&](int g) {
          const int p0 = panels * g / groups, p1 = panels * (g + 1) / groups;
          for (int jr = p0 * NR; jr < p1 * NR && jr < nc; jr += NR) {
            const int n = std::min(NR, nc - jr);
            for (int ir = 0; ir < mc; ir += MR) {
              const int m = std::min(MR, mc - ir);
              kernel(kc, ap + ir * kc, bp + jr * kc, C + (ic + ir) * ldc + jc + jr, ldc, m, n, add);
            }
          }
        });
      }
    }
  }
}

void sgemm_reference(bool trans_a, bool trans_b, int M, int N, int K, const float* A, int lda, const float* B, int ldb,
                     float* C, int ldc, bool accumulate) {
  for (int i = 0; i < M; ++i)
    for (int j = 0; j < N; ++j) {
      double s = accumulate ? C[i * ldc + j] : 0.0;
      for (int p = 0; p < K; ++p)
        s += static_cast<double>(at_a(trans_a, A, lda, i, p)) * (trans_b ? B[j * ldb + p] : B[p * ldb + j]);
      C[i * ldc + j] = static_cast<float>(s);
    }
}

}  // namespace ddprun::example
