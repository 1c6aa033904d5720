#!/usr/bin/env python3
"""What --metrics_port / --metrics-port costs (docs/BENCHMARKS.md "Metrics"), side by side:

  store:  ddprund serving ddprun_store_bench's closed loop of WAIT+GET (16 connections),
          as BASE (a ddprund built without metrics), and NEW without and with --metrics-port
          (scraped every second): WAIT+GET pairs per second and ddprund's CPU time per pair.
  agent:  one ddprun agent running 2 idle workers for --agent-seconds, without and with
          --metrics_port (scraped every --scrape-interval s): the agent's own CPU use, % of a core
          (its resolution: one clock tick, 10 ms, over --agent-seconds; 0 skips this part).

  bench_metrics.py --ddprund NEW --bench STORE_BENCH [--base-ddprund BASE] --ddprun DDPRUN
                   [--rounds 3] [--seconds 10] [--agent-seconds 30] [--scrape-interval 1]
Rounds alternate the configurations so drift of the machine hits them alike.
"""
import argparse
import os
import re
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request

TICK = os.sysconf("SC_CLK_TCK")


def cpu_s(pid):
    with open(f"/proc/{pid}/stat") as f:
        rest = f.read().rsplit(")", 1)[1].split()
    return (int(rest[11]) + int(rest[12])) / TICK  # utime, stime (fields 14, 15)


def scraper(url, interval, stop):
    while not stop.wait(interval):
        try:
            urllib.request.urlopen(url, timeout=5).read()
        except OSError:
            pass


def read_line(proc_out, pattern, timeout=10):
    rx, deadline = re.compile(pattern), time.time() + timeout
    while time.time() < deadline:
        with open(proc_out) as f:
            for line in f:
                if m := rx.search(line):
                    return m.group(1)
        time.sleep(0.05)
    raise RuntimeError(f"no /{pattern}/ in {proc_out}")


def store_run(ddprund, bench, metrics, seconds, tmp):
    out = os.path.join(tmp, "d.out")
    argv = [ddprund, "--port", "0", "--host", "127.0.0.1"] + (["--metrics-port", "0"] if metrics else [])
    d = subprocess.Popen(argv, stdout=open(out, "w"), stderr=subprocess.STDOUT)
    stop = threading.Event()
    try:
        port = read_line(out, r"listening on \S+:(\d+)")
        if metrics:
            url = "http://" + read_line(out, r"metrics on http://(\S+)")
            threading.Thread(target=scraper, args=(url, 1.0, stop), daemon=True).start()
        c0 = cpu_s(d.pid)
        r = subprocess.run([bench, "ops", "--port", port, "--op", "get", "--clients", "16", "--seconds", str(seconds)],
                           capture_output=True, text=True, check=True).stdout
        c1 = cpu_s(d.pid)
        ops = int(re.search(r"\bops=(\d+)", r).group(1))
        return ops / seconds, (c1 - c0) / ops * 1e6, float(re.search(r"p99_us=([\d.]+)", r).group(1))
    finally:
        stop.set()
        d.kill()
        d.wait()


def agent_run(ddprun, metrics, seconds, interval, tmp):
    worker = os.path.join(tmp, "idle.py")
    with open(worker, "w") as f:
        f.write("import time\ntime.sleep(%d)\n" % (seconds + 30))
    out = os.path.join(tmp, "a.out")
    argv = [ddprun, "--standalone", "--nproc_per_node=2", "--warm_spares=0"]
    argv += ["--metrics_port=0"] if metrics else []
    a = subprocess.Popen(argv + [worker], stdout=open(out, "w"), stderr=subprocess.STDOUT)
    stop = threading.Event()
    try:
        read_line(out, r"(attempt 0)")
        time.sleep(1)  # past the start
        if metrics:
            url = "http://" + read_line(out, r"metrics on http://(\S+)")
            threading.Thread(target=scraper, args=(url, interval, stop), daemon=True).start()
        c0, t0 = cpu_s(a.pid), time.time()
        time.sleep(seconds)
        return (cpu_s(a.pid) - c0) / (time.time() - t0) * 100
    finally:
        stop.set()
        a.terminate()
        a.wait(timeout=60)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--ddprund", required=True)
    ap.add_argument("--bench", required=True)
    ap.add_argument("--base-ddprund")
    ap.add_argument("--ddprun", required=True)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--seconds", type=int, default=10)
    ap.add_argument("--agent-seconds", type=int, default=30)
    ap.add_argument("--scrape-interval", type=float, default=1.0)
    a = ap.parse_args()
    tmp = tempfile.mkdtemp(prefix="bench_metrics_")
    configs = ([("base", a.base_ddprund, False)] if a.base_ddprund else []) + \
        [("no --metrics-port", a.ddprund, False), ("--metrics-port, scraped 1/s", a.ddprund, True)]
    store = {name: [] for name, _, _ in configs}
    agent = {"no --metrics_port": [], f"--metrics_port, scraped every {a.scrape_interval:g} s": []}
    for r in range(a.rounds):
        for name, binary, m in configs:
            store[name].append(store_run(binary, a.bench, m, a.seconds, tmp))
            print(f"round {r} store {name}: {store[name][-1][0]:,.0f} WAIT+GET/s, {store[name][-1][1]:.2f} us CPU per WAIT+GET, "
                  f"p99 {store[name][-1][2]:.0f} us", file=sys.stderr)
        for (name, runs), m in zip(agent.items(), (False, True)):
            if a.agent_seconds <= 0:
                break
            runs.append(agent_run(a.ddprun, m, a.agent_seconds, a.scrape_interval, tmp))
            print(f"round {r} agent {name}: {runs[-1]:.3f} % of a core", file=sys.stderr)
    med = lambda xs: sorted(xs)[len(xs) // 2]
    print("| ddprund (WAIT+GET, 16 connections) | WAIT+GET/s (median) | ddprund CPU µs per WAIT+GET (median) | p99 µs (median) |")
    print("|---|---|---|---|")
    for name, runs in store.items():
        print(f"| {name} | {med([x[0] for x in runs]):,.0f} | {med([x[1] for x in runs]):.2f} | {med([x[2] for x in runs]):.0f} |")
    if a.agent_seconds <= 0:
        return
    print()
    print("| ddprun agent, 2 idle workers | agent CPU, % of one core (median) |")
    print("|---|---|")
    for name, runs in agent.items():
        print(f"| {name} | {med(runs):.3f} |")


if __name__ == "__main__":
    main()
