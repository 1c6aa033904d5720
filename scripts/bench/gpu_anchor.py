#!/usr/bin/env python3
"""One GPU: ddprun's `train` MLP against PyTorch 2.x at its best, on the same work.

For each model (width x depth, batch, precision) it measures, in one run on one GPU:
  * PyTorch eager without DDP, DDP with its defaults, DDP tuned (gradient_as_bucket_view,
    static_graph, fused SGD) and torch.compile without DDP (fused SGD) -- each a fresh model in a
    one-rank NCCL process group, so the DDP rows really bucket and all-reduce;
  * ours: `train` under `ddprun --nproc_per_node=1`, as it runs by default (a one-rank reducer
    issues no collective, like a plain step) and with --force-collective (every bucket goes
    through NCCL, as PyTorch's DDP does at world size 1: the DDP machinery is measured); for
    bf16 also forced with --grad-dtype bf16 (bf16 gradients and all-reduce);
  * a roofline: the step's GEMMs timed alone at the shapes the model runs (cuBLAS through
    torch, same dtype) plus the optimizer's memory traffic at the measured copy bandwidth.

Usage (on the GPU machine, from the repository root):
  python3 scripts/bench/gpu_anchor.py --bin out/bench-bin [--steps 50] [--out report.md]
The PyTorch side runs in this interpreter's torch (2.11 on the H200 machines).
What it does not show: more than one GPU (every collective is a one-rank NCCL all-reduce, a
device copy), or other models than this MLP.
"""
import argparse
import json
import os
import re
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from benchlib import free_port  # noqa: E402

CONFIGS = [  # width, depth, batch, precision
    (8192, 5, 512, "bf16"),
    (4096, 6, 1024, "bf16"),
    (8192, 5, 512, "fp16"),
    (4096, 6, 1024, "fp32"),
]
VARIANTS = ["eager", "ddp", "ddp_tuned", "compile"]


# ---------------------------------------------------------------------------------------------
# PyTorch side (runs in a child process: --torch-worker)
def torch_worker(a):
    import torch
    import torch.distributed as dist
    import torch.nn as nn
    from torch.nn.parallel import DistributedDataParallel as DDP

    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", str(free_port()))
    dist.init_process_group("nccl", rank=0, world_size=1)
    dev = torch.device("cuda", 0)
    torch.cuda.set_device(dev)
    amp = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(a.precision)
    results = {}

    def build():
        torch.manual_seed(0)
        layers = [nn.Linear(10, a.width), nn.ReLU()]
        for _ in range(a.depth):
            layers += [nn.Linear(a.width, a.width), nn.ReLU()]
        layers += [nn.Linear(a.width, 1)]
        return nn.Sequential(*layers).to(dev)

    x = torch.randn(a.batch, 10, device=dev)
    y = torch.randn(a.batch, 1, device=dev)
    loss_fn = nn.MSELoss()
    for variant in a.variants.split(","):
        model = build()
        fused = variant in ("ddp_tuned", "compile")
        if variant == "ddp":
            model = DDP(model, device_ids=[0])
        elif variant == "ddp_tuned":
            model = DDP(model, device_ids=[0], gradient_as_bucket_view=True, static_graph=True)
        elif variant == "compile":
            model = torch.compile(model)
        opt = torch.optim.SGD(model.parameters(), lr=0.01, fused=fused or None)
        scaler = torch.amp.GradScaler("cuda") if a.precision == "fp16" else None

        def step():
            opt.zero_grad(set_to_none=True)
            with torch.autocast(device_type="cuda", dtype=amp, enabled=amp is not None):
                loss = loss_fn(model(x), y)
            if scaler:
                scaler.scale(loss).backward()
                scaler.step(opt)
                scaler.update()
            else:
                loss.backward()
                opt.step()
            return loss

        try:
            for _ in range(a.warmup):
                step()
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            for _ in range(a.steps):
                step()
            torch.cuda.synchronize()
            results[variant] = (time.perf_counter() - t0) * 1000 / a.steps
        except Exception as e:  # report and go on with the other variants
            results[variant] = None
            print(f"variant {variant} failed: {e}", file=sys.stderr)
        del model, opt
        torch.cuda.empty_cache()

    # Roofline parts: the GEMMs of one step, timed alone, and the copy bandwidth.
    dt = amp or torch.float32

    def timed(fn, reps=20):
        for _ in range(3):
            fn()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(reps):
            fn()
        end.record()
        torch.cuda.synchronize()
        return start.elapsed_time(end) / reps

    B, W = a.batch, a.width
    X = torch.randn(B, W, device=dev, dtype=dt)
    Wt = torch.randn(W, W, device=dev, dtype=dt)
    dY = torch.randn(B, W, device=dev, dtype=dt)
    # Per hidden layer: forward Y = X W^T, backward dX = dY W, dW = dY^T X.
    hidden = (timed(lambda: torch.nn.functional.linear(X, Wt)) + timed(lambda: dY @ Wt) +
              timed(lambda: dY.t() @ X))
    X0 = torch.randn(B, 10, device=dev, dtype=dt)
    W0 = torch.randn(W, 10, device=dev, dtype=dt)
    first = timed(lambda: torch.nn.functional.linear(X0, W0)) + timed(lambda: dY.t() @ X0)
    wl = torch.randn(1, W, device=dev, dtype=dt)
    dl = torch.randn(B, 1, device=dev, dtype=dt)
    last = (timed(lambda: torch.nn.functional.linear(X, wl)) + timed(lambda: dl @ wl) +
            timed(lambda: dl.t() @ X))
    gemm_ms = a.depth * hidden + first + last
    n = 256 << 20
    src = torch.empty(n, dtype=torch.uint8, device=dev)
    dst = torch.empty_like(src)
    copy_ms = timed(lambda: dst.copy_(src))
    bw = 2 * n / (copy_ms / 1000)  # bytes read + written per second
    params = 10 * W + W + a.depth * (W * W + W) + W + 1
    # SGD: read the fp32 parameter and gradient, write the parameter; with bf16/fp16 compute
    # also write the low-precision copy the next forward reads.
    opt_bytes = params * (12 + (2 if amp is not None else 0))
    results["roofline"] = {"gemm_ms": gemm_ms, "opt_ms": opt_bytes / bw * 1000, "bw_gbs": bw / 1e9,
                           "params": params,
                           "gemm_tflops": 2 * B * (a.depth * 3 * W * W) / (a.depth * hidden / 1000) / 1e12}
    results["torch"] = torch.__version__
    print("RESULT " + json.dumps(results), flush=True)
    dist.destroy_process_group()


# ---------------------------------------------------------------------------------------------
# Driver
def run_ours(a, cfg, force, extra=()):
    width, depth, batch, prec = cfg
    train = os.path.join(a.bin, "train")
    ddprun = os.path.join(a.bin, "ddprun")
    cmd = [ddprun, "--nproc_per_node=1", f"--master_port={free_port()}", train, "--device", "cuda",
           "--width", str(width), "--depth", str(depth), "--batch", str(batch), "--precision", prec,
           "--samples", str(batch * (a.steps + a.warmup)), "--epochs", "1", "--warmup-steps", str(a.warmup)]
    if force:
        cmd.append("--force-collective")
    cmd += list(extra)
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=a.timeout)
    m = re.findall(r"avg_step_ms=([0-9.]+)", p.stdout + p.stderr)
    if p.returncode != 0 or not m:
        sys.stderr.write(f"ours failed ({' '.join(cmd)}): rc {p.returncode}\n{(p.stdout + p.stderr)[-2000:]}\n")
        return None
    return float(m[-1])


def run_torch(a, cfg):
    width, depth, batch, prec = cfg
    cmd = [sys.executable, os.path.abspath(__file__), "--torch-worker", "--width", str(width), "--depth", str(depth),
           "--batch", str(batch), "--precision", prec, "--steps", str(a.steps), "--warmup", str(a.warmup),
           "--variants", ",".join(VARIANTS)]
    env = dict(os.environ, MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()))
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=a.timeout * 4, env=env)
    for line in p.stdout.splitlines():
        if line.startswith("RESULT "):
            return json.loads(line[7:])
    sys.stderr.write(f"torch side failed: rc {p.returncode}\n{(p.stdout + p.stderr)[-3000:]}\n")
    return None


def fmt(v):
    return "–" if v is None else f"{v:.2f}"


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--torch-worker", action="store_true")
    ap.add_argument("--bin", default="out/bench-bin")
    ap.add_argument("--steps", type=int, default=50)
    ap.add_argument("--warmup", type=int, default=10)
    ap.add_argument("--timeout", type=int, default=180)
    ap.add_argument("--out", default="")
    ap.add_argument("--only", default="", help="indices of CONFIGS to run, e.g. 0,1")
    ap.add_argument("--width", type=int)
    ap.add_argument("--depth", type=int)
    ap.add_argument("--batch", type=int)
    ap.add_argument("--precision")
    ap.add_argument("--variants", default=",".join(VARIANTS))
    a = ap.parse_args()
    if a.torch_worker:
        return torch_worker(a)

    configs = [CONFIGS[int(i)] for i in a.only.split(",")] if a.only else CONFIGS
    head = ("| model | ours | ours, collective forced | forced, bf16 grads | PyTorch eager (no DDP) | DDP default | "
            "DDP tuned | torch.compile (no DDP) | best forced / PyTorch's best | roofline (GEMMs + optimizer) | "
            "best forced: % of roofline |")
    rows = [head, "|" + "---|" * 11]
    raw = []
    for cfg in configs:
        t = run_torch(a, cfg) or {}
        ours = run_ours(a, cfg, False)
        forced = forced_fp32 = run_ours(a, cfg, True)
        forced_bf16 = run_ours(a, cfg, True, ["--grad-dtype", "bf16"]) if cfg[3] == "bf16" else None
        if forced_bf16 is not None and forced is not None:
            forced = min(forced, forced_bf16)  # the ratio and roofline columns take our best
        best = min([t[v] for v in VARIANTS if t.get(v)] or [float("nan")])
        roof = t.get("roofline")
        roof_ms = roof["gemm_ms"] + roof["opt_ms"] if roof else None
        ratio = forced / best if forced and best == best else None
        pct = 100 * roof_ms / forced if forced and roof_ms else None
        width, depth, batch, prec = cfg
        rows.append(f"| {width}x{depth} b{batch} {prec} | {fmt(ours)} | {fmt(forced_fp32)} | {fmt(forced_bf16)} | "
                    f"{fmt(t.get('eager'))} | "
                    f"{fmt(t.get('ddp'))} | {fmt(t.get('ddp_tuned'))} | {fmt(t.get('compile'))} | "
                    f"{'–' if ratio is None else f'{ratio:.2f}x'} | {fmt(roof_ms)} | {'–' if pct is None else f'{pct:.0f}%'} |")
        raw.append({"config": cfg, "torch": t, "ours": ours, "ours_forced": forced_fp32,
                    "ours_forced_bf16_grads": forced_bf16})
        print(rows[-1], flush=True)
    report = "\n".join(["ms per step, one GPU, {} timed steps after {} warm-up".format(a.steps, a.warmup), ""] + rows +
                       ["", "raw: " + json.dumps(raw)])
    print(report)
    if a.out:
        with open(a.out, "w") as f:
            f.write(report + "\n")


if __name__ == "__main__":
    sys.exit(main())
