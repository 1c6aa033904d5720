// GPU path of `train`: cuBLAS GEMMs, small kernels of our own, fp32 master weights with
// bf16/fp16 compute copies, the Reducer summing gradient buckets (fp32, or bf16 with
// --grad-dtype bf16) over NCCL on its own stream while backward continues on the compute
// stream; SGD divides by the world size. fp16 uses dynamic loss scaling with
// the overflow flag all-reduced (max) so every rank skips the same steps; the scale lives on
// the device, so no step needs a host synchronisation.
#include <cublas_v2.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <csignal>
#include <type_traits>
#include <cinttypes>
#include <cstdio>
#include <cstdlib>
#include <optional>
#include <string>
#include <vector>

#include "ddprun/worker/checkpoint.h"
#include "ddprun/worker/stop.h"
#include "mlp/mlp.h"
#include "ddprun/worker/gpu_checks.h"
#include "ddprun/worker/reducer.h"
#include "ddprun/worker/sampler.h"
#include "train_common.h"

namespace dw = ddprun::worker;
namespace ex = ddprun::example;

namespace train {
namespace {

template <class T> struct TypeOf;
template <> struct TypeOf<float> { static constexpr cudaDataType_t value = CUDA_R_32F; };
template <> struct TypeOf<__nv_bfloat16> { static constexpr cudaDataType_t value = CUDA_R_16BF; };
template <> struct TypeOf<__half> { static constexpr cudaDataType_t value = CUDA_R_16F; };

__device__ __forceinline__ float to_f(float v) { return v; }
__device__ __forceinline__ float to_f(__nv_bfloat16 v) { return __bfloat162float(v); }
__device__ __forceinline__ float to_f(__half v) { return __half2float(v); }
template <class T> __device__ __forceinline__ T from_f(float v);
template <> __device__ __forceinline__ float from_f<float>(float v) { return v; }
template <> __device__ __forceinline__ __nv_bfloat16 from_f<__nv_bfloat16>(float v) { return __float2bfloat16(v); }
template <> __device__ __forceinline__ __half from_f<__half>(float v) { return __float2half(v); }

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
__global__ void sgd_kernel(float* p, const G* g, float* buf, T* copy, size_t n, float lr, float momentum,
                           bool first, const float* scale, const int* flag, float inv_world) {
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

template <class T>
struct DeviceBuf {
  T* p = nullptr;
  size_t n = 0;
  explicit DeviceBuf(size_t count = 0) { resize(count); }
  void resize(size_t count) {
    if (count == n) return;
    if (p) cudaFree(p);
    p = nullptr;
    n = count;
    if (count) DDPRUN_CUDA_CHECK(cudaMalloc(&p, count * sizeof(T)));
  }
  ~DeviceBuf() { if (p) cudaFree(p); }
  DeviceBuf(const DeviceBuf&) = delete;
  DeviceBuf& operator=(const DeviceBuf&) = delete;
};

// DDPRUN_TRAIN_PROFILE=1 (a diagnostic of the example): GPU time per phase of the step, from
// events recorded on the compute stream after each phase (time between consecutive events is
// charged to the later phase), averaged over the timed steps (at most kMaxSteps), and the host's
// time per step issuing work and waiting. The events add small gaps between kernels, so the
// phases add up to a little more than an unprofiled step.
class PhaseProfile {
 public:
  static constexpr size_t kMaxSteps = 200;
  PhaseProfile(cudaStream_t s) : stream_(s) {
    const char* v = std::getenv("DDPRUN_TRAIN_PROFILE");
    on_ = v && std::string(v) == "1";
  }
  ~PhaseProfile() {
    for (auto& st : steps_)
      for (auto& m : st) cudaEventDestroy(m.second);
  }
  void begin_step(bool timed) {
    active_ = on_ && timed && steps_.size() < kMaxSteps;
    if (!active_) return;
    steps_.emplace_back();
    mark("start");
  }
  void mark(const char* name) {
    if (!active_) return;
    cudaEvent_t e;
    DDPRUN_CUDA_CHECK(cudaEventCreate(&e));
    DDPRUN_CUDA_CHECK(cudaEventRecord(e, stream_));
    steps_.back().emplace_back(name, e);
  }
  void host(const char* name, double ms) {
    if (!active_) return;
    add(host_, name, ms);
  }
  // After the stream is synchronised.
  void report() const {
    if (!on_ || steps_.empty()) return;
    std::vector<std::pair<std::string, double>> gpu;
    double total = 0;
    for (const auto& st : steps_)
      for (size_t k = 1; k < st.size(); ++k) {
        float ms = 0;
        DDPRUN_CUDA_CHECK(cudaEventElapsedTime(&ms, st[k - 1].second, st[k].second));
        add(gpu, st[k].first, ms);
        total += ms;
      }
    const double n = static_cast<double>(steps_.size());
    std::printf("profile: %zu steps, GPU ms per step by phase (sum %.3f):\n", steps_.size(), total / n);
    for (const auto& [name, ms] : gpu) std::printf("profile_gpu %-12s %8.3f\n", name.c_str(), ms / n);
    for (const auto& [name, ms] : host_) std::printf("profile_host %-12s %8.3f\n", name.c_str(), ms / n);
  }

 private:
  static void add(std::vector<std::pair<std::string, double>>& v, const char* name, double ms) {
    for (auto& e : v)
      if (e.first == name) {
        e.second += ms;
        return;
      }
    v.emplace_back(name, ms);
  }
  cudaStream_t stream_;
  bool on_ = false, active_ = false;
  std::vector<std::vector<std::pair<const char*, cudaEvent_t>>> steps_;
  std::vector<std::pair<std::string, double>> host_;
};

std::string config_fingerprint(const Options& o) {
  return "in=" + std::to_string(o.in) + " width=" + std::to_string(o.width) + " depth=" + std::to_string(o.depth) +
         " samples=" + std::to_string(o.samples) + " batch=" + std::to_string(o.batch);
}

// T: the compute type of activations and weights' copies; G: the gradients' (float, or bf16
// with --grad-dtype bf16: the weight-gradient GEMMs write them straight into the buckets).
template <class T, class G>
int run_typed(const Options& o, dw::Runtime& rt) {
  const dw::WorkerEnv& env = rt.env();
  dw::Communicator& comm = rt.comm();
  const int rank = env.rank, world = env.world_size;
  constexpr bool kLow = !std::is_same_v<T, float>;
  const bool fp16 = std::is_same_v<T, __half>;
  const cudaDataType_t ct = TypeOf<T>::value;

  cudaStream_t stream;
  DDPRUN_CUDA_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  comm.set_compute_stream(stream);
  cublasHandle_t blas;
  DDPRUN_CUBLAS_CHECK(cublasCreate(&blas));
  DDPRUN_CUBLAS_CHECK(cublasSetStream(blas, stream));

  const ex::MlpShape shape{o.in, o.width, o.depth, 1};
  const auto tensors = ex::mlp_param_tensors(shape);
  const size_t n = ex::mlp_num_params(shape);
  std::vector<int> dims{o.in, o.width};
  for (int i = 0; i < o.depth; ++i) dims.push_back(o.width);
  dims.push_back(1);
  const size_t L = dims.size() - 1;

  std::vector<float> host_params(n);
  ex::mlp_init(shape, o.seed, host_params.data());
  DeviceBuf<float> master(n), momentum(o.momentum != 0.f ? n : 0);
  DeviceBuf<G> grads(n);
  constexpr bool kLowGrads = !std::is_same_v<G, float>;
  static_assert(!kLowGrads || std::is_same_v<G, T>, "low-precision gradients are in the compute type");
  DeviceBuf<T> copy(kLow ? n : 0);

  dw::DistributedSampler sampler({static_cast<size_t>(o.samples), world, rank, true, o.seed, false});
  const int64_t steps_per_epoch = static_cast<int64_t>(sampler.num_batches(static_cast<size_t>(o.batch)));
  int64_t meta[4] = {0, 0, 0, 0};
  std::vector<float> host_mom(momentum.n, 0.f);
  // fp16 loss scaler state (scale, growth tracker), restored so a resumed run scales as the
  // uninterrupted one would.
  float scaler_scale = 65536.f;
  int scaler_growth = 0;
  if (!o.checkpoint_dir.empty()) {
    if (auto ck = dw::load_latest_checkpoint(o.checkpoint_dir)) {
      if (ck->section("config") != config_fingerprint(o)) throw dw::WorkerError("checkpoint is for another model");
      ck->get_into("params", host_params.data(), n * sizeof(float));
      if (momentum.n && ck->has("momentum")) ck->get_into("momentum", host_mom.data(), n * sizeof(float));
      meta[0] = static_cast<int64_t>(ck->step);
      meta[1] = static_cast<int64_t>(ck->get_u64("epoch"));
      meta[2] = static_cast<int64_t>(ck->get_u64("step_in_epoch"));
      meta[3] = static_cast<int64_t>(ck->get_u64("momentum_init"));
      scaler_scale = ck->get_value_or<float>("loss_scaler/scale", scaler_scale);
      scaler_growth = ck->get_value_or<int32_t>("loss_scaler/growth_tracker", scaler_growth);
      if (rank == 0) std::printf("[train] resumed from step %" PRId64 "\n", meta[0]);
    }
  }
  DDPRUN_CUDA_CHECK(cudaMemcpyAsync(master.p, host_params.data(), n * sizeof(float), cudaMemcpyHostToDevice, stream));
  if (momentum.n)
    DDPRUN_CUDA_CHECK(cudaMemcpyAsync(momentum.p, host_mom.data(), n * sizeof(float), cudaMemcpyHostToDevice, stream));
  DeviceBuf<int64_t> dmeta(4);
  DDPRUN_CUDA_CHECK(cudaMemcpyAsync(dmeta.p, meta, sizeof meta, cudaMemcpyHostToDevice, stream));
  comm.broadcast(master.p, n * sizeof(float), 0);
  if (momentum.n) comm.broadcast(momentum.p, n * sizeof(float), 0);
  comm.broadcast(dmeta.p, sizeof meta, 0);
  DDPRUN_CUDA_CHECK(cudaMemcpyAsync(meta, dmeta.p, sizeof meta, cudaMemcpyDeviceToHost, stream));
  DDPRUN_CUDA_CHECK(cudaStreamSynchronize(stream));
  if (kLow) cast_kernel<T><<<blocks_for(n, 256), 256, 0, stream>>>(master.p, copy.p, n);
  // Rank 0 writes checkpoints in the background (the loop does not wait for the disk).
  std::optional<dw::CheckpointWriter> writer;
  if (rank == 0 && !o.checkpoint_dir.empty()) writer.emplace(o.checkpoint_dir, o.keep_checkpoints);
  int64_t step = meta[0], start_epoch = meta[1], start_in_epoch = meta[2];
  bool momentum_init = meta[3] != 0;
  if (start_in_epoch >= steps_per_epoch) { ++start_epoch; start_in_epoch = 0; }

  const T* W[64];
  const T* Bv[64];
  DDPRUN_ENFORCE(2 * L <= 64, "depth too large for this example");
  for (size_t l = 0; l < L; ++l) {
    const T* base = kLow ? copy.p : reinterpret_cast<const T*>(master.p);
    W[l] = base + tensors[2 * l].offset;
    Bv[l] = base + tensors[2 * l + 1].offset;
  }
  const int B = o.batch;
  std::vector<DeviceBuf<T>> acts(L + 1);
  for (size_t l = 0; l <= L; ++l) acts[l].resize(static_cast<size_t>(B) * dims[l]);
  DeviceBuf<T> dz(static_cast<size_t>(B) * o.width), dprev(static_cast<size_t>(B) * o.width);
  DeviceBuf<float> xin(static_cast<size_t>(B) * o.in), yin(static_cast<size_t>(B)), dloss(1), dscale(1);
  DeviceBuf<int> dflag(1), dgood(1), dskipped(1);
  DeviceBuf<T> ones(static_cast<size_t>(B));  // the bias gradients' GEMV operand
  fill_kernel<T><<<blocks_for(ones.n, 256), 256, 0, stream>>>(ones.p, ones.n, 1.f);
  DDPRUN_CUDA_CHECK(cudaMemcpyAsync(dscale.p, &scaler_scale, sizeof(float), cudaMemcpyHostToDevice, stream));
  DDPRUN_CUDA_CHECK(cudaMemsetAsync(dflag.p, 0, sizeof(int), stream));
  DDPRUN_CUDA_CHECK(cudaMemcpyAsync(dgood.p, &scaler_growth, sizeof(int), cudaMemcpyHostToDevice, stream));
  DDPRUN_CUDA_CHECK(cudaMemsetAsync(dskipped.p, 0, sizeof(int), stream));
  // Two pinned staging buffers for the batch, so filling step k+1's never waits for step k.
  float* hbuf[2] = {nullptr, nullptr};
  cudaEvent_t hbuf_free[2];
  for (int k = 0; k < 2; ++k) {
    DDPRUN_CUDA_CHECK(cudaMallocHost(&hbuf[k], (static_cast<size_t>(B) * (o.in + 1)) * sizeof(float)));
    DDPRUN_CUDA_CHECK(cudaEventCreateWithFlags(&hbuf_free[k], cudaEventDisableTiming));
    DDPRUN_CUDA_CHECK(cudaEventRecord(hbuf_free[k], stream));
  }

  std::vector<dw::GradView> views;
  for (const auto& t : tensors) views.push_back({grads.p + t.offset, t.count});
  dw::ReducerOptions ro;
  ro.average = false;  // summed: sgd_kernel divides by the world size
  ro.overlap = !o.no_overlap;
  ro.force_collective = o.force_collective;
  dw::Reducer reducer(comm, views, kLowGrads ? dw::DType::BF16 : dw::DType::F32, ro);
  if (rank == 0)
    std::printf("[train] world=%d backend=%s device=cuda:%d precision=%s params=%zu width=%d depth=%d batch/rank=%d "
                "steps/epoch=%" PRId64 " buckets=%zu grads=%s\n",
                world, comm.backend(), rt.cuda_device(), o.precision.c_str(), n, o.width, o.depth, B, steps_per_epoch,
                reducer.buckets().size(), kLowGrads ? "bf16" : "fp32");

  const float one = 1.f, zero = 0.f;
  const cublasComputeType_t compute = CUBLAS_COMPUTE_32F;
  auto gemm = [&](cublasOperation_t ta, cublasOperation_t tb, int m, int nn, int k, const void* A, cudaDataType_t at,
                  int lda, const void* Bm, cudaDataType_t bt, int ldb, void* C, cudaDataType_t cty, int ldc) {
    DDPRUN_CUBLAS_CHECK(cublasGemmEx(blas, ta, tb, m, nn, k, &one, A, at, lda, Bm, bt, ldb, &zero, C, cty, ldc,
                                     compute, CUBLAS_GEMM_DEFAULT));
  };

  using Clock = std::chrono::steady_clock;
  cudaEvent_t t_start, t_end;
  DDPRUN_CUDA_CHECK(cudaEventCreate(&t_start));
  DDPRUN_CUDA_CHECK(cudaEventCreate(&t_end));
  int64_t run_steps = 0, timed_steps = 0;
  bool stop = false;
  PhaseProfile prof(stream);
  auto ms_since = [](Clock::time_point t) { return std::chrono::duration<double, std::milli>(Clock::now() - t).count(); };
  auto epoch_t0 = Clock::now();
  bool stopped_for_preemption = false;
  // Rank 0's checkpoint after batch `s` of `epoch` (global step `step`): copied off the GPU
  // here, written by the background writer.
  auto save = [&](int64_t epoch, int64_t s) {
    DDPRUN_CUDA_CHECK(cudaMemcpyAsync(host_params.data(), master.p, n * sizeof(float), cudaMemcpyDeviceToHost, stream));
    if (momentum.n)
      DDPRUN_CUDA_CHECK(cudaMemcpyAsync(host_mom.data(), momentum.p, n * sizeof(float), cudaMemcpyDeviceToHost, stream));
    if (fp16) {
      DDPRUN_CUDA_CHECK(cudaMemcpyAsync(&scaler_scale, dscale.p, sizeof(float), cudaMemcpyDeviceToHost, stream));
      DDPRUN_CUDA_CHECK(cudaMemcpyAsync(&scaler_growth, dgood.p, sizeof(int), cudaMemcpyDeviceToHost, stream));
    }
    DDPRUN_CUDA_CHECK(cudaStreamSynchronize(stream));
    dw::Checkpoint ck;
    ck.step = static_cast<uint64_t>(step);
    ck.put_vector("params", host_params);
    if (momentum.n) ck.put_vector("momentum", host_mom);
    ck.put_u64("epoch", static_cast<uint64_t>(epoch));
    ck.put_u64("step_in_epoch", static_cast<uint64_t>(s + 1));
    ck.put_u64("momentum_init", 1);
    ck.put_u64("world_size", static_cast<uint64_t>(world));
    ck.put_u64("rng_state", o.seed);
    const std::string cfg = config_fingerprint(o);
    ck.put("config", cfg.data(), cfg.size());
    if (fp16) {
      ck.put_value<float>("loss_scaler/scale", scaler_scale);
      ck.put_value<int32_t>("loss_scaler/growth_tracker", scaler_growth);
    }
    writer->save(std::move(ck));
  };
  for (int64_t epoch = start_epoch; epoch < o.epochs && !stop; ++epoch) {
    sampler.set_epoch(static_cast<uint64_t>(epoch));
    epoch_t0 = Clock::now();
    int64_t epoch_samples = 0;
    for (int64_t s = (epoch == start_epoch ? start_in_epoch : 0); s < steps_per_epoch; ++s) {
      if (o.max_steps > 0 && step >= o.max_steps) { stop = true; break; }
      maybe_inject_fault(o, env, step);
      if (run_steps == o.warmup_steps) DDPRUN_CUDA_CHECK(cudaEventRecord(t_start, stream));
      const auto host_t0 = Clock::now();
      prof.begin_step(run_steps >= o.warmup_steps);
      const auto idx = sampler.batch(static_cast<size_t>(s), static_cast<size_t>(B));
      const int b = static_cast<int>(idx.size());
      const int slot = static_cast<int>(run_steps & 1);
      float* hx = hbuf[slot];
      float* hy = hx + static_cast<size_t>(B) * o.in;
      DDPRUN_CUDA_CHECK(cudaEventSynchronize(hbuf_free[slot]));  // its copy two steps ago is done
      prof.host("wait_slot", ms_since(host_t0));
      for (int i = 0; i < b; ++i) make_sample(o.seed, static_cast<int64_t>(idx[i]), o.in, hx + static_cast<size_t>(i) * o.in, hy + i);
      DDPRUN_CUDA_CHECK(cudaMemcpyAsync(xin.p, hx, static_cast<size_t>(b) * o.in * sizeof(float),
                                        cudaMemcpyHostToDevice, stream));
      DDPRUN_CUDA_CHECK(cudaMemcpyAsync(yin.p, hy, static_cast<size_t>(b) * sizeof(float), cudaMemcpyHostToDevice, stream));
      DDPRUN_CUDA_CHECK(cudaEventRecord(hbuf_free[slot], stream));
      x_to_t_kernel<T><<<blocks_for(static_cast<size_t>(b) * o.in, 256), 256, 0, stream>>>(xin.p, acts[0].p, static_cast<size_t>(b) * o.in);
      prof.mark("input");
      // forward
      for (size_t l = 0; l < L; ++l) {
        gemm(CUBLAS_OP_T, CUBLAS_OP_N, dims[l + 1], b, dims[l], W[l], ct, dims[l], acts[l].p, ct, dims[l], acts[l + 1].p, ct,
             dims[l + 1]);
        prof.mark("fwd_gemm");
        bias_act_kernel<T><<<bias_act_grid(b, dims[l + 1]), 256, 0, stream>>>(
            acts[l + 1].p, Bv[l], b, dims[l + 1], l + 1 < L, fp16 ? dflag.p : nullptr);
        prof.mark("bias_act");
      }
      reducer.prepare_for_backward();
      mse_grad_kernel<T><<<1, 256, 0, stream>>>(acts[L].p, yin.p, dz.p, b, fp16 ? dscale.p : nullptr, dloss.p,
                                            fp16 ? dflag.p : nullptr);
      prof.mark("loss");
      // backward
      for (size_t l = L; l-- > 0;) {
        const int in = dims[l], out = dims[l + 1];
        G* dW = grads.p + tensors[2 * l].offset;
        G* db = grads.p + tensors[2 * l + 1].offset;
        gemm(CUBLAS_OP_N, CUBLAS_OP_T, in, out, b, acts[l].p, ct, in, dz.p, ct, out, dW, TypeOf<G>::value, in);
        prof.mark("wgrad");
        // db = dz^T 1 (the batch summed per column) as a GEMV in cuBLAS: it reads dz at full
        // bandwidth, and is deterministic, unlike atomics.
        gemm(CUBLAS_OP_N, CUBLAS_OP_N, out, 1, b, dz.p, ct, out, ones.p, ct, b, db, TypeOf<G>::value, out);
        prof.mark("bias_grad");
        reducer.mark_ready(2 * l + 1);
        reducer.mark_ready(2 * l);
        if (l == 0) break;
        gemm(CUBLAS_OP_N, CUBLAS_OP_N, in, b, out, W[l], ct, in, dz.p, ct, out, dprev.p, ct, in);
        prof.mark("dgrad");
        relu_bwd_kernel<T><<<pack_blocks(static_cast<size_t>(b) * in), 256, 0, stream>>>(dprev.p, acts[l].p,
                                                                                          static_cast<size_t>(b) * in,
                                                                                          fp16 ? dflag.p : nullptr);
        prof.mark("relu_bwd");
        std::swap(dz.p, dprev.p);
      }
      const auto fin_t0 = Clock::now();
      reducer.finalize();
      prof.host("finalize", ms_since(fin_t0));
      prof.mark("finalize");
      if constexpr (!kLowGrads) {
        if (fp16) {
          // dflag was raised (or not) by the forward and backward kernels: see overflow above.
          if (world > 1) {
            comm.comm_waits_for_compute();
            comm.allreduce(dflag.p, 1, dw::DType::I32, dw::ReduceOp::Max);
            comm.compute_waits_for_comm();
          }
        }
      }
      sgd_kernel<T, G><<<pack_blocks(n), 256, 0, stream>>>(
          master.p, grads.p, momentum.n ? momentum.p : nullptr, kLow ? copy.p : nullptr, n, o.lr, o.momentum,
          !momentum_init, fp16 ? dscale.p : nullptr, fp16 ? dflag.p : nullptr, 1.f / static_cast<float>(world));
      prof.mark("sgd");
      if (fp16) scale_update_kernel<<<1, 1, 0, stream>>>(dscale.p, dgood.p, dflag.p, dskipped.p);
      prof.host("issue_total", ms_since(host_t0));
      momentum_init = true;
      ++step;
      ++run_steps;
      if (run_steps > o.warmup_steps) ++timed_steps;
      epoch_samples += static_cast<int64_t>(b) * world;
      const bool epoch_end = s + 1 == steps_per_epoch;
      if (rank == 0 && o.log_every > 0 && step % o.log_every == 0) {
        float loss = 0;
        DDPRUN_CUDA_CHECK(cudaMemcpyAsync(&loss, dloss.p, sizeof loss, cudaMemcpyDeviceToHost, stream));
        DDPRUN_CUDA_CHECK(cudaStreamSynchronize(stream));
        std::printf("[train] epoch %" PRId64 " step %" PRId64 " loss %.6f\n", epoch, step, loss);
      }
      const bool ckpt_now = !o.checkpoint_dir.empty() && (o.checkpoint_every > 0 ? step % o.checkpoint_every == 0 : epoch_end);
      if (ckpt_now && rank == 0) save(epoch, s);
      // Every --stop-check-every steps, every rank: stop together when any rank was asked to
      // (a preemption; stop.h). The vote is a 4-byte NCCL all-reduce the host waits for.
      maybe_wait_for_signal(o, env, step);
      if (o.stop_check_every > 0 && step % o.stop_check_every == 0 && rt.agree_stop()) {
        const int sig = dw::stop_signal();
        std::printf("[train] rank %d: stopping after step %" PRId64 " for a preemption (%s)\n", rank, step,
                    sig == SIGUSR1 ? "SIGUSR1 here" : sig == SIGTERM ? "SIGTERM here" : "asked by another rank");
        if (rank == 0 && !o.checkpoint_dir.empty() && !ckpt_now) save(epoch, s);
        stopped_for_preemption = true;
        stop = true;
        break;
      }
    }
    if (rank == 0) {
      float loss = 0;
      DDPRUN_CUDA_CHECK(cudaMemcpyAsync(&loss, dloss.p, sizeof loss, cudaMemcpyDeviceToHost, stream));
      DDPRUN_CUDA_CHECK(cudaStreamSynchronize(stream));
      const double sec = std::chrono::duration<double>(Clock::now() - epoch_t0).count();
      std::printf("[train] epoch %" PRId64 " done: step %" PRId64 " loss %.6f samples/s %.0f\n", epoch, step, loss,
                  static_cast<double>(epoch_samples) / sec);
    }
  }
  DDPRUN_CUDA_CHECK(cudaEventRecord(t_end, stream));
  DDPRUN_CUDA_CHECK(cudaStreamSynchronize(stream));
  if (writer) writer->close();  // the last checkpoint is on disk before the exit (throws its error)
  comm.barrier();
  if (stopped_for_preemption) return finish_preempted(o, rank, step);
  float total_ms = 0;
  if (timed_steps > 0) DDPRUN_CUDA_CHECK(cudaEventElapsedTime(&total_ms, t_start, t_end));
  DDPRUN_CUDA_CHECK(cudaMemcpy(host_params.data(), master.p, n * sizeof(float), cudaMemcpyDeviceToHost));
  int skipped = 0;
  DDPRUN_CUDA_CHECK(cudaMemcpy(&skipped, dskipped.p, sizeof(int), cudaMemcpyDeviceToHost));
  if (rank == 0) prof.report();
  if (rank == 0) {
    if (timed_steps > 0) std::printf("avg_step_ms=%.3f steps=%" PRId64 "\n", total_ms / static_cast<double>(timed_steps), timed_steps);
    if (fp16) std::printf("fp16_skipped_steps=%d\n", skipped);
    std::printf("final_step=%" PRId64 "\nfinal_param_checksum=%016" PRIx64 "\n", step,
                dw::fnv1a64(host_params.data(), n * sizeof(float)));
    std::fflush(stdout);
  }
  for (int k = 0; k < 2; ++k) {
    cudaFreeHost(hbuf[k]);
    cudaEventDestroy(hbuf_free[k]);
  }
  cudaEventDestroy(t_start);
  cudaEventDestroy(t_end);
  cublasDestroy(blas);
  cudaStreamDestroy(stream);
  return dw::kExitOk;
}

}  // namespace

int run_gpu(const Options& o, dw::Runtime& rt) {
  if (o.grad_dtype == "bf16") {
    if (o.precision != "bf16")
      throw dw::WorkerError("--grad-dtype bf16 needs --precision bf16 (fp16 keeps fp32 gradients for its loss scaler)");
    return run_typed<__nv_bfloat16, __nv_bfloat16>(o, rt);
  }
  if (o.precision == "bf16") return run_typed<__nv_bfloat16, float>(o, rt);
  if (o.precision == "fp16") return run_typed<__half, float>(o, rt);
  return run_typed<float, float>(o, rt);
}

}  // namespace train
