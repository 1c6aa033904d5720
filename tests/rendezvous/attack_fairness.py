#!/usr/bin/env python3
"""Fairness of an I/O thread: a request of 61 MiB (128 Ki keys) applied in slices while another
job's client, a rendezvous JOIN or a job's workers share the thread that serves it. Each slice
of the big request runs after the thread's other ready work, so they wait for one slice, not
for the whole request: they must get many round trips in while it is applied (a count, on the
same thread), and stay under 50 ms at p99 (reported with p50 and max).

  wait_61mib_one_thread      ddprund --threads 1: a WAIT of 128 Ki keys (61 MiB) on the main
                             keyspace; another job's store client and a JOIN prober meanwhile.
  multi_61mib_one_thread     ddprund --threads 1: MULTI_SET then MULTI_GET of 64 Ki keys and
                             values (61 MiB each way).
  wait_answered_one_thread   ddprund --threads 1: the WAIT answered by a MULTI_SET of its keys
                             from another connection, then its connection closed.
  wait_61mib_default_threads the same WAIT with ddprund's default thread count.
  hosted_store_one_thread    a single-node ddprun job whose agent hosts the workers' store
                             in-process (one I/O thread): the WAIT goes to that store while the
                             workers do round trips on it.

usage: attack_fairness.py --ddprund PATH [--only SECTION]
"""
import argparse
import fcntl
import os
import subprocess
import sys
import tempfile
import termios
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import attack  # noqa: E402
from attack import JoinProber, Prober, other_job_store, p99_report, stopped  # noqa: E402
from interop_common import D2, Daemon, RawConn, blob, check, log, run_main, spawn, u64  # noqa: E402

KEYS = 128 * 1024
# Round trips of a client on the same thread while the big request is applied: about one per
# slice of 2048 keys (64 to 128 slices here); applied back to back, the slices let in 0-2.
MIN_ROUND_TRIPS = 20


def big_keys(n, size=480):
    return [f"/big/{i:07d}/".encode().ljust(size, b"k") for i in range(n)]


def recv_into(conn, view):
    """Fills `view` (a large reply: into one buffer, not by concatenation)."""
    got = 0
    while got < len(view):
        k = conn.sock.recv_into(view[got:], len(view) - got)
        if not k:
            raise EOFError(f"connection closed after {got} of {len(view)} bytes")
        got += k


def wait_read(sock):
    """Until the peer has acknowledged every byte sent (it is in the server's socket or buffer)."""
    end = time.monotonic() + 60
    while time.monotonic() < end:
        if int.from_bytes(fcntl.ioctl(sock.fileno(), termios.TIOCOUTQ, b"\0" * 4), "little") == 0:
            return
        time.sleep(0.001)
    check(False, "the server reads the request")


def wait_round_trips(prober, more):
    end, target = time.monotonic() + 60, len(prober.samples) + more
    while len(prober.samples) < target and time.monotonic() < end and prober.thread.is_alive():
        time.sleep(0.001)
    check(len(prober.samples) >= target, f"the other client makes {more} round trips")


def applied_with(conn, request, reply_size, prober, what):
    """Sends `request` then GETNUMKEYS; returns GETNUMKEYS's answer after checking that `prober`
    (a client on the same I/O thread) made round trips while the request was applied: from its
    last byte to the first byte of its answer. All of it but its last byte is buffered by the
    server first, so what is counted is the apply."""
    conn.send(memoryview(request)[:-1])  # no copy: the probing thread needs the GIL meanwhile
    wait_read(conn.sock)
    wait_round_trips(prober, 300)  # one I/O thread that served 300 round trips has read the rest
    reply = bytearray(reply_size + 8)  # allocated (and zeroed) before: that holds the GIL
    view = memoryview(reply)
    before, t0 = len(prober.samples), time.monotonic()
    conn.send(request[-1:] + bytes([conn.codes["GETNUMKEYS"]]))
    recv_into(conn, view[:1])  # the rest of a large reply is written over many turns anyway
    during = len(prober.samples) - before
    recv_into(conn, view[1:])
    took = time.monotonic() - t0
    log(f"{what}: applied in {took:.2f} s, {during} round trips of the other client meanwhile")
    check(during >= MIN_ROUND_TRIPS, f"{what}: the other client made {during} round trips while it was "
          f"applied (>= {MIN_ROUND_TRIPS})")
    return int.from_bytes(reply[-8:], "little"), memoryview(reply)[:-8]


def wait_request(conn):
    """A WAIT of 128 Ki keys of 480 bytes (built before any probing: building it holds the GIL)."""
    return bytes([conn.codes["WAIT"]]) + u64(KEYS) + b"".join(blob(k) for k in big_keys(KEYS))


def wait_sections(threads):
    def section(binary):
        d = Daemon(binary, ["--threads", str(threads)] if threads else [])
        victim, store_port = other_job_store(d)
        a = RawConn(d.host, d.port, timeout=120.0)
        request = wait_request(a)
        what = f"WAIT of {KEYS} keys ({len(request) / (1 << 20):.0f} MiB), --threads {threads or 'default'}"
        joins = JoinProber(d.port)
        with Prober(store_port) as p:
            joins.start()
            time.sleep(0.2)
            n, _ = applied_with(a, request, 0, p, what)
            check(n == 0, f"{what}: the request after the WAIT is answered after it (the WAIT is pending)")
            time.sleep(0.3)
            joins.stop_flag.set()
            joins.join(timeout=30)
        p.report("another job's store client")
        check(not joins.errors, f"every probing JOIN got its ROUND ({joins.errors[:3]})")
        p99_report("rendezvous JOIN to ROUND", joins.samples)
        a.close()
        victim.close()
        check(d.alive(), "ddprund alive")
        check(stopped(d) == 0, "ddprund exits 0 on SIGTERM")
    return section


def multi_61mib_one_thread(binary):
    d = Daemon(binary, ["--threads", "1"])
    n = 64 * 1024
    keys, value = big_keys(n), b"v" * 480
    a = RawConn(d.host, d.port, timeout=120.0)
    # Built before any probing (building them holds the GIL).
    multi_set = bytes([a.codes["MULTI_SET"]]) + u64(n) + b"".join(blob(k) + blob(value) for k in keys)
    multi_get = bytes([a.codes["MULTI_GET"]]) + u64(n) + b"".join(blob(k) for k in keys)
    victim, store_port = other_job_store(d)
    with Prober(store_port) as p:
        time.sleep(0.2)
        what = f"MULTI_SET of {n} keys ({len(multi_set) / (1 << 20):.0f} MiB)"
        got, _ = applied_with(a, multi_set, 0, p, what)
        check(got == n, f"{what}: the request after it sees every key ({got})")
        what = f"MULTI_GET of {n} keys ({n * (len(value) + 8) / (1 << 20):.0f} MiB reply)"
        got, reply = applied_with(a, multi_get, n * (len(value) + 8), p, what)
        time.sleep(0.3)
    p.report("another job's store client")
    check(got == n and reply == (u64(len(value)) + value) * n, f"{what}: every value, then the next reply")
    a.close()
    victim.close()
    check(stopped(d) == 0, "ddprund exits 0 on SIGTERM")


def wait_answered_one_thread(binary):
    """The 61 MiB WAIT answered by a MULTI_SET of its keys: its waiter's copies are let go."""
    d = Daemon(binary, ["--threads", "1"])
    a, b = RawConn(d.host, d.port, timeout=120.0), RawConn(d.host, d.port, timeout=120.0)
    wait = wait_request(a)
    multi_set = bytes([b.codes["MULTI_SET"]]) + u64(KEYS) + b"".join(blob(k) + blob(b"v") for k in big_keys(KEYS))
    victim, store_port = other_job_store(d)
    with Prober(store_port) as p:
        time.sleep(0.2)
        a.send(wait)
        a.op("GETNUMKEYS")
        check(a.recv_i64() == 0, "the WAIT is pending")
        what = f"MULTI_SET of the WAIT's {KEYS} keys ({len(multi_set) / (1 << 20):.0f} MiB)"
        got, _ = applied_with(b, multi_set, 0, p, what)
        check(got == KEYS and a.recv_exact(1) == b"\x00", f"{what}: the WAIT is answered")
        a.close()  # and its connection closed
        time.sleep(0.3)
    p.report("another job's store client")
    b.close()
    victim.close()
    check(stopped(d) == 0, "ddprund exits 0 on SIGTERM")


HOSTED_WORKER = attack.JOB_WORKER.replace(
    'c.op("SET"', 'open(os.path.join(d, "port"), "w").write(os.environ["MASTER_PORT"])\nc.op("SET"')


def hosted_store_one_thread(binary):
    """The agent hosts the workers' store with one I/O thread (single node)."""
    ddprun = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(binary))), "launcher", "ddprun")
    check(os.access(ddprun, os.X_OK), f"ddprun is built next to ddprund ({ddprun})")
    request = bytes([D2["WAIT"]]) + u64(KEYS) + b"".join(blob(k) for k in big_keys(KEYS))
    with tempfile.TemporaryDirectory(prefix="ddprun-fairness-") as tmp:
        env = dict(os.environ, ATTACK_DIR=tmp,
                   ATTACK_INTEROP_DIR=os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "interop"))
        lg = open(os.path.join(tmp, "agent.log"), "w+b")
        agent = spawn([ddprun, "--standalone", "--nproc_per_node=2", "--no_python", sys.executable, "-c",
                       HOSTED_WORKER], stdout=lg, stderr=subprocess.STDOUT, env=env)
        try:
            end = time.monotonic() + 60
            while not all(os.path.exists(os.path.join(tmp, f"started-{r}")) for r in range(2)):
                check(time.monotonic() < end and agent.poll() is None, "both workers of the job start")
                time.sleep(0.1)
            with open(os.path.join(tmp, "port")) as f:
                port = int(f.read())
            a = RawConn("127.0.0.1", port, timeout=120.0)
            t0 = time.monotonic()
            a.send(request)
            a.op("GETNUMKEYS")
            check(a.recv_i64() >= 2, "the request after the WAIT on the job's store is answered")
            log(f"WAIT of {KEYS} keys (61 MiB) on the agent's store applied within {time.monotonic() - t0:.2f} s")
            time.sleep(0.5)
            open(os.path.join(tmp, "stop"), "w").close()
            rc = agent.wait(timeout=60)
            a.close()
        finally:
            if agent.poll() is None:
                agent.kill()
                agent.wait()
            lg.seek(0)
            out = lg.read().decode(errors="replace")
            lg.close()
        if rc != 0:
            log(out[-4000:])
        check(rc == 0, f"the job exits 0 (got {rc})")
        samples = []
        for r in range(2):
            with open(os.path.join(tmp, f"lat-{r}-0")) as fh:
                samples += [float(x) for x in fh.read().split()]
        p99_report("the workers' round trips on the agent's store during the WAIT", samples)


SECTIONS = {"wait_61mib_one_thread": wait_sections(1), "multi_61mib_one_thread": multi_61mib_one_thread,
            "wait_answered_one_thread": wait_answered_one_thread, "wait_61mib_default_threads": wait_sections(0),
            "hosted_store_one_thread": hosted_store_one_thread}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--ddprund", required=True)
    ap.add_argument("--only", choices=sorted(SECTIONS), action="append")
    args = ap.parse_args()
    for name in args.only or list(SECTIONS):
        log(f"== {name}")
        SECTIONS[name](args.ddprund)


if __name__ == "__main__":
    run_main(main, watchdog_s=300)
