#!/usr/bin/env python3
"""What --hang_timeout costs (docs/BENCHMARKS.md "Hang watch"):

  tick:   ddprun.progress() (the pure-Python module, on a real progress file) and the worker
          runtime's ddprun::worker::progress() (a small C++ loop compiled here against
          libddprun_worker), ns per call, against an empty Python function call / an empty loop.
  agent:  one ddprun agent running 2 Python workers that tick 1000 times a second each, for
          --agent-seconds, without and with --hang_timeout: the agent's own CPU use, % of a core
          (from /proc/<pid>/stat, resolution one clock tick over the run).

  bench_hang.py --ddprun build/launcher/ddprun --build build [--rounds 3] [--agent-seconds 20]
Rounds alternate the configurations so drift of the machine hits them alike.
"""
import argparse
import os
import subprocess
import sys
import tempfile
import time
import timeit

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.abspath(os.path.join(HERE, "..", ".."))
TICK = os.sysconf("SC_CLK_TCK")
MAGIC = 0x3147525052504444


def cpu_s(pid):
    with open(f"/proc/{pid}/stat") as f:
        rest = f.read().rsplit(")", 1)[1].split()
    return (int(rest[11]) + int(rest[12])) / TICK


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


WORKER = """
import time, ddprun
end = time.monotonic() + {seconds}
while time.monotonic() < end:
    ddprun.progress()
    time.sleep(0.001)
"""


def agent_cpu(ddprun, seconds, hang):
    flags = ["--hang_timeout=60"] if hang else []
    env = dict(os.environ, PYTHONPATH=os.path.join(ROOT, "launcher", "python"))
    env.pop("DDPRUN_PROGRESS_FILE", None)
    p = subprocess.Popen([ddprun, "--nproc_per_node=2", *flags, "--no_python", sys.executable, "-c",
                          WORKER.format(seconds=seconds)], env=env, stdout=subprocess.DEVNULL,
                         stderr=subprocess.DEVNULL)
    time.sleep(0.5)
    c0, t0 = cpu_s(p.pid), time.monotonic()
    time.sleep(seconds - 1.0)
    c1, t1 = cpu_s(p.pid), time.monotonic()
    p.wait()
    return (c1 - c0) / (t1 - t0) * 100


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--ddprun", required=True)
    ap.add_argument("--build", default=os.path.join(ROOT, "build"))
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--agent-seconds", type=float, default=20)
    a = ap.parse_args()
    with tempfile.TemporaryDirectory() as d:
        tick, base = python_tick_ns(d)
        print(f"python ddprun.progress(): {tick:.1f} ns per call (an empty function call: {base:.1f} ns)")
        ctick, count = cpp_tick_ns(d, a.build)
        print(f"C++ ddprun::worker::progress(): {ctick:.2f} ns per call (counter {count})")
    res = {False: [], True: []}
    for r in range(a.rounds):
        for hang in (False, True):
            pct = agent_cpu(a.ddprun, a.agent_seconds, hang)
            res[hang].append(pct)
            print(f"round {r}: agent CPU {'with' if hang else 'without'} --hang_timeout: {pct:.3f} % of a core",
                  flush=True)
    for hang in (False, True):
        v = sorted(res[hang])
        print(f"agent CPU {'with' if hang else 'without'} --hang_timeout, median of {len(v)}: {v[len(v) // 2]:.3f} %")


if __name__ == "__main__":
    main()
