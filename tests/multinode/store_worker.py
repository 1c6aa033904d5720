"""A PyTorch gloo worker for the multi-node tests that uses the workers' store late: it
records what it was given (as worker.py does) once its process group is up, waits for the
release file, then uses the store and a new process group (so a store that went away meanwhile
fails the worker), and exits 0."""
import datetime
import json
import os
import sys
import time

import torch
import torch.distributed as dist

env = os.environ
dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=120))
rank, world = dist.get_rank(), dist.get_world_size()
rec = {k: env.get(k) for k in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "GROUP_RANK", "GROUP_WORLD_SIZE",
                               "LOCAL_WORLD_SIZE", "TORCHELASTIC_RESTART_COUNT", "MASTER_ADDR", "MASTER_PORT",
                               "TORCHELASTIC_RUN_ID", "DDPT_NODE")}
rec["pid"] = os.getpid()
rec["t"] = time.time()
fd = os.open(os.path.join(env["DDPT_OUT"], "records.jsonl"), os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
os.write(fd, (json.dumps(rec) + "\n").encode())
os.close(fd)

limit = time.monotonic() + float(env.get("DDPT_MAX_SECONDS", "60"))
while not os.path.exists(env["DDPT_RELEASE"]):
    if time.monotonic() > limit:
        print("worker hit DDPT_MAX_SECONDS", file=sys.stderr)
        sys.exit(7)
    time.sleep(0.05)

# The store, through the default group's client that connected before the release.
store = dist.distributed_c10d._get_default_store()
store.set(f"late/{rank}", str(rank))
for r in range(world):
    assert store.get(f"late/{r}") == str(r).encode()
dist.barrier()
group = dist.new_group(list(range(world)))  # keys in the store
t = torch.ones(1)
dist.all_reduce(t, group=group)
assert t.item() == world, t
dist.destroy_process_group()
print(f"rank {rank}: used the workers' store after the release", flush=True)
