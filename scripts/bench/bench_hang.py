#!/usr/bin/env python3
"""What watching a job costs: --metrics_port and --hang_timeout (docs/BENCHMARKS.md "Observability cost").

  tick:   ddprun.progress() (the pure-Python module, on a real progress file) and the worker
          runtime's ddprun::worker::progress() (a small C++ loop compiled here against
          libddprun_worker), ns per call, against an empty Python function call / an empty loop.
  agent:  one ddprun agent running 2 Python workers that tick 1000 times a second each, for
          --agent-seconds, in four configurations: plain; --metrics_port=<free port> with this
          script fetching /metrics (urllib) every --scrape-interval seconds; --hang_timeout=60;
          both. The agent's own CPU use, % of one core, from /proc/<pid>/task/*/schedstat (ns,
          every thread of the agent, not its workers and not this script's scraper) over the
          run less its first and last half second; /proc/<pid>/stat (10 ms clock ticks) as a check.
  train:  the C++ example `train` (CPU, Gloo) under ddprun with 2 ranks, without and with
          --hang_timeout=60 (libddprun_worker ticks once per synchronised step by itself); each
          run's avg_step_ms (rank 0's summary line, warm-up steps excluded) and the ticks its
          ranks made (read from their progress files while it runs). Steps per run are set
          from a first calibration run so that a run takes about --train-seconds.

Reproduce (what docs/bench/2026-12-03-2core-observe-cost.txt holds):

  python3 scripts/bench/bench_hang.py --ddprun build/launcher/ddprun --build build \\
      --rounds 5 --agent-seconds 15 --train-seconds 10 --scrape-interval 1

Rounds interleave the configurations (agent: the four in turn; train: without, with) so drift
of the machine hits them alike; every figure reported is the median over rounds.

Not shown: a GPU job's NVML sampling (the agent samples NVML every 2 s, only where a driver
loads; the line "NVIDIA driver:" says whether this machine has one), stack dumps on a hang,
scrapes over a network, larger jobs (more ranks per node mean more /proc reads per scrape and
more counters per second). train prints avg_step_ms to 1 µs; a thread of the agent that ended
within the window is missing from the schedstat sum (the stat figure keeps it).
"""
import argparse
import os
import re
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import timeit
import urllib.request

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.abspath(os.path.join(HERE, "..", ".."))
TICK = os.sysconf("SC_CLK_TCK")
MAGIC = 0x3147525052504444
AGENT_CONFIGS = ["plain", "metrics", "hang", "metrics+hang"]
AGENT_LABEL = {
    "plain": "plain",
    "metrics": "--metrics_port, scraped every {iv:g} s",
    "hang": "--hang_timeout=60",
    "metrics+hang": "--metrics_port (scraped every {iv:g} s) + --hang_timeout=60",
}
AGENT_MD = {
    "plain": "plain",
    "metrics": "`--metrics_port`, scraped every {iv:g} s",
    "hang": "`--hang_timeout=60`",
    "metrics+hang": "`--metrics_port` (scraped every {iv:g} s) + `--hang_timeout=60`",
}


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def cpu_ticks_s(pid):
    """utime + stime of the whole process (all its threads), seconds; 1/CLK_TCK resolution."""
    with open(f"/proc/{pid}/stat") as f:
        rest = f.read().rsplit(")", 1)[1].split()
    return (int(rest[11]) + int(rest[12])) / TICK


def cpu_sched_s(pid):
    """Time on CPU of every live thread of the process, seconds (schedstat, ns resolution)."""
    total = 0
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            with open(f"/proc/{pid}/task/{tid}/schedstat") as f:
                total += int(f.read().split()[0])
        except (OSError, ValueError, IndexError):
            pass
    return total / 1e9


def median(v):
    return statistics.median(v) if v else float("nan")


# ---------------------------------------------------------------- tick microbench

def progress_file(d):
    path = os.path.join(d, "progress")
    with open(path, "wb") as f:
        f.write(MAGIC.to_bytes(8, "little") + bytes(4088))
    return path


def python_tick_ns(d, n=2_000_000):
    os.environ["DDPRUN_PROGRESS_FILE"] = progress_file(d)
    sys.path.insert(0, os.path.join(ROOT, "launcher", "python"))
    import ddprun  # noqa: E402

    ddprun.progress()

    def empty():
        pass

    tick = min(timeit.repeat(ddprun.progress, number=n, repeat=5)) / n * 1e9
    base = min(timeit.repeat(empty, number=n, repeat=5)) / n * 1e9
    del os.environ["DDPRUN_PROGRESS_FILE"]
    return tick, base


CPP = r"""
#include <chrono>
#include <cstdio>
#include "ddprun/worker/progress.h"
int main() {
  const long n = 200000000;
  ddprun::worker::progress();
  auto t0 = std::chrono::steady_clock::now();
  for (long i = 0; i < n; ++i) ddprun::worker::progress();
  auto t1 = std::chrono::steady_clock::now();
  std::printf("%.3f %llu\n", std::chrono::duration<double, std::nano>(t1 - t0).count() / n,
              (unsigned long long)ddprun::worker::progress_ticks());
}
"""


def cpp_tick_ns(d, build):
    src = os.path.join(d, "tick.cpp")
    exe = os.path.join(d, "tick")
    with open(src, "w") as f:
        f.write(CPP)
    lib = os.path.join(build, "worker_runtime")
    subprocess.run(["c++", "-O2", "-std=c++20", "-I", os.path.join(ROOT, "worker_runtime", "include"), src, "-o", exe,
                    "-L", lib, "-lddprun_worker", f"-Wl,-rpath,{lib}"], check=True)
    env = dict(os.environ, DDPRUN_PROGRESS_FILE=progress_file(d))
    out = subprocess.run([exe], capture_output=True, text=True, env=env, check=True).stdout.split()
    return float(out[0]), int(out[1])


# ---------------------------------------------------------------- agent CPU

WORKER = """
import time, ddprun
end = time.monotonic() + {seconds}
while time.monotonic() < end:
    ddprun.progress()
    time.sleep(0.001)
"""


def scraper(url, interval, stop, stats):
    nxt = time.monotonic() + interval
    while not stop.wait(max(0.0, nxt - time.monotonic())):
        nxt += interval
        try:
            body = urllib.request.urlopen(url, timeout=5).read()
            stats["ok"] += 1
            stats["bytes"] = len(body)
        except OSError:
            stats["failed"] += 1


def agent_run(ddprun, seconds, config, interval):
    """The agent's own CPU, % of one core: (schedstat, stat ticks, scrape stats)."""
    metrics, hang = "metrics" in config, "hang" in config
    flags = ["--hang_timeout=60"] if hang else []
    port = free_port() if metrics else None
    if metrics:
        flags.append(f"--metrics_port={port}")
    env = dict(os.environ, PYTHONPATH=os.path.join(ROOT, "launcher", "python"))
    env.pop("DDPRUN_PROGRESS_FILE", None)
    p = subprocess.Popen([ddprun, "--nproc_per_node=2", *flags, "--no_python", sys.executable, "-c",
                          WORKER.format(seconds=seconds)], env=env, stdout=subprocess.DEVNULL,
                         stderr=subprocess.DEVNULL)
    stop, stats = threading.Event(), {"ok": 0, "failed": 0, "bytes": 0}
    th = None
    try:
        time.sleep(0.5)
        if metrics:
            th = threading.Thread(target=scraper, args=(f"http://127.0.0.1:{port}/metrics", interval, stop, stats),
                                  daemon=True)
            th.start()
        s0, k0, t0 = cpu_sched_s(p.pid), cpu_ticks_s(p.pid), time.monotonic()
        time.sleep(seconds - 1.0)
        s1, k1, t1 = cpu_sched_s(p.pid), cpu_ticks_s(p.pid), time.monotonic()
    finally:
        stop.set()
        if th:
            th.join()
        p.wait(timeout=60)
    if metrics and stats["ok"] == 0:
        raise RuntimeError(f"no scrape of http://127.0.0.1:{port}/metrics succeeded")
    stats["cpu_us"], stats["window_s"] = (s1 - s0) * 1e6, t1 - t0
    return (s1 - s0) / (t1 - t0) * 100, (k1 - k0) / (t1 - t0) * 100, stats


# ---------------------------------------------------------------- train step time

def children(pid):
    out = []
    try:
        for tid in os.listdir(f"/proc/{pid}/task"):
            with open(f"/proc/{pid}/task/{tid}/children") as f:
                out += [int(c) for c in f.read().split()]
    except OSError:
        pass
    return out


def progress_path(pid):
    try:
        with open(f"/proc/{pid}/environ", "rb") as f:
            for kv in f.read().split(b"\0"):
                if kv.startswith(b"DDPRUN_PROGRESS_FILE="):
                    return kv.split(b"=", 1)[1].decode()
    except OSError:
        pass
    return None


def read_ticks(path):
    try:
        with open(path, "rb") as f:
            b = f.read(16)
        if len(b) == 16 and int.from_bytes(b[:8], "little") == MAGIC:
            return int.from_bytes(b[8:], "little")
    except OSError:
        pass
    return None


def train_run(ddprun, train, hang, steps, a, tmp):
    """avg_step_ms of one run, and the largest tick count seen per progress file."""
    per_epoch = 1000
    epochs = max(1, -(-(steps + a.train_warmup) // per_epoch))
    args = ["--device", "cpu", "--threads", "1", "--width", str(a.train_width), "--depth", str(a.train_depth),
            "--batch", str(a.train_batch), "--samples", str(a.train_batch * 2 * per_epoch),
            "--epochs", str(epochs), "--max-steps", str(steps + a.train_warmup),
            "--warmup-steps", str(a.train_warmup)]
    flags = ["--hang_timeout=60"] if hang else []
    log = os.path.join(tmp, "train.log")
    env = dict(os.environ, OMP_NUM_THREADS="1")
    env.pop("DDPRUN_PROGRESS_FILE", None)
    with open(log, "w") as out:
        p = subprocess.Popen([ddprun, "--nproc_per_node=2", f"--master_port={free_port()}", *flags, train, *args],
                             stdout=out, stderr=subprocess.STDOUT, env=env)
        ticks = {}
        t0 = time.monotonic()
        while p.poll() is None:
            # The ranks' counters, read while they run (the files go with the run dir); the same
            # /proc reads in both configurations, so that this loop disturbs them alike.
            for c in children(p.pid):
                path = progress_path(c)
                if path:
                    n = read_ticks(path)
                    if n is not None:
                        ticks[path] = max(ticks.get(path, 0), n)
            time.sleep(0.5)
        wall = time.monotonic() - t0
    with open(log) as f:
        text = f.read()
    m = re.findall(r"avg_step_ms=([0-9.]+) steps=(\d+)", text)
    if p.returncode != 0 or not m:
        raise RuntimeError(f"train run failed (exit {p.returncode}); the end of its log:\n{text[-3000:]}")
    return float(m[-1][0]), int(m[-1][1]), wall, sorted(ticks.values())


# ---------------------------------------------------------------- main

def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--ddprun", required=True)
    ap.add_argument("--build", default=os.path.join(ROOT, "build"))
    ap.add_argument("--train", help="the train example (default: found under --build)")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--agent-seconds", type=float, default=15)
    ap.add_argument("--scrape-interval", type=float, default=1.0, help="seconds between scrapes (Prometheus: 15)")
    ap.add_argument("--train-seconds", type=float, default=15, help="about this long per train run")
    ap.add_argument("--train-width", type=int, default=50)
    ap.add_argument("--train-depth", type=int, default=0)
    ap.add_argument("--train-batch", type=int, default=20)
    ap.add_argument("--train-warmup", type=int, default=20)
    ap.add_argument("--skip", default="", help="comma list of parts to leave out: tick,agent,train")
    a = ap.parse_args()
    skip = set(filter(None, a.skip.split(",")))
    iv = a.scrape_interval

    cpu = next((l.split(":", 1)[1].strip() for l in open("/proc/cpuinfo") if l.startswith("model name")), "?")
    print(f"machine: {os.cpu_count()} cores ({cpu}), Linux {os.uname().release}, Python {sys.version.split()[0]}; "
          f"NVIDIA driver: {'yes' if shutil.which('nvidia-smi') or os.path.exists('/dev/nvidiactl') else 'none'}")
    print("command: " + " ".join([os.path.relpath(sys.argv[0], ROOT) if os.path.isabs(sys.argv[0]) else sys.argv[0],
                                  *sys.argv[1:]]), flush=True)

    summary = []
    if "tick" not in skip:
        with tempfile.TemporaryDirectory() as d:
            tick, base = python_tick_ns(d)
            print(f"python ddprun.progress(): {tick:.1f} ns per call (an empty function call: {base:.1f} ns)")
            ctick, count = cpp_tick_ns(d, a.build)
            print(f"C++ ddprun::worker::progress(): {ctick:.2f} ns per call (counter {count})", flush=True)
        summary += [("`ddprun.progress()` (Python), per call", f"{tick:.0f} ns (an empty Python function call: {base:.0f} ns)"),
                    ("`ddprun::worker::progress()` (C++), per call", f"{ctick:.1f} ns")]

    agent = {c: [] for c in AGENT_CONFIGS}
    agent_ticks = {c: [] for c in AGENT_CONFIGS}
    train_res = {False: [], True: []}
    train = a.train
    steps = 0
    with tempfile.TemporaryDirectory() as tmp:
        if "train" not in skip:
            if not train:
                cands = [os.path.join(dp, "train") for dp, _, fs in os.walk(os.path.join(a.build, "worker_runtime"))
                         if "train" in fs and os.access(os.path.join(dp, "train"), os.X_OK)]
                if not cands:
                    sys.exit(f"no train under {a.build}/worker_runtime: build it (cmake --build {a.build} --target train)")
                train = sorted(cands, key=len)[0]
            ms, _, wall, _ = train_run(a.ddprun, train, False, 20000, a, tmp)
            steps = max(200, int(a.train_seconds * 1000 / ms))
            print(f"train: {os.path.relpath(train, ROOT)}, width {a.train_width} depth {a.train_depth} batch "
                  f"{a.train_batch}/rank, 2 ranks, 1 thread each; calibration: {ms:.3f} ms/step -> {steps} timed steps "
                  f"(+{a.train_warmup} warm-up) per run", flush=True)
        for r in range(a.rounds):
            if "agent" not in skip:
                for c in AGENT_CONFIGS:
                    pct, pct_ticks, st = agent_run(a.ddprun, a.agent_seconds, c, iv)
                    agent[c].append(pct)
                    agent_ticks[c].append(pct_ticks)
                    scr = f", {st['ok']} scrapes ok ({st['bytes']} bytes), {st['failed']} failed" if "metrics" in c else ""
                    print(f"round {r} agent {AGENT_LABEL[c].format(iv=iv)}: {pct:.4f} % of a core "
                          f"({st['cpu_us']:.0f} us CPU in {st['window_s']:.1f} s; stat ticks: {pct_ticks:.3f} %){scr}",
                          flush=True)
            if "train" not in skip:
                for hang in (False, True):
                    ms, n, wall, ticks = train_run(a.ddprun, train, hang, steps, a, tmp)
                    train_res[hang].append(ms)
                    tk = f", ticks seen per rank {ticks}" if hang else (f", ticks seen {ticks}" if ticks else "")
                    print(f"round {r} train {'with' if hang else 'without'} --hang_timeout: avg_step_ms={ms:.4f} "
                          f"over {n} steps, {wall:.1f} s wall{tk}", flush=True)

    print()
    if "agent" not in skip:
        for c in AGENT_CONFIGS:
            print(f"agent {AGENT_LABEL[c].format(iv=iv)}, median of {len(agent[c])}: {median(agent[c]):.4f} % "
                  f"(stat ticks: {median(agent_ticks[c]):.3f} %)")
            summary.append((f"agent CPU, {AGENT_MD[c].format(iv=iv)}", f"{median(agent[c]):.3f} % of a core"))
    if "train" not in skip:
        w0, w1 = median(train_res[False]), median(train_res[True])
        paired = [b - x for x, b in zip(train_res[False], train_res[True])]
        print(f"train step without --hang_timeout, median of {len(train_res[False])}: {w0:.4f} ms")
        print(f"train step with --hang_timeout=60, median of {len(train_res[True])}: {w1:.4f} ms")
        print(f"difference per step: {(w1 - w0) * 1000:+.1f} us (of medians), {median(paired) * 1000:+.1f} us (median "
              f"of the rounds' differences); per round "
              f"{', '.join(f'{d * 1000:+.1f}' for d in paired)} us; spread without: "
              f"{min(train_res[False]):.4f}-{max(train_res[False]):.4f} ms, with: "
              f"{min(train_res[True]):.4f}-{max(train_res[True]):.4f} ms")
        summary += [("`train` step, 2 ranks, no `--hang_timeout`", f"{w0 * 1000:.1f} µs (median)"),
                    ("`train` step, 2 ranks, `--hang_timeout=60`", f"{w1 * 1000:.1f} µs (median)"),
                    ("difference per step (with − without)",
                     f"{(w1 - w0) * 1000:+.1f} µs of the medians; {median(paired) * 1000:+.1f} µs median of the "
                     f"{len(paired)} paired rounds (range {min(paired) * 1000:+.1f} to {max(paired) * 1000:+.1f})")]
    print("\n| what | cost |\n|---|---:|")
    for k, v in summary:
        print(f"| {k} | {v} |")


if __name__ == "__main__":
    main()
