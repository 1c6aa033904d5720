#!/usr/bin/env python3
"""PyTorch's own TCPStore client (1.13 or 2.11, whichever interpreter runs this) against ddprund,
every method that version exposes.

usage: pytorch_client_vs_ddprund.py --ddprund PATH [--relay PATH]
(--relay: every client goes through a store relay, ddprun_store_relay, in front of ddprund)
(helper modes, started by the test itself: --helper waiter|pusher|joiner ...)
"""
import argparse
import os
import subprocess
import sys
from datetime import timedelta

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from interop_common import (Daemon, RawConn, check, check_eq, expect_raises, log,  # noqa: E402
                            read_line_with_deadline, run_main, spawn, torch_major_minor)

import torch.distributed as dist  # noqa: E402

TIMEOUT = timedelta(seconds=30)  # store timeout: a hang guard, never reached when all is well
# A helper is a fresh Python that imports torch first (seconds on a loaded 2-core host, several
# at once): its first line is a hang guard too, not a time bound.
HELPER_START_S = 120


def client(port, **kw):
    kw.setdefault("timeout", TIMEOUT)
    return dist.TCPStore("127.0.0.1", port, is_master=False, **kw)


def helper(args):
    """Runs in a child process; reports on stdout, one line per step."""
    store = client(args.port)
    if args.helper == "waiter":
        # Announce, then block in get() (= WAIT + GET) until the parent's set wakes us.
        store.add("waiter_ready", 1)
        print("waiting", flush=True)
        value = store.get(args.key)
        print("got " + value.decode(), flush=True)
    elif args.helper == "popper":
        store.add("popper_ready", 1)
        print("popping", flush=True)
        value = store.queue_pop(args.key)  # blocking
        print("popped " + value.decode(), flush=True)
    elif args.helper == "joiner":
        # world_size given, wait_for_workers default: the client ADDs init/ once.
        dist.TCPStore("127.0.0.1", args.port, world_size=args.world_size, is_master=False, timeout=TIMEOUT)
        print("joined", flush=True)


def start_helper(port, mode, key="", world_size=0):
    return spawn([sys.executable, os.path.abspath(__file__), "--helper", mode, "--port", str(port), "--key", key,
                  "--world-size", str(world_size)], stdout=subprocess.PIPE)


def finish_helper(p, want_last_line):
    line = read_line_with_deadline(p.stdout, HELPER_START_S, f"helper {p.pid}")
    check_eq(line, want_last_line, f"helper {p.pid} output")
    check_eq(p.wait(timeout=30), 0, f"helper {p.pid} exit code")


def raw_d(version):
    return "D0" if version < (2, 0) else "D2"


def test_basic(d, store, version):
    log("== set/get/add/num_keys/delete_key")
    n0 = store.num_keys()
    store.set("k1", "v1")
    check_eq(store.get("k1"), b"v1", "get after set")
    store.set("k1", b"\x00\xffbinary")
    check_eq(store.get("k1"), b"\x00\xffbinary", "overwrite with binary value")
    store.set("empty", "")
    check_eq(store.get("empty"), b"", "empty value")
    check_eq(store.add("ctr", 5), 5, "add on a missing key starts at 0")
    check_eq(store.add("ctr", -7), -2, "negative delta")
    check_eq(store.add("ctr", 0), -2, "add 0 reads the counter")
    check_eq(store.get("ctr"), b"-2", "ADD is stored as decimal text")
    store.set("num", " 12 ")
    check_eq(store.add("num", 1), 13, "add on ' 12 ' (stoll rules)")
    check_eq(store.num_keys() - n0, 4, "num_keys counts the 4 new keys")
    check_eq(store.delete_key("k1"), True, "delete_key of an existing key")
    check_eq(store.delete_key("k1"), False, "delete_key of a missing key")
    check_eq(store.num_keys() - n0, 3, "num_keys after delete")
    raw = RawConn(d.host, d.port, raw_d(version))
    check_eq(raw.get("/ctr"), b"-2", "wire key carries PyTorch's '/' prefix")
    raw.close()


def test_compare_set(store):
    log("== compare_set matrix")
    n0 = store.num_keys()
    check_eq(store.compare_set("cas", "", "first"), b"first", "missing key + empty expected: stored")
    check_eq(store.get("cas"), b"first", "value after create")
    check_eq(store.compare_set("cas_none", "x", "y"), b"x", "missing key + non-empty expected: returns expected")
    check_eq(store.num_keys() - n0, 1, "nothing stored for the missing/non-empty branch")
    check_eq(store.compare_set("cas", "first", "second"), b"second", "match: stored")
    check_eq(store.get("cas"), b"second", "value after match")
    check_eq(store.compare_set("cas", "wrong", "third"), b"second", "mismatch: current value returned")
    check_eq(store.get("cas"), b"second", "value unchanged after mismatch")
    check_eq(store.compare_set("cas", "second", ""), b"", "match with empty desired")
    check_eq(store.get("cas"), b"", "empty value stored")


def test_wait(d, store, version):
    log("== wait")
    store.set("w1", "1")
    store.set("w2", "2")
    store.wait(["w1", "w2"])
    log("  ok: wait on present keys returns")
    store.wait(["w1"], timedelta(seconds=5))
    log("  ok: wait with timeout on a present key returns")
    store.wait([])
    log("  ok: wait on no keys returns")
    if version >= (2, 0):
        expect_raises(lambda: store.wait(["never"], timedelta(milliseconds=300)), "wait on a missing key with 300ms timeout")
        # The store stays usable (CANCEL_WAIT discipline): no stray byte later.
        check_eq(store.get("w1"), b"1", "store usable after a timed-out wait")
        other = client(d.port)
        other.set("never", "now")
        check_eq(store.add("after_timeout", 3), 3, "next reply not corrupted after the key arrives")
        check_eq(store.get("never"), b"now", "get of the formerly missing key")
        store.set_timeout(timedelta(milliseconds=200))
        expect_raises(lambda: store.get("still_missing"), "get() with a 200ms store timeout")
        store.set_timeout(TIMEOUT)
        check_eq(store.get("w2"), b"2", "store usable after a timed-out get")
        check_eq(store.timeout, TIMEOUT, "timeout property")
    else:
        # 1.13 has no CANCEL_WAIT: a timed-out wait leaves the connection unusable if the key
        # arrives later, so use a throwaway store object.
        tmp = client(d.port)
        expect_raises(lambda: tmp.wait(["never13"], timedelta(milliseconds=300)), "1.13 wait timeout")
        del tmp
        check_eq(store.get("w1"), b"1", "other clients unaffected by the timed-out one")
    # A waiter in another process, woken by our set.
    p = start_helper(d.port, "waiter", key="xproc")
    check_eq(read_line_with_deadline(p.stdout, HELPER_START_S, "waiter"), "waiting", "waiter announced")
    store.wait(["waiter_ready"])
    store.set("xproc", "woken")
    finish_helper(p, "got woken")


def test_prefix_and_sizes(d, store, version):
    log("== PrefixStore, 1 MiB values, many keys")
    raw = RawConn(d.host, d.port, raw_d(version))
    ps = dist.PrefixStore("pfx", store)
    ps.set("a", "pa")
    check_eq(ps.get("a"), b"pa", "PrefixStore get")
    check_eq(raw.get("/pfx/a"), b"pa", "PrefixStore wire key /pfx/a")
    nested = dist.PrefixStore("q", dist.PrefixStore("p1/", store))
    nested.set("a", "qa")
    # SET has no reply: a round trip on the same connection orders it before the raw read
    # on another connection (without it the raw GET can overtake the SET).
    check_eq(nested.get("a"), b"qa", "nested PrefixStore get")
    check_eq(raw.get("/p1//q/a"), b"qa", "nested PrefixStore wire key /p1//q/a")
    check_eq(ps.add("c", 2), 2, "PrefixStore add")
    check_eq(ps.compare_set("c", "2", "x"), b"x", "PrefixStore compare_set")
    ps.wait(["a", "c"])
    check_eq(ps.delete_key("c"), True, "PrefixStore delete_key")
    big = os.urandom(1 << 20)
    store.set("big", big)
    check_eq(store.get("big") == big, True, "1 MiB value round trip")
    check_eq(raw.get("/big") == big, True, "1 MiB value via a second connection")
    raw.close()
    n0 = store.num_keys()
    for i in range(2000):
        store.set(f"many/{i}", str(i))
    check_eq(store.num_keys() - n0, 2000, "2000 keys counted")
    check_eq(store.get("many/1999"), b"1999", "last of 2000 keys")
    check_eq(store.add("many/7", 1), 8, "add on one of them")
    if version >= (2, 0):
        ps.append("ap", "x")
        check_eq(store.get("pfx/ap"), b"x", "PrefixStore append")
        vals = store.multi_get([f"many/{i}" for i in range(2000)])
        check_eq(vals[0] == b"0" and vals[7] == b"8" and vals[1999] == b"1999" and len(vals) == 2000, True,
                 "multi_get of 2000 keys")
        keys = set(store.list_keys())
        check_eq(all(f"many/{i}" in keys for i in range(2000)), True, "list_keys holds all 2000 keys")
        store.append("big", big)
        check_eq(store.get("big") == big + big, True, "append 1 MiB to 1 MiB")


def test_extended_211(d, store):
    log("== 2.11 extended API: check/append/multi_*/queues/list_keys/clone")
    check_eq(isinstance(store.libuvBackend, bool), True, "libuvBackend property readable (client option)")
    check_eq(store.host, "127.0.0.1", "host property")
    check_eq(store.port, d.port, "port property")
    check_eq(store.has_extended_api(), True, "has_extended_api")
    store.set("c1", "1")
    check_eq(store.check(["c1"]), True, "check present key")
    check_eq(store.check(["c1", "c_missing"]), False, "check with a missing key")
    check_eq(store.check([]), True, "check of no keys")
    store.append("ap", "a")
    check_eq(store.get("ap"), b"a", "append creates")
    store.append("ap", "bc")
    check_eq(store.get("ap"), b"abc", "append concatenates")
    store.multi_set(["m1", "m2", "m3"], ["x", "", "z"])
    check_eq(store.multi_get(["m3", "m1", "m2"]), [b"z", b"x", b""], "multi_get in request order")
    check_eq(store.multi_get([]), [], "multi_get of no keys")
    # Queues.
    check_eq(store.queue_len("q"), 0, "queue_len of an unknown queue")
    store.queue_push("q", "one")
    store.queue_push("q", b"two")
    check_eq(store.queue_len("q"), 2, "queue_len after 2 pushes")
    check_eq(store.queue_pop("q"), b"one", "FIFO pop 1")
    check_eq(store.queue_pop("q", block=False), b"two", "non-blocking pop with data")
    expect_raises(lambda: store.queue_pop("q", block=False), "non-blocking pop of an empty queue", dist.QueueEmptyError)
    check_eq(store.get("c1"), b"1", "store usable after QueueEmptyError")
    store.set_timeout(timedelta(milliseconds=300))
    expect_raises(lambda: store.queue_pop("q"), "blocking pop of an empty queue times out")
    store.set_timeout(TIMEOUT)
    check_eq(store.queue_len("q"), 0, "queue still empty")
    p = start_helper(d.port, "popper", key="xq")
    check_eq(read_line_with_deadline(p.stdout, HELPER_START_S, "popper"), "popping", "popper announced")
    store.wait(["popper_ready"])
    store.queue_push("xq", "payload")
    finish_helper(p, "popped payload")
    check_eq(store.queue_len("xq"), 0, "queue drained by the other process")
    keys = store.list_keys()
    check_eq(isinstance(keys, list) and "c1" in keys and "ap" in keys and "init/" not in keys, True,
             "list_keys: prefix stripped, init/ dropped")
    check_eq("q" not in keys and "xq" not in keys, True, "list_keys lists no queues")
    c = store.clone()
    c.set("cloned", "yes")
    check_eq(store.get("cloned"), b"yes", "clone() talks to the same server")
    check_eq(c.get("ap"), b"abc", "clone reads")


def test_world_size(d, version):
    log("== world_size / wait_for_workers init counter")
    raw = RawConn(d.host, d.port, raw_d(version))
    before = raw.add("init/", 0)
    helpers = [start_helper(d.port, "joiner", world_size=3) for _ in range(3)]
    for p in helpers:
        finish_helper(p, "joined")
    check_eq(raw.add("init/", 0) - before, 3, "3 clients with world_size=3 each ADDed init/ once")
    check_eq(raw.get("init/"), str(before + 3).encode(), "init/ stored as decimal text")
    quiet = dist.TCPStore("127.0.0.1", d.port, world_size=3, is_master=False, wait_for_workers=False, timeout=TIMEOUT)
    check_eq(raw.add("init/", 0) - before, 3, "wait_for_workers=False: no init/ ADD")
    quiet.set("quiet", "1")
    check_eq(quiet.get("quiet"), b"1", "that client works")  # the round trip orders the SET
    check_eq(raw.get("/quiet"), b"1", "its key on the wire")
    raw.close()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--ddprund")
    ap.add_argument("--probe")  # passed to every interop script; unused here
    ap.add_argument("--relay")
    ap.add_argument("--helper")
    ap.add_argument("--port", type=int)
    ap.add_argument("--key", default="")
    ap.add_argument("--world-size", type=int, default=0)
    args = ap.parse_args()
    if args.helper:
        helper(args)
        return
    version = torch_major_minor()
    log(f"torch {version} client against ddprund {args.ddprund}")
    d = Daemon(args.ddprund, relay=args.relay)
    relay_rc, relay_log = None, ""
    try:
        store = client(d.port)
        test_basic(d, store, version)
        test_compare_set(store)
        test_wait(d, store, version)
        test_prefix_and_sizes(d, store, version)
        if version >= (2, 0):
            test_extended_211(d, store)
        test_world_size(d, version)
        check(d.alive(), "ddprund still running")
        del store
    finally:
        relay_rc, relay_log = d.stop_relay()
        rc = d.stop()
    check_eq(rc, 0, "ddprund exit code after SIGTERM")
    check("closing connection" not in d.log_text(), "ddprund closed no connection for bad input")
    if args.relay:
        log(relay_log.strip())
        check_eq(relay_rc, 0, "relay exit code after SIGTERM")
        check("lost the store" not in relay_log and "refused" not in relay_log.split("stopping")[0],
              "the relay kept its store connection and refused no client")
        check("(0 connections relayed" not in relay_log and "connections relayed" in relay_log,
              "the clients went through the relay")


if __name__ == "__main__":
    if "--helper" in sys.argv:
        main()
    else:
        run_main(main, 360)
