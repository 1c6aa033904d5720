#!/usr/bin/env python3
"""A PyTorch NCCL job for an installed ddprun (docs/INSTALL.md, the GPU check): every rank
all-reduces its rank + 1 on its GPU and checks the sum; rank 0 prints what ran it.
    ddprun --nproc_per_node=N nccl_allreduce.py
"""
import os
import sys

import torch
import torch.distributed as dist


def main() -> int:
    local_rank = int(os.environ["LOCAL_RANK"])
    torch.cuda.set_device(local_rank % torch.cuda.device_count())
    dist.init_process_group("nccl")
    rank, world = dist.get_rank(), dist.get_world_size()
    t = torch.full((1 << 20,), float(rank + 1), device="cuda")
    dist.all_reduce(t)
    torch.cuda.synchronize()
    want = world * (world + 1) / 2
    ok = bool(torch.all(t == want))
    if rank == 0:
        print(f"python {sys.executable} torch {torch.__version__} nccl {torch.cuda.nccl.version()} "
              f"{torch.cuda.get_device_name()} world {world}: all_reduce sum {t[0].item()} "
              f"(want {want}) {'ok' if ok else 'WRONG'}", flush=True)
    dist.destroy_process_group()
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
