"""PyTorch's torch.distributed (gloo) on the inputs of ddprun-torch-collectives, printed the
same way ("case <name> <dtype> <hex>"). Run as 2 ranks under a launcher. Where Gloo has no
such op (AVG) or the reference is built from others (reduce_scatter_tensor as all_reduce then
this rank's block; all_gather_into_tensor as all_gather then cat), the composition is exact
at 2 ranks: a sum of two terms is the same whichever rank adds it."""
import os

import torch
import torch.distributed as dist

DT = {torch.float32: "Float", torch.float64: "Double", torch.float16: "Half", torch.bfloat16: "BFloat16",
      torch.int32: "Int", torch.int64: "Long"}


def show(name, t):
    t = t.contiguous()
    raw = t.view(torch.uint8) if t.dim() > 0 else t.reshape(1).view(torch.uint8)
    print(f"case {name} {DT[t.dtype]} {bytes(raw.flatten().tolist()).hex()}", flush=True)


def main():
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(100 + rank)

    t = torch.randn(5, 7)
    dist.all_reduce(t)
    show("all_reduce_sum_f32", t)

    t = torch.randn(11, dtype=torch.float64)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    show("all_reduce_max_f64", t)

    t = torch.randn(33).to(torch.float16)
    dist.all_reduce(t)
    show("all_reduce_sum_f16", t)

    t = torch.randn(33).to(torch.bfloat16)
    dist.all_reduce(t)
    show("all_reduce_sum_bf16", t)

    t = torch.randint(-50, 50, (9,), dtype=torch.int64)
    dist.all_reduce(t)
    show("all_reduce_sum_i64", t)

    t = torch.randn(13)
    dist.all_reduce(t)  # Gloo has no AVG: the sum divided by the world size
    t /= world
    show("all_reduce_avg_f32", t)

    t = torch.randn(6, 4).t()
    t = t.contiguous()  # torch.distributed refuses a non-contiguous tensor
    dist.all_reduce(t)
    show("all_reduce_sum_noncontiguous", t)

    t = torch.randn(3, 3)
    dist.broadcast(t, src=world - 1)
    show("broadcast_last", t)

    t = torch.randint(-1000, 1000, (4,), dtype=torch.int32)
    parts = [torch.empty_like(t) for _ in range(world)]
    dist.all_gather(parts, t)
    show("all_gather_i32", torch.cat(parts))

    t = torch.randn(2, 3)
    parts = [torch.empty_like(t) for _ in range(world)]
    dist.all_gather(parts, t)
    show("all_gather_into_tensor_f32", torch.cat(parts))

    t = torch.randn(4 * world)
    dist.all_reduce(t)
    show("reduce_scatter_tensor_f32", t[4 * rank:4 * rank + 4])

    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
