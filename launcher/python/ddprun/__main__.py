"""``python -m ddprun ...`` is ``ddprun ...`` (as ``python -m torch.distributed.run`` is torchrun)."""

from ._launch import ddprun

if __name__ == "__main__":
    ddprun()
