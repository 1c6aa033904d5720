#!/usr/bin/env python3
"""PyTorch's own TCPStore client as a load generator, for scripts/bench/bench_store.sh.

usage: bench_store_client.py --port P --clients N [--ops get,add,compare_set,wait]
                             [--seconds S] [--tag T]
Forks N client processes (torch imported once, before the fork), each with its own
TCPStore(is_master=False) connection; per op, all start together (store-side barrier) and run a
closed loop for S seconds:
  get = store.get(k) (WAIT+GET on the wire), add = store.add(k, 1),
  compare_set = store.compare_set(k_i, cur, other) (success branch),
  wait = wake-up hop around a ring: client i sets its successor's key of round r (value = the
         CLOCK_MONOTONIC time of the set) and get()s its own (set by its predecessor);
         latency = from that set to this get returning.
Prints one line per op: RESULT op=... clients=N ops=... ops_per_s=... p50_us=... p99_us=...
"""
import argparse
import multiprocessing as mp
import os
import sys
import time
from datetime import timedelta

import torch.distributed as dist


def run_op(store, idx, op, n, tag, start, deadline):
    """One client's closed loop of `op` from `start` to `deadline` (CLOCK_MONOTONIC seconds);
    returns the latency of every operation in ns. `wait` is a ring of the n clients."""
    while time.monotonic() < start:
        pass
    lat = []
    clock = time.perf_counter_ns  # == CLOCK_MONOTONIC on Linux
    if op == "get":
        k = f"{tag}/key"
        while True:
            t0 = clock()
            if t0 * 1e-9 > deadline:
                break
            store.get(k)
            lat.append(clock() - t0)
    elif op == "add":
        k = f"{tag}/ctr"
        while True:
            t0 = clock()
            if t0 * 1e-9 > deadline:
                break
            store.add(k, 1)
            lat.append(clock() - t0)
    elif op == "compare_set":
        k, cur = f"{tag}/cas/{idx}", b"x"
        while True:
            t0 = clock()
            if t0 * 1e-9 > deadline:
                break
            want = b"y" if cur == b"x" else b"x"
            got = store.compare_set(k, cur, want)
            if got != want:
                raise RuntimeError(f"compare_set returned {got!r}, expected {want!r}")
            cur = want
            lat.append(clock() - t0)
    elif op == "wait":
        succ = (idx + 1) % n
        r = 0
        while True:
            if time.monotonic() > deadline:
                # Release a successor blocked on this round or the next one.
                store.set(f"{tag}/w/{r}/{succ}", "stop")
                store.set(f"{tag}/w/{r + 1}/{succ}", "stop")
                break
            store.set(f"{tag}/w/{r}/{succ}", str(clock()))
            v = store.get(f"{tag}/w/{r}/{idx}")
            now = clock()
            if v == b"stop":
                store.set(f"{tag}/w/{r + 1}/{succ}", "stop")
                break
            lat.append(now - int(v))
            r += 1
    else:
        raise ValueError(f"unknown op {op}")
    return lat


def child(idx, args, q):
    store = dist.TCPStore("127.0.0.1", args.port, is_master=False, timeout=timedelta(seconds=60))
    n = args.clients
    t = args.tag
    store.set(f"{t}/key", "v" * 32)
    store.set(f"{t}/cas/{idx}", "x")
    for op in args.ops.split(","):
        # Barrier: the last to arrive publishes the common start time.
        if store.add(f"{t}/{op}/ready", 1) == n:
            store.set(f"{t}/{op}/go", str(time.monotonic() + 0.02))
        start = float(store.get(f"{t}/{op}/go"))
        while time.monotonic() < start:
            pass
        q.put((op, idx, run_op(store, idx, op, n, t, start, start + args.seconds)))


def pct(v, p):
    if not v:
        return 0.0
    v = sorted(v)
    return v[int(p * (len(v) - 1))] / 1000.0


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--clients", type=int, default=1)
    ap.add_argument("--ops", default="get,add,compare_set,wait")
    ap.add_argument("--seconds", type=float, default=2.0)
    ap.add_argument("--tag", default=f"pybench{os.getpid()}")
    args = ap.parse_args()
    ctx = mp.get_context("fork")
    q = ctx.Queue()
    procs = [ctx.Process(target=child, args=(i, args, q), daemon=True) for i in range(args.clients)]
    for p in procs:
        p.start()
    ops = args.ops.split(",")
    results = {op: [] for op in ops}
    counts = {op: 0 for op in ops}
    hang_guard = time.monotonic() + 120 + len(ops) * (args.seconds + 30)
    for _ in range(args.clients * len(ops)):
        left = hang_guard - time.monotonic()
        if left <= 0:
            sys.exit("bench_store_client: clients did not finish in time")
        op, _idx, lat = q.get(timeout=left)
        results[op].extend(lat)
        counts[op] += len(lat)
    for p in procs:
        p.join(timeout=30)
    bad = [p.exitcode for p in procs if p.exitcode != 0]
    for op in ops:
        print(f"RESULT mode=pyops op={op} clients={args.clients} seconds={args.seconds:.2f} ops={counts[op]} "
              f"ops_per_s={counts[op] / args.seconds:.0f} p50_us={pct(results[op], 0.5):.1f} "
              f"p99_us={pct(results[op], 0.99):.1f} failed_clients={len(bad)}", flush=True)
    if bad:
        sys.exit(f"bench_store_client: {len(bad)} client processes failed: {bad[:5]}")


if __name__ == "__main__":
    main()
