#!/usr/bin/env python3
"""Store servers compared trial by trial: PyTorch 2.11's own TCPStore server and one or more
ddprund builds, every trial of one server next to the same trial of the others, so that the
machine's drift (other tenants, frequency, the scheduler) falls on all of them alike.

usage: bench_store_interleave.py --ddprund NAME=PATH [--ddprund NAME=PATH ...] --out DIR
           [--bench PATH] [--rounds R] [--seconds S] [--clients 16,64]
           [--ops get,add,compare_set,wait] [--py211 PYTHON] [--threads 0] [--gen-threads G]

One set of PyTorch client processes (torch 2.11 TCPStore(is_master=False), torch imported once
before they fork) serves every trial: the same processes, on the same cores, drive each server.
Each round starts every server afresh; then, for every op and client count, one trial per
server, the servers' order rotating from round to round. With --bench (ddprun_store_bench),
each round also runs the C++ generator's trials the same way. A trial is a closed loop of
S seconds:
  get = store.get(k) (WAIT+GET on the wire), add = store.add(k, 1),
  compare_set = store.compare_set(k_i, cur, other) (success branch),
  wait = wake-up hop around a ring of the clients (set the successor's key, get() one's own).
Writes DIR/trials.tsv (every trial) and DIR/report.md: per server the median ops/s, per round
each ddprund build's ratio to PyTorch's server in the same round, and every pair of builds'
ratio round by round (median, range, rounds where the first is ahead).
"""
import argparse
import multiprocessing as mp
import os
import re
import resource
import statistics
import subprocess
import sys
import time
from datetime import timedelta

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_store_client import run_op  # noqa: E402  (one closed loop per op for both drivers)
from bench_store_main import ServerProcess  # noqa: E402

PT = "pytorch"


def log(msg):
    print(msg, file=sys.stderr, flush=True)


# ---- the client processes -------------------------------------------------------------------

def client_loop(idx, conn):
    import torch.distributed as dist  # imported by the parent before the fork: no import cost here
    stores = {}
    while True:
        cmd = conn.recv()
        if cmd is None:
            return
        if cmd == "reset":  # a new round: its servers are new
            stores.clear()
            continue
        port, op, n, tag, seconds = cmd["port"], cmd["op"], cmd["n"], cmd["tag"], cmd["seconds"]
        try:
            store = stores.get(port)
            if store is None:
                store = dist.TCPStore("127.0.0.1", port, is_master=False, timeout=timedelta(seconds=60))
                stores[port] = store
            if op == "get":
                store.set(f"{tag}/key", "v" * 32)
            elif op == "compare_set":
                store.set(f"{tag}/cas/{idx}", "x")
            conn.send(("ready", None))
            start = conn.recv()
            lat = run_op(store, idx, op, n, tag, start, start + seconds)
            conn.send(("done", lat))
        except Exception as e:  # reported, the trial counts as failed
            stores.pop(port, None)
            conn.send(("error", f"client {idx}: {e!r}"))


class Clients:
    def __init__(self, n):
        ctx = mp.get_context("fork")
        self.conns, self.procs = [], []
        for i in range(n):
            parent, child = ctx.Pipe()
            p = ctx.Process(target=client_loop, args=(i, child), daemon=True)
            p.start()
            self.conns.append(parent)
            self.procs.append(p)

    def reset(self):
        for c in self.conns:
            c.send("reset")

    def trial(self, port, op, n, tag, seconds):
        active = self.conns[:n]
        for c in active:
            c.send({"port": port, "op": op, "n": n, "tag": tag, "seconds": seconds})
        ready, errors = [], []
        for c in active:
            if not c.poll(90):
                raise RuntimeError(f"{op} x{n}: a client did not connect within 90 s")
            kind, val = c.recv()
            (ready.append(c) if kind == "ready" else errors.append(val))
        # Every client that is ready waits for a start time; with an error the trial still runs
        # (a wait ring would hang without its member: their deadline is now).
        start = time.monotonic() + 0.05 if not errors else time.monotonic()
        for c in ready:
            c.send(start)
        lat = []
        for c in ready:
            if not c.poll(seconds + 60):
                raise RuntimeError(f"{op} x{n}: a client did not finish")
            kind, val = c.recv()
            if kind == "error":
                errors.append(val)
            else:
                lat.extend(val)
        if errors:
            return None, errors[0]
        lat.sort()
        pick = lambda p: lat[int(p * (len(lat) - 1))] / 1000.0 if lat else 0.0
        return {"ops_s": len(lat) / seconds, "p50_us": pick(0.5), "p99_us": pick(0.99)}, None

    def close(self):
        for c in self.conns:
            try:
                c.send(None)
            except OSError:
                pass
        for p in self.procs:
            p.join(timeout=10)
            if p.is_alive():
                p.kill()


# ---- servers --------------------------------------------------------------------------------

def generator_trial(bench, port, op, n, seconds, tag, threads):
    cmd = [bench, "ops", "--port", str(port), "--op", op, "--clients", str(n), "--seconds", str(seconds),
           "--dialect", "D2", "--tag", tag, "--threads", str(threads)]
    try:
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=seconds + 60)
    except subprocess.TimeoutExpired:
        return None, "the generator timed out"
    for line in p.stdout.splitlines():
        if line.startswith("RESULT"):
            r = dict(re.findall(r"(\w+)=(\S+)", line))
            return {"ops_s": float(r["ops_per_s"]), "p50_us": float(r["p50_us"]), "p99_us": float(r["p99_us"])}, None
    return None, f"the generator exited {p.returncode}: {p.stderr.strip()[-300:]}"


# ---- the report -----------------------------------------------------------------------------

def spread(v):
    return f"{min(v):,.0f}–{max(v):,.0f}" if v else "-"


def ratio_cell(rs):
    if not rs:
        return "-"
    return f"**{statistics.median(rs):.2f}×** ({min(rs):.2f}–{max(rs):.2f})"


def report(rows, builds, a, started, out):
    # rows: (round, driver, op, n, server, ops_s, p50, p99, cpu_us_per_op)
    by = {}
    for rnd, drv, op, n, srv, ops, p50, p99, cpu in rows:
        by[(drv, op, n, srv, rnd)] = (ops, p50, p99, cpu)
    keys = sorted({(drv, op, n) for _, drv, op, n, *_ in rows},
                  key=lambda k: (k[0] != "pytorch-clients", a.ops.index(k[1]), k[2]))
    rounds = sorted({r[0] for r in rows})
    lines = []
    w = lines.append
    w("# Store servers trial by trial: ddprund builds and PyTorch 2.11's server")
    w("")
    w(f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime(started))}, {os.cpu_count()} CPUs, loopback; "
      f"{len(rounds)} rounds of {a.seconds:g} s trials, every server started afresh each round, "
      f"the servers' order rotating by round.")
    w(f"Servers: {PT} = torch 2.11 `TCPStore(is_master=True)` (libuv); "
      + "; ".join(f"{b} = `{p}` (--threads {a.threads})" for b, p in builds) + ".")
    w("Drivers: `pytorch-clients` = torch 2.11 `TCPStore` client processes (one per client, the same "
      "processes for every server); `generator` = ddprun_store_bench ops "
      f"({a.gen_threads} threads, dialect D2).")
    w("")
    w("## Throughput (ops/s, median of the rounds; min–max) and the ratio to PyTorch's server in the same round")
    w("")
    head = "| driver | op | clients | " + f"{PT} | " + " | ".join(
        f"{b} | {b}/{PT}" for b, _ in builds) + " |"
    w(head)
    w("|" + "---|" * (3 + 1 + 2 * len(builds)))
    for drv, op, n in keys:
        pt = [by[(drv, op, n, PT, r)][0] for r in rounds if (drv, op, n, PT, r) in by]
        cells = [drv, op, str(n), f"{statistics.median(pt):,.0f} ({spread(pt)})" if pt else "-"]
        for b, _ in builds:
            v = [by[(drv, op, n, b, r)][0] for r in rounds if (drv, op, n, b, r) in by]
            rs = [by[(drv, op, n, b, r)][0] / by[(drv, op, n, PT, r)][0] for r in rounds
                  if (drv, op, n, b, r) in by and (drv, op, n, PT, r) in by and by[(drv, op, n, PT, r)][0] > 0]
            cells += [f"{statistics.median(v):,.0f} ({spread(v)})" if v else "-", ratio_cell(rs)]
        w("| " + " | ".join(cells) + " |")
    if len(builds) >= 2:
        w("")
        w("## Builds against each other, round by round")
        w("")
        w("Ratio of ops/s in the same round (median, min–max), and the rounds in which the first build was ahead.")
        w("")
        pairs = [(builds[i][0], builds[j][0]) for i in range(len(builds)) for j in range(i + 1, len(builds))]
        w("| driver | op | clients | " + " | ".join(f"{x}/{y} | {x} ahead" for x, y in pairs) + " |")
        w("|" + "---|" * (3 + 2 * len(pairs)))
        for drv, op, n in keys:
            cells = [drv, op, str(n)]
            for x, y in pairs:
                rs = [by[(drv, op, n, x, r)][0] / by[(drv, op, n, y, r)][0] for r in rounds
                      if (drv, op, n, x, r) in by and (drv, op, n, y, r) in by and by[(drv, op, n, y, r)][0] > 0]
                cells += [ratio_cell(rs), f"{sum(1 for v in rs if v > 1)}/{len(rs)}"]
            w("| " + " | ".join(cells) + " |")
    w("")
    w("## Latency (µs, median over the rounds of each trial's p50 / p99) and server CPU per op (generator)")
    w("")
    names = [PT] + [b for b, _ in builds]
    w("| driver | op | clients | " + " | ".join(f"{s} p50 / p99" for s in names) + " | "
      + " | ".join(f"{s} CPU µs/op" for s in names) + " |")
    w("|" + "---|" * (3 + 2 * len(names)))
    for drv, op, n in keys:
        cells = [drv, op, str(n)]
        for s in names:
            p50 = [by[(drv, op, n, s, r)][1] for r in rounds if (drv, op, n, s, r) in by]
            p99 = [by[(drv, op, n, s, r)][2] for r in rounds if (drv, op, n, s, r) in by]
            cells.append(f"{statistics.median(p50):.0f} / {statistics.median(p99):.0f}" if p50 else "-")
        for s in names:
            cpu = [by[(drv, op, n, s, r)][3] for r in rounds if (drv, op, n, s, r) in by and by[(drv, op, n, s, r)][3]]
            cells.append(f"{statistics.median(cpu):.1f}" if cpu and drv == "generator" else "-")
        w("| " + " | ".join(cells) + " |")
    w("")
    w("Does not show: clients on other hosts (clients and servers share this machine's cores); a server's "
      "speed under a long-lived, large keyspace (each round starts empty).")
    text = "\n".join(lines) + "\n"
    with open(os.path.join(out, "report.md"), "w") as f:
        f.write(text)
    print(text)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--ddprund", action="append", required=True, metavar="NAME=PATH",
                    help="a ddprund build to compare (repeat for several)")
    ap.add_argument("--bench", help="ddprun_store_bench: adds the C++ generator's trials")
    ap.add_argument("--py211", default=sys.executable, help="the Python with torch 2.11 (PyTorch's server)")
    ap.add_argument("--out", required=True)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--seconds", type=float, default=1.0)
    ap.add_argument("--clients", default="16,64")
    ap.add_argument("--ops", default="get,add,compare_set,wait")
    ap.add_argument("--threads", type=int, default=0, help="ddprund --threads (0: one per core, at most 8)")
    ap.add_argument("--gen-threads", type=int, default=max(1, (os.cpu_count() or 2) // 2))
    ap.add_argument("--budget-s", type=float, default=0, help="stop after the round that passes this many seconds")
    a = ap.parse_args()
    a.ops = [o for o in a.ops.split(",") if o]
    for o in a.ops:
        if o not in ("get", "add", "compare_set", "wait"):
            ap.error(f"--ops: unknown op '{o}' (get, add, compare_set, wait)")
    counts = [int(x) for x in a.clients.split(",") if x]
    builds = []
    for spec in a.ddprund:
        name, sep, path = spec.partition("=")
        if not sep or not name or name == PT or not os.access(path, os.X_OK):
            ap.error(f"--ddprund '{spec}': want NAME=PATH with an executable ddprund (NAME not '{PT}')")
        builds.append((name, os.path.abspath(path)))
    if a.bench and not os.access(a.bench, os.X_OK):
        ap.error(f"--bench {a.bench}: not an executable")
    import torch  # noqa: F401  imported once, before the clients fork
    os.makedirs(a.out, exist_ok=True)
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    here = os.path.dirname(os.path.abspath(__file__))
    commands = {PT: [a.py211, os.path.join(here, "bench_store_server.py"), "--libuv", "1"]}
    for name, path in builds:
        commands[name] = [path, "--host", "127.0.0.1", "--port", "0", "--log-level", "warn", "--threads", str(a.threads)]
    order = list(commands)
    started = time.time()
    clients = Clients(max(counts))
    rows = []
    tsv = open(os.path.join(a.out, "trials.tsv"), "w")
    tsv.write("round\tdriver\top\tclients\tserver\tops_s\tp50_us\tp99_us\tserver_cpu_us_per_op\n")
    try:
        for rnd in range(1, a.rounds + 1):
            rot = order[(rnd - 1) % len(order):] + order[:(rnd - 1) % len(order)]
            servers = {name: ServerProcess(name, commands[name]) for name in rot}
            clients.reset()
            drivers = ["pytorch-clients"] + (["generator"] if a.bench else [])
            try:
                for drv in drivers:
                    for op in a.ops:
                        for n in counts:
                            for name in rot:
                                s = servers[name]
                                tag = f"r{rnd}{drv[0]}{op}{n}"
                                cpu0 = s.cpu_s()
                                if drv == "generator":
                                    res, err = generator_trial(a.bench, s.port, op, n, a.seconds, tag, a.gen_threads)
                                else:
                                    res, err = clients.trial(s.port, op, n, tag, a.seconds)
                                if err:
                                    log(f"[interleave] round {rnd} {drv} {op} x{n} {name}: {err}")
                                    continue
                                cpu = (s.cpu_s() - cpu0) * 1e6 / max(res["ops_s"] * a.seconds, 1)
                                rows.append((rnd, drv, op, n, name, res["ops_s"], res["p50_us"], res["p99_us"], cpu))
                                tsv.write(f"{rnd}\t{drv}\t{op}\t{n}\t{name}\t{res['ops_s']:.0f}\t{res['p50_us']:.1f}\t"
                                          f"{res['p99_us']:.1f}\t{cpu:.1f}\n")
                                tsv.flush()
                                log(f"[interleave] round {rnd} {drv} {op} x{n} {name}: {res['ops_s']:,.0f} ops/s")
            finally:
                for s in servers.values():
                    s.stop()
            if a.budget_s and time.time() - started > a.budget_s:
                log(f"[interleave] stopping after round {rnd}: --budget-s {a.budget_s:g} passed")
                break
    finally:
        tsv.close()
        clients.close()
    report(rows, builds, a, started, a.out)


if __name__ == "__main__":
    main()
