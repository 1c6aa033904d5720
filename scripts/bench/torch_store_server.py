"""PyTorch's own TCPStore server, for bench_scale.sh (STORE=torch, STORE=torch-nolibuv): prints
"listening on 127.0.0.1:PORT" once it accepts, then serves until killed.
    python torch_store_server.py [--no-libuv]
"""
import datetime
import sys
import time

import torch
import torch.distributed as dist

libuv = "--no-libuv" not in sys.argv[1:]
store = dist.TCPStore("127.0.0.1", 0, is_master=True, use_libuv=libuv, wait_for_workers=False,
                      timeout=datetime.timedelta(seconds=900))
print(f"listening on 127.0.0.1:{store.port} (torch {torch.__version__}, "
      f"libuv {libuv})", flush=True)
while True:
    time.sleep(3600)
