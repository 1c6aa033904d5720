// Example code of the `train` program, not part of libddprun_worker (a user brings the model).
// Single-threaded fp32 GEMM for the CPU training path (BLIS-style: packed panels, a 6x16
// AVX2/FMA micro-kernel chosen at run time, a portable kernel otherwise).
// Deterministic: the same shapes give bit-identical results on the same machine.
#pragma once

namespace ddprun::example {

// Row-major: C[M,N] = op(A)[M,K] * op(B)[K,N] (+ C when accumulate).
// op(A) = A (lda >= K) or A^T when trans_a (A is [K,M], lda >= M); likewise B.
void sgemm(bool trans_a, bool trans_b, int M, int N, int K, const float* A, int lda, const float* B, int ldb,
           float* C, int ldc, bool accumulate);

// Plain triple loop (double accumulation), for tests.
void sgemm_reference(bool trans_a, bool trans_b, int M, int N, int K, const float* A, int lda, const float* B,
                     int ldb, float* C, int ldc, bool accumulate);

// True when the AVX2/FMA kernel is in use.
bool sgemm_uses_avx2();

// Threads sgemm() uses (default 1). Each thread computes disjoint tiles of C with the same
// summation order, so results are bit-identical for any thread count. Not thread-safe: set
// it before training; sgemm() itself must be called from one thread at a time.
void set_gemm_threads(int n);
int gemm_threads();

}  // namespace ddprun::example
