#!/usr/bin/env python3
"""ddprun's C++ StoreClient (store_interop_probe) against PyTorch's own TCPStore servers:
1.13's (dialect D0) or 2.11's libuv and legacy backends (dialect D2; queues/list_keys on libuv
only). The Python side hosts the server with TCPStore(is_master=True) and is also the peer that
must see the probe's keys, and whose set wakes the probe's wait.

usage: our_client_vs_pytorch_server.py --probe PATH [--ddprund PATH]
"""
import argparse
import os
import subprocess
import sys
from datetime import timedelta

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from interop_common import check, check_eq, log, run_main, spawn, torch_major_minor  # noqa: E402

import torch.distributed as dist  # noqa: E402


def one_server(probe, version, use_libuv):
    kw = {} if version < (2, 0) else {"use_libuv": use_libuv}
    if version < (2, 0):
        # 1.13 cannot bind port 0: pick a free port up front, again if a test beside this one
        # took it in between.
        from interop_common import free_port
        for attempt in range(3):
            try:
                master = dist.TCPStore("127.0.0.1", free_port(), is_master=True,
                                       timeout=timedelta(seconds=30), **kw)
                break
            except RuntimeError as e:
                if attempt == 2 or "in use" not in str(e):
                    raise
    else:
        master = dist.TCPStore("127.0.0.1", 0, is_master=True, timeout=timedelta(seconds=30), **kw)
    port = master.port
    name = "1.13 legacy" if version < (2, 0) else ("2.11 libuv" if use_libuv else "2.11 legacy")
    log(f"== our client against PyTorch {name} server on 127.0.0.1:{port}")
    if version >= (2, 0):
        check_eq(master.libuvBackend, use_libuv, "server backend as asked")
    cmd = [probe, "--host", "127.0.0.1", "--port", str(port), "--peer", "--tag", "probe",
           "--dialect", "D0" if version < (2, 0) else "D2"]
    if version >= (2, 0) and use_libuv:
        cmd.append("--queues")
    p = spawn(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    # Peer: see the probe's key, answer, and check what it wrote during its suite.
    check_eq(master.get("from_cpp"), b"hello from C++", "python sees the probe's from_cpp")
    check_eq(master.get("probe/ctr"), b"-2", "python sees the probe's ADD counter as decimal text")
    check_eq(master.get("probe/cas"), b"second", "python sees the probe's compare_set result")
    check_eq(master.get("probe/many/999"), b"999", "python sees the probe's 1000th key")
    check_eq(len(master.get("probe/big")), 1 << 20, "python sees the probe's 1 MiB value")
    if version >= (2, 0):
        check_eq(master.get("probe/ap"), b"abc", "python sees the probe's append")
        check_eq(master.check(["probe/m1", "probe/m2", "probe/m3"]), True, "python sees the probe's multi_set")
    if version >= (2, 0) and use_libuv:
        master.queue_push("probe_q_from_py", "x")
        check_eq(master.queue_len("probe_q_from_py"), 1, "queue from python")
    check_eq(master.add("shared_ctr", 1), 1, "python adds first")
    master.set("from_py", "hello from python")
    check_eq(master.get("cpp_done"), b"1", "probe finished its peer steps")
    out, _ = p.communicate(timeout=60)
    text = out.decode(errors="replace")
    sys.stdout.write("".join("    probe| " + line + "\n" for line in text.splitlines()))
    check_eq(p.returncode, 0, "probe exit code")
    check("PROBE PASS" in text, "probe passed its suite")
    check_eq(master.add("shared_ctr", 0), 2, "shared counter seen by python")
    del master


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--probe", required=True)
    ap.add_argument("--ddprund")
    args = ap.parse_args()
    version = torch_major_minor()
    if version < (2, 0):
        one_server(args.probe, version, use_libuv=False)
    else:
        one_server(args.probe, version, use_libuv=True)
        one_server(args.probe, version, use_libuv=False)


if __name__ == "__main__":
    run_main(main, 360)
