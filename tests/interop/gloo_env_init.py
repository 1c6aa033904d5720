#!/usr/bin/env python3
"""init_process_group("gloo", init_method="env://") of 3 real worker processes whose store is
ddprund (TORCHELASTIC_USE_AGENT_STORE=True, like workers under torchrun), then all_reduce with
a checked result, new_group + all_reduce in it, and a barrier. With torch 2.x, a second round
with TORCH_DIST_INIT_BARRIER=1 (store-based barrier at init) on a fresh daemon.

usage: gloo_env_init.py --ddprund PATH [--probe PATH]     (--worker: internal)
"""
import argparse
import os
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from interop_common import (Daemon, RawConn, check, check_eq, log, read_line_with_deadline,  # noqa: E402
                            run_main, spawn, torch_major_minor)

WORLD = 3


def worker():
    from datetime import timedelta

    import torch
    import torch.distributed as dist

    rank = int(os.environ["RANK"])
    world = int(os.environ["WORLD_SIZE"])
    dist.init_process_group("gloo", init_method="env://", timeout=timedelta(seconds=60))
    assert dist.get_rank() == rank and dist.get_world_size() == world
    t = torch.tensor([float(rank + 1), 10.0 * (rank + 1)])
    dist.all_reduce(t)
    sub = dist.new_group([0, 1])
    s = torch.tensor([float(rank + 1)])
    if rank in (0, 1):
        dist.all_reduce(s, group=sub)
    dist.barrier()
    b = torch.tensor([float(rank)])
    dist.broadcast(b, src=world - 1)
    dist.barrier()
    print(f"RESULT rank={rank} sum={t.tolist()} sub={s.item()} bcast={b.item()}", flush=True)
    dist.destroy_process_group()


def run_round(ddprund, extra_env, version):
    d = Daemon(ddprund)
    try:
        procs = []
        for rank in range(WORLD):
            env = dict(os.environ)
            env.update({"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(d.port), "WORLD_SIZE": str(WORLD),
                        "RANK": str(rank), "LOCAL_RANK": str(rank), "LOCAL_WORLD_SIZE": str(WORLD),
                        "TORCHELASTIC_USE_AGENT_STORE": "True", "TORCHELASTIC_RESTART_COUNT": "0",
                        "OMP_NUM_THREADS": "1", "GLOO_SOCKET_IFNAME": "lo"})
            env.update(extra_env)
            procs.append(spawn([sys.executable, os.path.abspath(__file__), "--worker"], env=env,
                               stdout=subprocess.PIPE))
        want_sum = [sum(range(1, WORLD + 1)) * 1.0, sum(range(1, WORLD + 1)) * 10.0]
        for rank, p in enumerate(procs):
            line = read_line_with_deadline(p.stdout, 120, f"worker {rank}")
            sub = 3.0 if rank in (0, 1) else float(rank + 1)
            check_eq(line, f"RESULT rank={rank} sum={want_sum} sub={sub} bcast={float(WORLD - 1)}",
                     f"worker {rank} results")
        for rank, p in enumerate(procs):
            check_eq(p.wait(timeout=60), 0, f"worker {rank} exit code")
        raw = RawConn(d.host, d.port, "D0" if version < (2, 0) else "D2")
        check_eq(raw.get("init/"), str(WORLD).encode(), "init/ counted every worker's client")
        check(raw.num_keys() > WORLD, f"workers left their bootstrap keys ({raw.num_keys()} keys)")
        if version < (2, 0):
            check_eq(raw.get("//worker/attempt_0/default_pg/store_based_barrier_key:1"), str(WORLD).encode(),
                     "1.13 init barrier counter under the /worker/attempt_0 prefix")
        elif extra_env.get("TORCH_DIST_INIT_BARRIER") == "1":
            check_eq(raw.get("/default_pg/store_based_barrier_key:0:last_worker") != b"", True,
                     "init barrier's last_worker key set")
        raw.close()
        check(d.alive(), "ddprund alive")
    finally:
        rc = d.stop()
    check_eq(rc, 0, "ddprund exit code")
    check("closing connection" not in d.log_text(), "ddprund closed no connection for bad input")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--ddprund")
    ap.add_argument("--probe")
    ap.add_argument("--worker", action="store_true")
    args = ap.parse_args()
    if args.worker:
        worker()
        return
    version = torch_major_minor()
    log(f"== torch {version}: {WORLD} gloo workers, env:// with the agent store = ddprund")
    run_round(args.ddprund, {}, version)
    if version >= (2, 0):
        log(f"== torch {version}: again with TORCH_DIST_INIT_BARRIER=1")
        run_round(args.ddprund, {"TORCH_DIST_INIT_BARRIER": "1"}, version)


if __name__ == "__main__":
    if "--worker" in sys.argv:
        main()
    else:
        run_main(main, 360)
