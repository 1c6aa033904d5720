import time

T_START = time.time()  # first thing: when this worker began running its own code (before `import torch`)
import json
import os
# Worker for scripts/bench/bench_spares.sh (warm spares vs cold restarts). The same file runs under every
# launcher. Appends one JSON line per event to $BENCH_SPARES_TS: {rank, attempt, pid, event, ...}: "start"
# (t_start), "init" (t_imported, t_init: past init_process_group), "ready" (t_ready: past a first all_reduce).
# Attempt 0: rank 1 writes its pid to $BENCH_SPARES_PIDFILE once past its first all_reduce and sleeps until
# the driver SIGKILLs it; rank 0 sits in a second all_reduce that cannot complete. Attempt 1: both ranks do
# the first all_reduce and exit 0.


def record(**kw):
    line = json.dumps(dict(rank=RANK, attempt=ATTEMPT, pid=os.getpid(), **kw)) + "\n"
    fd = os.open(os.environ["BENCH_SPARES_TS"], os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, line.encode())  # one O_APPEND write: lines from concurrent workers don't interleave
    finally:
        os.close(fd)


RANK = int(os.environ["RANK"])
ATTEMPT = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
record(event="start", t_start=T_START)

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

T_IMPORTED = time.time()
dist.init_process_group("gloo")
T_INIT = time.time()
record(event="init", t_imported=T_IMPORTED, t_init=T_INIT)
t = torch.ones(1)
dist.all_reduce(t)
record(event="ready", t_ready=time.time(), value=float(t.item()))

if ATTEMPT == 0:
    if RANK == 1:
        pidfile = os.environ["BENCH_SPARES_PIDFILE"]
        with open(pidfile + ".tmp", "w") as f:
            f.write(str(os.getpid()))
        os.rename(pidfile + ".tmp", pidfile)  # atomic: the driver never reads a partial pid
        time.sleep(600)  # waiting for SIGKILL
        raise SystemExit(3)
    try:
        dist.all_reduce(t)  # rank 1 never joins
    except Exception:  # gloo noticed the dead peer: wait for the launcher to stop the group
        pass
    time.sleep(600)
    raise SystemExit(4)
dist.destroy_process_group()
