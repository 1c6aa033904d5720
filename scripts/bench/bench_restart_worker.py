import time

T_START = time.time()  # first thing, before `import torch`: when this worker process began running Python
import json
import os
# Worker for scripts/bench/bench_restart.py (restart latency, warm spares). The same file runs under every
# launcher. Appends one JSON line per event to $BENCH_RESTART_TS: {rank, attempt, pid, event, ...}: "start"
# (t_start, written before `import torch`), "init" (t_start, t_imported, t_init: past init_process_group),
# "ready" (t_ready: past a first all_reduce), then "allreduce_error" / "done"; with BENCH_BACKEND=nccl
# (one GPU per local rank) also "cuda" (t_cuda: its device current and a tensor on it), before "init".
# BENCH_LOAD=N: in attempt 0 each worker starts N processes that spin on a core (a busy data loader) first
# thing, so the host is saturated while the spares import.
# Attempt 0: the last rank (rank 1 of 2) writes its pid to $BENCH_RESTART_PIDFILE once past init ($BENCH_KILL_AFTER=init) or past
# a first all_reduce (=ready) and sleeps until the driver SIGKILLs it; rank 0 sits in an all_reduce that
# cannot complete. If gloo raises (peer gone), rank 0 records it and sleeps, so the only failure the
# launcher sees is rank 1's SIGKILL. Attempt 1: both ranks do one all_reduce and exit 0.


def record(**kw):
    line = json.dumps(dict(rank=RANK, attempt=ATTEMPT, pid=os.getpid(), **kw)) + "\n"
    fd = os.open(os.environ["BENCH_RESTART_TS"], os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, line.encode())  # one O_APPEND write: lines from concurrent workers don't interleave
    finally:
        os.close(fd)


RANK = int(os.environ["RANK"])
ATTEMPT = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
KILL_AFTER = os.environ.get("BENCH_KILL_AFTER", "init")
record(event="start", t_start=T_START)
LOAD = int(os.environ.get("BENCH_LOAD", "0")) if ATTEMPT == 0 else 0
if LOAD:  # before `import torch`: data-loader-like processes that keep cores busy at normal priority, gone with this worker
    import subprocess
    import sys
    spin = "import ctypes\nctypes.CDLL(None).prctl(1, 9)\nwhile True:\n    pass\n"  # PR_SET_PDEATHSIG, SIGKILL
    LOADERS = [subprocess.Popen([sys.executable, "-c", spin]) for _ in range(LOAD)]

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

T_IMPORTED = time.time()
NCCL = os.environ.get("BENCH_BACKEND", "gloo") == "nccl"
if NCCL:  # the device of this local rank, a tensor on it: the CUDA context is ready
    torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
    torch.zeros(1, device="cuda")
    torch.cuda.synchronize()
    record(event="cuda", t_cuda=time.time())
dist.init_process_group("nccl" if NCCL else "gloo")
T_INIT = time.time()
record(event="init", t_start=T_START, t_imported=T_IMPORTED, t_init=T_INIT)
t = torch.ones(1, device="cuda" if NCCL else "cpu")
if ATTEMPT > 0 or KILL_AFTER == "ready":
    dist.all_reduce(t)  # with NCCL the communicator is created here (init_process_group is lazy)
    if NCCL:
        torch.cuda.synchronize()
    record(event="ready", t_ready=time.time(), value=float(t.item()))

if ATTEMPT == 0:
    if RANK == int(os.environ["WORLD_SIZE"]) - 1:  # the last rank is the one killed
        pidfile = os.environ["BENCH_RESTART_PIDFILE"]
        with open(pidfile + ".tmp", "w") as f:
            f.write(str(os.getpid()))
        os.rename(pidfile + ".tmp", pidfile)  # atomic: the driver never reads a partial pid
        time.sleep(600)  # waiting for SIGKILL
        raise SystemExit(3)
    try:
        dist.all_reduce(t)  # rank 1 never joins
        record(event="allreduce_returned", t=time.time())
    except Exception as e:  # gloo noticed the dead peer
        record(event="allreduce_error", t=time.time(), error=str(e).splitlines()[0][:200])
    time.sleep(600)  # waiting for the launcher to stop the group
    raise SystemExit(4)

record(event="done", t=time.time(), value=float(t.item()))
dist.destroy_process_group()
