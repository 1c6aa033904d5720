"""torch.distributed.all_reduce sweep (NCCL) for scripts/bench/bench_multigpu.sh, run under torchrun:
the PyTorch side of ddprun_allreduce_bench, with the same method and the same output lines.

In place, SUM, fp32 and bf16, sizes --min-bytes..--max-bytes (x --factor). Per size: a barrier
(a 1-element all_reduce + synchronize), `warmup` ops, then `iters` ops between two CUDA events on
the current stream (all_reduce makes the current stream wait for NCCL's, so the end event
follows the last op); time per op = max over ranks. iters = clamp(4 GiB / bytes, 10, 200),
warmup = clamp(iters // 10, 2, 20) unless --iters/--warmup are given (the C++ tool's rule).
Rank 0 prints `RESULT impl=torch dtype=.. bytes=.. count=.. iters=.. warmup=.. us=.. algbw=..
busbw=..` (GB/s = 1e9 B/s; busbw = algbw * 2(n-1)/n, 0 for n = 1) and the NCCL version.
  torchrun --nproc_per_node=N scripts/bench/bench_multigpu_allreduce.py [--out FILE]
  python3 scripts/bench/bench_multigpu_allreduce.py --plan       (prints the size/iteration plan, no GPU)
  --backend gloo: the same on CPU tensors, timed with perf_counter (tests the script without a GPU)
"""
import argparse
import os
import sys


def iters_for(nbytes, a):
    if a.iters > 0:
        return a.iters
    return max(10, min(200, (4 << 30) // max(nbytes, 1)))


def warmup_for(iters, a):
    return a.warmup if a.warmup >= 0 else max(2, min(20, iters // 10))


def sizes(a):
    s = a.min_bytes
    while s <= a.max_bytes:
        yield s
        s *= a.factor


def result_line(impl, dtype, nbytes, count, iters, warm, us, n):
    algbw = nbytes / (us * 1e-6) / 1e9
    busbw = algbw * (2.0 * (n - 1) / n if n > 1 else 0.0)
    return (f"RESULT impl={impl} dtype={dtype} bytes={nbytes} count={count} iters={iters} warmup={warm} "
            f"us={us:.3f} algbw={algbw:.3f} busbw={busbw:.3f}")


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--dtype", default="fp32,bf16")
    p.add_argument("--min-bytes", type=int, default=8)
    p.add_argument("--max-bytes", type=int, default=1 << 30)
    p.add_argument("--factor", type=int, default=2)
    p.add_argument("--iters", type=int, default=0)
    p.add_argument("--warmup", type=int, default=-1)
    p.add_argument("--out", default="")
    p.add_argument("--backend", default="nccl", choices=["nccl", "gloo"])
    p.add_argument("--plan", action="store_true", help="print the plan (sizes, iterations) and exit; no torch needed")
    a = p.parse_args(argv)
    if a.factor < 2 or a.min_bytes < 1 or a.min_bytes > a.max_bytes:
        p.error("need --factor >= 2 and 1 <= --min-bytes <= --max-bytes")
    dtypes = [d for d in a.dtype.split(",") if d]
    for d in dtypes:
        if d not in ("fp32", "bf16"):
            p.error(f"--dtype: unknown {d!r} (fp32, bf16)")
    if a.plan:
        for s in sizes(a):
            it = iters_for(s, a)
            print(f"PLAN bytes={s} iters={it} warmup={warmup_for(it, a)}")
        return 0

    import torch
    import torch.distributed as dist

    import time
    local = int(os.environ.get("LOCAL_RANK", 0))
    cuda = a.backend == "nccl"
    dev = torch.device("cuda", local) if cuda else torch.device("cpu")
    if cuda:
        torch.cuda.set_device(dev)
        dist.init_process_group("nccl", device_id=dev)
    else:
        dist.init_process_group("gloo")
    sync = (lambda: torch.cuda.synchronize(dev)) if cuda else (lambda: None)
    rank, n = dist.get_rank(), dist.get_world_size()
    tdt = {"fp32": torch.float32, "bf16": torch.bfloat16}
    out = open(a.out, "w") if (a.out and rank == 0) else None

    def emit(line):
        if rank == 0:
            print(line, flush=True)
            if out:
                out.write(line + "\n")
                out.flush()

    v = torch.cuda.nccl.version() if cuda else "none"
    vs = ".".join(str(x) for x in v) if isinstance(v, tuple) else str(v)
    emit(f"INFO torch={torch.__version__} torch_nccl={vs} world={n} "
         f"device={torch.cuda.get_device_name(dev) if cuda else 'cpu'}")
    scratch = torch.zeros(1, device=dev)

    def barrier():
        dist.all_reduce(scratch)
        sync()

    def max_over_ranks(x):
        t = torch.tensor([x], device=dev, dtype=torch.float64)
        dist.all_reduce(t, op=dist.ReduceOp.MAX)
        return float(t.item())

    buf = torch.empty(a.max_bytes, dtype=torch.uint8, device=dev)
    failed = 0
    for d in dtypes:  # the correctness check: rank+1 summed = n(n+1)/2
        t = buf[: min(a.max_bytes, 4 << 20)].view(tdt[d])
        t.fill_(rank + 1)
        dist.all_reduce(t)
        ok = bool((t == n * (n + 1) / 2).all().item())
        bad = max_over_ranks(0.0 if ok else 1.0)
        emit(f"CHECK impl=torch dtype={d} count={t.numel()} {'ok' if bad == 0 else 'FAILED'}")
        failed += bad != 0
    buf.zero_()
    if cuda:
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    for s in sizes(a):
        for d in dtypes:
            esz = 4 if d == "fp32" else 2
            count = s // esz
            if count == 0:
                continue
            t = buf[: count * esz].view(tdt[d])
            iters = iters_for(s, a)
            warm = warmup_for(iters, a)
            barrier()
            for _ in range(warm):
                dist.all_reduce(t)
            barrier()
            if cuda:
                start.record()
                for _ in range(iters):
                    dist.all_reduce(t)
                end.record()
                end.synchronize()
                ms = start.elapsed_time(end)
            else:
                t0 = time.perf_counter()
                for _ in range(iters):
                    dist.all_reduce(t)
                ms = (time.perf_counter() - t0) * 1000.0
            us = max_over_ranks(ms) * 1000.0 / iters
            emit(result_line("torch", d, s, count, iters, warm, us, n))
    if out:
        out.close()
    dist.destroy_process_group()
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
