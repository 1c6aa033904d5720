"""PyTorch DDP baseline for scripts/bench/bench_train_cpu.sh and bench_train_gpu.sh: the same MLP as
ddprun's `train` (Linear(10,W), ReLU, [Linear(W,W), ReLU] x depth, Linear(W,1)), MSE, SGD,
batch per rank, synthetic data; prints avg_step_ms from rank 0. Run under torchrun."""
import argparse, os, time
import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP

p = argparse.ArgumentParser()
p.add_argument("--width", type=int, default=1024)
p.add_argument("--depth", type=int, default=4)
p.add_argument("--batch", type=int, default=64)
p.add_argument("--steps", type=int, default=40)
p.add_argument("--warmup", type=int, default=5)
p.add_argument("--threads", type=int, default=1)
p.add_argument("--device", default="cpu")
p.add_argument("--precision", default="fp32")
p.add_argument("--tuned", action="store_true",
               help="DDP tuned: gradient_as_bucket_view=True, static_graph=True, gradients zeroed in place")
a = p.parse_args()

torch.set_num_threads(a.threads)
cuda = a.device == "cuda"
dist.init_process_group("nccl" if cuda else "gloo")
rank, world = dist.get_rank(), dist.get_world_size()
dev = torch.device("cuda", int(os.environ.get("LOCAL_RANK", 0))) if cuda else torch.device("cpu")
if cuda:
    torch.cuda.set_device(dev)
layers = [nn.Linear(10, a.width), nn.ReLU()]
for _ in range(a.depth):
    layers += [nn.Linear(a.width, a.width), nn.ReLU()]
layers += [nn.Linear(a.width, 1)]
tuned = dict(gradient_as_bucket_view=True, static_graph=True) if a.tuned else {}
model = DDP(nn.Sequential(*layers).to(dev), device_ids=[dev.index] if cuda else None, **tuned)
opt = torch.optim.SGD(model.parameters(), lr=0.01)
loss_fn = nn.MSELoss()
x = torch.randn(a.batch, 10, device=dev)
y = torch.randn(a.batch, 1, device=dev)
amp = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(a.precision)
scaler = torch.cuda.amp.GradScaler() if (cuda and a.precision == "fp16") else None


def step():
    opt.zero_grad(set_to_none=not a.tuned)  # tuned: the gradients stay views of the buckets
    if amp is not None:
        with torch.autocast(device_type="cuda", dtype=amp):
            loss = loss_fn(model(x), y)
    else:
        loss = loss_fn(model(x), y)
    if scaler:
        scaler.scale(loss).backward(); scaler.step(opt); scaler.update()
    else:
        loss.backward(); opt.step()
    return loss


for _ in range(a.warmup):
    step()
if cuda:
    torch.cuda.synchronize()
dist.barrier()
t0 = time.perf_counter()
for _ in range(a.steps):
    loss = step()
if cuda:
    torch.cuda.synchronize()
ms = (time.perf_counter() - t0) * 1000 / a.steps
if rank == 0:
    print(f"torch={torch.__version__} world={world} avg_step_ms={ms:.3f} loss={loss.item():.4f}", flush=True)
dist.destroy_process_group()
