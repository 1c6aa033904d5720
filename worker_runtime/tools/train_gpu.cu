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
#include <memory>
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
#include "train_gpu_kernels.cuh"
#include "train_gpu_support.cuh"

namespace dw = ddprun::worker;
namespace ex = ddprun::example;

namespace train {
namespace {

// One rank's GPU training run. T: the compute type of activations and weights' copies; G: the
// gradients' (float, or bf16 with --grad-dtype bf16: the weight-gradient GEMMs write them
// straight into the buckets).
template <class T, class G>
class GpuRun {
 public:
  GpuRun(const Options& o, dw::Runtime& rt);
  ~GpuRun();
  GpuRun(const GpuRun&) = delete;
  GpuRun& operator=(const GpuRun&) = delete;
  int run();

 private:
  using Clock = std::chrono::steady_clock;
  static constexpr bool kLow = !std::is_same_v<T, float>;
  static constexpr bool kLowGrads = !std::is_same_v<G, float>;
  static_assert(!kLowGrads || std::is_same_v<G, T>, "low-precision gradients are in the compute type");
  static constexpr bool kFp16 = std::is_same_v<T, __half>;

  void init_or_resume();
  void allocate();
  void make_reducer();
  void gemm(cublasOperation_t ta, cublasOperation_t tb, int m, int nn, int k, const void* A, cudaDataType_t at, int lda,
            const void* Bm, cudaDataType_t bt, int ldb, void* C, cudaDataType_t cty, int ldc);
  int load_batch(int64_t s, Clock::time_point host_t0);  // -> rows in the batch
  void forward(int b);
  void backward(int b);
  void step_parameters();
  bool run_epoch(int64_t epoch);  // false: stop (max steps or preemption)
  // Rank 0: the last step's loss (copied off the GPU: the host waits for the stream); with
  // epoch_t0, the epoch's line with its samples/s up to now.
  void print_loss(int64_t epoch, const Clock::time_point* epoch_t0 = nullptr, int64_t epoch_samples = 0);
  void save(int64_t epoch, int64_t s);
  bool stop_agreed(int64_t epoch, int64_t s, bool ckpt_now);
  int finish();
  static double ms_since(Clock::time_point t) {
    return std::chrono::duration<double, std::milli>(Clock::now() - t).count();
  }

  const Options& o_;
  dw::Runtime& rt_;
  const dw::WorkerEnv& env_;
  dw::Communicator& comm_;
  const int rank_, world_;
  const cudaDataType_t ct_ = TypeOf<T>::value;
  cudaStream_t stream_ = nullptr;
  cublasHandle_t blas_ = nullptr;

  const ex::MlpShape shape_;
  const std::vector<ex::ParamTensor> tensors_;
  const size_t n_;
  std::vector<int> dims_;
  size_t L_ = 0;
  dw::DistributedSampler sampler_;
  int64_t steps_per_epoch_ = 0;

  std::vector<float> host_params_, host_mom_;
  DeviceBuf<float> master_, momentum_;
  DeviceBuf<G> grads_;
  DeviceBuf<T> copy_;
  // fp16 loss scaler state (scale, growth tracker), restored so a resumed run scales as the
  // uninterrupted one would.
  float scaler_scale_ = 65536.f;
  int scaler_growth_ = 0;
  std::optional<dw::CheckpointWriter> writer_;
  int64_t step_ = 0, start_epoch_ = 0, start_in_epoch_ = 0;
  bool momentum_init_ = false;

  const T* W_[64];
  const T* Bv_[64];
  std::vector<DeviceBuf<T>> acts_;
  DeviceBuf<T> dz_, dprev_, ones_;  // ones: the bias gradients' GEMV operand
  DeviceBuf<float> xin_, yin_, dloss_, dscale_;
  DeviceBuf<int> dflag_, dgood_, dskipped_;
  // Two pinned staging buffers for the batch, so filling step k+1's never waits for step k.
  float* hbuf_[2] = {nullptr, nullptr};
  cudaEvent_t hbuf_free_[2] = {nullptr, nullptr};
  std::unique_ptr<dw::Reducer> reducer_;

  cudaEvent_t t_start_ = nullptr, t_end_ = nullptr;
  std::optional<PhaseProfile> prof_;
  int64_t run_steps_ = 0, timed_steps_ = 0;
  bool stopped_for_preemption_ = false;
};

template <class T, class G>
GpuRun<T, G>::GpuRun(const Options& o, dw::Runtime& rt)
    : o_(o),
      rt_(rt),
      env_(rt.env()),
      comm_(rt.comm()),
      rank_(env_.rank),
      world_(env_.world_size),
      shape_{o.in, o.width, o.depth, 1},
      tensors_(ex::mlp_param_tensors(shape_)),
      n_(ex::mlp_num_params(shape_)),
      sampler_({static_cast<size_t>(o.samples), world_, rank_, true, o.seed, false}) {
  DDPRUN_CUDA_CHECK(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
  comm_.set_compute_stream(stream_);
  DDPRUN_CUBLAS_CHECK(cublasCreate(&blas_));
  DDPRUN_CUBLAS_CHECK(cublasSetStream(blas_, stream_));
  dims_ = {o.in, o.width};
  for (int i = 0; i < o.depth; ++i) dims_.push_back(o.width);
  dims_.push_back(1);
  L_ = dims_.size() - 1;
}

template <class T, class G>
GpuRun<T, G>::~GpuRun() {
  for (int k = 0; k < 2; ++k) {
    if (hbuf_[k]) cudaFreeHost(hbuf_[k]);
    if (hbuf_free_[k]) cudaEventDestroy(hbuf_free_[k]);
  }
  if (t_start_) cudaEventDestroy(t_start_);
  if (t_end_) cudaEventDestroy(t_end_);
  if (blas_) cublasDestroy(blas_);
  if (stream_) cudaStreamDestroy(stream_);
}

// The initial state (rank 0's, or its checkpoint's) on every rank's GPU, and where to start.
template <class T, class G>
void GpuRun<T, G>::init_or_resume() {
  host_params_.resize(n_);
  ex::mlp_init(shape_, o_.seed, host_params_.data());
  master_.resize(n_);
  momentum_.resize(o_.momentum != 0.f ? n_ : 0);
  grads_.resize(n_);
  copy_.resize(kLow ? n_ : 0);
  steps_per_epoch_ = static_cast<int64_t>(sampler_.num_batches(static_cast<size_t>(o_.batch)));
  int64_t meta[4] = {0, 0, 0, 0};
  host_mom_.assign(momentum_.n, 0.f);
  if (!o_.checkpoint_dir.empty()) {
    if (auto ck = dw::load_agreed_checkpoint(o_.checkpoint_dir, comm_)) {
      if (ck->section("config") != config_fingerprint(o_)) throw dw::WorkerError("checkpoint is for another model");
      ck->get_into("params", host_params_.data(), n_ * sizeof(float));
      if (momentum_.n && ck->has("momentum")) ck->get_into("momentum", host_mom_.data(), n_ * sizeof(float));
      meta[0] = static_cast<int64_t>(ck->step);
      meta[1] = static_cast<int64_t>(ck->get_u64("epoch"));
      meta[2] = static_cast<int64_t>(ck->get_u64("step_in_epoch"));
      meta[3] = static_cast<int64_t>(ck->get_u64("momentum_init"));
      scaler_scale_ = ck->get_value_or<float>("loss_scaler/scale", scaler_scale_);
      scaler_growth_ = ck->get_value_or<int32_t>("loss_scaler/growth_tracker", scaler_growth_);
      if (rank_ == 0) std::printf("[train] resumed from step %" PRId64 "\n", meta[0]);
    }
  }
  DDPRUN_CUDA_CHECK(
      cudaMemcpyAsync(master_.p, host_params_.data(), n_ * sizeof(float), cudaMemcpyHostToDevice, stream_));
  if (momentum_.n)
    DDPRUN_CUDA_CHECK(
        cudaMemcpyAsync(momentum_.p, host_mom_.data(), n_ * sizeof(float), cudaMemcpyHostToDevice, stream_));
  DeviceBuf<int64_t> dmeta(4);
  DDPRUN_CUDA_CHECK(cudaMemcpyAsync(dmeta.p, meta, sizeof meta, cudaMemcpyHostToDevice, stream_));
  comm_.broadcast(master_.p, n_ * sizeof(float), 0);
  if (momentum_.n) comm_.broadcast(momentum_.p, n_ * sizeof(float), 0);
  comm_.broadcast(dmeta.p, sizeof meta, 0);
  DDPRUN_CUDA_CHECK(cudaMemcpyAsync(meta, dmeta.p, sizeof meta, cudaMemcpyDeviceToHost, stream_));
  DDPRUN_CUDA_CHECK(cudaStreamSynchronize(stream_));
  if (kLow) cast_kernel<T><<<blocks_for(n_, 256), 256, 0, stream_>>>(master_.p, copy_.p, n_);
  // Rank 0 writes checkpoints in the background (the loop does not wait for the disk).
  if (rank_ == 0 && !o_.checkpoint_dir.empty()) writer_.emplace(o_.checkpoint_dir, o_.keep_checkpoints);
  step_ = meta[0];
  start_epoch_ = meta[1];
  start_in_epoch_ = meta[2];
  momentum_init_ = meta[3] != 0;
  if (start_in_epoch_ >= steps_per_epoch_) {
    ++start_epoch_;
    start_in_epoch_ = 0;
  }
}

// Weights' views, activations, the loss scaler's device state, the staging buffers.
template <class T, class G>
void GpuRun<T, G>::allocate() {
  DDPRUN_ENFORCE(2 * L_ <= 64, "depth too large for train's GPU path");
  for (size_t l = 0; l < L_; ++l) {
    const T* base = kLow ? copy_.p : reinterpret_cast<const T*>(master_.p);
    W_[l] = base + tensors_[2 * l].offset;
    Bv_[l] = base + tensors_[2 * l + 1].offset;
  }
  const auto B = static_cast<size_t>(o_.batch);
  acts_ = std::vector<DeviceBuf<T>>(L_ + 1);
  for (size_t l = 0; l <= L_; ++l) acts_[l].resize(B * dims_[l]);
  dz_.resize(B * o_.width);
  dprev_.resize(B * o_.width);
  xin_.resize(B * o_.in);
  yin_.resize(B);
  dloss_.resize(1);
  dscale_.resize(1);
  dflag_.resize(1);
  dgood_.resize(1);
  dskipped_.resize(1);
  ones_.resize(B);
  fill_kernel<T><<<blocks_for(ones_.n, 256), 256, 0, stream_>>>(ones_.p, ones_.n, 1.f);
  DDPRUN_CUDA_CHECK(cudaMemcpyAsync(dscale_.p, &scaler_scale_, sizeof(float), cudaMemcpyHostToDevice, stream_));
  DDPRUN_CUDA_CHECK(cudaMemsetAsync(dflag_.p, 0, sizeof(int), stream_));
  DDPRUN_CUDA_CHECK(cudaMemcpyAsync(dgood_.p, &scaler_growth_, sizeof(int), cudaMemcpyHostToDevice, stream_));
  DDPRUN_CUDA_CHECK(cudaMemsetAsync(dskipped_.p, 0, sizeof(int), stream_));
  for (int k = 0; k < 2; ++k) {
    DDPRUN_CUDA_CHECK(cudaMallocHost(&hbuf_[k], (B * (o_.in + 1)) * sizeof(float)));
    DDPRUN_CUDA_CHECK(cudaEventCreateWithFlags(&hbuf_free_[k], cudaEventDisableTiming));
    DDPRUN_CUDA_CHECK(cudaEventRecord(hbuf_free_[k], stream_));
  }
}

template <class T, class G>
void GpuRun<T, G>::make_reducer() {
  std::vector<dw::GradView> views;
  for (const auto& t : tensors_) views.push_back({grads_.p + t.offset, t.count});
  dw::ReducerOptions ro;
  ro.average = false;  // summed: sgd_kernel divides by the world size
  ro.overlap = !o_.no_overlap;
  ro.force_collective = o_.force_collective;
  reducer_ = std::make_unique<dw::Reducer>(comm_, views, kLowGrads ? dw::DType::BF16 : dw::DType::F32, ro);
  if (rank_ == 0)
    std::printf("[train] world=%d backend=%s device=cuda:%d precision=%s params=%zu width=%d depth=%d batch/rank=%d "
                "steps/epoch=%" PRId64 " buckets=%zu grads=%s\n",
                world_, comm_.backend(), rt_.cuda_device(), o_.precision.c_str(), n_, o_.width, o_.depth, o_.batch,
                steps_per_epoch_, reducer_->buckets().size(), kLowGrads ? "bf16" : "fp32");
}

template <class T, class G>
void GpuRun<T, G>::gemm(cublasOperation_t ta, cublasOperation_t tb, int m, int nn, int k, const void* A,
                        cudaDataType_t at, int lda, const void* Bm, cudaDataType_t bt, int ldb, void* C,
                        cudaDataType_t cty, int ldc) {
  const float one = 1.f, zero = 0.f;
  DDPRUN_CUBLAS_CHECK(cublasGemmEx(blas_, ta, tb, m, nn, k, &one, A, at, lda, Bm, bt, ldb, &zero, C, cty, ldc,
                                   CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
}

// Batch `s` of the current epoch into a pinned staging slot, then onto the GPU as acts_[0].
template <class T, class G>
int GpuRun<T, G>::load_batch(int64_t s, Clock::time_point host_t0) {
  const auto idx = sampler_.batch(static_cast<size_t>(s), static_cast<size_t>(o_.batch));
  const int b = static_cast<int>(idx.size());
  const int slot = static_cast<int>(run_steps_ & 1);
  float* hx = hbuf_[slot];
  float* hy = hx + static_cast<size_t>(o_.batch) * o_.in;
  DDPRUN_CUDA_CHECK(cudaEventSynchronize(hbuf_free_[slot]));  // its copy two steps ago is done
  prof_->host("wait_slot", ms_since(host_t0));
  for (int i = 0; i < b; ++i)
    make_sample(o_.seed, static_cast<int64_t>(idx[i]), o_.in, hx + static_cast<size_t>(i) * o_.in, hy + i);
  DDPRUN_CUDA_CHECK(
      cudaMemcpyAsync(xin_.p, hx, static_cast<size_t>(b) * o_.in * sizeof(float), cudaMemcpyHostToDevice, stream_));
  DDPRUN_CUDA_CHECK(
      cudaMemcpyAsync(yin_.p, hy, static_cast<size_t>(b) * sizeof(float), cudaMemcpyHostToDevice, stream_));
  DDPRUN_CUDA_CHECK(cudaEventRecord(hbuf_free_[slot], stream_));
  x_to_t_kernel<T>
      <<<blocks_for(static_cast<size_t>(b) * o_.in, 256), 256, 0, stream_>>>(xin_.p, acts_[0].p,
                                                                             static_cast<size_t>(b) * o_.in);
  prof_->mark("input");
  return b;
}

template <class T, class G>
void GpuRun<T, G>::forward(int b) {
  for (size_t l = 0; l < L_; ++l) {
    gemm(CUBLAS_OP_T, CUBLAS_OP_N, dims_[l + 1], b, dims_[l], W_[l], ct_, dims_[l], acts_[l].p, ct_, dims_[l],
         acts_[l + 1].p, ct_, dims_[l + 1]);
    prof_->mark("fwd_gemm");
    bias_act_kernel<T><<<bias_act_grid(b, dims_[l + 1]), 256, 0, stream_>>>(acts_[l + 1].p, Bv_[l], b, dims_[l + 1],
                                                                            l + 1 < L_, kFp16 ? dflag_.p : nullptr);
    prof_->mark("bias_act");
  }
}

// The loss gradient, then layer by layer down, each layer's gradients marked ready as soon as
// they are written (the Reducer's all-reduce of a bucket overlaps the layers below it).
template <class T, class G>
void GpuRun<T, G>::backward(int b) {
  reducer_->prepare_for_backward();
  mse_grad_kernel<T><<<1, 256, 0, stream_>>>(acts_[L_].p, yin_.p, dz_.p, b, kFp16 ? dscale_.p : nullptr, dloss_.p,
                                             kFp16 ? dflag_.p : nullptr);
  prof_->mark("loss");
  for (size_t l = L_; l-- > 0;) {
    const int in = dims_[l], out = dims_[l + 1];
    G* dW = grads_.p + tensors_[2 * l].offset;
    G* db = grads_.p + tensors_[2 * l + 1].offset;
    gemm(CUBLAS_OP_N, CUBLAS_OP_T, in, out, b, acts_[l].p, ct_, in, dz_.p, ct_, out, dW, TypeOf<G>::value, in);
    prof_->mark("wgrad");
    // db = dz^T 1 (the batch summed per column) as a GEMV in cuBLAS: it reads dz at full
    // bandwidth, and is deterministic, unlike atomics.
    gemm(CUBLAS_OP_N, CUBLAS_OP_N, out, 1, b, dz_.p, ct_, out, ones_.p, ct_, b, db, TypeOf<G>::value, out);
    prof_->mark("bias_grad");
    reducer_->mark_ready(2 * l + 1);
    reducer_->mark_ready(2 * l);
    if (l == 0) break;
    gemm(CUBLAS_OP_N, CUBLAS_OP_N, in, b, out, W_[l], ct_, in, dz_.p, ct_, out, dprev_.p, ct_, in);
    prof_->mark("dgrad");
    relu_bwd_kernel<T><<<pack_blocks(static_cast<size_t>(b) * in), 256, 0, stream_>>>(dprev_.p, acts_[l].p,
                                                                                      static_cast<size_t>(b) * in,
                                                                                      kFp16 ? dflag_.p : nullptr);
    prof_->mark("relu_bwd");
    std::swap(dz_.p, dprev_.p);
  }
}

// finalize (the compute stream waits for the buckets), the fp16 overflow vote, SGD.
template <class T, class G>
void GpuRun<T, G>::step_parameters() {
  const auto fin_t0 = Clock::now();
  reducer_->finalize();
  prof_->host("finalize", ms_since(fin_t0));
  prof_->mark("finalize");
  if constexpr (!kLowGrads) {
    // dflag was raised (or not) by the forward and backward kernels: see overflow above.
    if (kFp16 && world_ > 1) {
      comm_.comm_waits_for_compute();
      comm_.allreduce(dflag_.p, 1, dw::DType::I32, dw::ReduceOp::Max);
      comm_.compute_waits_for_comm();
    }
  }
  sgd_kernel<T, G><<<pack_blocks(n_), 256, 0, stream_>>>(master_.p, grads_.p, momentum_.n ? momentum_.p : nullptr,
                                                         kLow ? copy_.p : nullptr, n_, o_.lr, o_.momentum,
                                                         !momentum_init_, kFp16 ? dscale_.p : nullptr,
                                                         kFp16 ? dflag_.p : nullptr, 1.f / static_cast<float>(world_));
  prof_->mark("sgd");
  if (kFp16) scale_update_kernel<<<1, 1, 0, stream_>>>(dscale_.p, dgood_.p, dflag_.p, dskipped_.p);
}

// Rank 0's checkpoint after batch `s` of `epoch` (global step step_): copied off the GPU here,
// written by the background writer.
template <class T, class G>
void GpuRun<T, G>::save(int64_t epoch, int64_t s) {
  DDPRUN_CUDA_CHECK(
      cudaMemcpyAsync(host_params_.data(), master_.p, n_ * sizeof(float), cudaMemcpyDeviceToHost, stream_));
  if (momentum_.n)
    DDPRUN_CUDA_CHECK(
        cudaMemcpyAsync(host_mom_.data(), momentum_.p, n_ * sizeof(float), cudaMemcpyDeviceToHost, stream_));
  if (kFp16) {
    DDPRUN_CUDA_CHECK(cudaMemcpyAsync(&scaler_scale_, dscale_.p, sizeof(float), cudaMemcpyDeviceToHost, stream_));
    DDPRUN_CUDA_CHECK(cudaMemcpyAsync(&scaler_growth_, dgood_.p, sizeof(int), cudaMemcpyDeviceToHost, stream_));
  }
  DDPRUN_CUDA_CHECK(cudaStreamSynchronize(stream_));
  dw::Checkpoint ck;
  ck.step = static_cast<uint64_t>(step_);
  ck.put_vector("params", host_params_);
  if (momentum_.n) ck.put_vector("momentum", host_mom_);
  ck.put_u64("epoch", static_cast<uint64_t>(epoch));
  ck.put_u64("step_in_epoch", static_cast<uint64_t>(s + 1));
  ck.put_u64("momentum_init", 1);
  ck.put_u64("world_size", static_cast<uint64_t>(world_));
  ck.put_u64("rng_state", o_.seed);
  const std::string cfg = config_fingerprint(o_);
  ck.put("config", cfg.data(), cfg.size());
  if (kFp16) {
    ck.put_value<float>("loss_scaler/scale", scaler_scale_);
    ck.put_value<int32_t>("loss_scaler/growth_tracker", scaler_growth_);
  }
  writer_->save(std::move(ck));
}

// Every --stop-check-every steps, every rank: stop together when any rank was asked to (a
// preemption; stop.h). The vote is a 4-byte NCCL all-reduce the host waits for.
template <class T, class G>
bool GpuRun<T, G>::stop_agreed(int64_t epoch, int64_t s, bool ckpt_now) {
  maybe_wait_for_signal(o_, env_, step_);
  if (!(o_.stop_check_every > 0 && step_ % o_.stop_check_every == 0 && rt_.agree_stop())) return false;
  const int sig = dw::stop_signal();
  std::printf("[train] rank %d: stopping after step %" PRId64 " for a preemption (%s)\n", rank_, step_,
              sig == SIGUSR1   ? "SIGUSR1 here"
              : sig == SIGTERM ? "SIGTERM here"
                               : "asked by another rank");
  if (rank_ == 0 && !o_.checkpoint_dir.empty() && !ckpt_now) save(epoch, s);
  stopped_for_preemption_ = true;
  return true;
}

template <class T, class G>
void GpuRun<T, G>::print_loss(int64_t epoch, const Clock::time_point* epoch_t0, int64_t epoch_samples) {
  float loss = 0;
  DDPRUN_CUDA_CHECK(cudaMemcpyAsync(&loss, dloss_.p, sizeof loss, cudaMemcpyDeviceToHost, stream_));
  DDPRUN_CUDA_CHECK(cudaStreamSynchronize(stream_));
  if (!epoch_t0) {
    std::printf("[train] epoch %" PRId64 " step %" PRId64 " loss %.6f\n", epoch, step_, loss);
    return;
  }
  const double sec = std::chrono::duration<double>(Clock::now() - *epoch_t0).count();
  std::printf("[train] epoch %" PRId64 " done: step %" PRId64 " loss %.6f samples/s %.0f\n", epoch, step_, loss,
              static_cast<double>(epoch_samples) / sec);
}

template <class T, class G>
bool GpuRun<T, G>::run_epoch(int64_t epoch) {
  sampler_.set_epoch(static_cast<uint64_t>(epoch));
  const auto epoch_t0 = Clock::now();
  int64_t epoch_samples = 0;
  bool go_on = true;
  for (int64_t s = (epoch == start_epoch_ ? start_in_epoch_ : 0); s < steps_per_epoch_; ++s) {
    if (o_.max_steps > 0 && step_ >= o_.max_steps) {
      go_on = false;
      break;
    }
    maybe_inject_fault(o_, env_, step_);
    if (run_steps_ == o_.warmup_steps) DDPRUN_CUDA_CHECK(cudaEventRecord(t_start_, stream_));
    const auto host_t0 = Clock::now();
    prof_->begin_step(run_steps_ >= o_.warmup_steps);
    const int b = load_batch(s, host_t0);
    forward(b);
    backward(b);
    step_parameters();
    prof_->host("issue_total", ms_since(host_t0));
    momentum_init_ = true;
    ++step_;
    ++run_steps_;
    if (run_steps_ > o_.warmup_steps) ++timed_steps_;
    epoch_samples += static_cast<int64_t>(b) * world_;
    const bool epoch_end = s + 1 == steps_per_epoch_;
    if (rank_ == 0 && o_.log_every > 0 && step_ % o_.log_every == 0) print_loss(epoch);
    const bool ckpt_now =
        !o_.checkpoint_dir.empty() && (o_.checkpoint_every > 0 ? step_ % o_.checkpoint_every == 0 : epoch_end);
    if (ckpt_now && rank_ == 0) save(epoch, s);
    if (stop_agreed(epoch, s, ckpt_now)) {
      go_on = false;
      break;
    }
  }
  if (rank_ == 0) print_loss(epoch, &epoch_t0, epoch_samples);
  return go_on;
}

template <class T, class G>
int GpuRun<T, G>::finish() {
  DDPRUN_CUDA_CHECK(cudaEventRecord(t_end_, stream_));
  DDPRUN_CUDA_CHECK(cudaStreamSynchronize(stream_));
  if (writer_) writer_->close();  // the last checkpoint is on disk before the exit (throws its error)
  comm_.barrier();
  if (stopped_for_preemption_) return finish_preempted(o_, rank_, step_);
  float total_ms = 0;
  if (timed_steps_ > 0) DDPRUN_CUDA_CHECK(cudaEventElapsedTime(&total_ms, t_start_, t_end_));
  DDPRUN_CUDA_CHECK(cudaMemcpy(host_params_.data(), master_.p, n_ * sizeof(float), cudaMemcpyDeviceToHost));
  int skipped = 0;
  DDPRUN_CUDA_CHECK(cudaMemcpy(&skipped, dskipped_.p, sizeof(int), cudaMemcpyDeviceToHost));
  if (rank_ == 0) prof_->report();
  if (rank_ == 0) {
    if (timed_steps_ > 0)
      std::printf("avg_step_ms=%.3f steps=%" PRId64 "\n", total_ms / static_cast<double>(timed_steps_), timed_steps_);
    if (kFp16) std::printf("fp16_skipped_steps=%d\n", skipped);
    std::printf("final_step=%" PRId64 "\nfinal_param_checksum=%016" PRIx64 "\n", step_,
                dw::fnv1a64(host_params_.data(), n_ * sizeof(float)));
    std::fflush(stdout);
  }
  return dw::kExitOk;
}

template <class T, class G>
int GpuRun<T, G>::run() {
  init_or_resume();
  allocate();
  make_reducer();
  DDPRUN_CUDA_CHECK(cudaEventCreate(&t_start_));
  DDPRUN_CUDA_CHECK(cudaEventCreate(&t_end_));
  prof_.emplace(stream_);
  for (int64_t epoch = start_epoch_; epoch < o_.epochs; ++epoch)
    if (!run_epoch(epoch)) break;
  return finish();
}

}  // namespace

int run_gpu(const Options& o, dw::Runtime& rt) {
  if (o.grad_dtype == "bf16") {
    if (o.precision != "bf16")
      throw dw::WorkerError("--grad-dtype bf16 needs --precision bf16 (fp16 keeps fp32 gradients for its loss scaler)");
    return GpuRun<__nv_bfloat16, __nv_bfloat16>(o, rt).run();
  }
  if (o.precision == "bf16") return GpuRun<__nv_bfloat16, float>(o, rt).run();
  if (o.precision == "fp16") return GpuRun<__half, float>(o, rt).run();
  return GpuRun<float, float>(o, rt).run();
}

}  // namespace train
