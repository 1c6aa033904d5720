"""PyTorch's own DDP on the model of ddprun-torch-example: the reference for the libtorch tests
and the Python side of scripts/bench/bench_torch_ddp.py. Run under torchrun (gloo on the CPU, or
NCCL with --device cuda, one GPU per local rank):

  torchrun --standalone --nproc_per_node=2 ddp_reference.py --load-init init.0 \
      --batches 'batches.%r' --dump-final 'py.%r' --steps 20

The model, the loss and the step loop mirror worker_runtime/torch/tools/cnn_ddp.cpp (same
module paths, same order of operations); the data come from the same torch generator calls.
"""
import argparse
import contextlib
import os
import sys
import struct
import time

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP


class Net(nn.Module):
    def __init__(self, channels, hidden, depth, bn):
        super().__init__()
        self.conv1 = nn.Conv2d(3, channels, 3, padding=1)
        if bn:
            self.bn1 = nn.BatchNorm2d(channels)
        else:
            self.bn1 = None
        self.conv2 = nn.Conv2d(channels, 2 * channels, 3, padding=1)
        width = 2 * channels
        layers = []
        for _ in range(depth):
            layers.append(nn.Linear(width, hidden))
            width = hidden
        self.hidden = nn.ModuleList(layers)
        self.fc = nn.Linear(width, 10)
        self.aux = nn.Linear(width, 10)

    def forward(self, x, use_aux):
        x = self.conv1(x)
        if self.bn1 is not None:
            x = self.bn1(x)
        x = torch.relu(x)
        x = torch.relu(self.conv2(x)).mean((2, 3))
        for m in self.hidden:
            x = torch.relu(m(x))
        y = self.fc(x)
        if use_aux:
            y = y + self.aux(x)
        return y


class ReferenceSyncBatchNorm(nn.BatchNorm2d):
    """nn.SyncBatchNorm's arithmetic for the CPU, where PyTorch's own runs on CUDA only: the batch
    statistics of every rank's batch together through torch.distributed.nn.functional.all_reduce,
    whose backward all-reduces the gradients of the statistics, i.e. the two per-channel sums
    that SyncBatchNorm's backward all-reduces; weight and bias gradients stay local."""

    def forward(self, x):
        if not self.training:
            return super().forward(x)
        import torch.distributed.nn.functional as dist_nn
        self.num_batches_tracked.add_(1)
        dims = [0, 2, 3]
        count = torch.tensor([x.numel() / x.size(1)], dtype=x.dtype)
        sums = dist_nn.all_reduce(torch.cat([x.sum(dims), count]))
        n = sums[-1]
        mean = sums[:-1] / n
        xmu = x - mean.view(1, -1, 1, 1)
        var = dist_nn.all_reduce((xmu * xmu).sum(dims)) / n
        with torch.no_grad():
            m = self.momentum
            self.running_mean.mul_(1 - m).add_(mean, alpha=m)
            self.running_var.mul_(1 - m).add_(var * (n / (n - 1)), alpha=m)
        out = xmu * torch.rsqrt(var + self.eps).view(1, -1, 1, 1)
        return out * self.weight.view(1, -1, 1, 1) + self.bias.view(1, -1, 1, 1)


_CODES = {0: torch.float32, 1: torch.int64, 2: torch.float64}


def read_dump(path):
    """The example's tensor dump: {'param/conv1.weight': tensor, 'buffer/bn1.running_mean': ...}."""
    out = {}
    with open(path, "rb") as f:
        data = f.read()
    assert data[:4] == b"DDPT", f"{path}: not a tensor dump"
    (count,) = struct.unpack_from("<I", data, 4)
    off = 8
    for _ in range(count):
        (n,) = struct.unpack_from("<I", data, off)
        off += 4
        name = data[off:off + n].decode()
        off += n
        code, nbytes = struct.unpack_from("<BQ", data, off)
        off += 9
        out[name] = torch.frombuffer(bytearray(data[off:off + nbytes]), dtype=_CODES[code]).clone()
        off += nbytes
    return out


def write_dump(path, module):
    items = [("param/" + k, v) for k, v in module.named_parameters()]
    items += [("buffer/" + k, v) for k, v in module.named_buffers()]
    with open(path, "wb") as f:
        f.write(b"DDPT" + struct.pack("<I", len(items)))
        for name, t in items:
            t = t.detach().cpu().contiguous()
            code = {torch.float32: 0, torch.int64: 1, torch.float64: 2}[t.dtype]
            raw = bytes(t.reshape(-1).view(torch.uint8).tolist())
            f.write(struct.pack("<I", len(name)) + name.encode() + struct.pack("<BQ", code, len(raw)) + raw)


def load_init(path, module):
    state = read_dump(path)
    with torch.no_grad():
        for k, v in list(module.named_parameters()) + list(module.named_buffers()):
            src = state["param/" + k] if ("param/" + k) in state else state["buffer/" + k]
            v.copy_(src.reshape(v.shape))


def per_rank(path, rank):
    return path.replace("%r", str(rank))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--accum", type=int, default=1)
    ap.add_argument("--samples", type=int, default=512)
    ap.add_argument("--lr", type=float, default=0.05)
    ap.add_argument("--momentum", type=float, default=0.9)
    ap.add_argument("--seed", type=int, default=1234)
    ap.add_argument("--bn", type=int, default=1)
    ap.add_argument("--sync-bn", action="store_true",
                    help="synchronised batch norm: nn.SyncBatchNorm.convert_sync_batchnorm on CUDA, "
                         "ReferenceSyncBatchNorm on the CPU")
    ap.add_argument("--unused-mode", default="step", choices=["none", "step", "rank", "always"])
    ap.add_argument("--find-unused", type=int, default=1)
    ap.add_argument("--channels", type=int, default=8)
    ap.add_argument("--hidden", type=int, default=16)
    ap.add_argument("--depth", type=int, default=0)
    ap.add_argument("--image", type=int, default=8)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--load-init", default="")
    ap.add_argument("--batches", default="", help="per-step sample indices written by the example (%%r = rank)")
    ap.add_argument("--dump-final", default="")
    ap.add_argument("--optimizer-zero-grad", type=int, default=1,
                    help="1: zero_grad(set_to_none=True); 0: zero in place (gradients stay bucket views)")
    ap.add_argument("--no-ddp", action="store_true")
    ap.add_argument("--static-graph", action="store_true")
    ap.add_argument("--gradient-as-bucket-view", type=int, default=1)
    ap.add_argument("--join", action="store_true", help="train inside model.join() (uneven inputs)")
    ap.add_argument("--join-divide-initial", type=int, default=1, help="join(divide_by_initial_world_size)")
    ap.add_argument("--uneven", type=int, default=0, help="rank r runs --steps minus r times this many steps")
    ap.add_argument("--powersgd-rank", type=int, default=1)
    ap.add_argument("--powersgd-start", type=int, default=1000)
    ap.add_argument("--powersgd-warm-start", type=int, default=1)
    ap.add_argument("--powersgd-error-feedback", type=int, default=1)
    ap.add_argument("--comm-hook", choices=["none", "allreduce", "fp16", "bf16", "powersgd"], default="none",
                    help="register_comm_hook with default_hooks' allreduce_hook / fp16_compress_hook / bf16_compress_hook")
    ap.add_argument("--time", action="store_true")
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    ap.add_argument("--foreach", type=int, default=0,
                    help="SGD foreach (multi-tensor) kernels: 0 (default) = one parameter at a time, the kernels "
                         "of LibTorch's C++ SGD; 1 = PyTorch's own CUDA default")
    ap.add_argument("--deterministic", action="store_true", help="deterministic cuDNN algorithms")
    a = ap.parse_args()

    torch.set_num_threads(a.threads)
    if a.deterministic:
        torch.backends.cudnn.deterministic = True
        torch.backends.cudnn.benchmark = False
    cuda = a.device == "cuda"
    local = int(os.environ.get("LOCAL_RANK", "0"))
    if cuda:
        torch.cuda.set_device(local)
    dist.init_process_group("nccl" if cuda else "gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    dev = torch.device("cuda", local) if cuda else torch.device("cpu")

    def sync():
        if cuda:
            torch.cuda.synchronize(dev)
    torch.manual_seed(a.seed)
    net = Net(a.channels, a.hidden, a.depth, bool(a.bn))
    if a.sync_bn and a.bn:
        if cuda:
            net = nn.SyncBatchNorm.convert_sync_batchnorm(net)
        else:
            net.bn1 = ReferenceSyncBatchNorm(a.channels)
    if a.load_init:
        load_init(a.load_init, net)
    net.to(dev)
    torch.manual_seed(a.seed + 1)
    X = torch.randn(a.samples, 3, a.image, a.image).to(dev)
    Y = torch.randint(0, 10, (a.samples,)).to(dev)
    model = net
    if not a.no_ddp:
        model = DDP(net, device_ids=[local] if cuda else None, find_unused_parameters=bool(a.find_unused),
                    broadcast_buffers=True, gradient_as_bucket_view=bool(a.gradient_as_bucket_view),
                    static_graph=a.static_graph)
        if a.comm_hook == "powersgd":
            from torch.distributed.algorithms.ddp_comm_hooks import powerSGD_hook as powerSGD
            state = powerSGD.PowerSGDState(process_group=None, matrix_approximation_rank=a.powersgd_rank,
                                           start_powerSGD_iter=a.powersgd_start,
                                           use_error_feedback=bool(a.powersgd_error_feedback),
                                           warm_start=bool(a.powersgd_warm_start), random_seed=0)
            model.register_comm_hook(state, powerSGD.powerSGD_hook)
        elif a.comm_hook != "none":
            from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
            model.register_comm_hook(None, {"allreduce": default_hooks.allreduce_hook,
                                            "fp16": default_hooks.fp16_compress_hook,
                                            "bf16": default_hooks.bf16_compress_hook}[a.comm_hook])
    opt = torch.optim.SGD(net.parameters(), lr=a.lr, momentum=a.momentum, foreach=bool(a.foreach))

    per_step = a.batch * a.accum
    if a.batches:
        with open(per_rank(a.batches, rank)) as f:
            schedule = [[int(t) for t in line.split()] for line in f if line.strip()]
    else:  # the benchmark: contiguous shards, as the sampler without shuffle
        mine = list(range(rank, a.samples, world))
        nb = len(mine) // per_step
        schedule = [mine[(s % nb) * per_step:(s % nb + 1) * per_step] for s in range(a.steps)]

    def use_aux(step):
        if a.unused_mode == "step":
            return step % 3 != 2
        if a.unused_mode == "rank":
            return not ((step + rank) % 4 == 0 or step % 5 == 4)
        return a.unused_mode != "always"

    net.train()
    stats = {"timed": 0, "timed_s": 0.0, "cpu_s": 0.0}

    def run_steps(n):
        for step in range(n):
            if a.time:
                sync()
            t0, c0 = time.perf_counter(), time.process_time()
            ids = torch.tensor(schedule[step], dtype=torch.long).to(dev)
            opt.zero_grad(set_to_none=bool(a.optimizer_zero_grad))
            for k in range(a.accum):
                part = ids[k * a.batch:(k + 1) * a.batch]
                x, y = X.index_select(0, part), Y.index_select(0, part)

                def fwd_bwd():
                    out = model(x, use_aux(step))
                    loss = F.cross_entropy(out, y) / a.accum
                    loss.backward()

                if not a.no_ddp and k + 1 < a.accum:
                    with model.no_sync():
                        fwd_bwd()
                else:
                    fwd_bwd()
            opt.step()
            if a.time:
                sync()
            dt = time.perf_counter() - t0
            if step >= a.warmup:
                stats["timed"] += 1
                stats["timed_s"] += dt
                stats["cpu_s"] += time.process_time() - c0

    join = model.join(divide_by_initial_world_size=bool(a.join_divide_initial)) \
        if a.join and not a.no_ddp else contextlib.nullcontext()
    with join:
        run_steps(a.steps - a.uneven * rank)
    timed, timed_s, cpu_s = stats["timed"], stats["timed_s"], stats["cpu_s"]
    if a.dump_final:
        write_dump(per_rank(a.dump_final, rank), net)
    if a.time and timed:
        print(f"rank {rank} step_ms={1e3 * timed_s / timed:.4f} cpu_ms={1e3 * cpu_s / timed:.4f} steps={timed}",
              flush=True)
    # Every rank is done, then leave without interpreter finalization: with a comm hook,
    # PyTorch 2.11's Gloo threads sometimes abort the process at teardown ("terminate called
    # without an active exception", SIGABRT) after everything above finished.
    dist.barrier()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


if __name__ == "__main__":
    main()
