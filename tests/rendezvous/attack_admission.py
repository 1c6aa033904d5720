#!/usr/bin/env python3
"""Admission under attack: connections that prove nothing must not keep out an agent that
proves the token, and a tampered agent message ends its connection at once (token or munge).
ddprund runs as a separate process; the agents are real ddprun agents where the section says so.

  new_hosts_past_stranger_share  a stranger holds all its --max-stranger-connections slots from
                      one host (network namespaces; re-opening every connection that is
                      closed): a token agent from another host, not admitted yet (a new job),
                      used to be closed at accept, and so was every node after a daemon restart.
                      Now it takes the slot of the stranger's oldest connection and its job
                      runs, before and after a restart of the daemon.
  idle_validate_only  loopback connections that sent VALIDATE and nothing more fill
                      --max-connections: they never timed out and locked every agent out. Now
                      an agent (whose round's store needs a descriptor too) takes their slots,
                      and they are closed at the first-bytes deadline, while a client that made
                      a request stays.
  tampered_join       a relay alters the MAC of a real agent's JOIN (standing ddprund, token):
                      the server dropped it and kept the connection, so the agent waited for a
                      ROUND until its join timeout. Now the server closes the connection at
                      once, the agent reconnects, and the job finishes with no restart spent.
  tampered_join_munge the same with agents that prove their srun step with munge credentials
                      (no token; a private munged; the MAC key is the secret the credential
                      carries): the hosting agent's server closes the connection at once, the
                      agent ends at once instead of at its join timeout (an agent reconnects
                      only to a standing ddprund, and munge admits only to an agent-hosted
                      rendezvous), and started again it joins and the job finishes. Left out,
                      with one line saying why, where munge or ddprun's munge support is missing.
  refused_peer_address  a client that connects to a round's store from a stranger's address and
                      resets at once was logged as "0.0.0.0": the address is now the one accept
                      returned.

usage: attack_admission.py --ddprund PATH [--ddprun PATH] [--only SECTION]
"""
import argparse
import os
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(HERE, "..", "multinode"))
from attack import (ROUND, daemon_on_any_address, join, non_loopback_address, other_job_store,  # noqa: E402
                    read_frame, stopped)
import admission_munge as munge  # noqa: E402
from interop_common import Daemon, RawConn, blob, check, log, log_says, run_main  # noqa: E402
from netns import Cluster  # noqa: E402

WORKER = os.path.join(HERE, "..", "multinode", "worker.py")
TOKEN = "admission attack token: 0123456789abcdef"
DDPRUN = None  # set by main()


def token_file(tmp):
    path = os.path.join(tmp, "token")
    with open(os.open(path, os.O_WRONLY | os.O_CREAT, 0o600), "w") as f:
        f.write(TOKEN + "\n")
    return path


def agent_argv(endpoint, run_id, token, join_timeout=30):
    # 1:2 nodes: a job of one node that still uses the rendezvous server (1 is local).
    return [DDPRUN, "--nnodes=1:2", "--nproc_per_node=1", "--rdzv_backend=c10d", f"--rdzv_endpoint={endpoint}",
            f"--rdzv_id={run_id}", "--max_restarts=0", "--rdzv_token_file", token,
            f"--rdzv_conf=join_timeout={join_timeout},last_call_timeout=1", WORKER]


def agent_env(tmp, release=None):
    env = dict(os.environ, DDPT_OUT=tmp, DDPT_NODE="0", PYTHON_EXEC="/usr/bin/python3", DDPT_MAX_SECONDS="120")
    if release:
        env["DDPT_RELEASE"] = release
    return env


def records(tmp):
    path = os.path.join(tmp, "records.jsonl")
    if not os.path.exists(path):
        return []
    with open(path) as f:
        return [ln for ln in f if ln.strip()]


def finish(p, what, timeout=90):
    try:
        out, _ = p.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        p.kill()
        out, _ = p.communicate()
    out = out if isinstance(out, str) else (out or b"").decode(errors="replace")
    if p.returncode != 0:
        log(f"--- {what} (exit {p.returncode}) ---\n{out[-4000:]}")
    return p.returncode, out


# A stranger who keeps `n` connections open to HOST:PORT, re-opening each one the server closes
# (every 50 ms at most); it says "holding" each time all n are open again.
HOLDER = r"""
import select, socket, sys, time
host, port, n = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
conns, full = [], False
while True:
    if conns:
        r, _, _ = select.select(conns, [], [], 0.05)
        for s in r:
            try:
                gone = s.recv(1) == b""
            except OSError:
                gone = True
            if gone:
                conns.remove(s)
                s.close()
    else:
        time.sleep(0.05)
    while len(conns) < n:
        try:
            conns.append(socket.create_connection((host, port), timeout=2))
        except OSError:
            time.sleep(0.05)
            break
    if (len(conns) == n) != full:
        full = len(conns) == n
        if full:
            print("holding", flush=True)
"""


def start_ddprund(cl, binary, token, lines):
    d = cl.spawn(0, [binary, "--port", "29400", "--rdzv_token_file", token, "--max-stranger-connections", "8"])
    line = d.stdout.readline()
    check("listening" in line, f"ddprund listens in its namespace ({line!r})")
    threading.Thread(target=lambda: lines.extend(iter(d.stdout.readline, "")), daemon=True).start()
    return d


def wait_lines(lines, text, count, timeout, what):
    deadline = time.monotonic() + timeout
    while sum(text in ln for ln in lines) < count and time.monotonic() < deadline:
        time.sleep(0.05)
    ok = sum(text in ln for ln in lines) >= count
    if not ok:
        log("".join(lines[-80:]))
    check(ok, what)


def new_hosts_past_stranger_share(binary):
    if os.geteuid() != 0:
        log("SKIP: network namespaces need root")
        return
    with tempfile.TemporaryDirectory(prefix="ddprun-admission-") as tmp, Cluster(f"ad{os.getpid() % 10000}") as cl:
        for _ in range(3):
            cl.add_node()
        token = token_file(tmp)
        dlines, hlines = [], []
        d = start_ddprund(cl, binary, token, dlines)
        holder = cl.spawn(1, [sys.executable, "-c", HOLDER, cl.addr(0), "29400", "8"])
        threading.Thread(target=lambda: hlines.extend(iter(holder.stdout.readline, "")), daemon=True).start()
        wait_lines(hlines, "holding", 1, 30, "the stranger holds its 8 slots")
        time.sleep(1.5)  # its connections are past kReplaceableAfter
        release = os.path.join(tmp, "release")
        t0 = time.monotonic()
        agent = cl.spawn(2, agent_argv(f"{cl.addr(0)}:29400", "newjob", token), env=agent_env(tmp, release))
        deadline = time.monotonic() + 60
        while not records(tmp):
            if agent.poll() is not None or time.monotonic() > deadline:
                finish(agent, "the agent")
                check(False, "an agent of a new host joins while a stranger holds its share")
            time.sleep(0.1)
        log(f"a token agent of a new host got its ROUND while a stranger held every stranger slot (its worker "
            f"started {time.monotonic() - t0:.2f} s after the agent)")

        # The daemon restarts while the agent is stopped; the stranger fills the new daemon's
        # share first; then the agent reconnects, as a stranger again.
        agent.send_signal(signal.SIGSTOP)
        held = sum("holding" in ln for ln in hlines)
        d.send_signal(signal.SIGKILL)
        d.wait(timeout=10)
        d = start_ddprund(cl, binary, token, dlines)
        wait_lines(hlines, "holding", held + 1, 30, "the stranger holds its 8 slots of the restarted daemon")
        time.sleep(1.5)
        agent.send_signal(signal.SIGCONT)
        t1 = time.monotonic()
        try:
            wait_lines(dlines, "rebuilt", 1, 60, "the restarted daemon rebuilds the job's round from the agent's re-join")
        except Exception:
            agent.kill()
            finish(agent, "the agent")
            raise
        log(f"the daemon rebuilt the round {time.monotonic() - t1:.2f} s after the agent went on")
        open(release, "w").close()
        rc, out = finish(agent, "the agent")
        check(rc == 0, f"the job finishes rc 0 after the restart (got {rc})")
        check(len(records(tmp)) == 1, "its worker ran once: no restart spent")
        check(any("make room" in ln for ln in dlines), "ddprund says whose slot the agent took")
        check(d.poll() is None, "ddprund alive")
        holder.kill()


VALIDATE = bytes([0]) + struct.pack("<I", 0x3C85F7CE)


def closed_by_peer(sock, within_s):
    sock.settimeout(within_s)
    try:
        return sock.recv(1) == b""
    except socket.timeout:
        return False
    except OSError:
        return True


def idle_validate_only(binary):
    limit = 200
    d = Daemon(binary, ["--max-connections", str(limit), "--first-bytes-timeout-ms", "4000"])
    client = RawConn("127.0.0.1", d.port, timeout=10.0)
    client.op("SET", blob("/k"), blob("v"))  # a request: a client for good, idle or not
    check(client.get("/k") == b"v", "a client is served")
    idle = []
    for _ in range(limit + 50):  # past the limit: the last ones are closed at once
        s = socket.create_connection(("127.0.0.1", d.port), timeout=10.0)
        try:
            s.sendall(VALIDATE)  # and nothing more
        except OSError:
            pass
        idle.append(s)
    opened = time.monotonic()
    time.sleep(1.5)
    agent = join(d.port, "member", 0)
    msg = read_frame(agent)
    check(msg is not None and msg[0] == ROUND, f"an agent joining past {limit} idle VALIDATE-only connections "
          f"gets its ROUND ({msg})")
    store = RawConn("127.0.0.1", int(msg[1]["store_port"]), timeout=10.0)
    store.op("SET", blob("/w"), blob("x"))
    check(store.get("/w") == b"x", "its round's store serves its workers")
    time.sleep(max(0.0, opened + 4.5 - time.monotonic()))
    open_left = sum(not closed_by_peer(c, 2.0) for c in idle)
    check(open_left == 0, f"VALIDATE-only connections are closed at the first-bytes deadline ({open_left} left)")
    check(client.get("/k") == b"v", "the client that made a request is still served")
    check(log_says(d, "made no request after VALIDATE"), "the daemon says why it closed them")
    for c in idle + [client, store]:
        c.close()
    agent.close()
    check(stopped(d) == 0, "ddprund exits 0 on SIGTERM")


class CorruptingRelay(threading.Thread):
    """Between agents and the server: forwards both ways, connection after connection, and
    alters one hex digit of the MAC of the first sealed JOIN it sees (once)."""

    MAC_KEY = struct.pack("<Q", 3) + b"mac"

    def __init__(self, server_port):
        super().__init__(daemon=True)
        self.server_port = server_port
        self.lsock = socket.create_server(("127.0.0.1", 0))
        self.port = self.lsock.getsockname()[1]
        self.tampered_at = None   # when the altered JOIN went to the server
        self.closed_at = None     # when the server closed that connection
        self.connections = 0

    def run(self):
        while True:
            try:
                agent, _ = self.lsock.accept()
            except OSError:
                return
            self.connections += 1
            server = socket.create_connection(("127.0.0.1", self.server_port))
            threading.Thread(target=self.up, args=(agent, server), daemon=True).start()
            threading.Thread(target=self.down, args=(server, agent), daemon=True).start()

    def up(self, src, dst):
        buf, skip, mine = b"", 5, False
        try:
            while chunk := src.recv(65536):
                buf += chunk
                out = b""
                if skip and len(buf) >= skip:
                    out, buf, skip = buf[:skip], buf[skip:], 0
                while not skip and len(buf) >= 4 and len(buf) >= 4 + struct.unpack("<I", buf[:4])[0]:
                    n = 4 + struct.unpack("<I", buf[:4])[0]
                    frame, buf = buf[:n], buf[n:]
                    at = frame.find(self.MAC_KEY)
                    if self.tampered_at is None and frame[4] == 1 and at >= 0:
                        v = at + len(self.MAC_KEY) + 8
                        frame = frame[:v] + (b"0" if frame[v:v + 1] != b"0" else b"1") + frame[v + 1:]
                        self.tampered_at, mine = time.monotonic(), True
                    out += frame
                dst.sendall(out)
        except OSError:
            pass
        finally:
            for s in (src, dst):
                try:
                    s.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass
        if mine and self.closed_at is None:
            self.closed_at = time.monotonic()

    def down(self, src, dst):
        try:
            while chunk := src.recv(65536):
                dst.sendall(chunk)
        except OSError:
            pass
        if self.tampered_at is not None and self.closed_at is None:
            self.closed_at = time.monotonic()
        for s in (src, dst):
            try:
                s.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass


def tampered_join(binary):
    with tempfile.TemporaryDirectory(prefix="ddprun-admission-") as tmp:
        token = token_file(tmp)
        d = Daemon(binary, ["--rdzv_token_file", token])
        relay = CorruptingRelay(d.port)
        relay.start()
        agent = subprocess.Popen(agent_argv(f"127.0.0.1:{relay.port}", "tampered", token, join_timeout=60),
                                 env=agent_env(tmp), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        try:
            deadline = time.monotonic() + 60
            while relay.closed_at is None and time.monotonic() < deadline and agent.poll() is None:
                time.sleep(0.05)
            check(relay.tampered_at is not None, "the relay altered the agent's JOIN")
            # Generous: before, the connection stayed open until the agent's join timeout.
            check(relay.closed_at is not None and relay.closed_at - relay.tampered_at < 10.0,
                  "the server closes the connection of the altered JOIN at once")
            if relay.closed_at is not None:
                log(f"the server closed it {(relay.closed_at - relay.tampered_at) * 1e3:.1f} ms after the altered JOIN")
            rc, out = finish(agent, "the agent", timeout=90)
        finally:
            if agent.poll() is None:
                agent.kill()
                agent.wait()
        check(rc == 0, f"the agent reconnects and its job finishes rc 0 (got {rc})")
        check(relay.connections >= 2 and "reconnected to the rendezvous server" in out,
              "it did so over a new connection")
        check(len(records(tmp)) == 1, "its worker ran once: no restart spent")
        check(log_says(d, "closed the connection"), "the daemon says it closed the connection")
        relay.lsock.close()
        check(stopped(d) == 0, "ddprund exits 0 on SIGTERM")


def munge_agent(endpoint, run_id, is_host, env, node, nnodes=2):
    argv = [DDPRUN, f"--nnodes={nnodes}", "--nproc_per_node=1", "--rdzv_backend=c10d", f"--rdzv_endpoint={endpoint}",
            f"--rdzv_id={run_id}", "--max_restarts=0",
            f"--rdzv_conf=is_host={is_host},join_timeout=60,last_call_timeout=1", WORKER]
    return subprocess.Popen(argv, env=dict(env, DDPT_NODE=str(node)), stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)


def tampered_join_munge(_binary):
    """tampered_join with agents that prove their srun step with munge credentials (no token).
    Only an agent hosts such a rendezvous, and an agent reconnects only to a standing ddprund:
    the joining agent ends at once (not at its join timeout), and the same agent started again
    joins the hosting agent, whose job then runs as if nothing happened."""
    why = munge.left_out(DDPRUN)
    if why:
        log(f"tampered_join_munge left out: {why}")
        return
    with tempfile.TemporaryDirectory(prefix="ddprun-admission-") as tmp, munge.PrivateMunged() as md:
        env = munge.step_env(agent_env(tmp), md.socket, 2)
        port = munge.free_port()
        host = munge_agent(f"127.0.0.1:{port}", "tampered-munge", 1, env, 0)
        hlines, relay, agents = [], None, []
        threading.Thread(target=lambda: hlines.extend(iter(host.stdout.readline, "")), daemon=True).start()
        try:
            wait_lines(hlines, "hosting the rendezvous for job", 1, 30, "an agent hosts the rendezvous")
            check(any("admits only the agents of Slurm job" in ln for ln in hlines),
                  "the hosting agent admits agents by their munge credentials")
            relay = CorruptingRelay(port)
            relay.start()
            agents.append(munge_agent(f"127.0.0.1:{relay.port}", "tampered-munge", 0, env, 1))
            deadline = time.monotonic() + 60
            while relay.closed_at is None and time.monotonic() < deadline and agents[0].poll() is None:
                if relay.tampered_at is not None and time.monotonic() - relay.tampered_at > 15:
                    break
                time.sleep(0.05)
            check(relay.tampered_at is not None, "the relay altered the munge-authenticated agent's JOIN")
            # Generous: before, the connection stayed open until the agent's join timeout.
            check(relay.closed_at is not None and relay.closed_at - relay.tampered_at < 10.0,
                  "the hosting agent's server closes the connection of the altered JOIN at once")
            log(f"it closed it {(relay.closed_at - relay.tampered_at) * 1e3:.1f} ms after the altered JOIN")
            rc, out = finish(agents[0], "the agent whose JOIN was altered", timeout=20)
            check("admits only the agents of Slurm job" in out, "the joining agent proves itself with munge")
            check(rc != 0 and "closed the connection" in out, "that agent ends at once: its rendezvous closed")
            agents.append(munge_agent(f"127.0.0.1:{relay.port}", "tampered-munge", 0, env, 1))
            rc, out = finish(agents[1], "the agent started again", timeout=90)
            hrc, _ = finish(host, "the hosting agent", timeout=30)
        finally:
            for p in agents + [host]:
                if p.poll() is None:
                    p.kill()
                    p.wait()
            if relay is not None:
                relay.lsock.close()
        check(rc == 0 and hrc == 0,
              f"started again, it joins and the job finishes rc 0 on both nodes (got {rc}, {hrc})")
        check(len(records(tmp)) == 2, "each node's worker ran once: no restart spent")
        check(any("closed the connection" in ln for ln in hlines), "the hosting agent says it closed the connection")


def wait_stopped(pid):
    """Until every thread of `pid` is stopped (a signal is delivered asynchronously)."""
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        states = []
        for tid in os.listdir(f"/proc/{pid}/task"):
            with open(f"/proc/{pid}/task/{tid}/stat") as f:
                states.append(f.read().rsplit(")", 1)[1].split()[0])
        if all(st in ("T", "t") for st in states):
            return
        time.sleep(0.01)
    check(False, f"process {pid} stops on SIGSTOP")


def refused_peer_address(binary):
    addr = non_loopback_address()
    check(addr is not None, "this host has a non-loopback IPv4 address")
    d = daemon_on_any_address(binary, [])
    agent, store_port = other_job_store(d)
    d.proc.send_signal(signal.SIGSTOP)  # the connection is reset before ddprund accepts it
    try:
        wait_stopped(d.proc.pid)
        s = socket.create_connection((addr, store_port), timeout=10.0)
        s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        s.close()
        time.sleep(0.2)
    finally:
        d.proc.send_signal(signal.SIGCONT)
    said = log_says(d, f" store from {addr}: only loopback")
    if not said:
        log(d.log_text()[-3000:])
    check(said, f"the refused peer that reset at once is logged as {addr}")
    check("from 0.0.0.0" not in d.log_text(), "and never as 0.0.0.0")
    agent.close()
    check(stopped(d) == 0, "ddprund exits 0 on SIGTERM")


SECTIONS = {f.__name__: f for f in (new_hosts_past_stranger_share, idle_validate_only, tampered_join,
                                     tampered_join_munge, refused_peer_address)}


def main():
    global DDPRUN
    ap = argparse.ArgumentParser()
    ap.add_argument("--ddprund", required=True)
    ap.add_argument("--ddprun")
    ap.add_argument("--only", choices=sorted(SECTIONS), action="append")
    args = ap.parse_args()
    DDPRUN = args.ddprun or os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(args.ddprund))),
                                         "launcher", "ddprun")
    check(os.access(DDPRUN, os.X_OK), f"ddprun is built ({DDPRUN})")
    for name in args.only or list(SECTIONS):
        log(f"== {name}")
        SECTIONS[name](args.ddprund)


if __name__ == "__main__":
    run_main(main, watchdog_s=280)
