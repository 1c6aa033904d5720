"""The attack suite's last section: a real 2-node job (two ddprun agents, c10d rendezvous on the
daemon) runs while the WAIT, APPEND and LIST_KEYS attacks hit another job's keyspace."""
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

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from attack_lib import *  # noqa: E402,F401,F403

JOB_WORKER = """
import os, sys, time
sys.path.insert(0, os.environ["ATTACK_INTEROP_DIR"])
from interop_common import RawConn, blob
d, r, n = os.environ["ATTACK_DIR"], os.environ["RANK"], os.environ["TORCHELASTIC_RESTART_COUNT"]
c = RawConn(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), timeout=30.0)
c.op("SET", blob("/w" + r), blob("x"))
open(os.path.join(d, "started-" + r), "w").close()
lat, end = [], time.monotonic() + 120
while not os.path.exists(os.path.join(d, "stop")) and time.monotonic() < end:
    t0 = time.monotonic()
    c.get("/w" + r)
    lat.append(time.monotonic() - t0)
    time.sleep(0.002)
with open(os.path.join(d, "lat-" + r + "-" + n), "w") as f:
    f.write("\\n".join(repr(x) for x in lat))
"""


def p99_report(what, samples):
    s = sorted(samples)
    check(len(s) >= 100, f"{what}: {len(s)} round trips (>= 100)")
    p99 = s[int(len(s) * 0.99) - 1]
    log(f"{what}: {len(s)} round trips, p50 {s[len(s) // 2] * 1e3:.2f} ms, p99 {p99 * 1e3:.2f} ms, "
        f"max {s[-1] * 1e3:.2f} ms")
    check(p99 < P99_LIMIT_S, f"{what}: p99 {p99 * 1e3:.1f} ms < 50 ms")


class JoinProber(threading.Thread):
    """Rendezvous round trips on the daemon: a 1-node job's JOIN until its ROUND, again and again."""

    def __init__(self, port):
        super().__init__(daemon=True)
        self.port, self.samples, self.stop_flag, self.errors = port, [], threading.Event(), []

    def run(self):
        i = 0
        while not self.stop_flag.is_set():
            i += 1
            t0 = time.monotonic()
            s = join(self.port, f"probe{i}", 0)
            msg = read_frame(s)
            self.samples.append(time.monotonic() - t0)
            if msg is None or msg[0] != ROUND:
                self.errors.append(msg)
            s.close()
            time.sleep(0.005)


def attack_keyspace(d, port):
    """The attack set against one keyspace (a round's store of another job on the daemon)."""
    a = RawConn(d.host, port, timeout=60.0)
    keys = [f"/attack/{i:06d}/".encode() + b"k" * 184 for i in range(64 * 1024)]
    a.op("WAIT", u64(len(keys)) + b"".join(blob(k) for k in keys))
    a.send((bytes([a.codes["APPEND"]]) + blob("/attack/log") + blob(b"a" * 512)) * 15000)
    a.send(b"".join(bytes([a.codes["SET"]]) + blob(f"/list/{i:06d}/{'p' * 230}") + blob("v") for i in range(20000)))
    a.op("GETNUMKEYS")
    got = a.recv_i64()
    check(got == 20001, f"the attacker's WAIT, 15,000 APPENDs and 20,000 SETs were applied")
    readers = []
    for _ in range(8):  # LIST_KEYS replies of 5 MB that nobody reads
        r = RawConn(d.host, port, timeout=60.0)
        r.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        r.send(bytes([r.codes["LIST_KEYS"]]) * 4)
        readers.append(r)
    time.sleep(1.0)
    return [a] + readers


def real_job_under_attack(binary):
    ddprun = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(binary))), "launcher", "ddprun")
    check(os.access(ddprun, os.X_OK), f"ddprun is built next to ddprund ({ddprun})")
    d = Daemon(binary, ["--max-memory", str(256 << 20)])
    with tempfile.TemporaryDirectory(prefix="ddprun-attack-") as tmp:
        env = dict(os.environ, ATTACK_DIR=tmp,
                   ATTACK_INTEROP_DIR=os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "interop"))
        args = [ddprun, "--nnodes=2", "--nproc_per_node=1", "--rdzv_backend=c10d",
                f"--rdzv_endpoint=127.0.0.1:{d.port}", "--rdzv_id=victim-job", "--max_restarts=3",
                "--no_python", sys.executable, "-c", JOB_WORKER]
        logs = [open(os.path.join(tmp, f"agent{i}.log"), "w+b") for i in range(2)]
        agents = [ic.spawn(args, stdout=lg, stderr=subprocess.STDOUT, env=env) for lg in logs]
        deadline = time.monotonic() + 60
        while not all(os.path.exists(os.path.join(tmp, f"started-{r}")) for r in range(2)):
            check(time.monotonic() < deadline and all(a.poll() is None for a in agents),
                  "waiting for both workers of the 2-node job to start")
            time.sleep(0.1)
        log("a 2-node ddprun job runs on the daemon; the attack set goes to another job's keyspace")
        prober = JoinProber(d.port)
        prober.start()
        time.sleep(0.5)
        attacker, store_port = other_job_store(d)
        t0 = time.monotonic()
        conns = attack_keyspace(d, store_port)
        log(f"the attack set was applied in {time.monotonic() - t0:.2f} s")
        time.sleep(2.0)  # the job keeps running with the unread replies held
        prober.stop_flag.set()
        prober.join(timeout=30)
        open(os.path.join(tmp, "stop"), "w").close()
        rcs = []
        for a in agents:
            try:
                rcs.append(a.wait(timeout=60))
            except subprocess.TimeoutExpired:
                rcs.append(None)
        out = b"".join(lg.seek(0) or lg.read() for lg in logs).decode(errors="replace")
        if rcs != [0, 0]:
            log(out[-4000:])
        check(rcs == [0, 0], f"both agents of the job exit 0 (got {rcs})")
        lat = sorted(os.listdir(tmp))
        check([f for f in lat if f.startswith("lat-")] == ["lat-0-0", "lat-1-0"],
              f"each worker ran once, in restart 0: no restart spent ({lat})")
        samples = []
        for f in ("lat-0-0", "lat-1-0"):
            with open(os.path.join(tmp, f)) as fh:
                samples += [float(x) for x in fh.read().split()]
        p99_report("the job's store during the attack", samples)
        check(not prober.errors, f"every probing JOIN got its ROUND ({prober.errors[:3]})")
        p99_report("rendezvous JOIN to ROUND during the attack", prober.samples)
        for c in conns:
            c.close()
        attacker.close()
        for lg in logs:
            lg.close()
    check(d.alive(), "ddprund alive")
    check(stopped(d) == 0, "ddprund exits 0 on SIGTERM")
