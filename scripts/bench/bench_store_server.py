#!/usr/bin/env python3
"""Hosts PyTorch's own TCPStore server for scripts/bench/bench_store.sh.

usage: bench_store_server.py [--libuv 1|0]     (run by the torch 2.11 venv or Debian's 1.13)
Prints "listening on 127.0.0.1:PORT" and serves until SIGTERM/SIGINT or stdin closes.
"""
import argparse
import resource
import signal
import sys
import threading
from datetime import timedelta

import torch
import torch.distributed as dist

ap = argparse.ArgumentParser()
ap.add_argument("--libuv", type=int, default=1)
args = ap.parse_args()
# Same descriptor limit as ddprund takes for itself (the hard limit).
soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
kw = {"use_libuv": bool(args.libuv)} if int(torch.__version__.split(".")[0]) >= 2 else {}
store = dist.TCPStore("127.0.0.1", 0, is_master=True, timeout=timedelta(seconds=60), **kw)
print(f"listening on 127.0.0.1:{store.port} torch {torch.__version__} "
      f"backend {'libuv' if getattr(store, 'libuvBackend', False) else 'legacy'}", flush=True)
done = threading.Event()
signal.signal(signal.SIGTERM, lambda *a: done.set())
signal.signal(signal.SIGINT, lambda *a: done.set())
threading.Thread(target=lambda: (sys.stdin.read(), done.set()), daemon=True).start()
done.wait()
