"""PyTorch DDP without overlap, for the overlap fraction in scripts/bench/bench_multigpu.sh (run under
torchrun). The model, data, optimizer, precision and timing are those of
scripts/bench/bench_worker_ddp.py (whose overlapped DDP step is the one in the tables); here backward
runs under DDP's no_sync() and the gradients are then all-reduced in 25 MB buckets (reverse
parameter order, like DDP's buckets: flatten, all_reduce, divide by world, copy back), so no
communication overlaps backward. Prints avg_step_ms from rank 0.
  torchrun --nproc_per_node=N scripts/bench/bench_multigpu_torch_ddp.py --width 4096 --depth 6 --batch 1024
"""
import argparse
import os
import sys
import time


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--width", type=int, default=4096)
    p.add_argument("--depth", type=int, default=6)
    p.add_argument("--batch", type=int, default=1024)
    p.add_argument("--steps", type=int, default=30)
    p.add_argument("--warmup", type=int, default=10)
    p.add_argument("--precision", default="bf16", choices=["fp32", "bf16"])
    p.add_argument("--bucket-mb", type=float, default=25.0)
    a = p.parse_args(argv)
    import torch
    import torch.distributed as dist
    import torch.nn as nn
    from torch._utils import _flatten_dense_tensors, _unflatten_dense_tensors
    from torch.nn.parallel import DistributedDataParallel as DDP

    dist.init_process_group("nccl")
    rank, world = dist.get_rank(), dist.get_world_size()
    dev = torch.device("cuda", int(os.environ.get("LOCAL_RANK", 0)))
    torch.cuda.set_device(dev)
    layers = [nn.Linear(10, a.width), nn.ReLU()]
    for _ in range(a.depth):
        layers += [nn.Linear(a.width, a.width), nn.ReLU()]
    layers += [nn.Linear(a.width, 1)]
    model = DDP(nn.Sequential(*layers).to(dev), device_ids=[dev.index])
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    loss_fn = nn.MSELoss()
    x = torch.randn(a.batch, 10, device=dev)
    y = torch.randn(a.batch, 1, device=dev)
    amp = torch.bfloat16 if a.precision == "bf16" else None
    params = [q for q in model.parameters() if q.requires_grad][::-1]
    cap = int(a.bucket_mb * 1024 * 1024)
    buckets, cur, size = [], [], 0
    for q in params:
        cur.append(q)
        size += q.numel() * q.element_size()
        if size >= cap:
            buckets.append(cur)
            cur, size = [], 0
    if cur:
        buckets.append(cur)

    def step():
        opt.zero_grad(set_to_none=True)
        with model.no_sync():
            if amp is not None:
                with torch.autocast(device_type="cuda", dtype=amp):
                    loss = loss_fn(model(x), y)
            else:
                loss = loss_fn(model(x), y)
            loss.backward()
        for b in buckets:
            grads = [q.grad for q in b]
            flat = _flatten_dense_tensors(grads)
            dist.all_reduce(flat)
            flat.div_(world)
            for g, s in zip(grads, _unflatten_dense_tensors(flat, grads)):
                g.copy_(s)
        opt.step()
        return loss

    for _ in range(a.warmup):
        step()
    torch.cuda.synchronize()
    dist.barrier()
    t0 = time.perf_counter()
    for _ in range(a.steps):
        loss = step()
    torch.cuda.synchronize()
    ms = (time.perf_counter() - t0) * 1000 / a.steps
    if rank == 0:
        print(f"torch={torch.__version__} world={world} mode=no-overlap buckets={len(buckets)} avg_step_ms={ms:.3f} "
              f"loss={loss.item():.4f}", flush=True)
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
