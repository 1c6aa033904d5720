#!/usr/bin/env python3
"""ddprun_scale_sim against a real ddprund with a rendezvous token: 1,024 simulated agents and
8 PyTorch-like workers each (8,192 store connections). Correctness only, no timing: every
agent gets its ROUND, every worker gets through the barrier and the NCCL id broadcast with a
rank no other worker has, nothing goes wrong (no ERROR, no closed connection, no MAC that
does not check), and the daemon is still alive afterwards.

--kill-one: then one agent's node dies (its connections close, no LEAVE; min_nodes is half
the agents): every survivor gets RESTART, joins again and gets a new ROUND, and every
surviving worker gets through the new round's store, again with unique ranks.

--relay: each node's workers reach the store over one relay connection (channels of the
multiplexed protocol, as through ddprun --store_relay), so the store holds 1,024 connections.

--churn PCT: then PCT % of the agents leave (every other one with a LEAVE, the rest just close)
and as many new agents (new node ids, new source addresses) join while the survivors re-form:
a round ends up holding every agent, old and new, with the full world of unique ranks, and
its workers get through its store.

--restart-daemon: the workers' store is on node rank 0 (a second ddprund on every address
stands for that agent's store); once every worker is through, ddprund is killed (SIGKILL) and
started again on the same port with the same token: every agent reconnects, re-joins its round
with the resume fields, and the round is rebuilt without a ROUND, a RESTART or a worker
restarted (the sim's agents then report success: every agent gets JOB_DONE; then every worker
reads the NCCL id again on its store connection of before).

usage: scale_sim.py --ddprund PATH --sim PATH [--agents N] [--nproc P] [--kill-one] [--relay]
                    [--churn PCT] [--restart-daemon]
"""
import argparse
import os
import re
import resource
import secrets
import subprocess
import sys
import tempfile
import time


def start_daemon(ddprund, token_file, log_path, port=0, store_only=False, allow_fail=False):
    log = open(log_path, "w")
    args = ([ddprund, "--port", "0"] if store_only else
            [ddprund, "--host", "127.0.0.1", "--port", str(port), "--rdzv-token-file", token_file])
    proc = subprocess.Popen(args + ["--threads", "2"], stdout=log, stderr=subprocess.STDOUT)
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        with open(log_path) as f:
            m = re.search(r"listening on \S*:(\d+)", f.read())
        if m:
            return proc, int(m.group(1))
        if proc.poll() is not None:
            break
        time.sleep(0.05)
    proc.kill()
    proc.wait()
    if allow_fail:
        return None, 0
    with open(log_path) as f:
        sys.exit("ddprund did not start:\n" + f.read())


def stop(proc):
    if proc is None or proc.poll() is not None:
        return
    proc.terminate()
    try:
        proc.wait(timeout=10)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def restart(a, daemon, port, token_file, log_path, ready, sim, failures):
    """Once the sim says every worker is through: SIGKILL ddprund, start it on the same port
    with the same token. Returns the new daemon."""
    deadline = time.monotonic() + 100
    while not os.path.exists(ready) and sim.poll() is None and time.monotonic() < deadline:
        time.sleep(0.02)
    if not os.path.exists(ready):
        failures.append("the simulator never said every worker was through")
        return daemon
    daemon.kill()
    daemon.wait()
    with open(log_path) as f:
        print("first ddprund's log (tail):\n" + "".join(f.readlines()[-3:]))
    # The port may linger a moment after the kill (the sockets the kernel closes for it).
    for _ in range(100):
        new, new_port = start_daemon(a.ddprund, token_file, log_path, port=port, allow_fail=True)
        if new is not None:
            return new
        time.sleep(0.1)
    failures.append(f"ddprund did not start again on port {port}")
    return daemon


def check(a, fields, world, failures):
    want = {"rounds": a.agents, "workers_done": world, "dup_ranks": 0, "errors": 0, "ok": 1}
    if a.kill_one:  # the survivors' second round, on top of the first
        want.update(rounds=2 * a.agents - 1, workers_done=world + (a.agents - 1) * a.nproc,
                    restarts=a.agents - 1)
    if a.churn:  # rounds and workers of the rounds between are not counted: the last one's are
        left = max(1, round(a.agents * a.churn / 100))
        want = {"churn_left": left, "churn_joined": left, "churn_round_nodes": a.agents, "churn_world": world,
                "churn_workers_done": world, "churn_dup_ranks": 0, "errors": 0, "ok": 1}
    if a.restart_daemon:  # no ROUND and no RESTART after the restart: the same round goes on
        want.update(restarts=0, restart_lost=a.agents, restart_rejoined=a.agents, restart_jobs_done=a.agents,
                    restart_workers_rechecked=world)
    for key, value in want.items():
        if int(fields.get(key, -1)) != value:
            failures.append(f"{key}={fields.get(key)} (want {value})")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--ddprund", required=True)
    ap.add_argument("--sim", required=True)
    ap.add_argument("--agents", type=int, default=1024)
    ap.add_argument("--nproc", type=int, default=8)
    ap.add_argument("--kill-one", action="store_true")
    ap.add_argument("--relay", action="store_true")
    ap.add_argument("--churn", type=float, default=0)
    ap.add_argument("--restart-daemon", action="store_true")
    a = ap.parse_args()
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    need = a.agents * ((1 if a.relay else a.nproc) + 1) + 256
    if hard != resource.RLIM_INFINITY and hard < need:
        print(f"SKIP: {need} descriptors needed, the hard limit is {hard}")
        return 77
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))  # the daemon inherits it
    with tempfile.TemporaryDirectory(prefix="ddprun-scale-") as tmp:
        token = secrets.token_hex(24)
        token_file = os.path.join(tmp, "token")
        fd = os.open(token_file, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        os.write(fd, token.encode())
        os.close(fd)
        log_path = os.path.join(tmp, "ddprund.log")
        daemon, port = start_daemon(a.ddprund, token_file, log_path)
        store = None
        failures = []
        world = a.agents * a.nproc
        try:
            extra = ["--server-pid", str(daemon.pid), "--probe"]
            if a.kill_one:
                extra += ["--kill-one", "--min-nodes", str(max(1, a.agents // 2))]
            if a.relay:
                extra += ["--relay"]
            if a.churn:
                extra += ["--churn", str(a.churn), "--min-nodes", str(max(1, a.agents // 2))]
            ready = os.path.join(tmp, "ready-for-kill")
            if a.restart_daemon:
                store, store_port = start_daemon(a.ddprund, None, os.path.join(tmp, "store.log"), store_only=True)
                # No probe: it would lose the daemon too.
                extra = ["--offer-store", str(store_port), "--expect-restart", "--ready-file", ready]
                extra += ["--relay"] if a.relay else []
            sim = subprocess.Popen(
                [a.sim, "--port", str(port), "--agents", str(a.agents), "--nproc", str(a.nproc), "--token", token,
                 "--timeout", "100"] + extra, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
            try:
                if a.restart_daemon:
                    daemon = restart(a, daemon, port, token_file, log_path, ready, sim, failures)
                out, err = sim.communicate(timeout=150)
            finally:
                if sim.poll() is None:
                    sim.kill()
                    sim.communicate()
            print(out + err)
            fields = dict(re.findall(r"(\w+)=(\S+)", out.split("RESULT", 1)[-1]))
            if sim.returncode != 0:
                failures.append(f"the simulator exited {sim.returncode}")
            check(a, fields, world, failures)
            if a.restart_daemon and "rebuilt from its agents' re-joins" not in open(log_path).read():
                failures.append("the restarted ddprund did not log the round rebuilt from the re-joins")
            if daemon.poll() is not None:
                failures.append(f"ddprund exited ({daemon.returncode})")
        finally:
            for p in (daemon, store):
                stop(p)
        if failures:
            with open(log_path) as f:
                print("ddprund's log (tail):\n" + "".join(f.readlines()[-30:]))
            print("FAIL: " + "; ".join(failures))
            return 1
    print(f"OK: {a.agents} agents, {world} workers past the barrier with unique ranks, no error"
          + (f"; after one node's death, {a.agents - 1} agents and their workers through a new round" if a.kill_one else "")
          + ("; after the churn, a round of every agent, old and new, through its store" if a.churn else "")
          + ("; after ddprund's restart, every agent back in its round, no worker restarted" if a.restart_daemon else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())
