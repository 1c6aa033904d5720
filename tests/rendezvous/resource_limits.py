#!/usr/bin/env python3
"""ddprund (a separate process) against a stranger who wants it to abort or balloon
(descriptors, JOIN floods, amplifying requests, warning floods). Each section failed on the
code before the limits:

  joins_past_fd_limit   5000 rendezvous JOINs with new run ids, server at 200 descriptors:
                        it aborted (rc 134) when a job's store could not bind (EMFILE).
  conns_past_fd_limit   5000 connections past the descriptor limit: a warning every 10 ms.
  warning_flood         2000 bad connections: one console line each.
  job_limit             --max-jobs: a JOIN for one job too many gets an ERROR naming the flag.
  amplifying_multi_get  one 1 KiB MULTI_GET naming an 8 MiB value 100 times: +1.6 GB RSS.
  shared_multi_get      the same MULTI_GET allowed (--max-reply-bytes 1 GiB) and answered: the
                        reply copied the value per occurrence (+800 MB RSS); now it references
                        it (streamed, a slow reader too, a SET meanwhile does not tear it).
  linear_parsing        one 60 MiB MULTI_SET of 128 Ki small pairs: ~18 s of server CPU.

After each, a plain TCPStore client and a fresh JOIN must still be served. Needs no torch.

usage: resource_limits.py --ddprund PATH
"""
import argparse
import os
import resource
import select
import socket
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "interop"))
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "pylib"))
import interop_common as ic  # noqa: E402
from interop_common import Daemon, RawConn, blob, check, check_eq, log, run_main, u64  # noqa: E402
from ddprun_testlib import AGENT_HELLO, agent_frame, read_agent_frame  # noqa: E402

JOIN, ROUND, ERROR = 1, 20, 24


def start_daemon(binary, extra=(), nofile=None):
    """ddprund, optionally with a low descriptor limit (soft = hard, so it cannot raise it)."""
    if nofile is None:
        return Daemon(binary, extra)
    orig = ic.spawn

    def limited(args, **kw):
        def lower():
            resource.setrlimit(resource.RLIMIT_NOFILE, (nofile, nofile))

        return orig(args, preexec_fn=lower, **kw)

    ic.spawn = limited
    try:
        return Daemon(binary, extra)
    finally:
        ic.spawn = orig


def raise_own_fd_limit(want):
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    target = hard if hard == resource.RLIM_INFINITY else min(hard, max(soft, want))
    resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
    if target < want:
        log(f"SKIP-ish: only {target} descriptors for the test process; using fewer connections")
    return target


def cpu_seconds(pid):
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def warning_lines(d, needle=""):
    return [ln for ln in d.log_text().splitlines() if "[warning]" in ln and needle in ln]


def join_bytes(run_id):
    fields = {"run_id": run_id, "node_id": run_id + "-node", "host": "127.0.0.1", "local_world_size": "1",
              "min_nodes": "1", "max_nodes": "1", "heartbeat_timeout_ms": "600000"}
    return AGENT_HELLO + agent_frame(JOIN, fields)


def open_join(port, run_id):
    """Connects and sends a JOIN without waiting: a server out of descriptors leaves it in its backlog."""
    s = socket.socket()
    s.setblocking(False)
    s.connect_ex(("127.0.0.1", port))
    return [s, join_bytes(run_id), b"", None]  # socket, unsent, received, outcome


def pump_joins(conns, quiet_s):
    """Sends what is unsent and reads replies until every JOIN has an outcome (ROUND, ERROR,
    closed) or nothing happened for quiet_s (a hang guard: the rest wait in the backlog)."""
    last = time.monotonic()
    while True:
        open_ = [c for c in conns if c[3] is None]
        if not open_ or time.monotonic() - last > quiet_s:
            return
        wr = [c[0] for c in open_ if c[1]]
        rd = [c[0] for c in open_]
        r, w, _ = select.select(rd, wr, [], 0.2)
        by_sock = {c[0]: c for c in open_}
        for s in w:
            c = by_sock[s]
            try:
                n = s.send(c[1])
                c[1] = c[1][n:]
                last = time.monotonic()
            except BlockingIOError:
                pass
            except OSError:
                c[3] = "closed"
        for s in r:
            c = by_sock[s]
            try:
                chunk = s.recv(65536)
            except BlockingIOError:
                continue
            except OSError:
                chunk = b""
            last = time.monotonic()
            if not chunk:
                c[3] = "closed"
                continue
            c[2] += chunk
            if len(c[2]) >= 5:
                c[3] = {ROUND: "round", ERROR: "error"}.get(c[2][4], "other")


def join_and_read(port, run_id, timeout_s=30.0, frame=None):
    """One JOIN (of run_id, or `frame` as is): the socket, and the reply's message type and
    fields (None and {} when the connection closed first)."""
    s = socket.create_connection(("127.0.0.1", port), timeout=timeout_s)
    s.sendall(frame or join_bytes(run_id))
    try:
        msg_type, fields = read_agent_frame(s)
    except AssertionError:
        s.close()
        return None, None, {}
    return s, msg_type, fields


def still_serves(d, what):
    c = RawConn(d.host, d.port, timeout=60.0)
    c.op("SET", blob(f"/alive/{what}"), blob(what))
    check_eq(c.get(f"/alive/{what}"), what.encode(), f"a TCPStore client is served after {what}")
    c.close()
    s, kind, _ = join_and_read(d.port, f"fresh-after-{what}-{time.monotonic_ns()}", timeout_s=60.0)
    check(s is not None and kind == ROUND, f"a fresh JOIN gets its ROUND after {what}")
    s.close()
    check(d.alive(), "ddprund alive")


def joins_past_fd_limit(binary):
    d = start_daemon(binary, ["--threads", "1"], nofile=200)
    start = time.monotonic()
    outcomes = {}
    total, batch = 5000, 400
    done = 0
    while done < total:
        n = min(batch, total - done)
        conns = [open_join(d.port, f"job-{done + i}") for i in range(n)]
        pump_joins(conns, quiet_s=1.0)
        for c in conns:
            outcomes[c[3] or "pending"] = outcomes.get(c[3] or "pending", 0) + 1
            c[0].close()
        done += n
        check(d.alive(), f"ddprund alive after {done} JOINs with new run ids (200 descriptors)")
    log(f"  JOIN outcomes: {outcomes}")
    check(outcomes.get("round", 0) > 0, "some JOINs got their ROUND")
    check(outcomes.get("round", 0) < total, "the descriptor limit was reached (not every JOIN got a ROUND)")
    errors = warning_lines(d)
    log(f"  {len(errors)} warning lines in {time.monotonic() - start:.1f}s")
    still_serves(d, "5000 JOINs past the descriptor limit")
    check_eq(d.stop(), 0, "ddprund exit code after SIGTERM")


def conns_past_fd_limit(binary):
    d = start_daemon(binary, ["--threads", "1"], nofile=200)
    n = min(5000, raise_own_fd_limit(5200) - 100)
    start = time.monotonic()
    socks = []
    for _ in range(n):
        s = socket.socket()
        s.setblocking(False)
        s.connect_ex(("127.0.0.1", d.port))
        socks.append(s)
    # Give the server the connections' first bytes (a D2 VALIDATE) so it has work on each.
    for s in socks:
        try:
            s.send(b"\x00" + ic.MAGIC)
        except OSError:
            pass
    check(d.alive(), f"ddprund alive with {n} connections at 200 descriptors")
    # A client now may be refused (closed) or wait: either is fine, the server must not die.
    for s in socks:
        s.close()
    still_serves(d, f"{n} connections past the descriptor limit")
    elapsed = time.monotonic() - start
    warns = warning_lines(d)
    log(f"  {len(warns)} warning lines in {elapsed:.1f}s; first: {warns[:1]}")
    # Rate-limited: at most one line per second per kind (a handful of kinds).
    check(len(warns) <= 8 * (elapsed + 2), f"warnings rate-limited ({len(warns)} lines in {elapsed:.1f}s)")
    check_eq(d.stop(), 0, "ddprund exit code after SIGTERM")


def warning_flood(binary):
    d = start_daemon(binary)
    start = time.monotonic()

    def bad_connection():
        c = RawConn(d.host, d.port)
        c.send(bytes([200]))  # an unknown command byte: closed as bad input
        c.is_closed_by_peer(30.0)
        c.close()

    n = 2000
    for _ in range(n):
        bad_connection()
    # The count of the lines left out rides on the next line shown, a second after the first:
    # keep misbehaving until it appears (bounded).
    deadline = time.monotonic() + 60
    while not any("more like it" in w for w in warning_lines(d, "closing connection")) and time.monotonic() < deadline:
        for _ in range(50):
            bad_connection()
            n += 1
    elapsed = time.monotonic() - start
    still_serves(d, f"{n} bad connections")
    warns = warning_lines(d, "closing connection")
    log(f"  {len(warns)} 'closing connection' lines for {n} bad connections in {elapsed:.1f}s")
    check(len(warns) <= 2 * (elapsed + 2), "bad-peer warnings are rate-limited (about one a second)")
    check(any("more like it" in w for w in warns), "a later line counts the ones left out")
    check_eq(d.stop(), 0, "ddprund exit code after SIGTERM")


def job_limit(binary):
    d = start_daemon(binary, ["--max-jobs", "3"])
    held = []
    for i in range(3):
        s, kind, _ = join_and_read(d.port, f"limited-{i}")
        check(s is not None and kind == ROUND, f"JOIN of job {i + 1} of 3 gets its ROUND")
        held.append(s)
    s, kind, fields = join_and_read(d.port, "one-too-many")
    check(kind == ERROR and "--max-jobs" in " ".join(fields.values()), "a JOIN for a 4th job gets an ERROR naming --max-jobs")
    if s is not None:
        s.close()
    # A job that would wait for a second node opens no store: it is counted all the same.
    two_nodes = (join_bytes("gathering").replace(blob("max_nodes") + blob("1"), blob("max_nodes") + blob("2"))
                 .replace(blob("min_nodes") + blob("1"), blob("min_nodes") + blob("2")))
    s, kind, _ = join_and_read(d.port, None, frame=two_nodes)
    check(kind == ERROR, "a JOIN for a 4th job still gathering its nodes gets an ERROR too")
    if s is not None:
        s.close()
    held.pop().close()
    # The job of the closed connection ends when the server sees the close; retry until then.
    deadline = time.monotonic() + 60
    while True:
        s, kind, _ = join_and_read(d.port, f"after-one-ended-{time.monotonic_ns()}")
        if kind == ROUND or time.monotonic() > deadline:
            break
        if s is not None:
            s.close()
    check(kind == ROUND, "once a job ends, a new one is admitted")
    s.close()
    for h in held:
        h.close()
    check_eq(d.stop(), 0, "ddprund exit code after SIGTERM")


def amplifying_multi_get(binary):
    d = start_daemon(binary)
    c = RawConn(d.host, d.port, timeout=60.0)
    value = os.urandom(8 * 1024 * 1024)
    c.op("SET", blob("/big"), blob(value))
    check_eq(c.get("/big")[:16], value[:16], "the 8 MiB value is stored")
    c.close()
    before = d.rss_kb()
    a = RawConn(d.host, d.port, timeout=60.0)
    req = bytes([ic.D2["MULTI_GET"]]) + u64(100) + blob("/big") * 100
    log(f"  MULTI_GET of {len(req)} bytes naming the 8 MiB value 100 times")
    a.send(req)
    a.is_closed_by_peer(30.0)  # refused (closed) or, unbounded, 800 MiB to drain
    a.close()
    after = d.rss_kb()
    log(f"  ddprund VmRSS {before} kB -> {after} kB")
    check((after - before) < 64 * 1024, f"RSS growth {(after - before) // 1024} MB < 64 MB")
    # A MULTI_GET within the reply limit still works: 4 x 8 MiB.
    b = RawConn(d.host, d.port, timeout=60.0)
    b.send(bytes([ic.D2["MULTI_GET"]]) + u64(4) + blob("/big") * 4)
    for i in range(4):
        check(b.recv_blob() == value, f"MULTI_GET within the limit: value {i + 1} of 4 intact")
    b.close()
    still_serves(d, "an amplifying MULTI_GET")
    check_eq(d.stop(), 0, "ddprund exit code after SIGTERM")


def recv_into_exact(sock, view):
    got = 0
    while got < len(view):
        n = sock.recv_into(view[got:])
        if n == 0:
            raise EOFError(f"connection closed after {got} of {len(view)} bytes")
        got += n


class PeakRss:
    """ddprund's peak RSS from now on: /proc/PID/clear_refs "5" resets VmHWM (Linux 4.0+);
    where it cannot, samples of VmRSS taken at each mark()."""

    def __init__(self, d):
        self.d = d
        self.base = d.rss_kb()
        try:
            with open(f"/proc/{d.proc.pid}/clear_refs", "w") as f:
                f.write("5")
            self.hwm = True
        except OSError:
            self.hwm = False
        self.sampled = self.base

    def mark(self):
        self.sampled = max(self.sampled, self.d.rss_kb())

    def growth_kb(self):
        self.mark()
        peak = self.sampled
        if self.hwm:
            with open(f"/proc/{self.d.proc.pid}/status") as f:
                for line in f:
                    if line.startswith("VmHWM:"):
                        peak = max(peak, int(line.split()[1]))
        return peak - self.base


def read_values(sock, count, value, what, peak, first_bytes=None):
    """Reads `count` blobs of a MULTI_GET reply (8 MiB each, into one buffer: streamed) and
    checks each is `value`. first_bytes: bytes of the first blob read already."""
    buf = bytearray(len(value))
    view = memoryview(buf)
    for i in range(count):
        if i == 0 and first_bytes is not None:
            head, body = first_bytes[:8], first_bytes[8:]
            recv_into_exact(sock, view[len(body):])
            view[:len(body)] = body
        else:
            head = bytearray(8)
            recv_into_exact(sock, memoryview(head))
            recv_into_exact(sock, view)
        if int.from_bytes(head, "little") != len(value):
            raise ic.TestFailure(f"{what}: value {i + 1} of {count} has length {int.from_bytes(head, 'little')}")
        if buf != value:
            raise ic.TestFailure(f"{what}: value {i + 1} of {count} differs from the value stored")
        if i % 10 == 0:
            peak.mark()
    log(f"  ok: {what}: {count} values of {len(value)} bytes intact")


def shared_multi_get(binary):
    d = start_daemon(binary, ["--max-reply-bytes", str(1 << 30)])
    value = os.urandom(8 * 1024 * 1024)
    w = RawConn(d.host, d.port, timeout=120.0)
    w.op("SET", blob("/big"), blob(value))
    check(w.get("/big") == value, "the 8 MiB value is stored")
    req = bytes([ic.D2["MULTI_GET"]]) + u64(100) + blob("/big") * 100

    # A reader that keeps up: 800 MiB answered, every occurrence intact, RSS flat.
    peak = PeakRss(d)
    a = RawConn(d.host, d.port, timeout=120.0)
    a.send(req)
    read_values(a.sock, 100, value, "MULTI_GET of one value 100 times", peak)
    grew = peak.growth_kb()
    log(f"  streamed 800 MiB; ddprund peak RSS growth {grew // 1024} MB")
    check(grew < 64 * 1024, f"RSS growth while answering 100 x 8 MiB: {grew // 1024} MB < 64 MB")
    a.close()

    # A reader that stops after the first bytes holds the whole reply queued in the server (it is
    # queued in full before its first byte is written); a SET of the key meanwhile must neither
    # copy the reply nor reach it.
    peak = PeakRss(d)
    s = socket.socket()
    s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 64 * 1024)
    s.connect((d.host, d.port))
    s.sendall(b"\x00" + ic.MAGIC + req)
    s.settimeout(120.0)
    first = bytearray(8 + 4096)
    recv_into_exact(s, memoryview(first))
    held = peak.growth_kb()
    log(f"  slow reader holding the reply: ddprund RSS growth {held // 1024} MB")
    check(held < 64 * 1024, f"RSS growth with a 800 MiB reply held by a slow reader: {held // 1024} MB < 64 MB")
    newer = os.urandom(8 * 1024 * 1024)
    w.op("SET", blob("/big"), blob(newer))
    check(w.get("/big") == newer, "a SET while the reply is in flight is stored")
    # From here: the SET's new value and its request buffer are the store's, not the reply's
    # (and under TSan, writing them costs shadow memory too).
    peak = PeakRss(d)
    read_values(s, 100, value, "the held reply after a SET of its key", peak, first_bytes=bytes(first))
    grew = peak.growth_kb()
    check(grew < 64 * 1024, f"RSS growth while the held reply is read: {grew // 1024} MB < 64 MB")
    s.close()
    w.close()

    # A reader that pipelines replies and reads none: closed once its queued wire bytes pass
    # --max-connection-buffered-bytes (here 1 GiB, following the reply limit), memory flat.
    peak = PeakRss(d)
    p = RawConn(d.host, d.port, timeout=120.0)
    p.send(req * 4)
    check(p.is_closed_by_peer(300.0), "a peer that queues 3.2 GB of replies and reads none is closed")
    p.close()
    grew = peak.growth_kb()
    check(grew < 64 * 1024, f"RSS growth for 4 pipelined 800 MiB replies: {grew // 1024} MB < 64 MB")
    check(ic.log_says(d, "--max-connection-buffered-bytes"), "the close names --max-connection-buffered-bytes")
    still_serves(d, "MULTI_GETs of 800 MiB")
    check_eq(d.stop(), 0, "ddprund exit code after SIGTERM")


def linear_parsing(binary):
    d = start_daemon(binary)
    n = 128 * 1024
    val = b"v" * 460
    parts = [bytes([ic.D2["MULTI_SET"]]), u64(n)]
    for i in range(n):
        parts.append(blob(b"/k%07d" % i))
        parts.append(blob(val))
    req = b"".join(parts)
    log(f"  one MULTI_SET of {len(req) / 2**20:.1f} MiB ({n} pairs)")
    c = RawConn(d.host, d.port, timeout=600.0)
    cpu0 = cpu_seconds(d.proc.pid)
    c.send(req)
    check_eq(c.get(f"/k{n - 1:07d}"), val, "the last pair is stored")
    cpu = cpu_seconds(d.proc.pid) - cpu0
    log(f"  server CPU for the request: {cpu:.2f}s")
    # Generous: linear parsing takes well under a second here; the quadratic one took ~18 s.
    check(cpu < 5.0, f"parsing is linear: {cpu:.2f}s of server CPU < 5s")
    c.close()
    still_serves(d, "a 60 MiB request")
    check_eq(d.stop(), 0, "ddprund exit code after SIGTERM")


SECTIONS = {f.__name__: f for f in (joins_past_fd_limit, conns_past_fd_limit, warning_flood, job_limit,
                                     amplifying_multi_get, shared_multi_get, linear_parsing)}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--ddprund", required=True)
    ap.add_argument("--only", choices=sorted(SECTIONS), action="append")
    args = ap.parse_args()
    raise_own_fd_limit(6000)
    for name in args.only or SECTIONS:
        log(f"== {name}")
        SECTIONS[name](args.ddprund)


if __name__ == "__main__":
    run_main(main, watchdog_s=900)
