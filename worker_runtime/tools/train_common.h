// Shared between the CPU (train.cpp) and GPU (train_gpu.cu) paths of the `train` harness.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "ddprun/worker/hash.h"
#include "ddprun/worker/runtime.h"

namespace train {

struct Options {
  int in = 10;
  int width = 50;
  int depth = 0;  // hidden width x width layers: total Linear layers = depth + 2
  int64_t samples = 100;
  int batch = 20;  // per rank
  int epochs = 5;
  float lr = 0.01f;
  float momentum = 0.f;
  std::string precision = "fp32";  // fp32 | bf16 | fp16 (bf16/fp16: CUDA only)
  std::string device = "auto";     // cpu | cuda | auto
  int threads = 1;
  std::string gemm = "auto";  // CPU GEMM: auto (openblas when built with it) | openblas | builtin
  uint64_t seed = 0;
  std::string checkpoint_dir;
  int64_t checkpoint_every = 0;  // steps; 0 = at the end of every epoch (when a dir is given)
  int keep_checkpoints = 3;
  std::vector<int64_t> fail_at_step;  // i-th entry fires on attempt i (or on --fail-attempt)
  int fail_rank = 0;
  int fail_attempt = -1;
  std::string fail_mode = "kill";  // kill (SIGKILL self) | exit (error file + exit 1)
  int64_t hang_at_step = -1;       // tests: --fail-rank sleeps for ever before this step (-1: never)
  double timeout_s = 600;          // NCCL init and every collective (PyTorch's 10 minutes)
  int64_t max_steps = 0;           // stop after this many global steps (0 = all epochs)
  int log_every = 0;               // 0 = once per epoch
  int warmup_steps = 3;            // excluded from the step-time average
  bool no_overlap = false;
  bool profile = false;                  // --profile: per-phase timings and internals besides loss and throughput
  bool force_collective = false;         // world size 1: still bucket and all-reduce (PyTorch DDP's way)
  bool fused_step = true;                // CPU: all-reduce and SGD in one pass (Reducer::finalize_and_step)
  std::string progress = "auto";         // CPU: who runs collectives during backward: auto | thread | inline
  bool sync_data = false;                // rank 0 generates data (debug)
  int64_t stop_check_every = 1;          // steps between stop agreements (stop.h); 0: none
  int64_t wait_for_signal_at_step = -1;  // tests: block after this step until a stop signal (-1: never)
  int wait_rank = -1;                    // the rank that blocks (-1: every rank)
  std::string grad_dtype = "fp32";       // CUDA, --precision bf16: fp32 | bf16 (gradients and their all-reduce)
};

// Deterministic synthetic data: sample i is a pure function of (seed, i).
inline void make_sample(uint64_t seed, int64_t i, int in, float* x, float* y) {
  using ddprun::worker::splitmix64;
  double t = 0;
  for (int j = 0; j < in; ++j) {
    const uint64_t h = splitmix64(splitmix64(seed ^ 0x5eed) + static_cast<uint64_t>(i) * 1315423911ull + j);
    x[j] = static_cast<float>(static_cast<double>(h >> 40) / 16777216.0 * 2.0 - 1.0);
    const uint64_t w = splitmix64(0xc0ffee + j);
    t += (static_cast<double>(w >> 40) / 16777216.0 - 0.5) * x[j];
  }
  y[0] = static_cast<float>(t + 0.1 * x[0] * x[(in > 1) ? 1 : 0]);
}

// Applies --fail-at-step and --hang-at-step: on the chosen rank and attempt, before global step
// `step` runs.
void maybe_inject_fault(const Options& o, const ddprun::worker::WorkerEnv& env, int64_t step);
// Applies --wait-for-signal-at-step: blocks until stop_requested() (stop.h).
void maybe_wait_for_signal(const Options& o, const ddprun::worker::WorkerEnv& env, int64_t step);
// After the ranks agreed to stop after `step` (stop.h) and rank 0's checkpoint is on disk: says
// so (rank 0) and returns the exit code that tells ddprun "preempted".
int finish_preempted(const Options& o, int rank, int64_t step);

#ifdef DDPRUN_TRAIN_HAVE_CUDA
int run_gpu(const Options& o, ddprun::worker::Runtime& rt);
// Loads cuBLAS (at run time: tools/cublas_loader.cpp) or throws the line that says what to install.
void require_cublas();
#endif

}  // namespace train
