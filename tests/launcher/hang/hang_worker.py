"""A gloo job for the hang tests: every step all-reduces, then ticks (ddprun.progress()).

    hang_worker.py --steps N [--hang-rank R --hang-step S] [--wait-file F]

--hang-rank/--hang-step: on attempt 0, rank R sleeps in the step S after its all-reduce, before
its tick (the others tick once more and wait in the next all-reduce). --wait-file: after the
first step rank 0 prints "ready" and every rank waits (ticking) until the file exists. Rank 0
prints the final sum, a function of the steps only.
"""
import argparse
import os
import time

import torch
import torch.distributed as dist

import ddprun

p = argparse.ArgumentParser()
p.add_argument("--steps", type=int, default=10)
p.add_argument("--hang-rank", type=int, default=-1)
p.add_argument("--hang-step", type=int, default=-1)
p.add_argument("--wait-file", default="")
a = p.parse_args()

dist.init_process_group("gloo")
rank = dist.get_rank()
attempt = int(os.environ["TORCHELASTIC_RESTART_COUNT"])
total = torch.zeros(1)
for step in range(a.steps):
    t = torch.full((1,), float(step + rank))
    dist.all_reduce(t)
    total += t
    if rank == a.hang_rank and step == a.hang_step and attempt == 0:
        print(f"rank {rank} stops making progress at step {step}", flush=True)
        time.sleep(3600)  # HANG_LINE
    ddprun.progress()
    if step == 0 and a.wait_file:
        if rank == 0:
            print("ready", flush=True)
        while not os.path.exists(a.wait_file):
            ddprun.progress()
            time.sleep(0.05)
if rank == 0:
    print(f"result {total.item():g} attempt {attempt}", flush=True)
dist.destroy_process_group()
