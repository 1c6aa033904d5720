// `train`: the seed's DDP program in C++ (Linear 10->50, ReLU, Linear 50->1, MSE, SGD 0.01,
// 100 samples, batch 20 per rank, 5 epochs), with flags for bigger MLPs, checkpoints and
// fault injection. CPU path here (Gloo); GPU path in train_gpu.cu (NCCL + cuBLAS).
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
#include <spdlog/spdlog.h>
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

namespace dw = ddprun::worker;
namespace ex = ddprun::example;

namespace train {

void maybe_inject_fault(const Options& o, const dw::WorkerEnv& env, int64_t step) {
  if (env.rank != o.fail_rank) return;
  for (size_t i = 0; i < o.fail_at_step.size(); ++i) {
    const int attempt = o.fail_attempt >= 0 ? o.fail_attempt : static_cast<int>(i);
    if (o.fail_at_step[i] != step || env.restart_count != attempt) continue;
    std::fprintf(stderr, "[train] rank %d attempt %d: injected fault (%s) before step %" PRId64 "\n", env.rank,
                 env.restart_count, o.fail_mode.c_str(), step);
    std::fflush(stderr);
    if (o.fail_mode == "exit") {
      dw::write_error_file(env.error_file, "injected failure before step " + std::to_string(step),
                           "train --fail-at-step " + std::to_string(step));
      std::_Exit(dw::kExitError);
    }
    ::kill(::getpid(), SIGKILL);
  }
}

// --wait-for-signal-at-step (tests): the chosen rank(s) block before the agreement of that step
// until a stop signal arrived, so a test signals "mid-run" at a known step without racing the
// run's end. Signals blocked around the check, then sigsuspend: none is lost in between.
void maybe_wait_for_signal(const Options& o, const dw::WorkerEnv& env, int64_t step) {
  if (o.wait_for_signal_at_step < 0 || step != o.wait_for_signal_at_step) return;
  if (o.wait_rank >= 0 && env.rank != o.wait_rank) return;
  sigset_t stop_set, old;
  sigemptyset(&stop_set);
  sigaddset(&stop_set, SIGUSR1);
  sigaddset(&stop_set, SIGTERM);
  ::sigprocmask(SIG_BLOCK, &stop_set, &old);
  std::printf("[train] rank %d: waiting for a stop signal after step %" PRId64 "\n", env.rank, step);
  std::fflush(stdout);
  while (!dw::stop_requested()) ::sigsuspend(&old);
  ::sigprocmask(SIG_SETMASK, &old, nullptr);
}

int finish_preempted(const Options& o, int rank, int64_t step) {
  if (rank == 0) {
    if (!o.checkpoint_dir.empty())
      std::printf("[train] checkpoint of step %" PRId64 " written to %s; exit %d (preempted): rerun to resume\n", step,
                  dw::checkpoint_path(o.checkpoint_dir, static_cast<uint64_t>(step)).c_str(), dw::kExitPreempted);
    else
      std::printf("[train] no --checkpoint-dir: nothing saved; exit %d (preempted)\n", dw::kExitPreempted);
  }
  std::fflush(stdout);
  return dw::kExitPreempted;
}

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

// Per-phase time of the training thread, summed over the timed steps: wall and this thread's
// CPU time (far less sensitive to a busy host than wall time: CPU time lost to other threads
// shows as wall minus CPU).
struct PhaseSums {
  double fwd = 0, fwd_cpu = 0, bwd = 0, bwd_cpu = 0, after = 0, after_cpu = 0;
  double comm = 0, comm_cpu = 0, finish = 0, done_early = 0;
  double model_cpu = 0;  // forward + backward CPU time minus the time inside mark_ready
  long invol = 0, vol = 0;
};

std::string config_fingerprint(const Options& o) {
  return "in=" + std::to_string(o.in) + " width=" + std::to_string(o.width) + " depth=" + std::to_string(o.depth) +
         " samples=" + std::to_string(o.samples) + " batch=" + std::to_string(o.batch);
}

int run_cpu(const Options& o, dw::Runtime& rt) {
  // SIGUSR1/SIGTERM now only ask for a stop, which the ranks agree on at the end of a step
  // (stop.h); the GPU path does the same (run_gpu, every 10 steps by default).
  if (o.stop_check_every > 0) dw::install_stop_handlers();
  const dw::WorkerEnv& env = rt.env();
  dw::Communicator& comm = rt.comm();
  const int rank = env.rank, world = env.world_size;
  if (o.precision != "fp32") throw dw::WorkerError("--precision " + o.precision + " needs --device cuda");
  if (o.grad_dtype != "fp32") throw dw::WorkerError("--grad-dtype " + o.grad_dtype + " needs --device cuda");
  if (o.gemm == "openblas" && !ex::gemm_blas_available())
    throw dw::WorkerError("--gemm openblas: this train was built without OpenBLAS (install libopenblas64-pthread-dev, "
                          "reconfigure, rebuild) — or use --gemm builtin");
  if (o.gemm != "auto") ex::set_gemm_impl(o.gemm == "openblas" ? ex::GemmImpl::Blas : ex::GemmImpl::Builtin);
  ex::set_gemm_threads(o.threads);

  const ex::MlpShape shape{o.in, o.width, o.depth, 1};
  ex::CpuMlp model(shape);
  const size_t n = ex::mlp_num_params(shape);
  // Gradients in memory the communicator reduces without copies when it has such memory.
  std::vector<float> grad_storage;
  dw::FusedStep* fs = comm.fused_step();
  float* grads = fs ? static_cast<float*>(fs->alloc_shared(n * sizeof(float))) : nullptr;
  if (!grads) {
    grad_storage.assign(n, 0.f);
    grads = grad_storage.data();
  }
  // With the fused step, parameters and momentum go into shared memory too (same flat layout),
  // so each rank steps its slice of them: into the ONE copy every rank maps
  // (alloc_shared_single: nothing copied to peers, one copy in the caches), else into every
  // rank's copy (alloc_shared). Both are collective and answer alike on every rank, so all
  // ranks take the same branch.
  const bool shared_state = o.fused_step && grad_storage.empty();
  std::vector<float> param_storage, momentum_storage;
  auto state_array = [&](std::vector<float>& storage) {
    float* p = shared_state ? static_cast<float*>(fs->alloc_shared_single(n * sizeof(float))) : nullptr;
    if (!p && shared_state) p = static_cast<float*>(fs->alloc_shared(n * sizeof(float)));
    if (!p) {
      storage.assign(n, 0.f);
      p = storage.data();
    }
    return p;
  };
  float* params = state_array(param_storage);
  float* momentum = o.momentum != 0.f ? state_array(momentum_storage) : nullptr;
  // One copy is written by rank 0 alone (initialisation, checkpoint load); the broadcasts
  // below then only order its writes before everyone's reads (communicator.h). Several
  // ranks writing it, even the same values, would race.
  auto single_copy = [&](const float* a) { return fs && fs->is_single_copy(a, n * sizeof(float)); };
  const bool single_state = single_copy(params);
  auto mine_to_write = [&](const float* a) { return rank == 0 || !single_copy(a); };
  if (mine_to_write(params)) ex::mlp_init(shape, o.seed, params);

  dw::DistributedSampler sampler({static_cast<size_t>(o.samples), world, rank, true, o.seed, false});
  const int64_t steps_per_epoch = static_cast<int64_t>(sampler.num_batches(static_cast<size_t>(o.batch)));
  // meta = {global step, epoch, step in epoch, momentum initialised}
  int64_t meta[4] = {0, 0, 0, 0};
  if (!o.checkpoint_dir.empty()) {
    if (auto ck = dw::load_latest_checkpoint(o.checkpoint_dir)) {
      if (ck->section("config") != config_fingerprint(o))
        throw dw::WorkerError("checkpoint in " + o.checkpoint_dir + " is for '" + ck->section("config") +
                              "', not '" + config_fingerprint(o) + "'");
      if (mine_to_write(params)) ck->get_into("params", params, n * sizeof(float));
      if (momentum && ck->has("momentum") && mine_to_write(momentum)) ck->get_into("momentum", momentum, n * sizeof(float));
      meta[0] = static_cast<int64_t>(ck->step);
      meta[1] = static_cast<int64_t>(ck->get_u64("epoch"));
      meta[2] = static_cast<int64_t>(ck->get_u64("step_in_epoch"));
      meta[3] = static_cast<int64_t>(ck->get_u64("momentum_init"));
      if (ck->get_u64("world_size") != static_cast<uint64_t>(world)) {
        spdlog::warn("checkpoint was written with world size {}, now {}: restarting its epoch", ck->get_u64("world_size"), world);
        meta[2] = 0;
      }
      if (rank == 0) std::printf("[train] resumed from step %" PRId64 " (epoch %" PRId64 ", batch %" PRId64 ")\n", meta[0], meta[1], meta[2]);
    }
  }
  // Rank 0's state wins everywhere (DDP's initial broadcast; over one-copy memory a barrier).
  comm.broadcast(params, n * sizeof(float), 0);
  if (momentum) comm.broadcast(momentum, n * sizeof(float), 0);
  comm.broadcast(meta, sizeof meta, 0);
  int64_t step = meta[0];
  int64_t start_epoch = meta[1], start_in_epoch = meta[2];
  bool momentum_init = meta[3] != 0;
  if (start_in_epoch >= steps_per_epoch) { ++start_epoch; start_in_epoch = 0; }
  // Rank 0 writes checkpoints in the background (the loop does not wait for the disk).
  std::optional<dw::CheckpointWriter> writer;
  if (rank == 0 && !o.checkpoint_dir.empty()) writer.emplace(o.checkpoint_dir, o.keep_checkpoints);

  std::vector<dw::GradView> views;
  for (const auto& t : model.tensors()) views.push_back({grads + t.offset, t.count});
  dw::ReducerOptions ro;
  ro.overlap = !o.no_overlap;
  ro.force_collective = o.force_collective;
  ro.progress = o.progress == "inline"   ? dw::ReducerOptions::Progress::Inline
                : o.progress == "thread" ? dw::ReducerOptions::Progress::Thread
                                         : dw::ReducerOptions::Progress::Auto;
  dw::Reducer reducer(comm, views, dw::DType::F32, ro);
  if (o.fused_step) {
    std::vector<float*> arrays{params};
    if (momentum) arrays.push_back(momentum);
    reducer.set_step_arrays(grads, std::move(arrays));
  }

  if (rank == 0)
    std::printf("[train] world=%d backend=%s params=%zu shape=%dx%d(depth %d) batch/rank=%d steps/epoch=%" PRId64
                " buckets=%zu step=%s state=%s gemm=%s blas_core=%s\n",
                world, comm.backend(), n, o.width, o.width, o.depth, o.batch, steps_per_epoch, reducer.buckets().size(),
                !o.fused_step ? "separate" : shared_state ? "fused(shm)" : "fused(default: all-reduce, then step)",
                single_state ? "one-copy" : param_storage.empty() ? "per-rank-shm" : "private", ex::gemm_impl_name(),
                ex::gemm_blas_core().c_str());
  std::fflush(stdout);

  std::vector<float> x, y;
  using Clock = std::chrono::steady_clock;
  double timed_ms = 0, comm_wait_ms = 0;  // comm_wait: time finalize() blocks after backward
  double after_backward_ms = 0;
  double ov_sum[5] = {0, 0, 0, 0, 0};  // buckets early, bytes early, comm ms, hidden ms, finish ms
  PhaseSums ph;
  Clock::time_point t_fwd_end;
  double c_fwd_end = 0;
  model.set_on_backward_start([&] {
    t_fwd_end = Clock::now();
    c_fwd_end = thread_cpu_ms();
  });
  int64_t timed_steps = 0, run_steps = 0;
  auto epoch_t0 = Clock::now();
  bool stop = false, stopped_for_preemption = false;
  // The state after global step `step`: `epoch`, `next_in_epoch` batches of it done. Called by
  // rank 0 after finalize_and_step: one-copy parameters are read while nobody writes them (the
  // next write is in the next finish_step, after a barrier that rank 0 has not reached yet).
  auto save = [&](int64_t epoch, int64_t next_in_epoch) {
    dw::Checkpoint ck;
    ck.step = static_cast<uint64_t>(step);
    ck.put("params", params, n * sizeof(float));
    if (momentum) ck.put("momentum", momentum, n * sizeof(float));
    ck.put_u64("epoch", static_cast<uint64_t>(epoch));
    ck.put_u64("step_in_epoch", static_cast<uint64_t>(next_in_epoch));
    ck.put_u64("momentum_init", momentum_init ? 1 : 0);
    ck.put_u64("world_size", static_cast<uint64_t>(world));
    ck.put_u64("rng_state", o.seed);  // data and shuffles are counter-based: the seed is the whole RNG state
    const std::string cfg = config_fingerprint(o);
    ck.put("config", cfg.data(), cfg.size());
    writer->save(std::move(ck));
  };
  for (int64_t epoch = start_epoch; epoch < o.epochs && !stop; ++epoch) {
    sampler.set_epoch(static_cast<uint64_t>(epoch));
    double loss_sum = 0;
    int64_t loss_n = 0, epoch_samples = 0;
    epoch_t0 = Clock::now();
    for (int64_t s = (epoch == start_epoch ? start_in_epoch : 0); s < steps_per_epoch; ++s) {
      if (o.max_steps > 0 && step >= o.max_steps) { stop = true; break; }
      maybe_inject_fault(o, env, step);
      const auto t0 = Clock::now();
      const double c0 = thread_cpu_ms();
      const auto sw0 = thread_switches();
      const auto idx = sampler.batch(static_cast<size_t>(s), static_cast<size_t>(o.batch));
      const int b = static_cast<int>(idx.size());
      x.resize(static_cast<size_t>(b) * o.in);
      y.resize(static_cast<size_t>(b));
      for (int i = 0; i < b; ++i) make_sample(o.seed, static_cast<int64_t>(idx[i]), o.in, &x[static_cast<size_t>(i) * o.in], &y[i]);
      reducer.prepare_for_backward();
      double ready_cpu = 0;  // in mark_ready (inline progress reduces there): not the model's compute
      const float loss = model.forward_backward(params, x.data(), y.data(), b, grads, false, [&](size_t t) {
        const double c = thread_cpu_ms();
        reducer.mark_ready(t);
        ready_cpu += thread_cpu_ms() - c;
      });
      const auto t_fin = Clock::now();
      const double c_fin = thread_cpu_ms();
      double wait_ms = 0;
      if (o.fused_step) {
        // wait_ms includes the step here: it is part of the fused collective.
        reducer.finalize_and_step(ex::SgdStep(o.lr, o.momentum, !momentum_init));
        wait_ms = std::chrono::duration<double, std::milli>(Clock::now() - t_fin).count();
      } else {
        reducer.finalize();
        wait_ms = std::chrono::duration<double, std::milli>(Clock::now() - t_fin).count();
        ex::sgd_step(params, grads, momentum, n, o.lr, o.momentum, !momentum_init);
      }
      // Backward's end to the new parameters, in both modes: what fusing the step saves.
      const double after_ms = std::chrono::duration<double, std::milli>(Clock::now() - t_fin).count();
      momentum_init = true;
      ++step;
      ++run_steps;
      const auto t_end = Clock::now();
      const double c_end = thread_cpu_ms();
      const double ms = std::chrono::duration<double, std::milli>(t_end - t0).count();
      if (run_steps > o.warmup_steps) {
        using Ms = std::chrono::duration<double, std::milli>;
        const auto sw1 = thread_switches();
        const auto& ov = reducer.overlap();
        ph.fwd += Ms(t_fwd_end - t0).count();
        ph.fwd_cpu += c_fwd_end - c0;
        ph.bwd += Ms(t_fin - t_fwd_end).count();
        ph.bwd_cpu += c_fin - c_fwd_end;
        ph.model_cpu += c_fin - c0 - ready_cpu;
        ph.after += Ms(t_end - t_fin).count();
        ph.after_cpu += c_end - c_fin;
        ph.comm += ov.comm_ms;
        ph.comm_cpu += ov.comm_cpu_ms;
        ph.finish += ov.finish_ms;
        ph.done_early += ov.bytes ? static_cast<double>(ov.bytes_done_early) / static_cast<double>(ov.bytes) : 0;
        ph.invol += sw1.first - sw0.first;
        ph.vol += sw1.second - sw0.second;
        // overlap evidence (ov above), averaged over the timed steps
        ov_sum[0] += ov.buckets ? static_cast<double>(ov.buckets_early) / static_cast<double>(ov.buckets) : 0;
        ov_sum[1] += ov.bytes ? static_cast<double>(ov.bytes_early) / static_cast<double>(ov.bytes) : 0;
        ov_sum[2] += ov.comm_ms;
        // Hidden = run concurrently with backward, by the communication thread. Inline, the
        // training thread itself runs them between layers: nothing is hidden, only moved.
        ov_sum[3] += ov.inline_progress ? 0.0 : std::max(0.0, ov.comm_ms - ov.exposed_ms);
        ov_sum[4] += ov.finish_ms;
        timed_ms += ms;
        comm_wait_ms += wait_ms;
        after_backward_ms += after_ms;
        ++timed_steps;
      }
      loss_sum += loss;
      ++loss_n;
      epoch_samples += static_cast<int64_t>(b) * world;
      if (rank == 0 && o.log_every > 0 && step % o.log_every == 0)
        std::printf("[train] epoch %" PRId64 " step %" PRId64 " loss %.6f step_ms %.2f samples/s %.0f\n", epoch, step,
                    loss, ms, static_cast<double>(b) * world / (ms / 1000.0));
      const bool epoch_end = s + 1 == steps_per_epoch;
      const bool ckpt_now = !o.checkpoint_dir.empty() &&
                            (o.checkpoint_every > 0 ? step % o.checkpoint_every == 0 : epoch_end);
      if (ckpt_now && rank == 0) save(epoch, s + 1);
      // Every step, every rank: stop together when any rank was asked to (a preemption).
      maybe_wait_for_signal(o, env, step);
      if (o.stop_check_every > 0 && step % o.stop_check_every == 0 && rt.agree_stop()) {
        const int sig = dw::stop_signal();
        std::printf("[train] rank %d: stopping after step %" PRId64 " for a preemption (%s)\n", rank, step,
                    sig == SIGUSR1 ? "SIGUSR1 here" : sig == SIGTERM ? "SIGTERM here" : "asked by another rank");
        if (rank == 0 && !o.checkpoint_dir.empty() && !ckpt_now) save(epoch, s + 1);
        stopped_for_preemption = true;
        stop = true;
        break;
      }
    }
    if (rank == 0 && loss_n > 0) {
      const double sec = std::chrono::duration<double>(Clock::now() - epoch_t0).count();
      std::printf("[train] epoch %" PRId64 " done: step %" PRId64 " loss %.6f samples/s %.0f\n", epoch, step,
                  loss_sum / static_cast<double>(loss_n), static_cast<double>(epoch_samples) / sec);
      std::fflush(stdout);
    }
  }
  if (writer) writer->close();  // the last checkpoint is on disk before the exit (throws its error)
  comm.barrier();
  if (stopped_for_preemption) return finish_preempted(o, rank, step);
  if (timed_steps > 0) {  // every rank: imbalance between ranks shows here
    const double k = static_cast<double>(timed_steps);
    std::printf("phase_ms rank=%d progress=%s forward=%.3f/%.3f backward=%.3f/%.3f after_backward=%.3f/%.3f "
                "model_cpu=%.3f comm=%.3f/%.3f finish=%.3f reduced_in_backward_frac=%.3f preempted_per_step=%.2f blocked_per_step=%.2f "
                "(wall/cpu of the training thread; model_cpu: forward+backward CPU outside the reducer; comm: the "
                "collectives' wall/cpu)\n",
                rank, world == 1 && !o.force_collective ? "none" : reducer.progress() == dw::ReducerOptions::Progress::Inline ? "inline" : "thread",
                ph.fwd / k, ph.fwd_cpu / k, ph.bwd / k, ph.bwd_cpu / k, ph.after / k, ph.after_cpu / k, ph.model_cpu / k, ph.comm / k,
                ph.comm_cpu / k, ph.finish / k, ph.done_early / k, static_cast<double>(ph.invol) / k,
                static_cast<double>(ph.vol) / k);
    std::fflush(stdout);
  }
  comm.barrier();  // rank 0's summary after every rank's line
  if (rank == 0) {
    if (timed_steps > 0)
      std::printf("avg_step_ms=%.3f steps=%" PRId64 " avg_comm_wait_ms=%.3f avg_after_backward_ms=%.3f\n",
                  timed_ms / static_cast<double>(timed_steps), timed_steps, comm_wait_ms / static_cast<double>(timed_steps),
                  after_backward_ms / static_cast<double>(timed_steps));
    if (timed_steps > 0 && world > 1) {
      const double k = static_cast<double>(timed_steps);
      std::printf("overlap progress=%s reduced_in_backward_frac=%.3f overlap_buckets_early=%.3f overlap_bytes_early=%.3f "
                  "comm_ms=%.3f comm_hidden_ms=%.3f "
                  "comm_hidden_frac=%.3f fused_finish_ms=%.3f\n",
                  reducer.progress() == dw::ReducerOptions::Progress::Inline ? "inline" : "thread", ph.done_early / k,
                  ov_sum[0] / k, ov_sum[1] / k, ov_sum[2] / k, ov_sum[3] / k, ov_sum[2] > 0 ? ov_sum[3] / ov_sum[2] : 0.0,
                  ov_sum[4] / k);
    }
    std::printf("final_step=%" PRId64 "\nfinal_param_checksum=%016" PRIx64 "\n", step,
                dw::fnv1a64(params, n * sizeof(float)));
    std::fflush(stdout);
  }
  return dw::kExitOk;
}

}  // namespace
}  // namespace train

int main(int argc, char** argv) {
  train::Options o;
  CLI::App app{"ddprun example: data-parallel MLP training (the seed's DDP program)"};
  app.add_option("--width", o.width, "hidden width")->check(CLI::PositiveNumber);
  app.add_option("--depth", o.depth, "hidden width x width layers (0 = the seed's model)")->check(CLI::NonNegativeNumber);
  app.add_option("--in-features", o.in, "input features")->check(CLI::PositiveNumber);
  app.add_option("--samples", o.samples, "dataset size")->check(CLI::PositiveNumber);
  app.add_option("--batch", o.batch, "batch size per rank")->check(CLI::PositiveNumber);
  app.add_option("--epochs", o.epochs, "epochs")->check(CLI::NonNegativeNumber);
  app.add_option("--lr", o.lr, "SGD learning rate");
  app.add_option("--momentum", o.momentum, "SGD momentum");
  app.add_option("--precision", o.precision, "fp32 | bf16 | fp16 (bf16/fp16 on CUDA)")
      ->check(CLI::IsMember({"fp32", "bf16", "fp16"}));
  app.add_option("--device", o.device, "cpu | cuda | auto")->check(CLI::IsMember({"cpu", "cuda", "auto"}));
  app.add_option("--threads", o.threads, "CPU threads per rank for the GEMMs (results identical for any count)")->check(CLI::PositiveNumber);
  app.add_option("--gemm", o.gemm, "CPU GEMM: auto (openblas when built with it) | openblas | builtin (our kernels)")
      ->check(CLI::IsMember({"auto", "openblas", "builtin"}));
  app.add_option("--seed", o.seed, "seed of init, data and shuffles");
  app.add_option("--checkpoint-dir", o.checkpoint_dir, "directory of checkpoints (resume from the newest valid one)");
  app.add_option("--checkpoint-every", o.checkpoint_every, "steps between checkpoints (0 = every epoch)");
  app.add_option("--keep-checkpoints", o.keep_checkpoints, "checkpoints kept (0 = all)");
  app.add_option("--fail-at-step", o.fail_at_step, "inject a fault before these global steps (i-th on attempt i)")
      ->delimiter(',');
  app.add_option("--fail-rank", o.fail_rank, "rank that fails");
  app.add_option("--fail-attempt", o.fail_attempt, "attempt (TORCHELASTIC_RESTART_COUNT) on which every fault fires");
  app.add_option("--fail-mode", o.fail_mode, "kill (SIGKILL self) | exit (error file, exit 1)")
      ->check(CLI::IsMember({"kill", "exit"}));
  app.add_option("--stop-check-every", o.stop_check_every,
                 "steps between the ranks' agreements on stopping for a preemption (SIGUSR1/SIGTERM); "
                 "0 = none (the signals then end the process). Default 1 on the CPU, 10 on the GPU")
      ->check(CLI::NonNegativeNumber);
  app.add_option("--wait-for-signal-at-step", o.wait_for_signal_at_step,
                 "tests: block after this global step until SIGUSR1/SIGTERM arrives (on --wait-rank)");
  app.add_option("--wait-rank", o.wait_rank, "rank that waits (-1 = every rank)");
  app.add_option("--timeout", o.timeout_s,
                 "timeout in seconds of NCCL init and of every collective (given, it beats env "
                 "DDPRUN_COLLECTIVE_TIMEOUT_S; not given, the environment beats its default)")
      ->check(CLI::PositiveNumber);
  app.add_option("--max-steps", o.max_steps, "stop after this many global steps");
  app.add_option("--log-every", o.log_every, "print every N steps (0 = per epoch)");
  app.add_option("--warmup-steps", o.warmup_steps, "steps excluded from avg_step_ms");
  app.add_option("--grad-dtype", o.grad_dtype, "fp32 | bf16 (with --precision bf16 on CUDA: bf16 gradients and all-reduce)")
      ->check(CLI::IsMember({"fp32", "bf16"}));
  app.add_flag("--no-overlap", o.no_overlap, "all-reduce after backward instead of overlapping it");
  app.add_flag("--force-collective", o.force_collective,
               "at world size 1, still bucket and all-reduce every gradient through a real communicator "
               "(as PyTorch's DDP does), so a one-rank run measures the DDP machinery");
  app.add_option("--fused-step", o.fused_step,
                 "1: all-reduce and SGD in one pass on the CPU shared-memory path (each rank steps its slice); "
                 "0: all-reduce, then SGD over all parameters on every rank. Same results")
      ->default_val(true);
  app.add_option("--progress", o.progress,
                 "CPU: who runs the collectives during backward: thread (a communication thread), inline (the "
                 "training thread at each layer boundary, never waiting for a peer before backward ends), auto "
                 "(inline on the shared-memory path when ranks have fewer than 2 CPUs each). Same results")
      ->check(CLI::IsMember({"auto", "thread", "inline"}));
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
    ro.device = o.device == "cpu" ? dw::DeviceKind::Cpu : o.device == "cuda" ? dw::DeviceKind::Cuda : dw::DeviceKind::Auto;
    ro.timeout = std::chrono::milliseconds(static_cast<long long>(o.timeout_s * 1000));
    ro.real_communicator_at_world_size_1 = o.force_collective;
    auto rt = dw::init(ro);
    if (rt->on_cuda()) {
#ifdef DDPRUN_TRAIN_HAVE_CUDA
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
