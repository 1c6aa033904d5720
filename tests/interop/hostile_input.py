#!/usr/bin/env python3
"""Hostile input against ddprund (a separate process): absurd length prefixes (2^60), unknown
commands, bad magic, oversize keys, non-numeric ADD, disconnects mid-request and while
waiting. Each bad connection must be closed, the daemon must stay up with bounded memory
(VmRSS), and a PyTorch client (of the interpreter's version) must keep working throughout.

usage: hostile_input.py --ddprund PATH [--probe PATH]
"""
import argparse
import os
import sys
from datetime import timedelta

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from interop_common import (MAGIC, Daemon, RawConn, blob, check, check_eq, i64, log, run_main,  # noqa: E402
                            torch_major_minor, u64)

import torch.distributed as dist  # noqa: E402

SETC = {"D2": 1, "D0": 0}
ADDC = {"D2": 4, "D0": 3}
WAITC = {"D2": 6, "D0": 5}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--ddprund", required=True)
    ap.add_argument("--probe")
    args = ap.parse_args()
    version = torch_major_minor()
    d = Daemon(args.ddprund)
    store = dist.TCPStore("127.0.0.1", d.port, is_master=False, timeout=timedelta(seconds=30))
    n_ok = [0]

    def pytorch_still_works(after):
        n_ok[0] += 1
        store.set(f"alive/{n_ok[0]}", after)
        check_eq(store.get(f"alive/{n_ok[0]}"), after.encode(), f"PyTorch client works after: {after}")
        check(d.alive(), "ddprund alive")

    def expect_closed(conn, what):
        check(conn.is_closed_by_peer(10.0), f"connection closed: {what}")
        conn.close()
        pytorch_still_works(what)

    store.set("k", "v")
    for dialect in ("D2", "D0"):
        log(f"== raw {dialect} connections")

        def conn():
            return RawConn(d.host, d.port, dialect)

        c = conn()
        c.send(bytes([SETC[dialect]]) + u64(1 << 60) + b"abc")
        expect_closed(c, f"{dialect} SET with key length 2^60")
        c = conn()
        c.send(bytes([SETC[dialect]]) + blob("/x") + u64(1 << 60))
        expect_closed(c, f"{dialect} SET with value length 2^60")
        c = conn()
        c.send(bytes([WAITC[dialect]]) + u64(1 << 60))
        expect_closed(c, f"{dialect} WAIT with key count 2^60")
        c = conn()
        c.send(bytes([200]))
        expect_closed(c, f"{dialect} unknown command byte 200")
        c = conn()
        c.send(bytes([SETC[dialect]]) + blob(b"K" * 9000) + blob("v"))
        expect_closed(c, f"{dialect} 9000-byte key (limit 8192)")
        c = conn()
        c.send(bytes([SETC[dialect]]) + blob("/nn") + blob("abc"))
        c.send(bytes([ADDC[dialect]]) + blob("/nn") + i64(1))
        expect_closed(c, f"{dialect} ADD on non-numeric value")
        check_eq(store.get("nn"), b"abc", "non-numeric value unchanged by the refused ADD")
        c = conn()
        c.send(bytes([SETC[dialect]]) + blob("/mid") + u64(100) + b"only part")
        c.close()
        pytorch_still_works(f"{dialect} disconnect mid-request")
        c = conn()
        c.send(bytes([WAITC[dialect]]) + u64(1) + blob(f"/dw{dialect}"))
        c.close()
        store.set(f"dw{dialect}", "set after the waiter left")
        pytorch_still_works(f"{dialect} disconnect while waiting, key set afterwards")

    log("== bad magic")
    c = RawConn(d.host, d.port, "D2", validate=False)
    c.send(b"\x00\xde\xad\xbe\xef")
    expect_closed(c, "VALIDATE with wrong magic 0xEFBEADDE")
    c = RawConn(d.host, d.port, "D2")
    c.send(b"\x00" + MAGIC)
    expect_closed(c, "second VALIDATE")
    check_eq(store.num_keys() >= 1, True, "num_keys answers")

    log("== memory: 100 absurd-length requests")
    rss0 = d.rss_kb()
    for i in range(100):
        c = RawConn(d.host, d.port, "D2")
        c.send(bytes([1]) + u64((1 << 60) + i) + b"x" * 64)
        check(c.is_closed_by_peer(10.0), f"absurd request {i} closed") if i % 25 == 0 else c.is_closed_by_peer(10.0)
        c.close()
    rss1 = d.rss_kb()
    log(f"  VmRSS before {rss0} kB, after {rss1} kB")
    check(rss1 - rss0 < 16 * 1024, f"RSS grew by {rss1 - rss0} kB (< 16 MiB) after 100 absurd requests")
    pytorch_still_works("100 absurd-length requests")

    log("== memory: 32 connections each announcing an 8 MiB value (the limit), sending 1 byte of it")
    held = []
    rss0 = d.rss_kb()
    for i in range(32):
        c = RawConn(d.host, d.port, "D2")
        c.send(bytes([1]) + blob(f"/half{i}") + u64(8 * 1024 * 1024) + b"x")
        held.append(c)
    pytorch_still_works("32 half-sent 8 MiB values")  # the requests above were all read by now
    rss1 = d.rss_kb()
    log(f"  VmRSS before {rss0} kB, after {rss1} kB with 32 pending announced-8MiB requests "
        f"(= {(rss1 - rss0) / 32:.0f} kB per connection)")
    for c in held:
        c.close()
    pytorch_still_works("the 32 half-sent connections closed")
    # Buffers grow only with bytes that arrived: 32 announced 8 MiB values stay small.
    check(rss1 - rss0 < 16 * 1024, "pending announced values do not pre-allocate (< 16 MiB for 32)")

    check_eq(store.get("k"), b"v", "the first key is intact")
    del store
    rc = d.stop()
    check_eq(rc, 0, "ddprund exit code after SIGTERM")
    text = d.log_text()
    check("closing connection" in text, "ddprund logged the closed connections")
    log("  ddprund log (first lines):\n" + "\n".join("    " + s for s in text.splitlines()[:12]))


if __name__ == "__main__":
    run_main(main, 360)
