#!/usr/bin/env python3
"""How a PyTorch DDP script stops for a preemption under ddprun (the recipe of the README's
"Preemption and time limits", and its test: test_torch_ddp.py's `preempt` mode).

    ddprun --nproc_per_node=2 preempt_ddp.py --checkpoint /scratch/ck.pt   # exit 99 when preempted; rerun to resume

SIGUSR1 (Slurm's warning, forwarded by ddprun) or SIGTERM only sets a flag. After every step the
ranks all-reduce the flag with MAX, so all of them stop after the same step, even when the signal
reached one rank only; rank 0 saves the model, the optimizer and the position in the data, and
every rank exits 99: ddprun then stops the job without a restart and exits 99 itself, which the
batch script takes as "requeue me". A rerun resumes from the checkpoint and ends with the same
parameters as a run that was never stopped (param_sha256: bit for bit).

Gloo on the CPU; the model, data and sampler are train_ddp.py's.
--wait-for-signal-at-step N (tests): every rank blocks after global step N until a stop signal
arrives, so a test signals "mid-run" at a known step.
"""
import argparse
import hashlib
import os
import signal
import struct
import sys
import time

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

PREEMPTED = 99  # ddprun's preemption exit code
stop_signal = 0


def on_stop(signo, frame):
    global stop_signal
    stop_signal = stop_signal or signo


def wait_for_signal(step, rank):
    """Blocks until on_stop saw SIGUSR1/SIGTERM. Polled: torch and Gloo run threads of their own,
    and a signal the main thread blocks (for sigwait) may be delivered to one of them instead,
    where Python's handler takes it and sigwait never returns; on_stop always runs here."""
    print(f"rank {rank}: waiting for a stop signal after step {step}", flush=True)
    while not stop_signal:
        time.sleep(0.002)


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--epochs", type=int, default=5)
    p.add_argument("--checkpoint", required=True)
    p.add_argument("--wait-for-signal-at-step", type=int, default=-1)
    args = p.parse_args()

    signal.signal(signal.SIGUSR1, on_stop)
    signal.signal(signal.SIGTERM, on_stop)
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()

    torch.manual_seed(0)  # the same data and initial weights on every rank
    x = torch.randn(100, 10)
    y = x @ torch.linspace(-1, 1, 10).unsqueeze(1) + 0.1 * torch.randn(100, 1)
    dataset = TensorDataset(x, y)
    sampler = DistributedSampler(dataset, num_replicas=world, rank=rank, shuffle=True, seed=0)
    loader = DataLoader(dataset, batch_size=10, sampler=sampler)
    model = DDP(nn.Sequential(nn.Linear(10, 50), nn.ReLU(), nn.Linear(50, 1)))
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)

    step, start_epoch, skip = 0, 0, 0
    if os.path.exists(args.checkpoint):
        ck = torch.load(args.checkpoint)
        model.module.load_state_dict(ck["model"])
        opt.load_state_dict(ck["opt"])
        step, start_epoch, skip = ck["step"], ck["epoch"], ck["batches_done"]
        if rank == 0:
            print(f"resumed from step {step}", flush=True)

    for epoch in range(start_epoch, args.epochs):
        sampler.set_epoch(epoch)
        for i, (xb, yb) in enumerate(loader):
            if epoch == start_epoch and i < skip:
                continue
            opt.zero_grad()
            nn.functional.mse_loss(model(xb), yb).backward()
            opt.step()
            step += 1
            if step == args.wait_for_signal_at_step:
                wait_for_signal(step, rank)
            flag = torch.tensor([1 if stop_signal else 0])
            dist.all_reduce(flag, op=dist.ReduceOp.MAX)  # every rank: did anyone get the signal?
            if flag.item():
                why = signal.Signals(stop_signal).name + " here" if stop_signal else "asked by another rank"
                print(f"rank {rank}: stopping after step {step} for a preemption ({why})", flush=True)
                if rank == 0:
                    tmp = args.checkpoint + ".tmp"
                    torch.save({"model": model.module.state_dict(), "opt": opt.state_dict(), "step": step,
                                "epoch": epoch, "batches_done": i + 1}, tmp)
                    os.replace(tmp, args.checkpoint)  # atomic: a half-written file is never the checkpoint
                dist.barrier()
                # Tell ddprun this 99 is a preemption, and what was saved (its summary says so).
                if os.environ.get("DDPRUN_PREEMPT_FILE"):
                    with open(os.environ["DDPRUN_PREEMPT_FILE"], "w") as f:
                        f.write(f"preempted\ncheckpoint {args.checkpoint} (step {step})\n")
                sys.exit(PREEMPTED)
    dist.barrier()
    if rank == 0:
        params = torch.cat([p.detach().flatten() for p in model.module.parameters()])
        digest = hashlib.sha256(struct.pack(f"<{params.numel()}f", *params.tolist())).hexdigest()
        print(f"final_step {step} param_sha256 {digest}", flush=True)


if __name__ == "__main__":
    main()
