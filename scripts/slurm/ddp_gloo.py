#!/usr/bin/env python3
"""A small PyTorch DDP job (gloo, CPU) for scripts/slurm/pytorch_gloo.sbatch: the same script
runs under torchrun and ddprun (env:// from RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT).

Linear(10,50) ReLU Linear(50,1), MSE, SGD 0.01, 400 samples, batch 20 per rank. Every rank
prints one line at the end: "rank R/W node N: loss L params P" where P is a checksum of the
parameters (equal on every rank when DDP kept them in sync).
"""
import argparse
import os
import socket

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--epochs", type=int, default=5)
    args = ap.parse_args()
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(0)
    data = TensorDataset(torch.randn(400, 10), torch.randn(400, 1))
    sampler = DistributedSampler(data, num_replicas=world, rank=rank, shuffle=True, seed=0)
    loader = DataLoader(data, batch_size=20, sampler=sampler)
    model = DDP(nn.Sequential(nn.Linear(10, 50), nn.ReLU(), nn.Linear(50, 1)))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    loss_fn = nn.MSELoss()
    loss = torch.zeros(())
    for epoch in range(args.epochs):
        sampler.set_epoch(epoch)
        for x, y in loader:
            opt.zero_grad()
            loss = loss_fn(model(x), y)
            loss.backward()
            opt.step()
    checksum = sum(float(p.detach().double().sum()) for p in model.parameters())
    print(f"rank {rank}/{world} node {os.environ.get('GROUP_RANK')} host {socket.gethostname()}: "
          f"loss {loss.item():.6f} params {checksum:.10f}", flush=True)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
