# Run by test_spares.py (resume): gloo DDP training that checkpoints every epoch (rank 0, then a
# barrier) and resumes from the checkpoint. On attempt 0, rank 1 stops at the start of epoch 3,
# says "waiting for the gate", and SIGKILLs itself once the file $GATE exists (the test creates it
# when the warm spares are ready). Rank 0 prints the losses and a digest of the final weights.
#   ddp_resume.py CHECKPOINT GATE
import hashlib
import os
import signal
import sys
import time

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP

ckpt, gate = sys.argv[1], sys.argv[2]
EPOCHS, FAIL_EPOCH = 6, 3
dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()
attempt = int(os.environ["TORCHELASTIC_RESTART_COUNT"])
torch.manual_seed(0)
model = DDP(nn.Sequential(nn.Linear(10, 32), nn.ReLU(), nn.Linear(32, 1)))
opt = torch.optim.SGD(model.parameters(), lr=0.05)
start = 0
if os.path.exists(ckpt):
    state = torch.load(ckpt)
    model.module.load_state_dict(state["model"])
    opt.load_state_dict(state["opt"])
    start = state["epoch"] + 1
g = torch.Generator().manual_seed(1)
x = torch.randn(200, 10, generator=g)
y = x.sum(dim=1, keepdim=True) * 0.5
if rank == 0:
    print("attempt %d resumes at epoch %d" % (attempt, start), flush=True)
for epoch in range(start, EPOCHS):
    if attempt == 0 and rank == 1 and epoch == FAIL_EPOCH:
        print("waiting for the gate", flush=True)
        while not os.path.exists(gate):
            time.sleep(0.05)
        os.kill(os.getpid(), signal.SIGKILL)
    total = 0.0
    for i in range(rank * 10, 200, world * 10):
        opt.zero_grad()
        loss = nn.functional.mse_loss(model(x[i : i + 10]), y[i : i + 10])
        loss.backward()
        opt.step()
        total += loss.item()
    if rank == 0:
        tmp = ckpt + ".tmp"
        torch.save({"model": model.module.state_dict(), "opt": opt.state_dict(), "epoch": epoch}, tmp)
        os.replace(tmp, ckpt)
        print("epoch %d loss %.6f" % (epoch, total), flush=True)
    dist.barrier()  # rank 1 enters the next epoch only once the checkpoint is written
if rank == 0:
    digest = hashlib.sha256(b"".join(p.detach().numpy().tobytes() for p in model.module.parameters())).hexdigest()
    print("final weights %s" % digest, flush=True)
dist.destroy_process_group()
