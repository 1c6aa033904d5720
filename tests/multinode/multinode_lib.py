"""What the multi-host scenarios share: a run of agents in a network-namespace cluster, their
flags, the round checks, a standing ddprund, the PyTorch to use."""
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from netns import Cluster, wait_for  # noqa: E402,F401

HERE = os.path.dirname(os.path.abspath(__file__))
WORKER = os.path.join(HERE, "worker.py")
TRAIN_DDP = os.path.join(HERE, "..", "launcher", "train_ddp.py")


class Run:
    def __init__(self, args, nodes):
        self.args = args
        self.out = tempfile.mkdtemp(prefix="ddpt-")
        self.cluster = Cluster(f"{os.getpid() % 100000}")
        for _ in range(nodes):
            self.cluster.add_node()
        self.agents = {}

    def env(self, node, extra=None):
        e = dict(os.environ)
        e.update({"DDPT_OUT": self.out, "DDPT_NODE": str(node), "PYTHON_EXEC": "/usr/bin/python3"})
        e.update(extra or {})
        return e

    def agent(self, node, flags, entry=WORKER, extra_env=None, entry_args=()):
        argv = [self.args.ddprun] + flags + [entry] + list(entry_args)
        p = self.cluster.spawn(node, argv, env=self.env(node, extra_env))
        self.agents[node] = p
        return p

    def wait(self, node, timeout):
        p = self.agents[node]
        try:
            out, _ = p.communicate(timeout=timeout)
        except Exception:
            p.kill()
            out, _ = p.communicate()
            print(f"--- node {node} output (killed after {timeout}s) ---\n{out}")
            raise AssertionError(f"node {node} did not finish within {timeout}s")
        print(f"--- node {node} exit {p.returncode} ---\n{out}")
        return p.returncode, out

    def records(self):
        path = os.path.join(self.out, "records.jsonl")
        if not os.path.exists(path):
            return []
        with open(path) as f:
            return [json.loads(line) for line in f if line.strip()]

    def release(self):
        open(os.path.join(self.out, "release"), "w").close()

    def close(self):
        # Agents nobody waited for (a scenario failed early): show what they said.
        for node, p in self.agents.items():
            if p.returncode is None:
                p.kill()
                out, _ = p.communicate()
                print(f"--- node {node} output (not waited for) ---\n{out}")
        self.cluster.close()


def dyn_flags(run, nnodes, nproc, rid="job", extra=()):
    ep = f"{run.cluster.addr(0)}:29400"
    return [f"--nnodes={nnodes}", "--rdzv_backend=c10d", f"--rdzv_endpoint={ep}", f"--rdzv_id={rid}",
            f"--nproc_per_node={nproc}", "--rdzv_conf=last_call_timeout=2,join_timeout=20"] + list(extra)


def static_flags(run, node, nnodes, nproc, extra=()):
    return [f"--nnodes={nnodes}", f"--node_rank={node}", f"--master_addr={run.cluster.addr(0)}",
            "--master_port=29500", f"--nproc_per_node={nproc}"] + list(extra)


def check_round(recs, attempt, world, expect_nodes):
    r = [x for x in recs if int(x["TORCHELASTIC_RESTART_COUNT"]) == attempt]
    ranks = sorted(int(x["RANK"]) for x in r)
    assert ranks == list(range(world)), f"attempt {attempt}: ranks {ranks}, expected 0..{world - 1}: {r}"
    assert all(int(x["WORLD_SIZE"]) == world for x in r), r
    assert all(int(x["GROUP_WORLD_SIZE"]) == expect_nodes for x in r), r
    return r


# The rendezvous token of the scenarios that use one.
TOKEN = "multinode test token: 0123456789abcdef"


def start_ddprund(run, args, extra=()):
    ddprund = os.path.join(os.path.dirname(args.ddprun), "..", "rendezvous", "ddprund")
    d = run.cluster.spawn(0, [ddprund, "--port", "29400"] + list(extra))
    line = d.stdout.readline()
    assert "listening" in line, line
    return d


STORE_WORKER = os.path.join(HERE, "store_worker.py")
VENV_TORCH2 = os.path.join(HERE, "..", "..", ".venv-torch2", "bin", "python")


def torch_python():
    """PyTorch 2.11 (the project's venv) when it is there, else Debian's 1.13."""
    return os.path.abspath(VENV_TORCH2) if os.path.exists(VENV_TORCH2) else "/usr/bin/python3"


# An intruder (intruder.py) on a node of the cluster, and its end.
INTRUDER = os.path.join(HERE, "intruder.py")


def intruder(run, node, modes, extra=()):
    argv = ["/usr/bin/python3", INTRUDER, "--host", run.cluster.addr(0), "--my_addr", run.cluster.addr(node)]
    return run.cluster.spawn(node, argv + list(extra) + list(modes), env=run.env(node))


def finish_intruder(p, timeout=90):
    out, _ = p.communicate(timeout=timeout)
    print(f"--- intruder (exit {p.returncode}) ---\n{out}")
    return out
