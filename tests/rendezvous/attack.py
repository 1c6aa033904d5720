#!/usr/bin/env python3
"""The attack suite: ddprund (a separate process) against requests that used to stall every
client of the daemon. Each section is bounded in time; while the attack runs, a client of
another job (its own keyspace on the daemon) measures its round trips, which must stay under
50 ms at p99, and the daemon must stay up and keep serving.

  wait_64ki_keys      one WAIT of 64 Ki distinct keys of 200 bytes (13 MiB): duplicates were
                      removed with a linear search per key, 42 s under the lock all clients share.
  append_15000        15,000 pipelined APPENDs of 512 bytes to one key: each copied the whole
                      value (10-17 s of stalls).
  server_stall        a 2-node job whose agents keep their heartbeats while ddprund itself is
                      stopped for 2.5 heartbeat timeouts (SIGSTOP): it dropped both agents for
                      "no heartbeat"; now it judges them without its own stalled time.
  token_store_filter  a standing ddprund with a rendezvous token: its plain TCPStore keyspace
                      served anyone who could connect; now a client from a non-loopback
                      address is closed unless --store-from-any-address opens it.

  half_open_and_idle  300 connections that send nothing and 300 that announce an agent and never
                      finish the handshake: they were never closed and took the slots agents
                      need; now each is closed at its deadline.
  handshake_timeout_zero  --handshake-timeout-ms 0 means no handshake deadline: the first-bytes
                      deadline used to stay armed and closed the agent anyway.
  stranger_slots      connections from a host with no admitted agent are limited on their own
                      (--max-stranger-connections): members always find slots.

  list_keys_non_readers  8 connections that ask for 4 LIST_KEYS replies of 7.7 MB each and read
                      none (4 such took ddprund to 2.28 GiB with larger stores): now one memory
                      budget (--max-memory 64 MiB here) bounds it and RSS comes back after.
  watch_key_flood     WATCH_KEY (PyTorch 1.13) of 6,000 distinct keys, and 20,000 repeats of
                      one: a repeat registered it again, without limit.

  real_job_under_attack  a 2-node job of two real ddprun agents (c10d rendezvous on the daemon)
                      runs while the WAIT, APPEND and LIST_KEYS attacks hit another job's
                      keyspace: its store and the daemon's JOIN-to-ROUND stay under 50 ms at
                      p99, and it finishes with no restart spent.

usage: attack.py --ddprund PATH [--only SECTION]
"""
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
from attack_real_job import JOB_WORKER, JoinProber, p99_report, real_job_under_attack  # noqa: E402,F401

def wait_64ki_keys(binary):
    d = Daemon(binary)
    keys = [f"/attack/{i:06d}/".encode() + b"k" * 184 for i in range(64 * 1024)]
    request = u64(len(keys)) + b"".join(blob(k) for k in keys)
    log(f"WAIT of {len(keys)} keys, {len(request) >> 20} MiB")
    victim, store_port = other_job_store(d)
    with Prober(store_port) as p:
        time.sleep(0.2)
        a = RawConn(d.host, d.port, timeout=60.0)
        t0 = time.monotonic()
        a.op("WAIT", request)
        # The WAIT is deferred (no key exists): a PING-like request behind it shows it was applied.
        a.op("GETNUMKEYS")
        check(a.recv_i64() == 0, "the attacker's next request is answered (the WAIT is pending)")
        log(f"the WAIT was applied within {time.monotonic() - t0:.2f} s")
        time.sleep(0.3)
    p.report("WAIT of 64 Ki keys")
    a.close()
    victim.close()
    check(d.alive(), "ddprund alive")
    check(stopped(d) == 0, "ddprund exits 0 on SIGTERM")


def append_15000(binary):
    d = Daemon(binary)
    piece = b"a" * 512
    one = None
    victim, store_port = other_job_store(d)
    with Prober(store_port) as p:
        time.sleep(0.2)
        a = RawConn(d.host, d.port, timeout=60.0)
        one = bytes([a.codes["APPEND"]]) + blob("/attack/log") + blob(piece)
        t0 = time.monotonic()
        a.send(one * 15000)
        a.op("GETNUMKEYS")
        check(a.recv_i64() == 1, "the attacker's request after 15,000 APPENDs is answered")
        log(f"15,000 APPENDs applied within {time.monotonic() - t0:.2f} s")
        time.sleep(0.3)
    p.report("15,000 APPENDs")
    check(len(a.get("/attack/log")) == 15000 * len(piece), "the appended value has every byte")
    a.close()
    victim.close()
    check(stopped(d) == 0, "ddprund exits 0 on SIGTERM")


def hold_ms(d):
    """The longest time a batch of requests held a lock, from ddprund's last line (None if absent)."""
    hold = [ln for ln in d.log_text().splitlines() if "longest lock hold" in ln]
    m = re.search(r"longest lock hold ([0-9.]+) ms", hold[-1]) if hold else None
    return float(m.group(1)) if m else None


def multi_requests_128ki_keys(binary):
    """MULTI_SET, MULTI_GET and LIST_KEYS of 120,000 keys against a client of the same keyspace."""
    d = Daemon(binary)
    n = 120_000
    keys = [f"/bulk/{i:07d}/".encode() + b"k" * 40 for i in range(n)]
    value = b"v" * 200
    multi_set = u64(n) + b"".join(blob(k) + blob(value) for k in keys)
    multi_get = u64(n) + b"".join(blob(k) for k in keys)
    log(f"MULTI_SET of {n} keys ({len(multi_set) >> 20} MiB), MULTI_GET and LIST_KEYS of them, 3 times")
    with Prober(d.port) as p:
        time.sleep(0.2)
        a = RawConn(d.host, d.port, timeout=60.0)
        t0 = time.monotonic()
        for _ in range(3):
            a.op("MULTI_SET", multi_set)
            a.op("MULTI_GET", multi_get)
            values = [a.recv_blob() for _ in range(n)]
            check(all(v == value for v in values), "MULTI_GET answers every key with its value")
            a.op("LIST_KEYS")
            listed = a.recv_i64()
            got = [a.recv_blob() for _ in range(listed)]
            check(listed == n + 1 and sorted(got)[:n] == sorted(keys), f"LIST_KEYS lists the {n} keys and the probe's ({listed})")
        log(f"applied within {time.monotonic() - t0:.2f} s")
        time.sleep(0.3)
    p.report(f"MULTI_SET/MULTI_GET/LIST_KEYS of {n} keys")
    a.close()
    check(d.alive(), "ddprund alive")
    check(stopped(d) == 0, "ddprund exits 0 on SIGTERM")
    held = hold_ms(d)
    check(held is not None, "ddprund reports its longest lock hold")
    # A figure, not a condition (a loaded machine decides a wall-clock bound); the slicing is
    # checked above by the other client's round trips during the batch.
    log(f"longest lock hold: {held:.1f} ms (about 1 ms per slice; hundreds if applied whole)")


def non_loopback_address():
    """An address of this host that is not loopback (a client from it is no loopback peer)."""
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    try:
        s.connect(("192.0.2.1", 9))  # no packet is sent: this only picks the outgoing address
        addr = s.getsockname()[0]
    except OSError:
        addr = None
    finally:
        s.close()
    if addr is None or addr.startswith("127."):
        out = subprocess.run(["hostname", "-I"], capture_output=True, text=True).stdout.split()
        addr = next((a for a in out if ":" not in a and not a.startswith("127.")), None)
    return addr


def daemon_on_any_address(binary, extra):
    """ddprund on every address (Daemon binds 127.0.0.1 only)."""
    orig = ic.spawn

    def any_host(args, **kw):
        args = list(args)
        args[args.index("--host") + 1] = "0.0.0.0"
        return orig(args, **kw)

    ic.spawn = any_host
    try:
        return Daemon(binary, extra)
    finally:
        ic.spawn = orig


def token_store_filter(binary):
    addr = non_loopback_address()
    check(addr is not None, "this host has a non-loopback IPv4 address")
    with tempfile.NamedTemporaryFile("w", prefix="ddprun-token-", delete=False) as f:
        f.write("attack-suite-token-0123456789\n")
        token = f.name
    os.chmod(token, 0o600)
    try:
        d = daemon_on_any_address(binary, ["--rdzv_token_file", token])
        c = RawConn(addr, d.port, timeout=10.0)
        c.op("SET", blob("/k"), blob("v"))
        check(c.is_closed_by_peer(10.0), f"a TCPStore client from {addr} is closed (a token, no agent there)")
        c.close()
        local = RawConn("127.0.0.1", d.port, timeout=10.0)
        local.op("SET", blob("/k"), blob("v"))
        check(local.get("/k") == b"v", "a client from loopback is served")
        local.close()
        check(stopped(d) == 0, "ddprund exits 0 on SIGTERM")

        d = daemon_on_any_address(binary, ["--rdzv_token_file", token, "--store-from-any-address"])
        c = RawConn(addr, d.port, timeout=10.0)
        c.op("SET", blob("/k"), blob("v"))
        check(c.get("/k") == b"v", f"with --store-from-any-address a client from {addr} is served")
        c.close()
        check(stopped(d) == 0, "ddprund exits 0 on SIGTERM")
    finally:
        os.unlink(token)


def server_stall(binary):
    d = Daemon(binary)
    agents = [join(d.port, "stalled", i, nodes=2, heartbeat_timeout_ms=2000) for i in range(2)]
    for i, a in enumerate(agents):
        msg = read_frame(a)
        check(msg is not None and msg[0] == ROUND, f"agent {i} of the 2-node job gets its ROUND")
    stop = threading.Event()

    def beat():
        while not stop.wait(0.1):
            for a in agents:
                a.sendall(frame(HEARTBEAT, {}))

    beater = threading.Thread(target=beat, daemon=True)
    beater.start()
    time.sleep(0.5)
    d.proc.send_signal(signal.SIGSTOP)  # the server itself stalls for 2.5 heartbeat timeouts
    time.sleep(5.0)
    d.proc.send_signal(signal.SIGCONT)
    time.sleep(3.0)
    stop.set()
    beater.join(timeout=10)
    # Every agent is read before any is closed: closing one ends the job for the other ("lost
    # node ... (connection closed)"), which is not what is judged here.
    heard = []
    for a in agents:
        a.setblocking(False)
        try:
            got = a.recv(65536)
            heard.append("closed" if got == b"" else f"sent {got[:200]!r}")
        except BlockingIOError:
            heard.append(None)
    for i, what in enumerate(heard):
        check(what is None, f"agent {i} that kept its heartbeats is not dropped after the server's own stall ({what})")
    check(log_says(d, "the rendezvous server did not run for"), "ddprund reports its own stall")
    for a in agents:
        a.close()
    check(stopped(d) == 0, "ddprund exits 0 on SIGTERM")


def half_open_and_idle(binary):
    d = Daemon(binary, ["--first-bytes-timeout-ms", "1500", "--handshake-timeout-ms", "1500"])
    silent = [socket.create_connection(("127.0.0.1", d.port), timeout=10.0) for _ in range(300)]
    half_open = []
    for _ in range(300):
        s = socket.create_connection(("127.0.0.1", d.port), timeout=10.0)
        s.sendall(AGENT_HELLO)  # announces an agent, never says HELLO
        half_open.append(s)
    agent = join(d.port, "member", 0)
    msg = read_frame(agent)
    check(msg is not None and msg[0] == ROUND, "an agent joining meanwhile gets its ROUND")
    time.sleep(1.5)
    deadline = time.monotonic() + 5.0
    open_left = 0
    for s in silent + half_open:
        s.settimeout(max(0.01, deadline - time.monotonic()))
        try:
            if s.recv(1) != b"":
                open_left += 1
        except socket.timeout:
            open_left += 1
        except OSError:
            pass
        s.close()
    check(open_left == 0, f"600 silent or half-open connections are closed at their deadline ({open_left} left)")
    agent.setblocking(False)
    try:
        got = agent.recv(1)
        check(False, f"the admitted agent is not closed by a deadline (got {got!r})")
    except BlockingIOError:
        pass
    agent.close()
    check(log_says(d, "deadline for unauthenticated connections"),
          "the daemon says why it closed them")
    check(stopped(d) == 0, "ddprund exits 0 on SIGTERM")


def handshake_timeout_zero(binary):
    d = Daemon(binary, ["--first-bytes-timeout-ms", "500", "--handshake-timeout-ms", "0"])
    s = socket.create_connection(("127.0.0.1", d.port), timeout=10.0)
    s.sendall(AGENT_HELLO)  # an agent, in time for the first deadline; then no handshake deadline
    silent = socket.create_connection(("127.0.0.1", d.port), timeout=10.0)
    time.sleep(1.5)
    s.setblocking(False)
    try:
        got = s.recv(1)
        what = "closed" if got == b"" else f"sent {got!r}"
    except BlockingIOError:
        what = None
    check(what is None, f"with --handshake-timeout-ms 0 an announced agent is not closed by a deadline ({what})")
    check(silent.recv(1) == b"", "a connection that sent nothing is still closed at --first-bytes-timeout-ms")
    s.close()
    silent.close()
    check(stopped(d) == 0, "ddprund exits 0 on SIGTERM")


def stranger_slots(binary):
    addr = non_loopback_address()
    check(addr is not None, "this host has a non-loopback IPv4 address")
    d = daemon_on_any_address(binary, ["--max-connections", "200", "--max-stranger-connections", "20"])
    strangers = [socket.create_connection((addr, d.port), timeout=10.0) for _ in range(40)]
    time.sleep(1.5)
    closed = 0
    for s in strangers:
        s.setblocking(False)
        try:
            if s.recv(1) == b"":
                closed += 1
        except BlockingIOError:
            pass
        except OSError:
            closed += 1
    check(closed == 20, f"past --max-stranger-connections 20, the other {closed} of 40 strangers' connections "
          "are closed at once")
    members = [RawConn("127.0.0.1", d.port, timeout=10.0) for _ in range(50)]
    for i, m in enumerate(members):
        m.op("SET", blob(f"/m/{i}"), blob("v"))
    check(all(m.get(f"/m/{i}") == b"v" for i, m in enumerate(members)),
          "50 loopback clients are served while strangers hold their 20 slots")
    for s in strangers + [m.sock for m in members]:
        s.close()
    check(stopped(d) == 0, "ddprund exits 0 on SIGTERM")


def list_keys_non_readers(binary):
    budget_mib = 64
    d = Daemon(binary, ["--max-memory", str(budget_mib << 20), "--max-request-bytes", str(16 << 20),
                        "--max-reply-bytes", str(16 << 20)])
    w = RawConn(d.host, d.port, timeout=60.0)
    pad = "p" * 230
    batch = []
    for i in range(30000):
        batch.append(bytes([w.codes["SET"]]) + blob(f"/list/{i:06d}/{pad}") + blob("v"))
    w.send(b"".join(batch))
    check(w.num_keys() == 30000, "30,000 keys of 250 bytes are stored (a 7.7 MB LIST_KEYS reply)")
    base = d.rss_kb()
    victim, store_port = other_job_store(d)
    readers = []
    with Prober(store_port) as p:
        for _ in range(8):  # 8 connections ask for 4 replies each (245 MB) and read none
            r = RawConn(d.host, d.port, timeout=60.0)
            r.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
            r.send(bytes([r.codes["LIST_KEYS"]]) * 4)
            readers.append(r)
        time.sleep(2.0)
        peak = d.rss_kb()
    p.report("LIST_KEYS from 8 non-readers")
    log(f"RSS {base // 1024} MB before, {peak // 1024} MB with 8 non-readers (budget {budget_mib} MiB)")
    # The budget, its reserve for connections that read (an eighth), and the process itself.
    check(peak < (budget_mib * 9 // 8 + 64) * 1024,
          f"RSS {peak // 1024} MB stays within the budget of {budget_mib} MiB (+ its reserve and 64 MB)")
    check(log_says(d, "--max-memory"),
          "the connections past the budget are closed with a line naming --max-memory")
    for r in readers:
        r.close()
    after = None
    for _ in range(6):  # each request lets the server hand what it freed back (at most once a second)
        time.sleep(0.6)
        w.op("GETNUMKEYS")
        check(w.recv_i64() == 30000, "the store is intact and serving")
        time.sleep(0.1)
        after = d.rss_kb() if after is None else min(after, d.rss_kb())
    log(f"RSS {after // 1024} MB after the non-readers went")
    check(after < base + 64 * 1024, f"RSS comes back ({after // 1024} MB < {base // 1024} + 64 MB)")
    w.close()
    victim.close()
    check(d.alive(), "ddprund alive")
    check(stopped(d) == 0, "ddprund exits 0 on SIGTERM")


def watch_key_flood(binary):
    d = Daemon(binary, ["--legacy-dialect", "1.13"])
    c = RawConn(d.host, d.port, dialect="D0", timeout=30.0)
    c.send(b"".join(b"\x07" + blob(f"/watched/{i}") for i in range(6000)))  # WATCH_KEY of PyTorch 1.13
    check(c.is_closed_by_peer(20.0), "a client watching 6,000 distinct keys is closed past 4,096")
    check(log_says(d, "--max-watches-per-connection"),
          "the daemon names --max-watches-per-connection")
    c.close()
    again = RawConn(d.host, d.port, dialect="D0", timeout=30.0)
    again.send(b"".join(b"\x07" + blob("/same") for _ in range(20000)))
    again.op("GETNUMKEYS")
    got = again.recv_exact(20000)
    check(got == b"\x03" * 20000, "20,000 repeats of one WATCH_KEY are answered (registered once)")
    check(again.recv_i64() == 0, "and the client is still served")
    again.close()
    check(stopped(d) == 0, "ddprund exits 0 on SIGTERM")


# The worker of the 2-node job (real ddprun agents): GET round trips on the job's own store
# until told to stop; its latencies go to a file named by its rank and restart count.
SECTIONS = {f.__name__: f for f in (wait_64ki_keys, append_15000, multi_requests_128ki_keys, token_store_filter, server_stall,
                                     half_open_and_idle, handshake_timeout_zero, stranger_slots, list_keys_non_readers, watch_key_flood,
                                     real_job_under_attack)}


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
