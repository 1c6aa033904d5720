#!/usr/bin/env python3
"""--store_relay on: two agents on this host join a standing ddprund; each node's workers reach
the workers' store (node rank 0's) through their node's relay. The workers see MASTER_ADDR
127.0.0.1 and a relay's port, a gloo all-reduce runs, and the store holds one connection per
node (counted in /proc/net/tcp while the workers wait), not one per worker.

Usage: test_store_relay.py <ddprun> <ddprund> <python with torch> [on|off]
(off: the same job without relays, the store sees every worker: the count the test tells apart)
Exit 77 (ctest: skipped) only when that Python does not exist, saying why.
"""
import os
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import time

HANG_GUARD = 240
NPROC = 2
NNODES = 2

WORKER = r"""
import os, sys, time
import torch, torch.distributed as dist
dist.init_process_group("gloo")
t = torch.ones(4) * (dist.get_rank() + 1)
dist.all_reduce(t)
print("env", os.environ["MASTER_ADDR"], os.environ["MASTER_PORT"], "sum", int(t[0].item()), flush=True)
go = os.path.join(os.environ["RELAY_TEST_DIR"], "go")
open(os.path.join(os.environ["RELAY_TEST_DIR"], "ready." + os.environ["RANK"]), "w").close()
deadline = time.monotonic() + 200  # a hang guard: the test creates `go` once it counted
while not os.path.exists(go) and time.monotonic() < deadline:
    time.sleep(0.05)
dist.barrier()
dist.destroy_process_group()
"""


def check(cond, what):
    if not cond:
        print("FAILED:", what, file=sys.stderr)
        sys.exit(1)
    print("ok:", what)


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def connections_to(port):
    """Established TCP connections whose remote end is 127.0.0.1:port (clients of that port)."""
    n = 0
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        with open(table) as f:
            for line in f.readlines()[1:]:
                fields = line.split()
                rem, state = fields[2], fields[3]
                if state == "01" and int(rem.split(":")[1], 16) == port:
                    n += 1
    return n


def main():
    ddprun, ddprund, python = sys.argv[1:4]
    mode = sys.argv[4] if len(sys.argv) > 4 else "on"
    if not os.path.exists(python):
        print(f"SKIPPED: {python} does not exist (scripts/setup_deps.sh creates the torch 2.x venv)")
        sys.exit(77)
    tmp = tempfile.mkdtemp(prefix="relay-e2e-")
    port = free_port()
    procs = []
    try:
        d = subprocess.Popen([ddprund, "--host", "127.0.0.1", "--port", str(port)], stdout=subprocess.DEVNULL,
                             stderr=subprocess.DEVNULL)
        procs.append(d)
        deadline = time.monotonic() + 60
        while True:
            try:
                socket.create_connection(("127.0.0.1", port)).close()
                break
            except OSError:
                if time.monotonic() > deadline:
                    check(False, "ddprund listens")
                time.sleep(0.05)
        env = dict(os.environ, PYTHON_EXEC=python, RELAY_TEST_DIR=tmp)
        logs = []
        for n in range(NNODES):
            err = open(os.path.join(tmp, f"agent{n}.err"), "w+")
            out = open(os.path.join(tmp, f"agent{n}.out"), "w+")
            logs.append((out, err))
            procs.append(subprocess.Popen(
                [ddprun, f"--nnodes={NNODES}", f"--nproc_per_node={NPROC}", "--rdzv_backend=c10d",
                 f"--rdzv_endpoint=127.0.0.1:{port}", "--rdzv_id=relay", f"--store_relay={mode}",
                 "--rdzv_conf=last_call_timeout=1,join_timeout=120", "--no_python", python, "-c", WORKER],
                stdout=out, stderr=err, env=env))
        world = NNODES * NPROC
        deadline = time.monotonic() + HANG_GUARD
        while sum(name.startswith("ready.") for name in os.listdir(tmp)) < world:
            if time.monotonic() > deadline or any(p.poll() is not None for p in procs[1:]):
                err = "".join(open(os.path.join(tmp, f"agent{n}.err")).read() for n in range(NNODES))
                check(False, "every worker all-reduced and waits; agents' stderr:\n" + err)
            time.sleep(0.1)
        text = "".join(open(os.path.join(tmp, f"agent{n}.err")).read() for n in range(NNODES))
        m = re.search(r"hosts the workers' store of round \d+ on port (\d+)", text)
        check(m is not None, "a node hosts the workers' store: " + text[-2000:])
        store_port = int(m.group(1))
        held = connections_to(store_port)
        open(os.path.join(tmp, "go"), "w").close()
        codes = [p.wait(timeout=HANG_GUARD) for p in procs[1:]]
        outs = "".join(open(os.path.join(tmp, f"agent{n}.out")).read() for n in range(NNODES))
        errs = "".join(open(os.path.join(tmp, f"agent{n}.err")).read() for n in range(NNODES))
        print(outs)
        print(errs, file=sys.stderr)
        check(codes == [0] * NNODES, f"both agents exit 0: {codes}")
        envs = re.findall(r"\benv (\S+) (\d+) sum (\d+)", outs)
        check(len(envs) == world, f"{world} workers reported: {envs}")
        total = sum(range(1, world + 1))
        check(all(int(s) == total for _, _, s in envs), f"the all-reduce summed to {total}: {envs}")
        if mode == "on":
            check(all(a == "127.0.0.1" and int(p) != store_port for a, p, _ in envs),
                  f"MASTER_ADDR is 127.0.0.1 and MASTER_PORT a relay's, not the store's {store_port}: {envs}")
            check(len({p for _, p, _ in envs}) == NNODES, f"one relay port per node: {envs}")
            check("through this node's store relay" in errs, "the agents say the workers use a relay")
            check(held == NNODES, f"the store held one connection per node ({held}, {world} workers)")
        else:
            check(all(int(p) == store_port for _, p, _ in envs), f"MASTER_PORT is the store's: {envs}")
            check(held == world, f"without relays the store held one connection per worker ({held})")
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
