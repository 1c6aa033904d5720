#!/usr/bin/env python3
"""Launch time of several ddprun builds on one machine, interleaved run by run: the wall time from
posix_spawn of `ddprun ARGS...` to its exit (its workers started, ran and were reaped), without a
shell or /usr/bin/time in between. Prints the median, p10 and p90 of each build, and each median
against the first build's.

  usage: scripts/bench/bench_launch_ab.py [-n RUNS] NAME=PATH [NAME=PATH...] -- ARGS...
  e.g.   scripts/bench/bench_launch_ab.py -n 30 this=build/launcher/ddprun old=/tmp/ddprun-old \\
             -- --nproc_per_node=2 --no_python true

Not a timed test: run it and read it. The first few runs of each build warm the page cache and
are dropped (--warmup)."""
import argparse
import os
import statistics
import sys
import time


def spawn_once(path, args):
    devnull = os.open(os.devnull, os.O_WRONLY)
    try:
        acts = [(os.POSIX_SPAWN_DUP2, devnull, 1), (os.POSIX_SPAWN_DUP2, devnull, 2)]
        t0 = time.perf_counter_ns()
        pid = os.posix_spawn(path, [path, *args], os.environ, file_actions=acts)
        _, status = os.waitpid(pid, 0)
        t1 = time.perf_counter_ns()
    finally:
        os.close(devnull)
    if os.waitstatus_to_exitcode(status) != 0:
        sys.exit(f"{path} {' '.join(args)} exited with {os.waitstatus_to_exitcode(status)}")
    return (t1 - t0) / 1e6


def quantile(xs, q):
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))]


def main():
    argv = sys.argv[1:]
    if "--" not in argv:
        sys.exit(__doc__)
    split = argv.index("--")
    p = argparse.ArgumentParser(usage=__doc__)
    p.add_argument("-n", type=int, default=30)
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("builds", nargs="+", help="NAME=PATH")
    opts = p.parse_args(argv[:split])
    args = argv[split + 1:]
    builds = []
    for b in opts.builds:
        name, _, path = b.partition("=")
        if not path or not os.access(path, os.X_OK):
            sys.exit(f"not an executable: {b!r} (give NAME=PATH)")
        builds.append((name, path))
    walls = {name: [] for name, _ in builds}
    for i in range(opts.warmup + opts.n):
        for name, path in builds:
            ms = spawn_once(path, args)
            if i >= opts.warmup:
                walls[name].append(ms)
    first = statistics.median(walls[builds[0][0]])
    print(f"# launch wall time, `ddprun {' '.join(args)}`, {opts.n} interleaved runs each, {os.cpu_count()} cores")
    print("| build | median (ms) | p10 (ms) | p90 (ms) | median vs " + builds[0][0] + " |")
    print("|---|---:|---:|---:|---:|")
    for name, _ in builds:
        xs = walls[name]
        med = statistics.median(xs)
        print(f"| {name} | {med:.1f} | {quantile(xs, 0.1):.1f} | {quantile(xs, 0.9):.1f} | {med / first:.2f}x |")


if __name__ == "__main__":
    main()
