// train's command line: every flag fills a field of Options.
#include "train_flags.h"

#include <CLI/CLI.hpp>

namespace train {

void add_flags(CLI::App& app, Options& o) {
  app.add_option("--width", o.width, "hidden width")->check(CLI::PositiveNumber);
  app.add_option("--depth", o.depth, "hidden width x width layers (0 = one hidden layer)")
      ->check(CLI::NonNegativeNumber);
  app.add_option("--in-features", o.in, "input features")->check(CLI::PositiveNumber);
  app.add_option("--samples", o.samples, "dataset size")->check(CLI::PositiveNumber);
  app.add_option("--batch", o.batch, "batch size per rank")->check(CLI::PositiveNumber);
  app.add_option("--epochs", o.epochs, "epochs")->check(CLI::NonNegativeNumber);
  app.add_option("--lr", o.lr, "SGD learning rate");
  app.add_option("--momentum", o.momentum, "SGD momentum");
  app.add_option("--precision", o.precision, "fp32 | bf16 | fp16 (bf16/fp16 on CUDA)")
      ->check(CLI::IsMember({"fp32", "bf16", "fp16"}));
  app.add_option("--device", o.device, "cpu | cuda | auto")->check(CLI::IsMember({"cpu", "cuda", "auto"}));
  app.add_option("--threads", o.threads, "CPU threads per rank for the GEMMs (results identical for any count)")
      ->check(CLI::PositiveNumber);
  app.add_option("--gemm", o.gemm, "CPU GEMM: auto (openblas when built with it) | openblas | builtin (our kernels)")
      ->check(CLI::IsMember({"auto", "openblas", "builtin"}));
  app.add_option("--seed", o.seed, "seed of init, data and shuffles");
  app.add_option("--checkpoint-dir", o.checkpoint_dir, "directory of checkpoints (resume from the newest valid one)");
  app.add_option("--checkpoint-every", o.checkpoint_every, "steps between checkpoints (0 = every epoch)");
  app.add_option("--keep-checkpoints", o.keep_checkpoints, "checkpoints kept (0 = all)");
  app.add_option("--fail-at-step", o.fail_at_step, "inject a fault before these global steps (i-th on attempt i)")
      ->delimiter(',');
  app.add_option("--fail-rank", o.fail_rank, "rank that fails (or hangs)");
  app.add_option("--hang-at-step", o.hang_at_step,
                 "tests: --fail-rank sleeps for ever before this global step, on attempt 0 (or --fail-attempt)");
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
  app.add_option("--grad-dtype", o.grad_dtype,
                 "fp32 | bf16 (with --precision bf16 on CUDA: bf16 gradients and all-reduce)")
      ->check(CLI::IsMember({"fp32", "bf16"}));
  app.add_flag("--profile", o.profile,
               "also print the per-phase timings of every rank (phase_ms), the overlap of the all-reduce with "
               "backward and the run's internals (state placement, GEMM, buckets); off: loss and throughput only");
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
}

}  // namespace train
