"""PyTorch NCCL worker for the launch/restart rows of scripts/bench/bench_multigpu.sh (run by ddprun or
torchrun): init_process_group("nccl"), one all_reduce, synchronize, then one JSON line
  {"rank", "world", "attempt", "pid", "t_start", "t_import", "t_init", "t_first"}   (time.time())
appended to $BENCH_MG_TS (one write, O_APPEND). t_start is taken before `import torch`.
$BENCH_MG_MODE:
  launch   exit 0 after the first collective
  restart  attempt 0 ($TORCHELASTIC_RESTART_COUNT): the victim rank (world-1) sleeps until the
           driver SIGKILLs it; the others enter a second all_reduce the victim never joins (a
           job killed mid-training) and stay there until the launcher stops them.
           attempt >= 1: exit 0 after the first collective.
$BENCH_MG_BACKEND=gloo runs the same on CPU (to test the driver on a machine without a GPU).
Every wait is bounded ($BENCH_MG_HOLD_S, default 90 s; NCCL timeout the same) so that nothing
outlives a broken launcher for long.
"""
import json
import os
import sys
import time

t_start = time.time()


def main():
    ts = os.environ.get("BENCH_MG_TS", "")
    mode = os.environ.get("BENCH_MG_MODE", "launch")
    hold = float(os.environ.get("BENCH_MG_HOLD_S", "90"))
    if mode not in ("launch", "restart"):
        print(f"BENCH_MG_MODE={mode!r}: expected launch or restart", file=sys.stderr)
        return 2
    import datetime
    import torch
    import torch.distributed as dist
    t_import = time.time()
    local = int(os.environ.get("LOCAL_RANK", "0"))
    attempt = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
    backend = os.environ.get("BENCH_MG_BACKEND", "nccl")
    cuda = backend == "nccl"
    dev = torch.device("cuda", local) if cuda else torch.device("cpu")
    if cuda:
        torch.cuda.set_device(dev)
    dist.init_process_group(backend, timeout=datetime.timedelta(seconds=hold))
    t_init = time.time()
    rank, world = dist.get_rank(), dist.get_world_size()
    x = torch.ones(1024, device=dev)
    dist.all_reduce(x)
    if cuda:
        torch.cuda.synchronize(dev)
    t_first = time.time()
    rec = dict(rank=rank, world=world, attempt=attempt, pid=os.getpid(), t_start=t_start, t_import=t_import,
               t_init=t_init, t_first=t_first, ok=bool(x[0].item() == world))
    if ts:
        fd = os.open(ts, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        os.write(fd, (json.dumps(rec) + "\n").encode())
        os.close(fd)
    if mode == "restart" and attempt == 0:
        if rank == world - 1:
            time.sleep(hold)  # the driver SIGKILLs us here
            return 1
        dist.all_reduce(x)  # never completes: the victim does not join
        if cuda:
            torch.cuda.synchronize(dev)
        time.sleep(hold)
        return 1
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
