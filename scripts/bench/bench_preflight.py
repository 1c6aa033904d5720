#!/usr/bin/env python3
"""The cost of ddprun's preflight checks before a launch.

Two figures:
  1. the preflight itself, as `ddprun -v` reports it ("preflight checks took N us (CPU M us)";
     the wall time includes being descheduled on a busy machine, the CPU time does not), over many
     launches: single node (/dev/nvidia*, statvfs(/dev/shm)) and multi-node with a token file
     (adds getaddrinfo of the rendezvous host and a stat; the launch then stops at the 0644 token,
     after the preflight, so no peer is needed);
  2. the whole `ddprun --nproc_per_node=2 --no_python true`, with and without --no_preflight,
     interleaved so drift hits both alike.

    usage: scripts/bench/bench_preflight.py BUILD/launcher/ddprun [--runs 200]
"""
import argparse
import os
import re
import statistics
import subprocess
import tempfile
import time


def preflight_us(ddprun, args, runs):
    out = []
    for _ in range(runs):
        p = subprocess.run([ddprun, "-v"] + args, capture_output=True, text=True)
        m = re.search(r"preflight checks took (\d+) us \(CPU (\d+) us\)", p.stderr)
        if not m:
            raise SystemExit("no preflight timing in ddprun -v's output:\n" + p.stderr)
        out.append((int(m.group(1)), int(m.group(2))))
    return [w for w, _ in out], [c for _, c in out]


def wall_ms(ddprun, runs):
    with_pf, without = [], []
    base = ["--nproc_per_node=2", "--no_python", "true"]
    for _ in range(runs):
        for extra, into in (([], with_pf), (["--no_preflight"], without)):
            t0 = time.perf_counter()
            subprocess.run([ddprun] + extra + base, capture_output=True, check=True)
            into.append((time.perf_counter() - t0) * 1000)
    return with_pf, without


def summary(xs):
    xs = sorted(xs)
    return f"median {statistics.median(xs):.1f}, p95 {xs[int(len(xs) * 0.95) - 1]:.1f}, max {xs[-1]:.1f}"


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("ddprun")
    ap.add_argument("--runs", type=int, default=200)
    a = ap.parse_args()
    single, single_cpu = preflight_us(a.ddprun, ["--nproc_per_node=2", "--no_python", "true"], a.runs)
    with tempfile.TemporaryDirectory() as d:
        token = os.path.join(d, "token")
        with open(token, "w") as f:
            f.write("a-token-of-at-least-sixteen-bytes\n")
        os.chmod(token, 0o644)
        multi, multi_cpu = preflight_us(a.ddprun, ["--nnodes=2", "--rdzv_backend=c10d", "--rdzv_endpoint=localhost:29400",
                                        f"--rdzv_token_file={token}", "--nproc_per_node=2", "--no_python", "true"], a.runs)
    with_pf, without = wall_ms(a.ddprun, a.runs)
    print(f"preflight, single node (us): wall {summary(single)}; CPU {summary(single_cpu)}")
    print(f"preflight, multi-node + token (us): wall {summary(multi)}; CPU {summary(multi_cpu)}")
    print(f"ddprun --nproc_per_node=2 --no_python true (ms): with preflight {summary(with_pf)}; "
          f"--no_preflight {summary(without)}")


if __name__ == "__main__":
    main()
