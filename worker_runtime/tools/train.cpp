// `train`: the harness the worker tests and benchmarks run. A data-parallel MLP in C++ (by
// default Linear 10->50, ReLU, Linear 50->1, MSE, SGD 0.01, 100 samples, batch 20 per rank, 5
// epochs), with flags for bigger MLPs, checkpoints, fault injection and timing; tests and
// benchmark scripts parse its output, so its lines keep their format. CPU path here (Gloo);
// GPU path in train_gpu.cu (NCCL + cuBLAS). A short program to read is examples/ddp_minimal.cpp.
//   ddprun --nproc_per_node=2 train
//   ddprun --nproc_per_node=2 --max_restarts=3 train --checkpoint-dir /tmp/ck --fail-at-step 7,13
// SIGUSR1 or SIGTERM (Slurm's warning, a preemption, ddprun forwarding one) stops every rank
// after the same step (stop.h's agreement, once per step), with a checkpoint of that step when
// --checkpoint-dir is given, and exit code kExitPreempted (99); rerun to resume.
#include <signal.h>
#include <sys/resource.h>
#include <time.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <cinttypes>
#include <cstdio>
#include <cstring>
#include <memory>
#include <optional>
#include <spdlog/spdlog.h>
#include <thread>
#include <utility>

#include "ddprun/worker/checkpoint.h"
#include "ddprun/worker/checks.h"
#include "mlp/gemm.h"
#include "mlp/mlp.h"
#include "ddprun/worker/error_file.h"
#include "ddprun/worker/reducer.h"
#include "ddprun/worker/runtime.h"
#include "ddprun/worker/sampler.h"
#include "ddprun/worker/stop.h"
#include "train_common.h"
#include "train_flags.h"

namespace dw = ddprun::worker;
namespace ex = ddprun::example;

namespace train {

namespace {

double thread_cpu_ms() {
  timespec ts{};
  ::clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) * 1e3 + static_cast<double>(ts.tv_nsec) * 1e-6;
}

// Context switches of the calling thread so far: {involuntary (preempted), voluntary (blocked)}.
std::pair<long, long> thread_switches() {
  rusage ru{};
  ::getrusage(RUSAGE_THREAD, &ru);
  return {ru.ru_nivcsw, ru.ru_nvcsw};
}

using Clock = std::chrono::steady_clock;
using Ms = std::chrono::duration<double, std::milli>;

// Per-phase time of the training thread, summed over the timed steps: wall and this thread's
// CPU time (far less sensitive to a busy host than wall time: CPU time lost to other threads
// shows as wall minus CPU).
struct PhaseSums {
  double fwd = 0, fwd_cpu = 0, bwd = 0, bwd_cpu = 0, after = 0, after_cpu = 0;
  double comm = 0, comm_cpu = 0, finish = 0, done_early = 0;
  double model_cpu = 0;  // forward + backward CPU time minus the time inside mark_ready
  long invol = 0, vol = 0;
};

// Clock readings of one step, from its start to its end.
struct StepClock {
  Clock::time_point t0, t_fin, t_end;
  double c0 = 0, c_fin = 0, c_end = 0;
  std::pair<long, long> sw0;
  double ready_cpu = 0;  // in mark_ready (inline progress reduces there): not the model's compute
  double wait_ms = 0;    // finalize (with the fused step: finalize_and_step) after backward
  double after_ms = 0;   // backward's end to the new parameters
};

std::string config_fingerprint(const Options& o) {
  return "in=" + std::to_string(o.in) + " width=" + std::to_string(o.width) + " depth=" + std::to_string(o.depth) +
         " samples=" + std::to_string(o.samples) + " batch=" + std::to_string(o.batch);
}

// One rank's CPU training run (Gloo, the shared-memory path when every rank is on this host):
// where the state lives, its initialisation or resume, the reducer, the epochs, the report.
class CpuRun {
 public:
  CpuRun(const Options& o, dw::Runtime& rt);
  int run();

 private:
  void place_state();
  void init_or_resume();
  void make_reducer();
  void print_header() const;
  bool run_epoch(int64_t epoch);  // false: stop (max steps or preemption)
  float step_once(int64_t s, StepClock& c);
  void add_timing(const StepClock& c);
  bool stop_agreed(int64_t epoch, int64_t s, bool ckpt_now);
  void save(int64_t epoch, int64_t next_in_epoch);
  void report_phases() const;
  void report_summary() const;

  const Options& o_;
  dw::Runtime& rt_;
  const dw::WorkerEnv& env_;
  dw::Communicator& comm_;
  const int rank_, world_;
  const ex::MlpShape shape_;
  ex::CpuMlp model_;
  const size_t n_;
  dw::DistributedSampler sampler_;
  int64_t steps_per_epoch_ = 0;

  // Memory: the communicator's shared memory where it has some (FusedStep), else our own.
  dw::FusedStep* fs_ = nullptr;
  std::vector<float> grad_storage_, param_storage_, momentum_storage_;
  float* grads_ = nullptr;
  float* params_ = nullptr;
  float* momentum_ = nullptr;
  bool shared_state_ = false, single_state_ = false;

  int64_t step_ = 0, start_epoch_ = 0, start_in_epoch_ = 0;
  bool momentum_init_ = false;
  std::optional<dw::CheckpointWriter> writer_;
  std::unique_ptr<dw::Reducer> reducer_;
  std::vector<float> x_, y_;

  // Timing of the steps after the warm-up.
  double timed_ms_ = 0, comm_wait_ms_ = 0;  // comm_wait: time finalize() blocks after backward
  double after_backward_ms_ = 0;
  double ov_sum_[5] = {0, 0, 0, 0, 0};  // buckets early, bytes early, comm ms, hidden ms, finish ms
  PhaseSums ph_;
  Clock::time_point t_fwd_end_;
  double c_fwd_end_ = 0;
  int64_t timed_steps_ = 0, run_steps_ = 0;
  bool stopped_for_preemption_ = false;
};

CpuRun::CpuRun(const Options& o, dw::Runtime& rt)
    : o_(o),
      rt_(rt),
      env_(rt.env()),
      comm_(rt.comm()),
      rank_(env_.rank),
      world_(env_.world_size),
      shape_{o.in, o.width, o.depth, 1},
      model_(shape_),
      n_(ex::mlp_num_params(shape_)),
      sampler_({static_cast<size_t>(o.samples), world_, rank_, true, o.seed, false}) {}

// Gradients in memory the communicator reduces without copies when it has such memory. With
// the fused step, parameters and momentum go into shared memory too (same flat layout), so each
// rank steps its slice of them: into the ONE copy every rank maps (alloc_shared_single: nothing
// copied to peers, one copy in the caches), else into every rank's copy (alloc_shared). Both are
// collective and answer alike on every rank, so all ranks take the same branch.
void CpuRun::place_state() {
  fs_ = comm_.fused_step();
  grads_ = fs_ ? static_cast<float*>(fs_->alloc_shared(n_ * sizeof(float))) : nullptr;
  if (!grads_) {
    grad_storage_.assign(n_, 0.f);
    grads_ = grad_storage_.data();
  }
  shared_state_ = o_.fused_step && grad_storage_.empty();
  auto state_array = [&](std::vector<float>& storage) {
    float* p = shared_state_ ? static_cast<float*>(fs_->alloc_shared_single(n_ * sizeof(float))) : nullptr;
    if (!p && shared_state_) p = static_cast<float*>(fs_->alloc_shared(n_ * sizeof(float)));
    if (!p) {
      storage.assign(n_, 0.f);
      p = storage.data();
    }
    return p;
  };
  params_ = state_array(param_storage_);
  momentum_ = o_.momentum != 0.f ? state_array(momentum_storage_) : nullptr;
}

// One copy is written by rank 0 alone (initialisation, checkpoint load); the broadcasts below
// then only order its writes before everyone's reads (communicator.h). Several ranks writing
// it, even the same values, would race.
void CpuRun::init_or_resume() {
  auto single_copy = [&](const float* a) { return fs_ && fs_->is_single_copy(a, n_ * sizeof(float)); };
  single_state_ = single_copy(params_);
  auto mine_to_write = [&](const float* a) { return rank_ == 0 || !single_copy(a); };
  if (mine_to_write(params_)) ex::mlp_init(shape_, o_.seed, params_);
  steps_per_epoch_ = static_cast<int64_t>(sampler_.num_batches(static_cast<size_t>(o_.batch)));
  int64_t meta[4] = {0, 0, 0, 0};  // {global step, epoch, step in epoch, momentum initialised}
  if (!o_.checkpoint_dir.empty()) {
    if (auto ck = dw::load_agreed_checkpoint(o_.checkpoint_dir, comm_)) {
      if (ck->section("config") != config_fingerprint(o_))
        throw dw::WorkerError("checkpoint in " + o_.checkpoint_dir + " is for '" + ck->section("config") + "', not '" +
                              config_fingerprint(o_) + "'");
      if (mine_to_write(params_)) ck->get_into("params", params_, n_ * sizeof(float));
      if (momentum_ && ck->has("momentum") && mine_to_write(momentum_))
        ck->get_into("momentum", momentum_, n_ * sizeof(float));
      meta[0] = static_cast<int64_t>(ck->step);
      meta[1] = static_cast<int64_t>(ck->get_u64("epoch"));
      meta[2] = static_cast<int64_t>(ck->get_u64("step_in_epoch"));
      meta[3] = static_cast<int64_t>(ck->get_u64("momentum_init"));
      if (ck->get_u64("world_size") != static_cast<uint64_t>(world_)) {
        spdlog::warn("checkpoint was written with world size {}, now {}: restarting its epoch",
                     ck->get_u64("world_size"), world_);
        meta[2] = 0;
      }
      if (rank_ == 0)
        std::printf("[train] resumed from step %" PRId64 " (epoch %" PRId64 ", batch %" PRId64 ")\n", meta[0], meta[1],
                    meta[2]);
    }
  }
  // Rank 0's state wins everywhere (DDP's initial broadcast; over one-copy memory a barrier).
  comm_.broadcast(params_, n_ * sizeof(float), 0);
  if (momentum_) comm_.broadcast(momentum_, n_ * sizeof(float), 0);
  comm_.broadcast(meta, sizeof meta, 0);
  step_ = meta[0];
  start_epoch_ = meta[1];
  start_in_epoch_ = meta[2];
  momentum_init_ = meta[3] != 0;
  if (start_in_epoch_ >= steps_per_epoch_) {
    ++start_epoch_;
    start_in_epoch_ = 0;
  }
  // Rank 0 writes checkpoints in the background (the loop does not wait for the disk).
  if (rank_ == 0 && !o_.checkpoint_dir.empty()) writer_.emplace(o_.checkpoint_dir, o_.keep_checkpoints);
}

void CpuRun::make_reducer() {
  std::vector<dw::GradView> views;
  for (const auto& t : model_.tensors()) views.push_back({grads_ + t.offset, t.count});
  dw::ReducerOptions ro;
  ro.overlap = !o_.no_overlap;
  ro.force_collective = o_.force_collective;
  ro.progress = o_.progress == "inline"   ? dw::ReducerOptions::Progress::Inline
                : o_.progress == "thread" ? dw::ReducerOptions::Progress::Thread
                                          : dw::ReducerOptions::Progress::Auto;
  reducer_ = std::make_unique<dw::Reducer>(comm_, views, dw::DType::F32, ro);
  if (o_.fused_step) {
    std::vector<float*> arrays{params_};
    if (momentum_) arrays.push_back(momentum_);
    reducer_->set_step_arrays(grads_, std::move(arrays));
  }
}

void CpuRun::print_header() const {
  if (rank_ == 0 && !o_.profile)
    std::printf("[train] world=%d backend=%s params=%zu batch/rank=%d steps/epoch=%" PRId64 "\n", world_,
                comm_.backend(), n_, o_.batch, steps_per_epoch_);
  if (rank_ == 0 && o_.profile)
    std::printf("[train] world=%d backend=%s params=%zu shape=%dx%d(depth %d) batch/rank=%d steps/epoch=%" PRId64
                " buckets=%zu step=%s state=%s gemm=%s blas_core=%s\n",
                world_, comm_.backend(), n_, o_.width, o_.width, o_.depth, o_.batch, steps_per_epoch_,
                reducer_->buckets().size(),
                !o_.fused_step  ? "separate"
                : shared_state_ ? "fused(shm)"
                                : "fused(default: all-reduce, then step)",
                single_state_            ? "one-copy"
                : param_storage_.empty() ? "per-rank-shm"
                                         : "private",
                ex::gemm_impl_name(), ex::gemm_blas_core().c_str());
  std::fflush(stdout);
}

// Batch `s` of the current epoch: forward, backward with the reducer, the SGD step (fused into
// the all-reduce or after it). Returns the loss; fills the step's clock readings.
float CpuRun::step_once(int64_t s, StepClock& c) {
  c.t0 = Clock::now();
  c.c0 = thread_cpu_ms();
  c.sw0 = thread_switches();
  const auto idx = sampler_.batch(static_cast<size_t>(s), static_cast<size_t>(o_.batch));
  const int b = static_cast<int>(idx.size());
  x_.resize(static_cast<size_t>(b) * o_.in);
  y_.resize(static_cast<size_t>(b));
  for (int i = 0; i < b; ++i)
    make_sample(o_.seed, static_cast<int64_t>(idx[i]), o_.in, &x_[static_cast<size_t>(i) * o_.in], &y_[i]);
  reducer_->prepare_for_backward();
  const float loss = model_.forward_backward(params_, x_.data(), y_.data(), b, grads_, false, [&](size_t t) {
    const double c1 = thread_cpu_ms();
    reducer_->mark_ready(t);
    c.ready_cpu += thread_cpu_ms() - c1;
  });
  c.t_fin = Clock::now();
  c.c_fin = thread_cpu_ms();
  if (o_.fused_step) {
    // wait_ms includes the step here: it is part of the fused collective.
    reducer_->finalize_and_step(ex::SgdStep(o_.lr, o_.momentum, !momentum_init_));
    c.wait_ms = Ms(Clock::now() - c.t_fin).count();
  } else {
    reducer_->finalize();
    c.wait_ms = Ms(Clock::now() - c.t_fin).count();
    ex::sgd_step(params_, grads_, momentum_, n_, o_.lr, o_.momentum, !momentum_init_);
  }
  // Backward's end to the new parameters, in both modes: what fusing the step saves.
  c.after_ms = Ms(Clock::now() - c.t_fin).count();
  momentum_init_ = true;
  ++step_;
  ++run_steps_;
  c.t_end = Clock::now();
  c.c_end = thread_cpu_ms();
  return loss;
}

void CpuRun::add_timing(const StepClock& c) {
  const auto sw1 = thread_switches();
  const auto& ov = reducer_->overlap();
  ph_.fwd += Ms(t_fwd_end_ - c.t0).count();
  ph_.fwd_cpu += c_fwd_end_ - c.c0;
  ph_.bwd += Ms(c.t_fin - t_fwd_end_).count();
  ph_.bwd_cpu += c.c_fin - c_fwd_end_;
  ph_.model_cpu += c.c_fin - c.c0 - c.ready_cpu;
  ph_.after += Ms(c.t_end - c.t_fin).count();
  ph_.after_cpu += c.c_end - c.c_fin;
  ph_.comm += ov.comm_ms;
  ph_.comm_cpu += ov.comm_cpu_ms;
  ph_.finish += ov.finish_ms;
  ph_.done_early += ov.bytes ? static_cast<double>(ov.bytes_done_early) / static_cast<double>(ov.bytes) : 0;
  ph_.invol += sw1.first - c.sw0.first;
  ph_.vol += sw1.second - c.sw0.second;
  // overlap evidence (ov above), averaged over the timed steps
  ov_sum_[0] += ov.buckets ? static_cast<double>(ov.buckets_early) / static_cast<double>(ov.buckets) : 0;
  ov_sum_[1] += ov.bytes ? static_cast<double>(ov.bytes_early) / static_cast<double>(ov.bytes) : 0;
  ov_sum_[2] += ov.comm_ms;
  // Hidden = run concurrently with backward, by the communication thread. Inline, the
  // training thread itself runs them between layers: nothing is hidden, only moved.
  ov_sum_[3] += ov.inline_progress ? 0.0 : std::max(0.0, ov.comm_ms - ov.exposed_ms);
  ov_sum_[4] += ov.finish_ms;
  timed_ms_ += Ms(c.t_end - c.t0).count();
  comm_wait_ms_ += c.wait_ms;
  after_backward_ms_ += c.after_ms;
  ++timed_steps_;
}

// The state after global step step_: `epoch`, `next_in_epoch` batches of it done. Called by
// rank 0 after finalize_and_step: one-copy parameters are read while nobody writes them (the
// next write is in the next finish_step, after a barrier that rank 0 has not reached yet).
void CpuRun::save(int64_t epoch, int64_t next_in_epoch) {
  dw::Checkpoint ck;
  ck.step = static_cast<uint64_t>(step_);
  ck.put("params", params_, n_ * sizeof(float));
  if (momentum_) ck.put("momentum", momentum_, n_ * sizeof(float));
  ck.put_u64("epoch", static_cast<uint64_t>(epoch));
  ck.put_u64("step_in_epoch", static_cast<uint64_t>(next_in_epoch));
  ck.put_u64("momentum_init", momentum_init_ ? 1 : 0);
  ck.put_u64("world_size", static_cast<uint64_t>(world_));
  ck.put_u64("rng_state", o_.seed);  // data and shuffles are counter-based: the seed is the whole RNG state
  const std::string cfg = config_fingerprint(o_);
  ck.put("config", cfg.data(), cfg.size());
  writer_->save(std::move(ck));
}

// Every step, every rank: stop together when any rank was asked to (a preemption).
bool CpuRun::stop_agreed(int64_t epoch, int64_t s, bool ckpt_now) {
  maybe_wait_for_signal(o_, env_, step_);
  if (!(o_.stop_check_every > 0 && step_ % o_.stop_check_every == 0 && rt_.agree_stop())) return false;
  const int sig = dw::stop_signal();
  std::printf("[train] rank %d: stopping after step %" PRId64 " for a preemption (%s)\n", rank_, step_,
              sig == SIGUSR1   ? "SIGUSR1 here"
              : sig == SIGTERM ? "SIGTERM here"
                               : "asked by another rank");
  if (rank_ == 0 && !o_.checkpoint_dir.empty() && !ckpt_now) save(epoch, s + 1);
  stopped_for_preemption_ = true;
  return true;
}

bool CpuRun::run_epoch(int64_t epoch) {
  sampler_.set_epoch(static_cast<uint64_t>(epoch));
  double loss_sum = 0;
  int64_t loss_n = 0, epoch_samples = 0;
  const auto epoch_t0 = Clock::now();
  bool go_on = true;
  for (int64_t s = (epoch == start_epoch_ ? start_in_epoch_ : 0); s < steps_per_epoch_; ++s) {
    if (o_.max_steps > 0 && step_ >= o_.max_steps) {
      go_on = false;
      break;
    }
    maybe_inject_fault(o_, env_, step_);
    StepClock c;
    const float loss = step_once(s, c);
    if (run_steps_ > o_.warmup_steps) add_timing(c);
    const int b = static_cast<int>(y_.size());
    const double ms = Ms(c.t_end - c.t0).count();
    loss_sum += loss;
    ++loss_n;
    epoch_samples += static_cast<int64_t>(b) * world_;
    if (rank_ == 0 && o_.log_every > 0 && step_ % o_.log_every == 0)
      std::printf("[train] epoch %" PRId64 " step %" PRId64 " loss %.6f step_ms %.2f samples/s %.0f\n", epoch, step_,
                  loss, ms, static_cast<double>(b) * world_ / (ms / 1000.0));
    const bool epoch_end = s + 1 == steps_per_epoch_;
    const bool ckpt_now =
        !o_.checkpoint_dir.empty() && (o_.checkpoint_every > 0 ? step_ % o_.checkpoint_every == 0 : epoch_end);
    if (ckpt_now && rank_ == 0) save(epoch, s + 1);
    if (stop_agreed(epoch, s, ckpt_now)) {
      go_on = false;
      break;
    }
  }
  if (rank_ == 0 && loss_n > 0) {
    const double sec = std::chrono::duration<double>(Clock::now() - epoch_t0).count();
    std::printf("[train] epoch %" PRId64 " done: step %" PRId64 " loss %.6f samples/s %.0f\n", epoch, step_,
                loss_sum / static_cast<double>(loss_n), static_cast<double>(epoch_samples) / sec);
    std::fflush(stdout);
  }
  return go_on;
}

const char* progress_name(const dw::Reducer& r) {
  return r.progress() == dw::ReducerOptions::Progress::Inline ? "inline" : "thread";
}

void CpuRun::report_phases() const {  // every rank: imbalance between ranks shows here
  const double k = static_cast<double>(timed_steps_);
  std::printf("phase_ms rank=%d progress=%s forward=%.3f/%.3f backward=%.3f/%.3f after_backward=%.3f/%.3f "
              "model_cpu=%.3f comm=%.3f/%.3f finish=%.3f reduced_in_backward_frac=%.3f preempted_per_step=%.2f "
              "blocked_per_step=%.2f "
              "(wall/cpu of the training thread; model_cpu: forward+backward CPU outside the reducer; comm: the "
              "collectives' wall/cpu)\n",
              rank_, world_ == 1 && !o_.force_collective ? "none" : progress_name(*reducer_), ph_.fwd / k,
              ph_.fwd_cpu / k, ph_.bwd / k, ph_.bwd_cpu / k, ph_.after / k, ph_.after_cpu / k, ph_.model_cpu / k,
              ph_.comm / k, ph_.comm_cpu / k, ph_.finish / k, ph_.done_early / k, static_cast<double>(ph_.invol) / k,
              static_cast<double>(ph_.vol) / k);
  std::fflush(stdout);
}

void CpuRun::report_summary() const {  // rank 0
  const double k = static_cast<double>(timed_steps_);
  if (timed_steps_ > 0 && !o_.profile) std::printf("avg_step_ms=%.3f steps=%" PRId64 "\n", timed_ms_ / k, timed_steps_);
  if (timed_steps_ > 0 && o_.profile)
    std::printf("avg_step_ms=%.3f steps=%" PRId64 " avg_comm_wait_ms=%.3f avg_after_backward_ms=%.3f\n", timed_ms_ / k,
                timed_steps_, comm_wait_ms_ / k, after_backward_ms_ / k);
  if (timed_steps_ > 0 && world_ > 1 && o_.profile)
    std::printf("overlap progress=%s reduced_in_backward_frac=%.3f overlap_buckets_early=%.3f overlap_bytes_early=%.3f "
                "comm_ms=%.3f comm_hidden_ms=%.3f "
                "comm_hidden_frac=%.3f fused_finish_ms=%.3f\n",
                progress_name(*reducer_), ph_.done_early / k, ov_sum_[0] / k, ov_sum_[1] / k, ov_sum_[2] / k,
                ov_sum_[3] / k, ov_sum_[2] > 0 ? ov_sum_[3] / ov_sum_[2] : 0.0, ov_sum_[4] / k);
  std::printf("final_step=%" PRId64 "\nfinal_param_checksum=%016" PRIx64 "\n", step_,
              dw::fnv1a64(params_, n_ * sizeof(float)));
  std::fflush(stdout);
}

int CpuRun::run() {
  place_state();
  init_or_resume();
  make_reducer();
  print_header();
  model_.set_on_backward_start([this] {
    t_fwd_end_ = Clock::now();
    c_fwd_end_ = thread_cpu_ms();
  });
  for (int64_t epoch = start_epoch_; epoch < o_.epochs; ++epoch)
    if (!run_epoch(epoch)) break;
  if (writer_) writer_->close();  // the last checkpoint is on disk before the exit (throws its error)
  comm_.barrier();
  if (stopped_for_preemption_) return finish_preempted(o_, rank_, step_);
  if (timed_steps_ > 0 && o_.profile) report_phases();
  comm_.barrier();  // rank 0's summary after every rank's line
  if (rank_ == 0) report_summary();
  return dw::kExitOk;
}

int run_cpu(const Options& o, dw::Runtime& rt) {
  // SIGUSR1/SIGTERM now only ask for a stop, which the ranks agree on at the end of a step
  // (stop.h); the GPU path does the same (run_gpu, every 10 steps by default).
  if (o.stop_check_every > 0) dw::install_stop_handlers();
  if (o.precision != "fp32") throw dw::WorkerError("--precision " + o.precision + " needs --device cuda");
  if (o.grad_dtype != "fp32") throw dw::WorkerError("--grad-dtype " + o.grad_dtype + " needs --device cuda");
  if (o.gemm == "openblas" && !ex::gemm_blas_available())
    throw dw::WorkerError("--gemm openblas: this train was built without OpenBLAS (install libopenblas64-pthread-dev, "
                          "reconfigure, rebuild) — or use --gemm builtin");
  if (o.gemm != "auto") ex::set_gemm_impl(o.gemm == "openblas" ? ex::GemmImpl::Blas : ex::GemmImpl::Builtin);
  ex::set_gemm_threads(o.threads);
  return CpuRun(o, rt).run();
}

}  // namespace
}  // namespace train

int main(int argc, char** argv) {
  train::Options o;
  CLI::App app{"train: data-parallel MLP training, the ddprun worker library's test and benchmark harness"};
  train::add_flags(app, o);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e) == 0 ? 0 : dw::kExitUsage;
  }
  std::setvbuf(stdout, nullptr, _IOLBF, 0);
  // The usual CLI rule: an explicit flag beats the environment, which beats the default. init()
  // reads the knob itself, so an explicit --timeout replaces the knob for this process.
  if (app.count("--timeout") > 0) ::setenv("DDPRUN_COLLECTIVE_TIMEOUT_S", std::to_string(o.timeout_s).c_str(), 1);
  return dw::run_worker_main([&] {
    dw::RuntimeOptions ro;
    ro.device = o.device == "cpu"    ? dw::DeviceKind::Cpu
                : o.device == "cuda" ? dw::DeviceKind::Cuda
                                     : dw::DeviceKind::Auto;
    ro.timeout = std::chrono::milliseconds(static_cast<long long>(o.timeout_s * 1000));
    ro.real_communicator_at_world_size_1 = o.force_collective;
#ifdef DDPRUN_TRAIN_HAVE_CUDA
    if (ro.device == dw::DeviceKind::Cuda) train::require_cublas();  // before the NCCL bootstrap
#endif
    auto rt = dw::init(ro);
    if (rt->on_cuda()) {
#ifdef DDPRUN_TRAIN_HAVE_CUDA
      train::require_cublas();
      // On the GPU each agreement makes the host wait for the step's communication: every 10
      // steps by default there, so the host keeps running ahead of the GPU in between.
      if (app.count("--stop-check-every") == 0) o.stop_check_every = 10;
      if (o.stop_check_every > 0) dw::install_stop_handlers();
      return train::run_gpu(o, *rt);
#else
      throw dw::WorkerError("train was built without CUDA");
#endif
    }
    return train::run_cpu(o, *rt);
  });
}
