"""Tables of scripts/bench/bench_multigpu.sh: reads its raw directory and prints markdown to stdout and
to --out (multigpu.md). Every section says "not measured" with the failing step's name when its
inputs are missing, so a partial run still gives a report.
  python3 scripts/bench/bench_multigpu_report.py --raw OUT/multigpu-raw --out OUT/multigpu.md
  python3 scripts/bench/bench_multigpu_report.py --selftest [--out F]   (fake inputs in a temp dir; no GPU)
Raw layout (written by bench_multigpu.sh):
  steps.txt                       STEP <name> rc=<rc> secs=<s>
  info/machine.txt                nproc, nvidia-smi, topo -m, versions (verbatim)
  info/versions.txt               key=value (ngpu, gpus, nccl_lib, torch, torch_nccl, driver, ...)
  correct/params.txt              key=value (width, depth, batch, steps, ngpu, seed, samples)
  correct/<run>/{run.log,ck/}     runs init, {ref1,ngpu,control}_{fp32,bf16}, killed_bf16
  allreduce/ours_raw.txt          RESULT lines of ddprun_allreduce_bench
  allreduce/torch.txt             RESULT lines of bench_multigpu_allreduce.py
  ddp/<model>.<impl>.<n>.<mode>.log   avg_step_ms=... (impl ours|torch, mode overlap|nooverlap)
  launch/runs.jsonl               bench_multigpu_launch.py
Checkpoints are read in ddprun's format (worker_runtime/README.md): magic DDPRCKP1, u32 version,
u32 sections, u64 payload length, sections (u32 name length, name, u64 data length, data).
"""
import argparse
import glob
import json
import math
import os
import re
import statistics
import struct
import sys
import tempfile

# Targets of the multi-GPU benchmark.
H200_BUSBW = 370.0          # GB/s, ~NVLink busbw of 8 H200 in nccl-tests
GOAL_BUSBW_FRAC = 0.90      # at >= 64 MB: ours >= 90% of ~370 GB/s busbw ...
GOAL_VS_TORCH_BW = 0.98     # ... and >= 0.98 of PyTorch's
GOAL_SMALL_LAT = 0.70       # at <= 64 KB: ours' time per op <= 0.7 of PyTorch's
# DDP-invariant tolerances (n GPUs x batch B vs 1 GPU x batch nB, same samples per step), on
# ||p_n - p_1||_2 / ||p_1 - p_0||_2 = the fraction of the training update that differs, and on
# the relative difference of the MSE of the final parameters over the first 2048 samples.
TOL = {"fp32": {"update": 1e-3, "loss": 1e-3}, "bf16": {"update": 1e-2, "loss": 1e-2}}
# ... and (n > 1) at most this fraction of the control's ||p_c - p_1|| / ||p_1 - p_0||, the control
# being 1 GPU at the per-rank batch (what one rank alone would do). On CPU (Gloo, 64x2, 4 ranks)
# the n-rank run was 8e-9 of the update away and the control 9e-3: the control is small because
# the mean gradient dominates a short run, so a fixed bf16 tolerance alone would not catch
# ranks that never exchange their gradients.
CONTROL_FRAC = 0.1

M64 = (1 << 64) - 1


# ---------------------------------------------------------------- parsing helpers
def kv_file(path):
    d = {}
    try:
        with open(path) as f:
            for line in f:
                if "=" in line:
                    k, _, v = line.rstrip("\n").partition("=")
                    d[k.strip()] = v.strip()
    except FileNotFoundError:
        pass
    return d


def read(path, default=""):
    try:
        with open(path, errors="replace") as f:
            return f.read()
    except FileNotFoundError:
        return default


def steps_status(raw):
    st = {}
    for line in read(os.path.join(raw, "steps.txt")).splitlines():
        m = re.match(r"STEP (\S+) rc=(\S+) secs=(\S+)", line)
        if m:
            st[m.group(1)] = (m.group(2), m.group(3))
    return st


def result_lines(path):
    rows = []
    for line in read(path).splitlines():
        if line.startswith("RESULT "):
            d = dict(kv.split("=", 1) for kv in line.split()[1:] if "=" in kv)
            try:
                rows.append(dict(impl=d["impl"], dtype=d["dtype"], bytes=int(d["bytes"]), us=float(d["us"]),
                                 algbw=float(d["algbw"]), busbw=float(d["busbw"]), iters=int(d.get("iters", 0))))
            except (KeyError, ValueError):
                pass
    return rows


def check_lines(path):
    return [l[len("CHECK "):] for l in read(path).splitlines() if l.startswith("CHECK ")]


def grep1(text, rx):
    m = None
    for m in re.finditer(rx, text):
        pass
    return m.group(1) if m else None


def fmt_bytes(b):
    for unit, s in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if b >= s and b % s == 0:
            return f"{b // s} {unit}"
    return f"{b} B"


def f(x, nd=2):
    if x is None or (isinstance(x, float) and (math.isnan(x) or math.isinf(x))):
        return "—"
    return f"{x:.{nd}f}"


def missing(what, step, st):
    rc = st.get(step, ("not run", ""))[0]
    return f"_not measured: {what} (step `{step}`: {'rc=' + rc if rc != 'not run' else 'not run'}; see the logs under the raw directory)_\n"


# ---------------------------------------------------------------- checkpoints and the model
def read_checkpoint(path):
    with open(path, "rb") as fh:
        b = fh.read()
    if b[:8] != b"DDPRCKP1" or b[-8:] != b"DDPREND1":
        raise ValueError(f"{path}: not a ddprun checkpoint")
    _version, count, plen = struct.unpack_from("<IIQ", b, 8)
    off, secs = 24, {}
    for _ in range(count):
        (nl,) = struct.unpack_from("<I", b, off)
        name = b[off + 4:off + 4 + nl].decode()
        off += 4 + nl
        (dl,) = struct.unpack_from("<Q", b, off)
        secs[name] = b[off + 8:off + 8 + dl]
        off += 8 + dl
    if off != 24 + plen:
        raise ValueError(f"{path}: payload length mismatch")
    return secs


def latest_params(ckdir):
    files = sorted(glob.glob(os.path.join(ckdir, "ckpt-*.ddpck")))
    if not files:
        return None, None
    step = int(re.search(r"ckpt-(\d+)", os.path.basename(files[-1])).group(1))
    return step, as_vec(read_checkpoint(files[-1])["params"])


def as_vec(b):
    """float32 little-endian bytes -> a float64 vector: numpy or torch when importable, else a tuple."""
    try:
        import numpy as np
        return np.frombuffer(b, dtype="<f4").astype(np.float64)
    except ImportError:
        pass
    try:
        import torch
        return torch.frombuffer(bytearray(b), dtype=torch.float32).to(torch.float64)
    except ImportError:
        return struct.unpack(f"<{len(b) // 4}f", b)


def splitmix64(x):
    x = (x + 0x9E3779B97F4A7C15) & M64
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & M64
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & M64
    return x ^ (x >> 31)


def f32(v):
    return struct.unpack("<f", struct.pack("<f", v))[0]


def make_sample(seed, i, n_in):
    """train_common.h's make_sample, bit for bit (floats rounded where C++ stores a float)."""
    base = splitmix64(seed ^ 0x5EED)
    x, t = [], 0.0
    for j in range(n_in):
        h = splitmix64((base + i * 1315423911 + j) & M64)
        xj = f32((h >> 40) / 16777216.0 * 2.0 - 1.0)
        x.append(xj)
        w = splitmix64((0xC0FFEE + j) & M64)
        t += ((w >> 40) / 16777216.0 - 0.5) * xj
    return x, f32(t + 0.1 * x[0] * x[1 if n_in > 1 else 0])


def mlp_loss(params, n_in, width, depth, seed, n_samples):
    """MSE of the MLP (Linear layers, weights [out][in] then bias, ReLU between) over samples
    0..n_samples-1, in float64 (numpy); None without numpy."""
    xs, ys = zip(*(make_sample(seed, i, n_in) for i in range(n_samples)))
    dims = [n_in, width] + [width] * depth + [1]
    try:
        import numpy as np
        P = np.asarray(params, dtype=np.float64)
        h, off = np.asarray(xs, dtype=np.float64), 0
        for l in range(len(dims) - 1):
            W = P[off:off + dims[l + 1] * dims[l]].reshape(dims[l + 1], dims[l]); off += dims[l + 1] * dims[l]
            b = P[off:off + dims[l + 1]]; off += dims[l + 1]
            h = h @ W.T + b
            if l + 2 < len(dims):
                h = np.maximum(h, 0)
        return float(((h[:, 0] - np.asarray(ys)) ** 2).mean())
    except ImportError:
        return None


def l2(a, b=None):
    """||a - b||_2 (||a|| without b) for the vectors of as_vec()."""
    if not isinstance(a, tuple):
        d = a if b is None else a - b
        return float((d * d).sum()) ** 0.5
    if b is None:
        return math.sqrt(sum(x * x for x in a))
    return math.sqrt(sum((x - y) * (x - y) for x, y in zip(a, b)))


def maxabs(a, b):
    if not isinstance(a, tuple):
        return float(abs(a - b).max())
    return max(abs(x - y) for x, y in zip(a, b))


# ---------------------------------------------------------------- sections
def sec_machine(raw, st):
    v = kv_file(os.path.join(raw, "info", "versions.txt"))
    out = ["## Machine\n"]
    if v:
        out.append("| what | value |\n|---|---|")
        for k in ("date", "host", "nproc", "ngpu", "gpus", "driver", "nccl_lib", "torch", "torch_nccl", "cuda_runtime",
                  "bin", "env"):
            if k in v:
                out.append(f"| {k} | {v[k]} |")
        out.append("")
    m = read(os.path.join(raw, "info", "machine.txt"))
    if m:
        out.append("```\n" + m.rstrip() + "\n```\n")
    if not v and not m:
        out.append(missing("machine information", "info", st))
    return "\n".join(out)


def sec_correct(raw, st):
    out = ["## Correctness\n"]
    p = kv_file(os.path.join(raw, "correct", "params.txt"))
    if not p:
        return "\n".join(out + [missing("DDP invariant and resume", "correct", st)])
    n = int(p.get("ngpu", 1))
    width, depth, seed, n_in = int(p["width"]), int(p["depth"]), int(p.get("seed", 0)), 10
    B, steps = int(p["batch"]), int(p["steps"])
    out.append(f"`train` {width}x{depth} hidden, momentum 0.9, {steps} steps; n = {n} GPUs at batch {B}/rank vs 1 GPU "
               f"at batch {B * n} over the same samples per step (DistributedSampler: the union of the ranks' batch s "
               f"is the 1-rank batch s). Metric: ||p_n - p_1|| / ||p_1 - p_0|| (the fraction of the training update "
               f"that differs; p_0 = the initial parameters, from a `--lr 0` run) and max |p_n - p_1|; loss = MSE of the "
               f"final parameters over samples 0..{min(2048, int(p.get('samples', 2048))) - 1} in float64 (computed here "
               f"from the checkpoints).\n")
    ck = lambda name: os.path.join(raw, "correct", name, "ck")
    _, p0 = latest_params(ck("init"))
    nsamp = min(2048, int(p.get("samples", 2048)))
    rows = ["| check | precision | runs | ‖Δ‖/‖update‖ | max abs Δ | loss 1 GPU | loss n GPU | loss rel Δ | tolerance | result |",
            "|---|---|---|---:|---:|---:|---:|---:|---|---|"]
    for prec in ("fp32", "bf16"):
        s1, p1 = latest_params(ck(f"ref1_{prec}"))
        sn, pn = latest_params(ck(f"ngpu_{prec}"))
        if p1 is None or pn is None or p0 is None or len(p1) != len(pn):
            rows.append(f"| DDP invariant | {prec} | — | | | | | | | not measured (step `correct`, run ref1_{prec}/ngpu_{prec}/init) |")
            continue
        upd = l2(p1, p0)
        rel = l2(pn, p1) / upd if upd > 0 else float("nan")
        mx = maxabs(pn, p1)
        L1, Ln = mlp_loss(p1, n_in, width, depth, seed, nsamp), mlp_loss(pn, n_in, width, depth, seed, nsamp)
        lrel = abs(Ln - L1) / L1 if (L1 and Ln is not None) else None
        tol = TOL[prec]
        # The control: 1 GPU at the per-rank batch only (the update without the other ranks'
        # gradients). The n-GPU run must be well inside it: at most CONTROL_FRAC of its distance.
        sc, pc = latest_params(ck(f"control_{prec}")) if n > 1 else (None, None)
        rc = l2(pc, p1) / upd if (pc is not None and len(pc) == len(p1) and upd > 0) else None
        ok = rel <= tol["update"] and (lrel is None or lrel <= tol["loss"]) and s1 == sn
        if rc is not None:
            ok = ok and rel <= CONTROL_FRAC * rc
        tol_s = f"≤ {tol['update']:.0e}" + (f" and ≤ {CONTROL_FRAC} × control" if rc is not None else "") + f" / ≤ {tol['loss']:.0e}"
        rows.append(f"| DDP invariant | {prec} | 1x{B * n} vs {n}x{B}, step {sn} | {rel:.2e} | {mx:.2e} | {f(L1, 6)} | "
                    f"{f(Ln, 6)} | {(f'{lrel:.2e}' if lrel is not None else '—')} | {tol_s} "
                    f"| {'**ok**' if ok else '**FAILED**'} |")
        if rc is not None:
            Lc = mlp_loss(pc, n_in, width, depth, seed, nsamp)
            rows.append(f"| control: 1 GPU at batch {B} only | {prec} | vs 1x{B * n}, step {sc} | {rc:.2e} | "
                        f"{maxabs(pc, p1):.2e} | | {f(Lc, 6)} | {(f'{abs(Lc - L1) / L1:.2e}' if (Lc is not None and L1) else '—')} "
                        f"| (no other ranks' gradients: the size of a real error) | — |")
    out.append("\n".join(rows) + "\n")
    # resume
    clean = read(os.path.join(raw, "correct", "ngpu_bf16", "run.log"))
    killed = read(os.path.join(raw, "correct", "killed_bf16", "run.log"))
    want = grep1(clean, r"final_param_checksum=([0-9a-f]+)")
    got = grep1(killed, r"final_param_checksum=([0-9a-f]+)")
    kills = len(re.findall(r"injected fault", killed))
    resumed = re.findall(r"resumed from step (\d+)", killed)
    if want and got:
        same = want == got
        line = (f"Kill and resume (bf16, n = {n}, `ddprun --max_restarts=2`, checkpoints every {p.get('ckpt_every', '?')} "
                f"steps, rank {n - 1} SIGKILLed {kills}x (`--fail-at-step {p.get('fail_steps', '?')}`), resumed from "
                f"steps {', '.join(resumed) or '—'}): uninterrupted `{want}`, killed+resumed `{got}` — ")
        if same:
            line += "**bit-identical**.\n"
        else:
            _, pa = latest_params(ck("ngpu_bf16"))
            _, pb = latest_params(ck("killed_bf16"))
            if pa is not None and pb is not None and len(pa) == len(pb) and p0 is not None:
                line += (f"**differ**: ‖Δ‖/‖update‖ = {l2(pa, pb) / l2(pa, p0):.2e}, max abs Δ = "
                         f"{maxabs(pa, pb):.2e} (bit-identity was expected: same world size, "
                         f"same NCCL configuration).\n")
            else:
                line += "**differ** (no checkpoints to measure by how much).\n"
        out.append(line)
    else:
        out.append(missing("kill and resume (no final checksum in the clean or the killed run)", "correct", st))
    return "\n".join(out)


def sec_allreduce(raw, st):
    out = ["## All-reduce sweep\n"]
    ours = result_lines(os.path.join(raw, "allreduce", "ours_raw.txt"))
    torch_rows = result_lines(os.path.join(raw, "allreduce", "torch.txt"))
    n = int(kv_file(os.path.join(raw, "info", "versions.txt")).get("ngpu", "0") or 0)
    checks = check_lines(os.path.join(raw, "allreduce", "ours_raw.txt")) + check_lines(os.path.join(raw, "allreduce", "torch.txt"))
    if not ours and not torch_rows:
        return "\n".join(out + [missing("all-reduce sweep, ours and raw", "allreduce_ours", st),
                                 missing("all-reduce sweep, PyTorch", "allreduce_torch", st)])
    if not ours:
        out.append(missing("ours/raw rows", "allreduce_ours", st))
    if not torch_rows:
        out.append(missing("PyTorch rows", "allreduce_torch", st))
    out.append(f"In place, sum, n = {n}; time per op = max over ranks of (CUDA-event time of `iters` back-to-back ops) "
               f"/ iters after warm-up; algbw = bytes / time, busbw = algbw · 2(n-1)/n (GB/s = 1e9 B/s; "
               f"busbw is 0 for n = 1 by definition). Sum checks: {', '.join(checks) if checks else '—'}.\n")
    idx = {}
    for r in ours + torch_rows:
        idx[(r["impl"], r["dtype"], r["bytes"])] = r
    summary = []
    for dt in ("fp32", "bf16"):
        sizes = sorted({b for (i, d, b) in idx if d == dt})
        if not sizes:
            continue
        out.append(f"### {dt}\n")
        out.append("| size | iters | ours µs | raw µs | torch µs | ours busbw | raw busbw | torch busbw | ours/torch time | ours/raw time |")
        out.append("|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
        big, small = [], []
        for b in sizes:
            o, r, t = (idx.get((i, dt, b)) for i in ("ours", "raw", "torch"))
            g = lambda x, k: x[k] if x else None
            ot = (o["us"] / t["us"]) if (o and t) else None
            orr = (o["us"] / r["us"]) if (o and r) else None
            it = (o or r or t)["iters"]
            out.append(f"| {fmt_bytes(b)} | {it} | {f(g(o, 'us'))} | {f(g(r, 'us'))} | {f(g(t, 'us'))} | {f(g(o, 'busbw'), 1)} | "
                       f"{f(g(r, 'busbw'), 1)} | {f(g(t, 'busbw'), 1)} | {f(ot, 3)} | {f(orr, 3)} |")
            if b >= 64 << 20 and o:
                big.append((b, o, t))
            if b <= 64 << 10 and o and t:
                small.append((b, o["us"] / t["us"]))
        out.append("")
        if big:
            worst_bw = min(x[1]["busbw"] for x in big)
            # busbw ratio = torch time / ours time (same bytes, same n): defined for n = 1 too
            vs = [x[2]["us"] / x[1]["us"] for x in big if x[2] and x[1]["us"] > 0]
            goal_bw = GOAL_BUSBW_FRAC * H200_BUSBW
            summary.append(f"| {dt} | ≥ 64 MiB: min ours busbw | {worst_bw:.1f} GB/s | ≥ {goal_bw:.0f} GB/s (90% of ~{H200_BUSBW:.0f}) | "
                           f"{'ok' if worst_bw >= goal_bw else ('n/a (n = 1: busbw is 0)' if n <= 1 else 'missed')} |")
            if vs:
                summary.append(f"| {dt} | ≥ 64 MiB: min ours/torch bandwidth (torch time / ours time) | {min(vs):.3f} | "
                               f"≥ {GOAL_VS_TORCH_BW} | {'ok' if min(vs) >= GOAL_VS_TORCH_BW else 'missed'} |")
            else:
                summary.append(f"| {dt} | ≥ 64 MiB: ours/torch bandwidth | — | ≥ {GOAL_VS_TORCH_BW} | not measured |")
        if small:
            worst = max(x[1] for x in small)
            summary.append(f"| {dt} | ≤ 64 KiB: max ours/torch time | {worst:.3f} | ≤ {GOAL_SMALL_LAT} | "
                           f"{'ok' if worst <= GOAL_SMALL_LAT else 'missed'} |")
    if summary:
        out.append("Targets:\n\n| dtype | figure | value | target | |\n|---|---|---:|---|---|")
        out += summary
        out.append("")
    return "\n".join(out)


def step_ms(path):
    v = grep1(read(path), r"avg_step_ms=([0-9.]+)")
    return float(v) if v else None


def sec_ddp(raw, st):
    out = ["## DDP step\n"]
    n = int(kv_file(os.path.join(raw, "info", "versions.txt")).get("ngpu", "0") or 0)
    p = kv_file(os.path.join(raw, "ddp", "params.txt"))
    models = [m for m in p.get("models", "").split(",") if m]
    if not models:
        return "\n".join(out + [missing("DDP step", "ddp", st)])
    out.append(f"bf16, per-rank batch fixed (weak scaling), {p.get('steps', '?')} timed steps after {p.get('warmup', '?')} "
               f"warm-up. ours = `train` under ddprun (CUDA-event time per step, rank 0); torch = "
               f"scripts/bench/bench_worker_ddp.py under torchrun (DDP, bucket_cap 25 MB, autocast bf16; wall time per step "
               f"with synchronize). efficiency = t(1 GPU) / t({n} GPUs). overlap fraction = 1 - (t_overlap - t_1) / "
               f"(t_no_overlap - t_1), t_1 = the 1-GPU step standing in for compute only: the share of the exposed "
               f"communication time that overlapping hides (ours: `train --no-overlap`; torch: "
               f"scripts/bench/bench_multigpu_torch_ddp.py, no_sync() + 25 MB bucket all-reduces after backward).\n")
    out.append(f"| model | impl | 1 GPU ms | {n} GPU ms | efficiency | {n} GPU no-overlap ms | overlap fraction | ours/torch ({n} GPU) |")
    out.append("|---|---|---:|---:|---:|---:|---:|---:|")
    for m in models:
        label = p.get(f"label.{m}", m)
        tn = {}
        for impl in ("ours", "torch"):
            t1 = step_ms(os.path.join(raw, "ddp", f"{m}.{impl}.1.overlap.log"))
            tN = t1 if n <= 1 else step_ms(os.path.join(raw, "ddp", f"{m}.{impl}.{n}.overlap.log"))
            tNo = None if n <= 1 else step_ms(os.path.join(raw, "ddp", f"{m}.{impl}.{n}.nooverlap.log"))
            tn[impl] = tN
            eff = (t1 / tN) if (t1 and tN) else None
            ov = None
            if t1 and tN and tNo and tNo - t1 > 1e-3:
                ov = 1 - (tN - t1) / (tNo - t1)
            ratio = (tn["ours"] / tn["torch"]) if impl == "torch" and tn.get("ours") and tn.get("torch") else None
            out.append(f"| {label} | {impl} | {f(t1, 3)} | {f(tN, 3)} | {(f(eff * 100, 1) + '%') if eff else '—'} | {f(tNo, 3)} | "
                       f"{f(ov, 2) if n > 1 else 'n/a (n = 1)'} | {f(ratio, 3) if impl == 'torch' else ''} |")
    out.append("")
    if n <= 1:
        out.append("n = 1: the scaling rows compare 1 GPU with 1 GPU (efficiency 100% by construction) and there is no "
                   "communication to overlap.\n")
    return "\n".join(out)


def sec_launch(raw, st):
    out = ["## Launch and restart\n"]
    runs = []
    for line in read(os.path.join(raw, "launch", "runs.jsonl")).splitlines():
        try:
            runs.append(json.loads(line))
        except ValueError:
            pass
    if not runs:
        return "\n".join(out + [missing("launch and restart", "launch", st)])
    n = runs[0].get("nproc", "?")
    out.append(f"`--nproc_per_node={n} --max_restarts=1`, medians over the ok runs. launch = exec of the launcher → every "
               f"rank past its first collective; restart = SIGKILL of rank {n - 1 if isinstance(n, int) else 'N-1'} after "
               f"its first collective → every rank of attempt 1 past its first collective (py: the driver kills it by "
               f"pid once all ranks wrote their timestamps; train: it kills itself before step 1, `--fail-at-step 1`, and "
               f"\"first collective\" is rank 0's `[train] world=` line, read from the launcher's output). "
               f"torchrun gets `--monitor_interval=0.1`.\n")
    out.append("| launcher | worker | ok runs | launch s | restart s | kill → replacements started s | ratio torchrun/ddprun (launch, restart) |")
    out.append("|---|---|---:|---:|---:|---:|---|")
    med = {}
    errors = []
    for w in ("py", "train"):
        for l in ("ddprun", "torchrun"):
            rs = [r for r in runs if r.get("launcher") == l and r.get("worker") == w]
            if not rs:
                continue
            ok = [r for r in rs if not r.get("error") and "restart_s" in r]
            for r in rs:
                if r.get("error"):
                    errors.append(f"- {l} {w} run {r.get('run')}: {r['error']}" +
                                  (f" — last lines: `{' | '.join(r.get('tail', [])[-3:])[:400]}`" if r.get("tail") else ""))
            g = lambda k: statistics.median([r[k] for r in ok if k in r]) if any(k in r for r in ok) else None
            med[(l, w)] = (g("launch_s"), g("restart_s"))
            ratio = ""
            if l == "torchrun" and ("ddprun", w) in med:
                d, t = med[("ddprun", w)], med[(l, w)]
                ratio = ", ".join(f(t[i] / d[i], 2) + "×" if (t[i] and d[i]) else "—" for i in (0, 1))
            out.append(f"| {l} | {w} | {len(ok)}/{len(rs)} | {f(g('launch_s'), 3)} | {f(g('restart_s'), 3)} | "
                       f"{f(g('restart_started_s'), 3)} | {ratio} |")
    out.append("")
    if errors:
        out.append("Failed runs:\n\n" + "\n".join(errors) + "\n")
    return "\n".join(out)


def sec_steps(raw, st):
    if not st:
        return ""
    rows = ["## Steps\n", "| step | rc | seconds |", "|---|---:|---:|"]
    for k, (rc, secs) in st.items():
        rows.append(f"| {k} | {rc if rc == '0' else '**' + rc + '**'} | {secs} |")
    return "\n".join(rows) + "\n"


def render(raw):
    st = steps_status(raw)
    parts = ["# Multi-GPU benchmark (scripts/bench/bench_multigpu.sh)\n", sec_machine(raw, st), sec_correct(raw, st),
             sec_allreduce(raw, st), sec_ddp(raw, st), sec_launch(raw, st), sec_steps(raw, st)]
    return "\n".join(p for p in parts if p)


# ---------------------------------------------------------------- self-test with fake inputs
def write_ckpt(path, step, params):
    secs = {"params": struct.pack(f"<{len(params)}f", *params), "epoch": struct.pack("<Q", 0)}
    payload = b""
    for name, data in secs.items():
        payload += struct.pack("<I", len(name)) + name.encode() + struct.pack("<Q", len(data)) + data
    blob = b"DDPRCKP1" + struct.pack("<IIQ", 1, len(secs), len(payload)) + payload + struct.pack("<I", 0) + b"DDPREND1"
    os.makedirs(path, exist_ok=True)
    with open(os.path.join(path, f"ckpt-{step:012d}.ddpck"), "wb") as fh:
        fh.write(blob)


def make_fake(raw, n=8):
    import random
    rnd = random.Random(1)
    for d in ("info", "correct", "allreduce", "ddp", "launch"):
        os.makedirs(os.path.join(raw, d), exist_ok=True)
    with open(os.path.join(raw, "steps.txt"), "w") as fh:
        fh.write("STEP info rc=0 secs=2\nSTEP correct rc=0 secs=40\nSTEP allreduce_ours rc=0 secs=20\n"
                 "STEP allreduce_torch rc=0 secs=30\nSTEP ddp rc=0 secs=120\nSTEP launch rc=1 secs=200\n")
    with open(os.path.join(raw, "info", "versions.txt"), "w") as fh:
        fh.write(f"ngpu={n}\nnproc=128\ngpus={n}x NVIDIA H200 (fake)\nnccl_lib=2.27.7\ntorch=2.11.0\ntorch_nccl=2.27.7\n")
    with open(os.path.join(raw, "info", "machine.txt"), "w") as fh:
        fh.write("(fake) nvidia-smi topo -m\n\tGPU0\tGPU1\nGPU0\t X \tNV18\n")
    width, depth, B, steps = 16, 2, 4, 24
    with open(os.path.join(raw, "correct", "params.txt"), "w") as fh:
        fh.write(f"width={width}\ndepth={depth}\nbatch={B}\nsteps={steps}\nngpu={n}\nseed=0\nsamples={B * n * steps}\n"
                 f"ckpt_every=6\nfail_steps=13,19\n")
    npar = 10 * width + width + depth * (width * width + width) + width + 1
    p0 = [rnd.uniform(-0.3, 0.3) for _ in range(npar)]
    p1 = [x + rnd.uniform(-0.01, 0.01) for x in p0]
    write_ckpt(os.path.join(raw, "correct", "init", "ck"), 1, p0)
    for prec, eps in (("fp32", 1e-7), ("bf16", 3e-5)):
        write_ckpt(os.path.join(raw, "correct", f"ref1_{prec}", "ck"), steps, p1)
        write_ckpt(os.path.join(raw, "correct", f"ngpu_{prec}", "ck"), steps, [x + rnd.uniform(-eps, eps) for x in p1])
    for prec in ("fp32", "bf16"):
        write_ckpt(os.path.join(raw, "correct", f"control_{prec}", "ck"), steps, [x + rnd.uniform(-3e-3, 3e-3) for x in p1])
    for name, cs in (("ngpu_bf16", "103380d18196c264"), ("killed_bf16", "103380d18196c264")):
        os.makedirs(os.path.join(raw, "correct", name), exist_ok=True)
        with open(os.path.join(raw, "correct", name, "run.log"), "w") as fh:
            extra = ("[train] rank 7 attempt 0: injected fault (kill) before step 13\n[r0]: [train] resumed from step 12\n"
                     "[train] rank 7 attempt 1: injected fault (kill) before step 19\n[r0]: [train] resumed from step 18\n"
                     if name.startswith("killed") else "")
            fh.write(extra + f"final_step={steps}\nfinal_param_checksum={cs}\n")
    ours, tor = ["INFO nccl_version=22707 world=8 device=NVIDIA H200", "CHECK impl=ours dtype=fp32 count=1048576 ok",
                 "CHECK impl=raw dtype=fp32 count=1048576 ok"], ["CHECK impl=torch dtype=fp32 count=1048576 ok"]
    b = 8
    while b <= 1 << 30:
        for dt in ("fp32", "bf16"):
            if b // (4 if dt == "fp32" else 2) == 0:
                continue
            lat = 9.0 + b / 200e3
            for impl, k, lst in (("ours", 1.0, ours), ("raw", 0.99, ours), ("torch", 1.0 + 20 / lat, tor)):
                us = lat * k
                alg = b / (us * 1e-6) / 1e9
                lst.append(f"RESULT impl={impl} dtype={dt} bytes={b} count={b // 4} iters=10 warmup=2 us={us:.3f} "
                           f"algbw={alg:.3f} busbw={alg * 2 * (n - 1) / n:.3f}")
        b *= 2
    with open(os.path.join(raw, "allreduce", "ours_raw.txt"), "w") as fh:
        fh.write("\n".join(ours) + "\n")
    with open(os.path.join(raw, "allreduce", "torch.txt"), "w") as fh:
        fh.write("\n".join(tor) + "\n")
    with open(os.path.join(raw, "ddp", "params.txt"), "w") as fh:
        fh.write("models=w4096d6,w8192d5\nlabel.w4096d6=4096x6 (100.7 M), b1024\nlabel.w8192d5=8192x5 (335.6 M), b512\n"
                 "steps=30\nwarmup=10\n")
    for m, base in (("w4096d6", 1.9), ("w8192d5", 3.3)):
        for impl, k in (("ours", 1.0), ("torch", 1.6)):
            for nn, mode, extra in ((1, "overlap", 0), (n, "overlap", 0.3), (n, "nooverlap", 1.0)):
                with open(os.path.join(raw, "ddp", f"{m}.{impl}.{nn}.{mode}.log"), "w") as fh:
                    fh.write(f"avg_step_ms={(base + extra) * k:.3f}\n")
    with open(os.path.join(raw, "launch", "runs.jsonl"), "w") as fh:
        for run in range(2):
            for l, w, la, re_ in (("ddprun", "py", 6.0, 5.5), ("torchrun", "py", 9.0, 7.0), ("ddprun", "train", 1.1, 0.9),
                                  ("torchrun", "train", 4.0, 3.0)):
                r = dict(launcher=l, worker=w, run=run, nproc=n, error=None, launch_s=la + run * 0.1, restart_s=re_)
                if w == "py":
                    r["restart_started_s"] = 0.05 if l == "ddprun" else 0.3
                if l == "torchrun" and w == "train" and run == 1:
                    r = dict(launcher=l, worker=w, run=run, nproc=n, error="attempt 1's rank 0 never printed '[train] world='",
                             tail=["CommError: nccl ncclCommInitRankConfig: timed out after 30000 ms"])
                fh.write(json.dumps(r) + "\n")


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--raw", help="the raw directory of bench_multigpu.sh")
    p.add_argument("--out", default="", help="also write the markdown here")
    p.add_argument("--selftest", action="store_true", help="render fake inputs (written to a temp dir)")
    p.add_argument("--ngpu", type=int, default=8, help="GPU count of the fake inputs (--selftest)")
    a = p.parse_args(argv)
    if a.selftest:
        raw = tempfile.mkdtemp(prefix="bench-multigpu-selftest-")
        make_fake(raw, a.ngpu)
    elif a.raw:
        raw = a.raw
    else:
        p.error("need --raw DIR or --selftest")
    md = render(raw)
    print(md)
    if a.out:
        with open(a.out, "w") as fh:
            fh.write(md)
    return 0


if __name__ == "__main__":
    sys.exit(main())
