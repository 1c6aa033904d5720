#!/usr/bin/env python3
"""The same LibTorch model under ddprun's DDP for LibTorch and under PyTorch's Python DDP
(same wheel, so the same kernels: only DDP differs), plus each side's step without DDP (same
processes and concurrency, no wrapper, no communication), so DDP's own overhead = step -
no-DDP step can be compared.

  CPU, N ranks (Gloo / shared memory against Gloo):
    .venv-torch2/bin/python scripts/bench/bench_torch_ddp.py [--build build] [--ranks 2] [--reps 3]
  GPU, 1 rank on one GPU, collective forced (ours: DdpOptions::force_collective; PyTorch's DDP
  always all-reduces), NCCL on both sides:
    python3 scripts/bench/bench_torch_ddp.py --device cuda [--reps 3] [--torch-foreach-too]

PyTorch side, tuned: gradient_as_bucket_view=True, static_graph=True (valid: every parameter
is used every step), broadcast_buffers=True (as ours), gradients zeroed in place (they stay
bucket views) unless --zero-grad none; on the GPU device_ids=[local rank]. SGD with momentum
one parameter at a time (foreach=False: the kernels of LibTorch's C++ SGD, which has no
multi-tensor path); --torch-foreach-too adds PyTorch with its CUDA default (foreach) for
reference. Both sides: torch.set_num_threads(--threads), the CNN of
worker_runtime/torch/tools/cnn_ddp.cpp with batch norm and an MLP head (--model; the GPU
default is wider, so a step takes milliseconds). On the GPU every timed step ends (and starts)
with a device synchronisation on both sides.
Targets: step <= 0.9x PyTorch's, DDP overhead <= 0.5x PyTorch's.
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
CPU_MODEL = "--channels 32 --hidden 1024 --depth 3 --image 16 --batch 32 --samples 4096"
# 51 M parameters (204 MB of fp32 gradients, several 25 MiB-capped buckets): an H200 step of about 4 ms.
GPU_MODEL = "--channels 64 --hidden 4096 --depth 4 --image 32 --batch 128 --samples 4096"


def step_ms(out, key):
    v = [float(x) for x in re.findall(key + r"=([0-9.]+)", out)]
    if not v:
        print(out)
        raise SystemExit(f"no {key} in the output")
    return statistics.mean(v)  # mean over ranks


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--build", default=os.path.join(ROOT, "build"))
    ap.add_argument("--example", default="", help="the ddprun-torch-example binary (default: under --build)")
    ap.add_argument("--ddprun", default="", help="the ddprun binary (default: under --build)")
    ap.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    ap.add_argument("--torch-foreach-too", action="store_true",
                    help="also run PyTorch with foreach SGD (its CUDA default; different optimizer kernels)")
    ap.add_argument("--python", default=sys.executable, help="python with torch 2.11")
    ap.add_argument("--ranks", type=int, default=0, help="default: 2 on the CPU, 1 on the GPU")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--timeout", type=int, default=900, help="seconds per run")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--launcher", choices=["torchrun", "ddprun"], default="torchrun",
                    help="launcher of our side (PyTorch's side always runs under torchrun). Default torchrun: it "
                         "starts each worker in a session of its own, which under the kernel's autogroup "
                         "scheduling gives it a CPU share of its own on a loaded machine; ddprun keeps workers in "
                         "the caller's session, so on a shared box the launchers, not DDP, would differ")
    ap.add_argument("--zero-grad", choices=["inplace", "none"], default="inplace")
    ap.add_argument("--model", default="",
                    help="model and batch flags shared by both sides (default: CPU " + CPU_MODEL + "; GPU " +
                         GPU_MODEL + ")")
    a = ap.parse_args()
    gpu = a.device == "cuda"
    a.ranks = a.ranks or (1 if gpu else 2)
    a.model = a.model or (GPU_MODEL if gpu else CPU_MODEL)

    example = a.example or os.path.join(a.build, "worker_runtime", "torch", "ddprun-torch-example")
    ddprun = a.ddprun or os.path.join(a.build, "launcher", "ddprun")
    for f in (example, ddprun):
        if not os.path.exists(f):
            raise SystemExit(f"missing {f}: build the targets ddprun and ddprun-torch-example first")
    zg = "1" if a.zero_grad == "none" else "0"
    common = a.model.split() + ["--steps", str(a.steps), "--warmup", str(a.warmup), "--threads", str(a.threads),
                                "--unused-mode", "none", "--find-unused", "0", "--optimizer-zero-grad", zg, "--time",
                                "--device", a.device]
    # World size 1: PyTorch's DDP still buckets and all-reduces; ours must be told to.
    force = ["--force-collective"] if a.ranks == 1 else []
    torchrun = [a.python, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={a.ranks}"]
    if a.launcher == "ddprun":
        ours = [ddprun, f"--nproc_per_node={a.ranks}", "--master_port=0", example, "--shuffle", "0", *common]
    else:
        ours = [*torchrun, "--no-python", example, "--shuffle", "0", *common]
    theirs = [*torchrun, REF, *common]
    runs = {
        "ours_ddp": ours + force,
        "ours_noddp": ours + ["--no-ddp"],
        "torch_ddp": theirs + ["--static-graph"],
        "torch_noddp": theirs + ["--no-ddp"],
    }
    if a.torch_foreach_too:
        runs["torch_ddp_fe"] = theirs + ["--static-graph", "--foreach", "1"]
        runs["torch_noddp_fe"] = theirs + ["--no-ddp", "--foreach", "1"]
    print("commands:")
    for name, cmd in runs.items():
        print(f"  {name}: {' '.join(cmd)}")
    env = dict(os.environ, OMP_NUM_THREADS=str(a.threads))
    got = {k: [] for k in runs}
    cpu = {k: [] for k in runs}
    for rep in range(a.reps):
        for name, cmd in runs.items():
            p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env, timeout=a.timeout)
            if p.returncode != 0:
                print(p.stdout)
                raise SystemExit(f"{name} failed ({p.returncode})")
            ms, cms = step_ms(p.stdout, "step_ms"), step_ms(p.stdout, "cpu_ms")
            got[name].append(ms)
            cpu[name].append(cms)
            print(f"rep {rep} {name:12s} {ms:8.3f} ms/step wall {cms:8.3f} ms/step CPU", flush=True)
    print()
    print(f"device {a.device}, ranks {a.ranks}, threads/rank {a.threads}, zero_grad {a.zero_grad}, "
          f"our launcher {a.launcher}, collective forced: {bool(force)}, model: {a.model}")
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
        if "torch_ddp_fe" in med:
            ov_fe = med["torch_ddp_fe"] - med["torch_noddp_fe"]
            print(f"{'PyTorch foreach':14s}{med['torch_ddp_fe']:10.3f}ms{med['torch_noddp_fe']:12.3f}ms"
                  f"{ov_fe:12.3f}ms   (other optimizer kernels: reference only)")
        print("all repetitions: " + ", ".join(f"{k}=[{', '.join(f'{x:.3f}' for x in v)}]" for k, v in table.items()))
        print(f"step ratio ours/PyTorch: {med['ours_ddp'] / med['torch_ddp']:.3f} (target <= 0.9)")
        if ov_torch > 0:
            print(f"overhead ratio ours/PyTorch: {ov_ours / ov_torch:.3f} (target <= 0.5)")
        else:
            print("overhead ratio: undefined (PyTorch's DDP step was not slower than its no-DDP step here)")


if __name__ == "__main__":
    main()
