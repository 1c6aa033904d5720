"""Multi-host scenarios with a hostile node: an intruder agent with a wrong or no token, an
absurd world size, JOIN/LEAVE churn or a forged failure, against the job's rendezvous."""
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

from multinode_lib import *  # noqa: E402,F401,F403

ATTACKS = ["wrong_token", "no_token", "huge_world", "join_leave", "forge_failure"]


def intruded_job(args, token):
    """Nodes 0 and 1 run an elastic 2:3 job (max_restarts=3, workers held); node 2 is a stranger
    who knows the run id. With room for a third node, a JOIN gets a stranger into the round
    (scale-up) and its LEAVE then spends the budget; its FAILURE fails the job. Every attack
    must change nothing: one attempt, restart count 0, both nodes exit 0."""
    run = Run(args, 3)
    try:
        env = {"DDPT_RELEASE": os.path.join(run.out, "release"), "DDPT_MAX_SECONDS": "120"}
        if token:
            env["DDPRUN_RDZV_TOKEN"] = TOKEN
        # Before the second node comes, a stranger declares 2^31-1 workers (the job exists:
        # node 0 created it; without the checks the round formed with the stranger).
        run.agent(0, dyn_flags(run, "2:3", 1, extra=["--max_restarts=3"]), extra_env=env)
        same_flags = ["--min_nodes", "2", "--nnodes", "3", "--max_restarts", "3"]  # the job's: not refused for those
        first = finish_intruder(intruder(run, 2, ["huge_world"], ["--once"] + same_flags))
        run.agent(1, dyn_flags(run, "2:3", 1, extra=["--max_restarts=3"]), extra_env=env)
        wait_for(lambda: len(run.records()) >= 2, 40, "both workers of round 0")
        modes = ATTACKS if token else ["huge_world"]
        loop = finish_intruder(intruder(run, 2, modes, ["--seconds", "8"] + same_flags))
        if token:
            # A real ddprun with the wrong token, then with none: refused, saying what to set.
            for bad_env, says in (({"DDPRUN_RDZV_TOKEN": "not the job's token, 16+ bytes"}, "token mismatch"),
                                  ({}, "requires a token and this agent has none")):
                run.agent(2, dyn_flags(run, "2:3", 1, extra=["--max_restarts=3"]), extra_env=bad_env)
                code, out = run.wait(2, 60)
                assert code != 0 and "rendezvous refused: " in out and says in out, (code, out)
                assert "set DDPRUN_RDZV_TOKEN or --rdzv_token_file the same on every node" in out, out
            # A token file others may read is a usage error that says how to fix it.
            loose = os.path.join(run.out, "loose_token")
            with open(loose, "w") as f:
                f.write(TOKEN)
            os.chmod(loose, 0o644)
            run.agent(2, dyn_flags(run, "2:3", 1, extra=["--max_restarts=3", "--rdzv_token_file", loose]))
            code, out = run.wait(2, 60)
            assert code == 2 and f"chmod 600 {loose}" in out, (code, out)
        store_port = run.records()[0]["MASTER_PORT"]
        store = finish_intruder(intruder(run, 2, ["store"], ["--store_port", store_port]))
        run.release()
        codes = [run.wait(n, 60)[0] for n in (0, 1)]
        assert codes == [0, 0], codes
        recs = run.records()
        assert len(recs) == 2, f"one attempt of two workers, nothing restarted: {recs}"
        check_round(recs, 0, 2, 2)
        for line in (first + loop).splitlines():
            if line.split(":")[0] in ATTACKS:
                assert "ERROR" in line and ("rendezvous refused" in line or "JOIN refused" in line), line
        if not token:
            assert "local_world_size 2147483647" in first, first
        assert "store: refused" in store, store
        return run
    finally:
        run.close()


def scenario_intruder_token(args):
    """With a token, a stranger (no token, a wrong one, or raw frames) is refused at the door."""
    intruded_job(args, token=True)


def scenario_intruder_open(args):
    """Without a token the rendezvous is open, but a JOIN out of bounds is refused and the
    workers' store still serves only the job's nodes."""
    intruded_job(args, token=False)


def scenario_intruder_static_store(args):
    """Static two nodes: node 0's own store is the workers' store (--master_port); a stranger's
    TCPStore client there is closed, the nodes' workers are served."""
    run = Run(args, 3)
    try:
        env = {"DDPT_RELEASE": os.path.join(run.out, "release"), "DDPT_MAX_SECONDS": "120"}
        for n in (0, 1):
            run.agent(n, static_flags(run, n, 2, 1), extra_env=env)
        wait_for(lambda: len(run.records()) >= 2, 40, "both workers")
        store = finish_intruder(intruder(run, 2, ["store"], ["--store_port", "29500"]))
        run.release()
        codes = [run.wait(n, 60)[0] for n in (0, 1)]
        assert codes == [0, 0], codes
        check_round(run.records(), 0, 2, 2)
        assert "store: refused" in store, store
    finally:
        run.close()
