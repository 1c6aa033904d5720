// The model code of the `train` harness, not part of libddprun_worker (a user brings the model).
// fp32 GEMM for the CPU training path, two implementations behind sgemm():
//  * Blas: OpenBLAS's cblas_sgemm, when train was built with it (gemm_blas_available();
//    CMake finds Debian's libopenblas64-pthread-dev). The default when available, unless
//    OpenBLAS fell back to an old generic kernel on a CPU with AVX2 (gemm_auto_choice).
//  * Builtin: our own (BLIS-style: packed panels, a 6x16 AVX2/FMA micro-kernel chosen at
//    run time, a portable kernel otherwise).
// Deterministic: the same shapes give bit-identical results on the same machine with the
// same implementation (the two differ from each other in the last bits).
#pragma once

#include <string>

namespace ddprun::example {

enum class GemmImpl { Builtin, Blas };
bool gemm_blas_available();
// Not thread-safe: choose before training. Throws std::invalid_argument for Blas when the
// harness was built without a BLAS.
void set_gemm_impl(GemmImpl impl);
GemmImpl gemm_impl();
const char* gemm_impl_name();  // "openblas" or "builtin"
// The kernel set OpenBLAS picked for this CPU at load (its runtime detection, or
// OPENBLAS_CORETYPE), e.g. "SkylakeX"; "none" when built without OpenBLAS. `auto` keeps the
// builtin GEMM when this is an old generic core on a CPU with AVX2: printed so a benchmark
// says which GEMM ran and why.
std::string gemm_blas_core();
// The rule behind the default (`auto`), pure: Builtin without a BLAS; Blas on a CPU without
// AVX2; otherwise Blas only when OpenBLAS's core (any case) names a modern kernel set
// (Haswell, Zen, SkylakeX, Cooperlake, SapphireRapids): a guest whose CPUID hides the model
// gets "Prescott", whose kernels ran 1.5-2.5x slower than the builtin AVX2 one.
GemmImpl gemm_auto_choice(bool have_blas, bool have_avx2, const std::string& blas_core);

// Row-major: C[M,N] = op(A)[M,K] * op(B)[K,N] (+ C when accumulate).
// op(A) = A (lda >= K) or A^T when trans_a (A is [K,M], lda >= M); likewise B.
void sgemm(bool trans_a, bool trans_b, int M, int N, int K, const float* A, int lda, const float* B, int ldb,
           float* C, int ldc, bool accumulate);
// The Builtin implementation, whatever gemm_impl() is.
void sgemm_builtin(bool trans_a, bool trans_b, int M, int N, int K, const float* A, int lda, const float* B, int ldb,
                   float* C, int ldc, bool accumulate);

// Plain triple loop (double accumulation), for tests.
void sgemm_reference(bool trans_a, bool trans_b, int M, int N, int K, const float* A, int lda, const float* B,
                     int ldb, float* C, int ldc, bool accumulate);

// True when the builtin AVX2/FMA kernel is in use.
bool sgemm_uses_avx2();

// Threads sgemm() uses (default 1), in either implementation. Each thread computes disjoint
// tiles of C with the same summation order (with OpenBLAS: fixed blocks of C's columns, one
// single-threaded cblas_sgemm each, the same blocks for any count), so results are
// bit-identical for any thread count. Not thread-safe: set it before training; sgemm()
// itself must be called from one thread at a time.
void set_gemm_threads(int n);
int gemm_threads();

}  // namespace ddprun::example
