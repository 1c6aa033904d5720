#!/usr/bin/env python3
"""Store benchmark driver (called by scripts/bench/bench_store.sh): ddprund vs PyTorch's own TCPStore
server, side by side in one run, loopback only.

Phases (each bounded):
  1. PyTorch's own client processes (bench_store_client.py, torch 2.11 client) against ddprund
     and PyTorch 2.11's libuv server: get/add/compare_set/wait-wakeup, 1/4/16/64 clients.
  2. The C++ load generator (ddprun_store_bench: one process, epoll over N connections on
     --gen-threads threads, default half the cores), same
     op mix and client counts, against ddprund, PyTorch 2.11 libuv and (dialect D0) PyTorch 1.13.
  3. Join storm (C++ generator): N = 256, 1024, 4096, 16384 connections connect, VALIDATE+PING,
     ADD a counter, WAIT on a last-worker key; time until all are released; resets counted.
Writes the tables to stdout and to OUT_DIR/store_bench.md.
"""
import argparse
import datetime
import os
import platform
import re
import resource
import select
import signal
import subprocess
import sys
import time

CLIENTS = [1, 4, 16, 64]
OPS = ["get", "add", "compare_set", "wait"]
STORM = [256, 1024, 4096, 16384]


def log(msg):
    print(msg, file=sys.stderr, flush=True)


def read_line(proc, deadline_s, what):
    buf = b""
    end = time.monotonic() + deadline_s
    while b"\n" not in buf:
        left = end - time.monotonic()
        if left <= 0:
            raise RuntimeError(f"{what}: no line within {deadline_s}s")
        r, _, _ = select.select([proc.stdout], [], [], left)
        if r:
            chunk = os.read(proc.stdout.fileno(), 4096)
            if not chunk:
                raise RuntimeError(f"{what} exited before printing its port (got {buf!r})")
            buf += chunk
    return buf.split(b"\n")[0].decode()


class ServerProcess:
    """A store server process that prints its port on its first line; stopped by SIGTERM."""

    def __init__(self, name, cmd):
        self.kind = name
        self.proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stdin=subprocess.PIPE,
                                     stderr=subprocess.DEVNULL)
        line = read_line(self.proc, 60, name)
        self.port = int(re.search(r":(\d+)", line).group(1))
        log(f"[bench] {name} up on 127.0.0.1:{self.port} ({line})")

    def rss_kb(self):
        try:
            with open(f"/proc/{self.proc.pid}/status") as f:
                for line in f:
                    if line.startswith("VmHWM:"):
                        return int(line.split()[1])
        except OSError:
            return 0
        return 0

    def cpu_s(self):
        """User+system CPU seconds the server process has used so far."""
        try:
            with open(f"/proc/{self.proc.pid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
        except (OSError, IndexError, ValueError):
            return 0.0

    def stop(self):
        hwm = self.rss_kb()
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        return hwm


def server_command(kind, a):
    if kind == "ddprund":
        return [a.ddprund, "--host", "127.0.0.1", "--port", "0", "--log-level", "warn",
                "--threads", str(a.ddprund_threads)]
    if kind == "pt211":
        return [a.py211, os.path.join(a.here, "bench_store_server.py"), "--libuv", "1"]
    return [a.py113, os.path.join(a.here, "bench_store_server.py"), "--libuv", "0"]


def parse(line):
    return {k: v for k, v in re.findall(r"(\w+)=(\S+)", line)}


def run_results(cmd, timeout):
    try:
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        log(f"[bench] TIMEOUT after {timeout}s: {' '.join(cmd)}")
        return []
    if p.returncode != 0:
        log(f"[bench] exit {p.returncode}: {' '.join(cmd)}\n{p.stderr[-2000:]}")
    return [parse(line) for line in p.stdout.splitlines() if line.startswith("RESULT")]


def fmt_rate(v):
    return f"{float(v):,.0f}" if v is not None else "n/a"


def ratio(a, b, inverse=False):
    try:
        a, b = float(a), float(b)
        if a <= 0 or b <= 0:
            return "n/a"
        return f"{(a / b):.2f}×"
    except (TypeError, ValueError):
        return "n/a"


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--ddprund", required=True)
    ap.add_argument("--bench", required=True)
    ap.add_argument("--py211", required=True)
    ap.add_argument("--py113", default="/usr/bin/python3")
    ap.add_argument("--out", required=True)
    ap.add_argument("--seconds", type=float, default=2.0)
    ap.add_argument("--skip-pt113", action="store_true")
    ap.add_argument("--storm-timeout", type=float, default=30.0)
    ap.add_argument("--storm-repeat", type=int, default=3, help="join-storm runs per size and server (median)")
    ap.add_argument("--storm-source-ips", type=int, default=64,
                    help="storm clients connect from 127.0.1.1..K, like clients on K hosts (0 = all from 127.0.0.1)")
    ap.add_argument("--clients", default=",".join(map(str, CLIENTS)), help="client counts, comma-separated")
    ap.add_argument("--storm", default=",".join(map(str, STORM)), help="join-storm sizes, comma-separated")
    ap.add_argument("--quick", action="store_true", help="1 s phases, storm up to 4096")
    ap.add_argument("--phases", default="1,2,3", help="which phases to run, e.g. 3 for the join storm alone")
    ap.add_argument("--ops", default=",".join(OPS), help="operations of phases 1 and 2, comma-separated")
    ncpu = os.cpu_count() or 1
    ap.add_argument("--gen-threads", type=int, default=max(1, ncpu // 2),
                    help="threads of the C++ load generator (default: half the cores)")
    ap.add_argument("--ddprund-threads", type=int, default=0,
                    help="ddprund --threads (default 0: one per core, at most 8)")
    a = ap.parse_args()
    a.here = os.path.dirname(os.path.abspath(__file__))
    secs = 1.0 if a.quick else a.seconds
    CLIENTS[:] = [int(x) for x in a.clients.split(",")]
    OPS[:] = [x for x in a.ops.split(",") if x]
    STORM[:] = [int(x) for x in a.storm.split(",")]
    storm_sizes = STORM[:3] if a.quick else STORM
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    t_start = time.monotonic()
    if not a.skip_pt113:
        ok = subprocess.run([a.py113, "-c", "import torch"], capture_output=True).returncode == 0 \
            if os.path.exists(a.py113) else False
        if not ok:
            log(f"[bench] no torch in {a.py113}: skipping the PyTorch 1.13 column")
            a.skip_pt113 = True
    py = {}   # (server, op, n) -> result
    cpp = {}
    storm = {}
    hwm = {}

    phases = {int(x) for x in a.phases.split(",")}
    # ---- phase 1: PyTorch's own client processes
    for kind in ("ddprund", "pt211") if 1 in phases else ():
        for n in CLIENTS:
            s = ServerProcess(kind, server_command(kind, a))
            log(f"[bench] python clients x{n} -> {kind}")
            for r in run_results([a.py211, os.path.join(a.here, "bench_store_client.py"), "--port", str(s.port),
                                  "--clients", str(n), "--seconds", str(secs), "--ops", ",".join(OPS)],
                                 timeout=120 + 4 * (secs + 30)):
                py[(kind, r["op"], n)] = r
            hwm[(kind, "py")] = max(hwm.get((kind, "py"), 0), s.stop())

    # ---- phase 2: C++ load generator
    kinds = ["ddprund", "pt211"] + ([] if a.skip_pt113 else ["pt113"])
    for kind in kinds if 2 in phases else ():
        s = ServerProcess(kind, server_command(kind, a))
        dialect = "D0" if kind == "pt113" else "D2"
        for op in OPS:
            for n in CLIENTS:
                log(f"[bench] C++ generator {op} x{n} -> {kind}")
                cpu0 = s.cpu_s()
                for r in run_results([a.bench, "ops", "--port", str(s.port), "--op", op, "--clients", str(n),
                                      "--seconds", str(secs), "--dialect", dialect, "--tag", f"c{op}{n}",
                                      "--threads", str(a.gen_threads)],
                                     timeout=secs + 60):
                    cpp[(kind, op, n)] = r
                    # Server CPU per op (includes the generator's connect/setup, a small share).
                    ops_done = float(r.get("ops", 0))
                    r["cpu_us_per_op"] = f"{(s.cpu_s() - cpu0) * 1e6 / ops_done:.1f}" if ops_done else "n/a"
                    r["cpu_cores"] = f"{(s.cpu_s() - cpu0) / max(float(r.get('seconds', secs)), 1e-9):.2f}"
        hwm[(kind, "cpp")] = s.stop()

    # ---- phase 3: join storm (fresh server per run), --storm-repeat runs per size with the
    # servers' order alternating; the median counts. A server that needed more than the storm
    # timeout for one size is not run at the larger ones (they would only time out).
    gave_up = {}
    runs = {}  # (kind, n) -> [result, ...]
    for n in storm_sizes if 3 in phases else ():
        for rep in range(a.storm_repeat):
            order = ("ddprund", "pt211") if rep % 2 == 0 else ("pt211", "ddprund")
            for kind in order:
                if kind in gave_up:
                    continue
                s = ServerProcess(kind, server_command(kind, a))
                log(f"[bench] join storm N={n} -> {kind} (run {rep + 1})")
                for r in run_results([a.bench, "storm", "--port", str(s.port), "--clients", str(n), "--timeout",
                                      str(a.storm_timeout), "--tag", f"storm{n}", "--threads", str(a.gen_threads),
                                      "--source-ips", str(a.storm_source_ips)],
                                     timeout=a.storm_timeout + 30):
                    runs.setdefault((kind, n), []).append(r)
                    if r.get("completed") != "1":
                        gave_up[kind] = n
                hwm[(kind, f"storm{n}")] = max(hwm.get((kind, f"storm{n}"), 0), s.stop())
        for kind in ("ddprund", "pt211"):
            rs = runs.get((kind, n), [])
            if not rs:
                if kind in gave_up:
                    storm[(kind, n)] = {"skipped": "1",
                                        "reason": f"not run: N={gave_up[kind]} already took over {a.storm_timeout:g} s"}
                continue
            done = [r for r in rs if r.get("completed") == "1" and "seconds" in r]
            pick = sorted(done, key=lambda r: float(r["seconds"]))[len(done) // 2] if done else rs[-1]
            pick = dict(pick)
            for f in ("resets", "refused", "eof", "errors"):
                pick[f] = str(sum(int(r.get(f, 0)) for r in rs))  # over every run
            pick["runs"] = " / ".join(f"{float(r['seconds']):.3f}" for r in rs if "seconds" in r)
            storm[(kind, n)] = pick

    # ---- report
    out = []
    w = out.append
    w("# Store benchmark: ddprund vs PyTorch's TCPStore server")
    w("")
    w(f"{datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M} UTC, {platform.node()}, {os.cpu_count()} CPUs, "
      f"loopback 127.0.0.1; clients and server share the machine. Phase length {secs:g} s. "
      f"RLIMIT_NOFILE {resource.getrlimit(resource.RLIMIT_NOFILE)[0]}.")
    w(f"ddprund `--threads {a.ddprund_threads}` (0 = one per core, at most 8); C++ generator on "
      f"{a.gen_threads} thread(s) (the same for every server).")
    w("PyTorch 2.11 server = `TCPStore(is_master=True)` with the libuv backend (its default); "
      "1.13 = Debian's python3-torch legacy server (C++ generator in dialect D0).")
    w("`get` = WAIT+GET (what PyTorch's `get()` sends); `wait` = wake-up hop around a ring of clients "
      "(SET the successor's key, get() one's own; latency from the predecessor's SET to the wake-up).")
    w("")
    w("## 1. Driven by PyTorch's own client processes (torch 2.11 `TCPStore(is_master=False)`, one process per client)")
    w("")
    w("| op | clients | ddprund ops/s | p50 µs | p99 µs | PyTorch 2.11 ops/s | p50 µs | p99 µs | ratio ours/PyTorch |")
    w("|---|---:|---:|---:|---:|---:|---:|---:|---:|")
    for op in OPS:
        for n in CLIENTS:
            o, p = py.get(("ddprund", op, n), {}), py.get(("pt211", op, n), {})
            w(f"| {op} | {n} | {fmt_rate(o.get('ops_per_s'))} | {o.get('p50_us', 'n/a')} | {o.get('p99_us', 'n/a')} | "
              f"{fmt_rate(p.get('ops_per_s'))} | {p.get('p50_us', 'n/a')} | {p.get('p99_us', 'n/a')} | "
              f"{ratio(o.get('ops_per_s'), p.get('ops_per_s'))} |")
    w("")
    w(f"## 2. Driven by the C++ load generator (`ddprun_store_bench ops`: one process, epoll, N connections, {a.gen_threads} thread(s))")
    w("")
    has113 = "pt113" in kinds
    w("Server CPU: CPU time of the server process during the phase, per completed op, and in cores "
      "(1.00 = one core busy the whole phase).")
    w("")
    hdr = ("| op | clients | ddprund ops/s | p50 µs | p99 µs | srv CPU µs/op | cores | PyTorch 2.11 ops/s | p50 µs | "
           "p99 µs | srv CPU µs/op | cores | ratio ours/2.11 |")
    sep = "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"
    if has113:
        hdr += " PyTorch 1.13 ops/s | p50 µs | p99 µs | ratio ours/1.13 |"
        sep += "---:|---:|---:|---:|"
    w(hdr)
    w(sep)
    for op in OPS:
        for n in CLIENTS:
            o, p = cpp.get(("ddprund", op, n), {}), cpp.get(("pt211", op, n), {})
            line = (f"| {op} | {n} | {fmt_rate(o.get('ops_per_s'))} | {o.get('p50_us', 'n/a')} | {o.get('p99_us', 'n/a')} | "
                    f"{o.get('cpu_us_per_op', 'n/a')} | {o.get('cpu_cores', 'n/a')} | "
                    f"{fmt_rate(p.get('ops_per_s'))} | {p.get('p50_us', 'n/a')} | {p.get('p99_us', 'n/a')} | "
                    f"{p.get('cpu_us_per_op', 'n/a')} | {p.get('cpu_cores', 'n/a')} | "
                    f"{ratio(o.get('ops_per_s'), p.get('ops_per_s'))} |")
            if has113:
                q = cpp.get(("pt113", op, n), {})
                line += (f" {fmt_rate(q.get('ops_per_s'))} | {q.get('p50_us', 'n/a')} | {q.get('p99_us', 'n/a')} | "
                         f"{ratio(o.get('ops_per_s'), q.get('ops_per_s'))} |")
            w(line)
    errs = {k: sum(int(r.get(f, 0)) for f in ("resets", "refused", "eof", "errors")) for k, r in cpp.items()}
    w("")
    w(f"Connection errors in phase 2 (resets+refused+EOF+other): ddprund "
      f"{sum(v for k, v in errs.items() if k[0] == 'ddprund')}, PyTorch 2.11 "
      f"{sum(v for k, v in errs.items() if k[0] == 'pt211')}"
      + (f", PyTorch 1.13 {sum(v for k, v in errs.items() if k[0] == 'pt113')}" if has113 else "") + ".")
    w("")
    w("## 3. Join storm (`ddprun_store_bench storm`: N connections from one process, VALIDATE+PING, ADD, WAIT on last-worker key)")
    w("")
    w(f"{a.storm_repeat} runs per size and server, order alternating, median shown (every run in the last columns); "
      f"clients connect from {a.storm_source_ips or 1} loopback source address(es), as from that many hosts "
      "(one address makes the kernel's ephemeral-port search in connect() the bottleneck, whichever server). "
      "Resets/refused/EOF summed over the runs.")
    w("")
    w("| N | ddprund s | released | resets/refused/EOF | PyTorch 2.11 s | released | resets/refused/EOF | time ratio ours/PyTorch | ddprund runs | PyTorch runs |")
    w("|---:|---:|---:|---:|---:|---:|---:|---:|---|---|")
    for n in STORM:
        o, p = storm.get(("ddprund", n)), storm.get(("pt211", n))
        if n not in storm_sizes:
            w(f"| {n} | skipped (--quick) | | | | | | |")
            continue
        def cells(r):
            if not r:
                return "n/a | n/a | n/a"
            if r.get("skipped"):
                return f"{r.get('reason', 'skipped').replace('_', ' ')} | | "
            return (f"{'' if r.get('completed') == '1' else '> '}{float(r['seconds']):.3f}"
                    f"{'' if r.get('completed') == '1' else ' (timeout)'} | {r['released']} | "
                    f"{r['resets']}/{r['refused']}/{r['eof']}")
        rt = ratio(o and o.get('seconds'), p and p.get('seconds'))
        if p and (p.get("skipped") or p.get("completed") != "1") and o and o.get("completed") == "1":
            rt = f"< {ratio(o.get('seconds'), a.storm_timeout)}"
        w(f"| {n} | {cells(o)} | {cells(p)} | {rt} | {(o or {}).get('runs', '')} | {(p or {}).get('runs', '')} |")
    w("")
    w("Peak server RSS (VmHWM, kB): " + ", ".join(f"{k[0]} {k[1]} {v}" for k, v in sorted(hwm.items())))
    w("")
    # Targets.
    def at16(table, op):
        vals = []
        for n in (16, 64):
            o, p = table.get(("ddprund", op, n), {}), table.get(("pt211", op, n), {})
            try:
                vals.append(float(o["ops_per_s"]) / float(p["ops_per_s"]))
            except (KeyError, ValueError, ZeroDivisionError):
                pass
        return min(vals) if vals else None
    w("## Targets")
    w("")
    for name, table in (("PyTorch client processes", py), ("C++ generator", cpp)):
        for op in OPS:
            m = at16(table, op)
            w(f"- throughput ≥ 1.5× at 16+ clients, {name}, {op}: min ratio "
              f"{'n/a' if m is None else f'{m:.2f}×'} → {'MET' if m and m >= 1.5 else 'NOT MET'}")
    for n in storm_sizes if 3 in phases else ():
        o, p = storm.get(("ddprund", n)), storm.get(("pt211", n))
        try:
            pt = a.storm_timeout if (p.get("skipped") or p.get("completed") != "1") else float(p["seconds"])
            r = float(o["seconds"]) / pt
            bound = "<" if pt == a.storm_timeout else ""
            w(f"- join storm N={n}: ours/PyTorch time {bound}{r:.2f}× (target ≤ 0.5×) → "
              f"{'MET' if r <= 0.5 and o.get('completed') == '1' else 'NOT MET'}")
        except (AttributeError, TypeError, KeyError, ValueError, ZeroDivisionError):
            w(f"- join storm N={n}: n/a")
    zero = all(int(r.get(f, 0)) == 0 for (k, n), r in storm.items() if k == "ddprund" for f in ("resets", "refused", "eof")) \
        and all(v == 0 for k, v in errs.items() if k[0] == "ddprund")
    w(f"- zero connection resets/refusals against ddprund: {'MET' if zero else 'NOT MET'}")
    w("")
    w(f"Total bench time {time.monotonic() - t_start:.0f} s.")
    text = "\n".join(out) + "\n"
    os.makedirs(a.out, exist_ok=True)
    path = os.path.join(a.out, "store_bench.md")
    with open(path, "w") as f:
        f.write(text)
    print(text)
    log(f"[bench] written to {path}")


if __name__ == "__main__":
    main()
