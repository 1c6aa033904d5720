"""What the attack suite's sections share: the bounds, agent frames, a JOIN, another job's
store, and the prober that times another client's round trips meanwhile."""
import argparse
import os
import re
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "interop"))
import interop_common as ic  # noqa: E402
from interop_common import Daemon, RawConn, blob, check, log, log_says, run_main, u64  # noqa: E402
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "pylib"))
from ddprun_testlib import AGENT_HELLO, agent_frame, read_agent_frame  # noqa: E402

P99_LIMIT_S = 0.050
MAX_STALL_S = 2.0
MAX_HOLD_MS = 60


JOIN, HEARTBEAT, ROUND, ERROR = 1, 2, 20, 24
frame = agent_frame


def read_frame(sock):
    """(type, fields) of the next frame; None when the connection closed."""
    try:
        return read_agent_frame(sock)
    except (AssertionError, OSError):
        return None


def join(port, run_id, node, nodes=1, heartbeat_timeout_ms=600000):
    """An agent of job `run_id` (open rendezvous): the connection, after its JOIN was sent."""
    s = socket.create_connection(("127.0.0.1", port), timeout=30.0)
    s.sendall(AGENT_HELLO + frame(JOIN, {
        "run_id": run_id, "node_id": f"{run_id}-{node}", "host": "127.0.0.1", "local_world_size": "1",
        "min_nodes": str(nodes), "max_nodes": str(nodes), "heartbeat_timeout_ms": str(heartbeat_timeout_ms)}))
    return s


def other_job_store(d):
    """Another job on the daemon: its agent, and the port of its round's workers' store (its own keyspace)."""
    agent = join(d.port, "victim", 0)
    msg = read_frame(agent)
    check(msg is not None and msg[0] == ROUND, "the other job's agent gets its ROUND")
    return agent, int(msg[1]["store_port"])


def stopped(d):
    """Stops ddprund; logs the longest time a batch of requests held a lock (its last line)."""
    rc = d.stop()
    hold = [ln for ln in d.log_text().splitlines() if "longest lock hold" in ln]
    if hold:
        log("ddprund: " + hold[-1].split("(", 1)[-1].rstrip(")"))
    return rc


class Prober:
    """A client of another job doing GET round trips on its own connection until stopped."""

    def __init__(self, port):
        self.conn = RawConn("127.0.0.1", port, timeout=30.0)
        self.conn.op("SET", blob("/probe"), blob("x"))
        self.samples = []
        self.stop_flag = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self):
        while not self.stop_flag.is_set():
            t0 = time.monotonic()
            self.conn.get("/probe")
            self.samples.append(time.monotonic() - t0)

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.stop_flag.set()
        self.thread.join(timeout=60)
        self.conn.close()

    def report(self, what):
        s = sorted(self.samples)
        check(len(s) >= 100, f"{what}: the other client made {len(s)} round trips (>= 100)")
        p99, worst = s[int(len(s) * 0.99) - 1], s[-1]
        log(f"{what}: {len(s)} round trips of another client, p50 {s[len(s) // 2] * 1e3:.2f} ms, "
            f"p99 {p99 * 1e3:.2f} ms, max {worst * 1e3:.2f} ms")
        check(p99 < P99_LIMIT_S, f"{what}: another client's p99 {p99 * 1e3:.1f} ms < 50 ms")
        # One long stall hides in a percentile: bound the worst round trip too (generously: a
        # shared CI machine may deschedule a process for a while).
        check(worst < MAX_STALL_S, f"{what}: another client's worst round trip {worst * 1e3:.0f} ms < "
              f"{MAX_STALL_S * 1e3:.0f} ms")
