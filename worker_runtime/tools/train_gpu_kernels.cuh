// The GPU path's kernels (train_gpu.cu): bias + activation, the MSE gradient, ReLU's backward,
// fills, SGD with momentum over fp32 master weights (and their compute copies), casts and the
// fp16 loss scale's update. Private to train_gpu.cu (its one includer), hence the unnamed namespace.
#pragma once

#include <cublas_v2.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstddef>

namespace train {
namespace {

template <class T>
struct TypeOf;
template <>
struct TypeOf<float> {
  static constexpr cudaDataType_t value = CUDA_R_32F;
};
template <>
struct TypeOf<__nv_bfloat16> {
  static constexpr cudaDataType_t value = CUDA_R_16BF;
};
template <>
struct TypeOf<__half> {
  static constexpr cudaDataType_t value = CUDA_R_16F;
};

__device__ __forceinline__ float to_f(float v) { return v; }
__device__ __forceinline__ float to_f(__nv_bfloat16 v) { return __bfloat162float(v); }
__device__ __forceinline__ float to_f(__half v) { return __half2float(v); }
template <class T>
__device__ __forceinline__ T from_f(float v);
template <>
__device__ __forceinline__ float from_f<float>(float v) {
  return v;
}
template <>
__device__ __forceinline__ __nv_bfloat16 from_f<__nv_bfloat16>(float v) {
  return __float2bfloat16(v);
}
template <>
__device__ __forceinline__ __half from_f<__half>(float v) {
  return __float2half(v);
}

inline unsigned blocks_for(size_t n, unsigned threads) {
  return static_cast<unsigned>(std::min<size_t>((n + threads - 1) / threads, 65535u * 16));
}

// Four consecutive elements in one aligned access (16 bytes of float, 8 of bf16/fp16): the
// elementwise kernels below are memory-bound, and 2- or 4-byte accesses left bandwidth unused.
template <class T>
struct alignas(4 * sizeof(T)) Pack4 {
  T v[4];
};

// z = act(z + b) over [rows, cols], in packs of 4 (cols % 4 == 0) or one by one (the last layer,
// cols 1). One block row per activation row (grid-stride over rows): the bias index needs no
// 64-bit modulo per element.
// fp16 (flag given): flag = 1 when an output is inf or NaN (see overflow_check below).
template <class T>
__global__ void bias_act_kernel(T* z, const T* b, int rows, int cols, bool relu, int* flag) {
  bool bad = false;
  const bool packed = cols % 4 == 0;
  const int units = packed ? cols / 4 : cols;
  for (int r = blockIdx.y; r < rows; r += gridDim.y) {
    T* row = z + static_cast<size_t>(r) * cols;
    for (int j = blockIdx.x * blockDim.x + threadIdx.x; j < units; j += gridDim.x * blockDim.x) {
      if (packed) {
        Pack4<T> v = reinterpret_cast<Pack4<T>*>(row)[j];
        const Pack4<T> bb = reinterpret_cast<const Pack4<T>*>(b)[j];
#pragma unroll
        for (int k = 0; k < 4; ++k) {
          const float x = to_f(v.v[k]) + to_f(bb.v[k]);
          v.v[k] = from_f<T>(relu ? fmaxf(x, 0.f) : x);
          if (flag) bad |= !isfinite(to_f(v.v[k]));
        }
        reinterpret_cast<Pack4<T>*>(row)[j] = v;
      } else {
        const float x = to_f(row[j]) + to_f(b[j]);
        row[j] = from_f<T>(relu ? fmaxf(x, 0.f) : x);
        if (flag) bad |= !isfinite(to_f(row[j]));
      }
    }
  }
  if (flag && __syncthreads_or(bad) && threadIdx.x == 0) *flag = 1;
}
inline dim3 bias_act_grid(int rows, int cols) {
  const int units = cols % 4 == 0 ? cols / 4 : cols;
  return dim3(static_cast<unsigned>((units + 255) / 256), static_cast<unsigned>(std::min(rows, 65535)));
}

// out is [rows, 1]: dz = 2 (o - y) / rows * scale; loss += sum (o - y)^2 / rows.
// fp16 (flag given): flag = 1 when a (scaled) output gradient is inf or NaN.
template <class T>
__global__ void mse_grad_kernel(const T* o, const float* y, T* dz, int rows, const float* scale, float* loss,
                                int* flag) {
  __shared__ float part[256];
  float acc = 0.f;
  bool bad = false;
  const float s = scale ? *scale : 1.f;
  for (int i = threadIdx.x; i < rows; i += blockDim.x) {
    const float d = to_f(o[i]) - y[i];
    acc += d * d;
    dz[i] = from_f<T>(2.f * d / rows * s);
    if (flag) bad |= !isfinite(to_f(dz[i]));
  }
  if (flag && __syncthreads_or(bad) && threadIdx.x == 0) *flag = 1;
  part[threadIdx.x] = acc;
  __syncthreads();
  for (int k = blockDim.x / 2; k > 0; k >>= 1) {
    if (threadIdx.x < k) part[threadIdx.x] += part[threadIdx.x + k];
    __syncthreads();
  }
  if (threadIdx.x == 0) *loss = part[0] / rows;
}

// da = 0 where the forward activation a was not positive: packs of 4, then the tail. fp16
// (flag given): flag = 1 when a resulting gradient is inf or NaN.
template <class T>
__global__ void relu_bwd_kernel(T* da, const T* a, size_t n, int* flag) {
  auto* d4 = reinterpret_cast<Pack4<T>*>(da);
  const auto* a4 = reinterpret_cast<const Pack4<T>*>(a);
  bool bad = false;
  const size_t t = blockIdx.x * size_t(blockDim.x) + threadIdx.x, stride = size_t(gridDim.x) * blockDim.x;
  for (size_t i = 4 * (n / 4) + t; i < n; i += stride) {
    if (!(to_f(a[i]) > 0.f)) da[i] = from_f<T>(0.f);
    if (flag) bad |= !isfinite(to_f(da[i]));
  }
  for (size_t i = t; i < n / 4; i += stride) {
    Pack4<T> d = d4[i];
    const Pack4<T> x = a4[i];
#pragma unroll
    for (int k = 0; k < 4; ++k) {
      if (!(to_f(x.v[k]) > 0.f)) d.v[k] = from_f<T>(0.f);
      if (flag) bad |= !isfinite(to_f(d.v[k]));
    }
    d4[i] = d;
  }
  if (flag && __syncthreads_or(bad) && threadIdx.x == 0) *flag = 1;
}

template <class T>
__global__ void fill_kernel(T* p, size_t n, float v) {
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x)
    p[i] = from_f<T>(v);
}

// fp16 loss scaling needs to know whether any gradient is inf or NaN. Instead of a pass over
// the fp32 gradients (1.34 GB on the 8192x5 model, 0.3 ms), the flag is raised by the kernels
// that write the fp16 operands of the gradient GEMMs: every activation (bias_act_kernel) and
// every output gradient (mse_grad_kernel, relu_bwd_kernel). Equivalent: a weight gradient is a
// sum of at most `batch` products of those fp16 values in fp32 (cuBLAS, CUBLAS_COMPUTE_32F), at
// most 65504^2 * batch in magnitude, far below fp32's 3.4e38, so it is non-finite exactly when
// one of its operands is; a bias gradient is a sum of output gradients. A non-finite value that
// ReLU's mask removes never reaches a gradient, as in PyTorch. Across ranks the flags are
// all-reduced with max: a sum of finite gradients is finite at any realistic world size.

// Blocks for a kernel that takes packs of 4 elements: one thread per pack, at most 8192 blocks
// of 256 (grid-stride beyond).
inline unsigned pack_blocks(size_t n) { return std::min(blocks_for((n + 3) / 4, 256), 8192u); }

// p -= lr * (momentum buf | g / (world * scale)); refresh the compute copy. Skipped when flag is
// set. The gradients arrive summed over ranks: the average is this multiply, not a pass of its own.
// Packs of 4 (every array starts 256-byte aligned, so pack k is aligned in each), then the tail.
template <class T, class G>
__device__ __forceinline__ void sgd_one(float& p, float g, float* buf, T* copy, float lr, float momentum, bool first) {
  float d = g;
  if (buf) {
    d = first ? d : momentum * *buf + d;
    *buf = d;
  }
  p -= lr * d;
  if (copy) *copy = from_f<T>(p);
}
template <class T, class G>
__global__ void sgd_kernel(float* p, const G* g, float* buf, T* copy, size_t n, float lr, float momentum, bool first,
                           const float* scale, const int* flag, float inv_world) {
  if (flag && *flag) return;
  const float inv = scale ? inv_world / *scale : inv_world;
  const size_t n4 = n / 4, stride = size_t(gridDim.x) * blockDim.x;
  const size_t t = blockIdx.x * size_t(blockDim.x) + threadIdx.x;
  for (size_t k = t; k < n4; k += stride) {
    Pack4<float> pv = reinterpret_cast<Pack4<float>*>(p)[k];
    const Pack4<G> gv = reinterpret_cast<const Pack4<G>*>(g)[k];
    Pack4<float> bv{};
    if (buf) bv = reinterpret_cast<Pack4<float>*>(buf)[k];
    Pack4<T> cv;
#pragma unroll
    for (int e = 0; e < 4; ++e)
      sgd_one<T, G>(pv.v[e], to_f(gv.v[e]) * inv, buf ? &bv.v[e] : nullptr, &cv.v[e], lr, momentum, first);
    reinterpret_cast<Pack4<float>*>(p)[k] = pv;
    if (buf) reinterpret_cast<Pack4<float>*>(buf)[k] = bv;
    if (copy) reinterpret_cast<Pack4<T>*>(copy)[k] = cv;
  }
  for (size_t i = 4 * n4 + t; i < n; i += stride)
    sgd_one<T, G>(p[i], to_f(g[i]) * inv, buf ? &buf[i] : nullptr, copy ? &copy[i] : nullptr, lr, momentum, first);
}

template <class T>
__global__ void cast_kernel(const float* p, T* copy, size_t n) {
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x)
    copy[i] = from_f<T>(p[i]);
}

__global__ void scale_update_kernel(float* scale, int* good, int* flag, int* skipped) {
  if (*flag) {
    *scale = fmaxf(*scale * 0.5f, 1.f);
    *good = 0;
    ++*skipped;
  } else if (++*good >= 2000) {
    *scale *= 2.f;
    *good = 0;
  }
  *flag = 0;
}

template <class T>
__global__ void x_to_t_kernel(const float* x, T* out, size_t n) {
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x)
    out[i] = from_f<T>(x[i]);
}

}  // namespace
}  // namespace train
