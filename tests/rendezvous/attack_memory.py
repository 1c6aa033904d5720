#!/usr/bin/env python3
"""ddprund under a memory cgroup, started as ddprund.service starts it: memory attacks end in
refusals, never in the kernel's OOM killer, and what an attack made it hold goes back to the
system once it is idle.

The cgroup is a child of this process's own memory cgroup (v1 memory controller, or v2 where
it has one) whose limit is the unit's MemoryMax / SCALE (ddprund sizes its budget,
--max-memory, from the limit it finds, so the proportions are those of the unit).
ddprund is started by the unit's ExecStart script (packaging/systemd/ddprund-service, with the
settings of packaging/default/ddprund) inside it, as a spare uid. Socket buffers are charged to
the cgroup in v2; in v1 only when TCP accounting is switched on, which this test does, adding
them to the peak it reports.

  queue_non_readers  20 connections pipeline 8 MiB QUEUE_PUSH + QUEUE_POP and read nothing
                     (with the unit's old budget, as large as MemoryMax, the kernel killed it);
                     the kernel's socket buffers for them stay small (capped per connection)
  big_sets           8 MiB SETs of distinct keys from 4 connections until refused
  big_wait_keys      WAITs naming 8,000 absent keys of 8 KiB (64 MiB each) from 8 connections
  many_connections   400 connections that each send 1 MiB of an 8 MiB SET and stop
  idle_trim          4 connections wait on 2,000 absent keys of 8 KiB each (within the budget:
                     small blocks the allocator keeps once freed), then go at once; with no
                     request after, RSS falls below half its peak (it used to stay until the
                     next request)

The attacks run in this order against one ddprund: big_sets, big_wait_keys, many_connections,
queue_non_readers, idle_trim. After each: ddprund alive, no OOM kill in the cgroup, the attack
was refused (connections closed, a line naming --max-memory), and an honest client is served.
Idle connections (about 9 KiB each in the cgroup) are charged to the budget too; the tens of
thousands it takes to fill 512 MiB pass the descriptor limit a test can have here, so
rendezvous.server_client checks that (IdleConnectionsCountInTheMemoryBudget).

Needs root (cgroups, the spare uid); fails, never skips, without them.
usage: attack_memory.py --ddprund PATH [--only ATTACK]... [--args "MORE DDPRUND FLAGS"]
(--args, e.g. the old unit's --max-memory as large as the limit, is for measurements.)
"""
import argparse
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "interop"))
import interop_common as ic  # noqa: E402
from interop_common import RawConn, TestFailure, blob, check, log, log_says, run_main, u64  # noqa: E402

ROOT = os.path.abspath(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
UNIT = os.path.join(ROOT, "packaging", "systemd", "ddprund.service")
WRAPPER = os.path.join(ROOT, "packaging", "systemd", "ddprund-service")
DEFAULTS = os.path.join(ROOT, "packaging", "default", "ddprund")
SCALE = 12  # the cgroup's limit is the unit's MemoryMax / SCALE (512 MiB)
SPARE_UID = 64917
MIB = 1 << 20
VALUE = 8 * MIB


def unit_memory_max():
    units = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}
    with open(UNIT) as f:
        for line in f:
            if line.startswith("MemoryMax="):
                v = line.split("=", 1)[1].strip()
                return int(v[:-1]) * units[v[-1]] if v[-1] in units else int(v)
    raise TestFailure(f"{UNIT} sets no MemoryMax")


class MemoryCgroup:
    """A child of this process's memory cgroup, with a limit; removed by close()."""

    def __init__(self, limit):
        self.limit = limit
        own = {}
        with open("/proc/self/cgroup") as f:
            for line in f:
                hid, ctrl, path = line.rstrip("\n").split(":", 2)
                own["v2" if hid == "0" and not ctrl else ctrl] = path
        mounts = {}
        with open("/proc/self/mountinfo") as f:
            for line in f:
                left, right = line.split(" - ", 1)
                root, point = left.split()[3:5]
                fstype, _src, opts = right.split()[:3]
                if fstype == "cgroup2":
                    mounts.setdefault("v2", (root, point))
                elif fstype == "cgroup" and "memory" in opts.split(","):
                    mounts.setdefault("memory", (root, point))
        self.v2 = False
        self.dir = None
        v2_dir = self._dir_of(mounts.get("v2"), own.get("v2"))
        if v2_dir and os.path.exists(os.path.join(v2_dir, "memory.max")):
            self.v2, parent = True, v2_dir
        else:
            ctrl = next((c for c in own if "memory" in c.split(",")), None)
            parent = self._dir_of(mounts.get("memory"), own.get(ctrl))
        if not parent or not os.path.isdir(parent):
            raise TestFailure("no memory cgroup controller found (run as root on a host with cgroup v1 memory or v2)")
        self.dir = os.path.join(parent, f"ddprun-attack-memory-{os.getpid()}")
        try:
            os.mkdir(self.dir)
            if self.v2:
                self._write("memory.max", limit)
                self._write("memory.swap.max", 0)
            else:
                self._write("memory.limit_in_bytes", limit)
                if os.path.exists(self._path("memory.memsw.limit_in_bytes")):
                    self._write("memory.memsw.limit_in_bytes", limit)
                # v1 charges socket buffers only once TCP accounting is on (v2 always does).
                self._write("memory.kmem.tcp.limit_in_bytes", 1 << 40)
        except OSError as e:
            raise TestFailure(f"cannot set up the memory cgroup {self.dir}: {e} (the test needs root)")
        log(f"memory cgroup {self.dir} (v{'2' if self.v2 else '1'}), limit {limit // MIB} MiB")

    @staticmethod
    def _dir_of(mount, path):
        if not mount or path is None:
            return None
        root, point = mount
        if root != "/" and not (path == root or path.startswith(root + "/")):
            return None
        return point + (path[len(root):] if root != "/" else path).rstrip("/")

    def _path(self, name):
        return os.path.join(self.dir, name)

    def _write(self, name, value):
        with open(self._path(name), "w") as f:
            f.write(str(value))

    def read(self, name):
        try:
            with open(self._path(name)) as f:
                return f.read()
        except OSError:
            return ""

    def join(self):
        """In a child before exec: moves it into the cgroup."""
        with open(self._path("cgroup.procs"), "w") as f:
            f.write(str(os.getpid()))

    def usage(self):
        """Bytes charged now, socket buffers included."""
        if self.v2:
            return int(self.read("memory.current") or 0)
        return int(self.read("memory.usage_in_bytes") or 0) + int(self.read("memory.kmem.tcp.usage_in_bytes") or 0)

    def socket_bytes(self):
        """Kernel memory of its sockets' buffers now."""
        if self.v2:
            for line in self.read("memory.stat").splitlines():
                if line.startswith("sock "):
                    return int(line.split()[1])
            return 0
        return int(self.read("memory.kmem.tcp.usage_in_bytes") or 0)

    def oom_kills(self):
        for line in self.read("memory.events" if self.v2 else "memory.oom_control").splitlines():
            if line.startswith("oom_kill "):
                return int(line.split()[1])
        return 0

    def close(self):
        """Removes the cgroup, killing what is left in it (only this test's processes are)."""
        if not self.dir or not os.path.isdir(self.dir):
            return
        for _ in range(50):
            for pid in self.read("cgroup.procs").split():
                try:
                    os.kill(int(pid), signal.SIGKILL)
                except OSError:
                    pass
            try:
                os.rmdir(self.dir)
                return
            except OSError:
                time.sleep(0.1)
        log(f"could not remove {self.dir}")


class ServiceDaemon(ic.Daemon):
    """ddprund started by the unit's ExecStart script with the packaged settings, inside `cg`, as
    SPARE_UID (the unit's User=). Only the binary's path, the port and the token file differ."""

    def __init__(self, binary, cg, work, more_args=""):
        token = os.path.join(work, "rdzv-token")
        with open(token, "w") as f:
            f.write("0123456789abcdef0123456789abcdef\n")
        os.chmod(token, 0o600)
        os.chown(token, SPARE_UID, SPARE_UID)
        wrapper = os.path.join(work, "ddprund-service")
        with open(WRAPPER) as f:
            text = f.read()
        check("exec /usr/bin/ddprund " in text, "the unit's ExecStart script execs /usr/bin/ddprund")
        with open(wrapper, "w") as f:
            f.write(text.replace("/usr/bin/ddprund", binary))
        os.chmod(wrapper, 0o755)
        env = {"PATH": "/usr/sbin:/usr/bin:/sbin:/bin"}
        with open(DEFAULTS) as f:  # EnvironmentFile=: its assignments
            for line in f:
                line = line.strip()
                if line and not line.startswith("#") and "=" in line:
                    k, v = line.split("=", 1)
                    env[k] = v.strip('"')
        env.update(DDPRUND_PORT="0", DDPRUND_TOKEN_FILE=token, DDPRUND_ARGS=f"--host=127.0.0.1 {more_args}")
        self.stderr_file = tempfile.NamedTemporaryFile(prefix="ddprund-", suffix=".log", delete=False)
        os.chmod(work, 0o755)
        self.proc = ic.spawn(["setpriv", f"--reuid={SPARE_UID}", f"--regid={SPARE_UID}", "--clear-groups", wrapper],
                             env=env, stdout=subprocess.PIPE, stderr=self.stderr_file, preexec_fn=cg.join)
        line = ic.read_line_with_deadline(self.proc.stdout, 30, "ddprund")
        if not line.startswith("ddprund listening on "):
            raise TestFailure(f"unexpected first line from ddprund: {line!r}")
        self.port, self.host = int(line.rsplit(":", 1)[1]), "127.0.0.1"
        self._stdout_chunks = []
        self._drain = threading.Thread(target=self._drain_stdout, daemon=True)
        self._drain.start()
        log(f"ddprund pid {self.proc.pid} (the service's start, uid {SPARE_UID}) on {self.host}:{self.port}")


class Peak:
    """Samples the cgroup's usage and ddprund's RSS while an attack runs."""

    def __init__(self, cg, d):
        self.cg, self.d, self.usage, self.rss = cg, d, 0, 0
        self.t0 = time.monotonic()
        self._stop = threading.Event()
        self._t = threading.Thread(target=self._run, daemon=True)

    def _run(self):
        while not self._stop.is_set():
            self.sample()
            time.sleep(0.02)

    def sample(self):
        self.usage = max(self.usage, self.cg.usage())
        if self.d.alive():
            try:
                self.rss = max(self.rss, self.d.rss_kb() * 1024)
            except (OSError, TestFailure):
                pass

    def __enter__(self):
        self._t.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._t.join()
        self.sample()


def attackers(d, n, send, settle_s=15.0, then=None):
    """n connections in threads, each running send(conn) until it returns or the server closes
    it, then waiting up to settle_s for the server to close it; returns how many it closed.
    then(): called while the attackers still hold their connections open."""
    conns = [RawConn(d.host, d.port, timeout=60.0) for _ in range(n)]
    for c in conns:
        c.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    closed = []

    def run(c):
        try:
            send(c)
        except OSError:
            pass
        if c.is_closed_by_peer(settle_s):
            closed.append(c)

    threads = [threading.Thread(target=run, args=(c,), daemon=True) for c in conns]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    if then:
        then()
    for c in conns:
        c.close()
    return len(closed)


def after_attack(name, d, cg, peak, closed, n, budget_words=True):
    log(f"{name} ({time.monotonic() - peak.t0:.1f} s): peak cgroup usage {peak.usage // MIB} MiB (RSS {peak.rss // MIB} MiB) of {cg.limit // MIB} MiB; "
        f"{closed} of {n} connections closed by ddprund")
    check(d.alive() and cg.oom_kills() == 0, f"{name}: ddprund alive, no OOM kill in its cgroup")
    check(closed > 0, f"{name}: ddprund refused the attack (closed its connections)")
    if budget_words:
        check(log_says(d, "--max-memory"), f"{name}: the refusals name --max-memory")
    honest = RawConn(d.host, d.port, timeout=30.0)
    honest.op("SET", blob(f"/honest/{name}"), blob("ok"))
    check(honest.get(f"/honest/{name}") == b"ok", f"{name}: an honest client is served")
    honest.close()


def queue_non_readers(d, cg):
    def send(c):
        item = bytes([c.codes["QUEUE_PUSH"]]) + blob(f"/q/{id(c)}") + u64(VALUE) + b"q" * VALUE
        pop = bytes([c.codes["QUEUE_POP"]]) + blob(f"/q/{id(c)}")
        for _ in range(6):
            c.send(item + pop)

    held = []
    with Peak(cg, d) as peak:
        closed = attackers(d, 20, send, then=lambda: held.append(cg.socket_bytes()))
    after_attack("queue_non_readers", d, cg, peak, closed, 20)
    log(f"queue_non_readers: the kernel held {held[0] // 1024} KiB of socket buffers once the attackers "
        "were refused (their ends still open, reading nothing)")
    # Autotuned, each connection's send buffer grows to 4 MiB (10-20 MiB held here).
    check(held[0] < 8 * MIB, "queue_non_readers: the socket buffers of 20 non-readers stay under 8 MiB (capped)")
    return peak


def big_sets(d, cg):
    def send(c):
        for i in range(40):
            c.op("SET", blob(f"/big/{id(c)}/{i}"), u64(VALUE) + b"s" * VALUE)

    with Peak(cg, d) as peak:
        closed = attackers(d, 4, send)
    after_attack("big_sets", d, cg, peak, closed, 4)
    # What the attack stored stays (it is data): an honest client deletes it.
    c = RawConn(d.host, d.port, timeout=60.0)
    c.op("LIST_KEYS")
    n = c.recv_i64()
    keys = [c.recv_blob() for _ in range(n)]
    for k in keys:
        c.op("DELETE_KEY", blob(k))
        c.recv_i64()
    c.close()
    return peak


def big_wait_keys(d, cg):
    def send(c):
        keys = [f"/absent/{id(c)}/{i:05d}/".encode() + b"k" * (8 * 1024 - 40) for i in range(8000)]
        for _ in range(4):
            c.op("WAIT", u64(len(keys)), *[blob(k) for k in keys])

    with Peak(cg, d) as peak:
        closed = attackers(d, 8, send, settle_s=5.0)
    after_attack("big_wait_keys", d, cg, peak, closed, 8)
    return peak


def many_connections(d, cg):
    def send(c):
        c.op("SET", blob(f"/part/{id(c)}"), u64(VALUE) + b"p" * MIB)

    with Peak(cg, d) as peak:
        closed = attackers(d, 400, send, settle_s=5.0)
    after_attack("many_connections", d, cg, peak, closed, 400)
    return peak


def idle_trim(d, cg):
    conns = [RawConn(d.host, d.port, timeout=60.0) for _ in range(4)]
    for c in conns:
        keys = [f"/idle/{id(c)}/{i:05d}/".encode() + b"k" * (8 * 1024 - 40) for i in range(2000)]
        c.op("WAIT", u64(len(keys)), *[blob(k) for k in keys])
    honest = RawConn(d.host, d.port, timeout=30.0)
    check(honest.num_keys() >= 0, "idle_trim: the 4 WAITs are registered (a later request is served)")
    honest.close()
    peak = d.rss_kb() * 1024
    for c in conns:
        c.close()
    low = peak
    for _ in range(30):  # 3 s, and not one request
        time.sleep(0.1)
        low = min(low, d.rss_kb() * 1024)
    log(f"idle_trim: RSS {peak // MIB} MiB with the waiters, {low // MIB} MiB once idle")
    check(low < peak // 2, "idle_trim: idle, ddprund hands the freed memory back (RSS < half its peak)")
    check(d.alive() and cg.oom_kills() == 0, "idle_trim: ddprund alive, no OOM kill")


ATTACKS = (big_sets, big_wait_keys, many_connections, queue_non_readers, idle_trim)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--ddprund", required=True)
    ap.add_argument("--only", choices=[f.__name__ for f in ATTACKS], action="append")
    ap.add_argument("--args", default="")
    args = ap.parse_args()
    if os.geteuid() != 0:
        raise TestFailure("this test needs root (a memory cgroup, a spare uid); CI runs it as root")
    limit = unit_memory_max() // SCALE
    cg = MemoryCgroup(limit)
    work = tempfile.mkdtemp(prefix="ddprun-attack-memory-")
    d = None
    try:
        d = ServiceDaemon(os.path.abspath(args.ddprund), cg, work, args.args)
        log(f"idle: cgroup usage {cg.usage() // MIB} MiB, RSS {d.rss_kb() // 1024} MiB")
        peaks = [f(d, cg) for f in ATTACKS if not args.only or f.__name__ in args.only]
        worst = max((p.usage for p in peaks if p), default=0)
        log(f"worst peak: {worst // MIB} MiB of the cgroup's {limit // MIB} MiB")
        check(d.alive() and cg.oom_kills() == 0, "ddprund alive, never OOM-killed")
        check(d.stop() == 0, "ddprund exits 0 on SIGTERM")
    except BaseException:
        if d:
            log("ddprund's last lines:\n" + "\n".join(d.log_text().splitlines()[-20:]))
        raise
    finally:
        if d and d.alive():
            d.proc.kill()
            d.proc.wait(10)
        ic.kill_children()
        cg.close()
        shutil.rmtree(work, ignore_errors=True)
        if d:
            os.unlink(d.stderr_file.name)


if __name__ == "__main__":
    run_main(main, watchdog_s=170)
