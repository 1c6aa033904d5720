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

usage: scale_sim.py --ddprund PATH --sim PATH [--agents N] [--nproc P] [--kill-one] [--relay]
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


def start_daemon(ddprund, token_file, log_path):
    log = open(log_path, "w")
    proc = subprocess.Popen(
        [ddprund, "--host", "127.0.0.1", "--port", "0", "--rdzv-token-file", token_file, "--threads", "2"],
        stdout=log, stderr=subprocess.STDOUT)
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        with open(log_path) as f:
            m = re.search(r"listening on 127\.0\.0\.1:(\d+)", f.read())
        if m:
            return proc, int(m.group(1))
        if proc.poll() is not None:
            break
        time.sleep(0.05)
    proc.kill()
    proc.wait()
    with open(log_path) as f:
        sys.exit("ddprund did not start:\n" + f.read())


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--ddprund", required=True)
    ap.add_argument("--sim", required=True)
    ap.add_argument("--agents", type=int, default=1024)
    ap.add_argument("--nproc", type=int, default=8)
    ap.add_argument("--kill-one", action="store_true")
    ap.add_argument("--relay", action="store_true")
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
        try:
            sim = subprocess.run(
                [a.sim, "--port", str(port), "--agents", str(a.agents), "--nproc", str(a.nproc), "--token", token,
                 "--server-pid", str(daemon.pid), "--probe", "--timeout", "100"]
                + (["--kill-one", "--min-nodes", str(max(1, a.agents // 2))] if a.kill_one else [])
                + (["--relay"] if a.relay else []),
                capture_output=True, text=True, timeout=150)
            print(sim.stdout + sim.stderr)
            fields = dict(re.findall(r"(\w+)=(\S+)", sim.stdout.split("RESULT", 1)[-1]))
            world = a.agents * a.nproc
            failures = []
            if sim.returncode != 0:
                failures.append(f"the simulator exited {sim.returncode}")
            want = {"rounds": a.agents, "workers_done": world, "dup_ranks": 0, "errors": 0, "ok": 1}
            if a.kill_one:  # the survivors' second round, on top of the first
                want.update(rounds=2 * a.agents - 1, workers_done=world + (a.agents - 1) * a.nproc,
                            restarts=a.agents - 1)
            for key, want in want.items():
                if int(fields.get(key, -1)) != want:
                    failures.append(f"{key}={fields.get(key)} (want {want})")
            if daemon.poll() is not None:
                failures.append(f"ddprund exited ({daemon.returncode})")
        finally:
            daemon.terminate()
            try:
                daemon.wait(timeout=10)
            except subprocess.TimeoutExpired:
                daemon.kill()
                daemon.wait()
        if failures:
            with open(log_path) as f:
                print("ddprund's log (tail):\n" + "".join(f.readlines()[-30:]))
            print("FAIL: " + "; ".join(failures))
            return 1
    print(f"OK: {a.agents} agents, {world} workers past the barrier with unique ranks, no error"
          + (f"; after one node's death, {a.agents - 1} agents and their workers through a new round" if a.kill_one else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())
