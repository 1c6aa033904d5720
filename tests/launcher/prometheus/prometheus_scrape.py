#!/usr/bin/env python3
"""A real Prometheus scrapes a standing ddprund and the two agents of a job (--nnodes=2 on this
host, one worker killed once, --max_restarts=1), then the test asks Prometheus's HTTP API
(/api/v1/query) whether every target is up and whether the series say what the job did.
Also runs the PromQL of the docs (launcher/README.md "Metrics").

    usage: prometheus_scrape.py --ddprun PATH --ddprund PATH [--prometheus PATH]
Exit 77 (skipped) only when no prometheus binary exists (scripts/setup_deps.sh installs it).
"""
import argparse
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.parse
import urllib.request

WORKER = r'''
import os, signal, sys, time
rank = int(os.environ["RANK"])
attempt = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
stop = sys.argv[1]
if attempt == 0 and rank == 1:
    time.sleep(0.5)
    os.kill(os.getpid(), signal.SIGKILL)   # the one failure: restarts_total must say 1
ballast = bytearray(32 << 20)              # resident memory the RSS series must show
for i in range(0, len(ballast), 4096):
    ballast[i] = 1
t0 = time.time()
while not os.path.exists(stop):
    if time.time() - t0 < 1.0:
        sum(range(20000))                  # some CPU time
    else:
        time.sleep(0.05)
'''


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_for(what, fn, timeout):
    deadline = time.time() + timeout
    last = None
    while time.time() < deadline:
        try:
            last = fn()
            if last:
                return last
        except Exception as e:  # not up yet
            last = e
        time.sleep(0.25)
    raise AssertionError(f"timed out after {timeout} s waiting for {what} (last: {last!r})")


def read_line(path, pattern, timeout):
    rx = re.compile(pattern)

    def find():
        with open(path, errors="replace") as f:
            for line in f:
                m = rx.search(line)
                if m:
                    return m
        return None
    try:
        return wait_for(f"/{pattern}/ in {path}", find, timeout)
    except AssertionError:
        with open(path, errors="replace") as f:
            sys.stderr.write(f"--- {path}:\n{f.read()}\n")
        raise


class Prom:
    def __init__(self, port):
        self.base = f"http://127.0.0.1:{port}"

    def query(self, q):
        url = self.base + "/api/v1/query?" + urllib.parse.urlencode({"query": q})
        with urllib.request.urlopen(url, timeout=5) as r:
            body = json.load(r)
        assert body["status"] == "success", f"{q}: {body}"
        return body["data"]["result"]

    def values(self, q):
        """{instance or '': float} of an instant vector."""
        return {r["metric"].get("instance", ""): float(r["value"][1]) for r in self.query(q)}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--ddprun", required=True)
    ap.add_argument("--ddprund", required=True)
    ap.add_argument("--prometheus", default=shutil.which("prometheus") or "/usr/bin/prometheus")
    a = ap.parse_args()
    a.ddprun, a.ddprund = os.path.abspath(a.ddprun), os.path.abspath(a.ddprund)
    if not os.access(a.prometheus, os.X_OK):
        print(f"SKIP: no prometheus binary at {a.prometheus} (scripts/setup_deps.sh installs Debian's prometheus)")
        return 77

    tmp = tempfile.mkdtemp(prefix="ddprun_prom_")
    procs = []

    def spawn(name, argv):
        out = open(os.path.join(tmp, name + ".log"), "w")
        p = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, cwd=tmp, start_new_session=True)
        procs.append(p)
        return os.path.join(tmp, name + ".log")

    try:
        worker = os.path.join(tmp, "worker.py")
        with open(worker, "w") as f:
            f.write(WORKER)
        stop = os.path.join(tmp, "stop")

        dlog = spawn("ddprund", [a.ddprund, "--port", "0", "--host", "127.0.0.1", "--metrics_port", "0"])
        rdzv_port = int(read_line(dlog, r"^ddprund listening on \S+:(\d+)$", 10).group(1))
        ddprund_target = read_line(dlog, r"^ddprund metrics on http://(\S+)/metrics$", 10).group(1)

        agent_targets = []
        for n in range(2):
            log = spawn(f"agent{n}", [a.ddprun, "--nnodes=2", "--nproc_per_node=1", "--rdzv_backend=c10d",
                                      f"--rdzv_endpoint=127.0.0.1:{rdzv_port}", "--rdzv_id=promjob",
                                      "--max_restarts=1", "--warm_spares=0", "--metrics_port=0",
                                      worker, stop])
            agent_targets.append(read_line(log, r"metrics on http://(\S+)/metrics", 10).group(1))

        prom_port = free_port()
        config = os.path.join(tmp, "prometheus.yml")
        with open(config, "w") as f:
            f.write(f"""global:
  scrape_interval: 1s
  evaluation_interval: 1s
scrape_configs:
  - job_name: ddprund
    static_configs:
      - targets: ['{ddprund_target}']
  - job_name: ddprun
    static_configs:
      - targets: ['{agent_targets[0]}', '{agent_targets[1]}']
""")
        spawn("prometheus", [a.prometheus, f"--config.file={config}", f"--storage.tsdb.path={tmp}/tsdb",
                             f"--web.listen-address=127.0.0.1:{prom_port}", "--log.level=warn"])
        prom = Prom(prom_port)
        targets = {ddprund_target, *agent_targets}

        # Every target up.
        up = wait_for("up == 1 for ddprund and both agents",
                      lambda: (v := prom.values("up")) and set(v) == targets and all(x == 1 for x in v.values()) and v,
                      60)
        print(f"up: {up}")

        # The restart happened on both agents (attempt 1), and Prometheus has scraped it.
        wait_for("ddprun_attempt == 1 on both agents",
                 lambda: (v := prom.values("ddprun_attempt")) and len(v) == 2 and all(x == 1 for x in v.values()), 60)
        wait_for("a scrape with both ranks' CPU and memory",
                 lambda: len(prom.values("ddprun_worker_resident_memory_bytes")) == 2, 30)

        # The docs' store p99: a rate needs two scrapes with requests between them (the agents'
        # heartbeats are requests).
        p99 = 'histogram_quantile(0.99, sum by (le) (rate(ddprund_request_duration_seconds_bucket[1m])))'
        wait_for("a store p99 latency", lambda: [x for x in prom.values(p99).values() if x == x], 30)

        def one(q):
            v = prom.values(q)
            assert len(v) == 1, f"{q}: {v}"
            return next(iter(v.values()))

        checks = {
            # One worker was killed: one restart of each node's group, one failure (a signal).
            'sum(ddprun_restarts_total)': lambda x: x == 2,
            'sum(ddprun_restarts_total{cause="worker_failure"})': lambda x: x == 1,
            'sum(ddprun_restarts_total{cause="peer_restart"})': lambda x: x == 1,
            'sum(ddprun_worker_failures_total{cause="signal"})': lambda x: x == 1,
            'sum(ddprun_worker_failures_total{cause="exit_code"})': lambda x: x == 0,
            'sum(ddprun_workers{state="running"})': lambda x: x == 2,
            'sum(ddprun_workers{state="failed"})': lambda x: x == 0,
            'min(ddprun_rendezvous_duration_seconds_count)': lambda x: x == 2,  # two rounds each
            'max(ddprun_last_rendezvous_duration_seconds)': lambda x: 0 < x < 30,
            'min(ddprun_worker_resident_memory_bytes)': lambda x: x > 32 * 2**20,
            'count(ddprun_worker_cpu_seconds_total)': lambda x: x == 2,
            'ddprund_rendezvous_jobs': lambda x: x == 1,
            'ddprund_rendezvous_agents': lambda x: x == 2,
            'ddprund_connections_open': lambda x: x >= 2,
            'ddprund_requests_total{op="agent"}': lambda x: x > 0,
            'ddprund_request_duration_seconds_count': lambda x: x > 0,
            'sum(ddprund_auth_failures_total)': lambda x: x == 0,
            'sum(ddprund_rejections_total)': lambda x: x == 0,
            # The docs' queries: store p99 latency, restarts per job.
            p99: lambda x: 0 < x < 1,
            'sum by (job) (ddprun_restarts_total)': lambda x: x == 2,
        }
        failed = []
        for q, ok in checks.items():
            try:
                x = one(q)
            except AssertionError as e:
                failed.append(str(e))
                continue
            print(f"{'ok  ' if ok(x) else 'FAIL'} {q} = {x:g}")
            if not ok(x):
                failed.append(f"{q} = {x:g}")
        # Per rank: both ranks present, and CPU time grew past zero for at least one.
        ranks = {r["metric"]["rank"] for r in prom.query("ddprun_worker_cpu_seconds_total")}
        if ranks != {"0", "1"}:
            failed.append(f"ddprun_worker_cpu_seconds_total ranks {ranks}, expected 0 and 1")
        # The GPU query of the docs parses and, without a GPU sampler, finds nothing.
        gpu = prom.query("avg by (rank) (ddprun_worker_gpu_utilization_ratio)")
        if gpu:
            failed.append(f"GPU series without a GPU sampler: {gpu}")
        if failed:
            raise AssertionError("; ".join(failed))

        # The job ends well after its one restart.
        open(stop, "w").close()
        for p in procs[1:3]:
            assert p.wait(timeout=60) == 0, f"agent exited {p.returncode}"
        print("PASS")
        return 0
    except Exception:
        for name in ("ddprund", "agent0", "agent1", "prometheus"):
            path = os.path.join(tmp, name + ".log")
            if os.path.exists(path):
                with open(path, errors="replace") as f:
                    sys.stderr.write(f"--- {name}.log (last 40 lines):\n" + "".join(f.readlines()[-40:]))
        raise
    finally:
        for p in procs:
            if p.poll() is None:
                try:
                    os.killpg(p.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
                p.wait()
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
