#!/usr/bin/env python3
"""The same LibTorch model under ddprun's DDP for LibTorch and under PyTorch's Python DDP
(same wheel, so the same kernels: only DDP differs), CPU, N ranks, plus each side's step
without DDP (same processes and concurrency, no wrapper, no communication), so DDP's own
overhead = step - no-DDP step can be compared.

  .venv-torch2/bin/python scripts/bench/bench_torch_ddp.py [--build build] [--ranks 2] [--reps 3]

PyTorch side, tuned: gradient_as_bucket_view=True, static_graph=True (valid: every parameter
is used every step), broadcast_buffers=True (as ours), gradients zeroed in place (they stay
bucket views) unless --zero-grad none. Both sides: torch.set_num_threads(--threads), the CNN of
worker_runtime/torch/examples/cnn_ddp.cpp with batch norm and a deeper MLP head (--model).
Goals (issue #10): step <= 0.9x PyTorch's, DDP overhead <= 0.5x PyTorch's.
Prints one line per run and a summary; medians over --reps repetitions (interleaved).
"""
import argparse
import os
import re
import statistics
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
REF = os.path.join(ROOT, "tests", "worker_runtime", "torch", "ddp_reference.py")


def step_ms(out, key):
    v = [float(x) for x in re.findall(key + r"=([0-9.]+)", out)]
    if not v:
        print(out)
        raise SystemExit(f"no {key} in the output")
    return statistics.mean(v)  # mean over ranks


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--build", default=os.path.join(ROOT, "build"))
    ap.add_argument("--python", default=sys.executable, help="python with torch 2.11")
    ap.add_argument("--ranks", type=int, default=2)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--launcher", choices=["torchrun", "ddprun"], default="torchrun",
                    help="launcher of our side (PyTorch's side always runs under torchrun). Default torchrun: it "
                         "starts each worker in a session of its own, which under the kernel's autogroup "
                         "scheduling gives it a CPU share of its own on a loaded machine; ddprun keeps workers in "
                         "the caller's session, so on a shared box the launchers, not DDP, would differ")
    ap.add_argument("--zero-grad", choices=["inplace", "none"], default="inplace")
    ap.add_argument("--model", default="--channels 32 --hidden 1024 --depth 3 --image 16 --batch 32 --samples 4096",
                    help="model and batch flags shared by both sides")
    a = ap.parse_args()

    example = os.path.join(a.build, "worker_runtime", "torch", "ddprun-torch-example")
    ddprun = os.path.join(a.build, "launcher", "ddprun")
    for f in (example, ddprun):
        if not os.path.exists(f):
            raise SystemExit(f"missing {f}: build the targets ddprun and ddprun-torch-example first")
    zg = "1" if a.zero_grad == "none" else "0"
    common = a.model.split() + ["--steps", str(a.steps), "--warmup", str(a.warmup), "--threads", str(a.threads),
                                "--unused-mode", "none", "--find-unused", "0", "--optimizer-zero-grad", zg, "--time"]
    torchrun = [a.python, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={a.ranks}"]
    if a.launcher == "ddprun":
        ours = [ddprun, f"--nproc_per_node={a.ranks}", "--master_port=0", example, "--shuffle", "0", *common]
    else:
        ours = [*torchrun, "--no-python", example, "--shuffle", "0", *common]
    theirs = [*torchrun, REF, *common]
    runs = {
        "ours_ddp": ours,
        "ours_noddp": ours + ["--no-ddp"],
        "torch_ddp": theirs + ["--static-graph"],
        "torch_noddp": theirs + ["--no-ddp"],
    }
    env = dict(os.environ, OMP_NUM_THREADS=str(a.threads))
    got = {k: [] for k in runs}
    cpu = {k: [] for k in runs}
    for rep in range(a.reps):
        for name, cmd in runs.items():
            p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env, timeout=900)
            if p.returncode != 0:
                print(p.stdout)
                raise SystemExit(f"{name} failed ({p.returncode})")
            ms, cms = step_ms(p.stdout, "step_ms"), step_ms(p.stdout, "cpu_ms")
            got[name].append(ms)
            cpu[name].append(cms)
            print(f"rep {rep} {name:12s} {ms:8.3f} ms/step wall {cms:8.3f} ms/step CPU", flush=True)
    print()
    print(f"ranks {a.ranks}, threads/rank {a.threads}, zero_grad {a.zero_grad}, our launcher {a.launcher}, "
          f"model: {a.model}")
    # Wall: what a user waits for. Process CPU time (all threads, per rank): what the step
    # computes, blind to waiting but far less sensitive to other load on a shared machine.
    for label, table in (("wall", got), ("CPU", cpu)):
        med = {k: statistics.median(v) for k, v in table.items()}
        ov_ours = med["ours_ddp"] - med["ours_noddp"]
        ov_torch = med["torch_ddp"] - med["torch_noddp"]
        print(f"-- {label} time per step (median of {a.reps})")
        print(f"{'':14s}{'DDP step':>12s}{'no-DDP step':>14s}{'DDP overhead':>14s}")
        print(f"{'ours':14s}{med['ours_ddp']:10.3f}ms{med['ours_noddp']:12.3f}ms{ov_ours:12.3f}ms")
        print(f"{'PyTorch DDP':14s}{med['torch_ddp']:10.3f}ms{med['torch_noddp']:12.3f}ms{ov_torch:12.3f}ms")
        print(f"step ratio ours/PyTorch: {med['ours_ddp'] / med['torch_ddp']:.3f} (goal <= 0.9)")
        if ov_torch > 0:
            print(f"overhead ratio ours/PyTorch: {ov_ours / ov_torch:.3f} (goal <= 0.5)")
        else:
            print("overhead ratio: undefined (PyTorch's DDP step was not slower than its no-DDP step here)")


if __name__ == "__main__":
    main()
