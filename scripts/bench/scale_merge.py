#!/usr/bin/env python3
"""Merges the RESULT lines of ddprun_scale_sim processes that shared one job's agents (--part K
--parts M) into one RESULT line, on the monotonic clock the processes share: each phase ends
when the last process's last event did, counted from the earliest first JOIN. Ranks: every
process's count, sum and sum of squares must add up to the world's (0..world-1 once each).
CPU, RSS and the probe come from part 0, the one given --server-pid, --store-pid and --probe.
usage: scale_merge.py FILE...   (each holding one process's output)"""
import re
import sys


def fields(path):
    with open(path) as f:
        text = f.read()
    line = next((l for l in text.splitlines() if l.startswith("RESULT ")), None)
    return dict(re.findall(r"(\w+)=(\S+)", line)) if line else None


def main():
    parts = [fields(p) for p in sys.argv[1:]]
    if not parts or any(p is None for p in parts):
        print("RESULT ok=0 errors=1")
        return 1
    abs_ns = lambda p, k: int(p["start_mono_ns"]) + int(p[k]) if int(p[k]) else None
    first_join = min(abs_ns(p, "first_join_ns") for p in parts)
    out = dict(next(p for p in parts if p["part"] == "0"))

    def phase(key):
        ends = [abs_ns(p, key) for p in parts]
        return "-1" if None in ends else "%.1f" % ((max(ends) - first_join) / 1e6)

    for ms_key, ns_key in (("round_ms", "last_round_ns"), ("workers_joined_ms", "last_joined_ns"),
                           ("barrier_ms", "last_barrier_ns"), ("done_ms", "last_done_ns")):
        out[ms_key] = phase(ns_key)
    out["connect_ms"] = "%.1f" % max(float(p["connect_ms"]) for p in parts)
    for k in ("rounds", "workers_done", "dup_ranks", "errors"):
        out[k] = str(sum(int(p[k]) for p in parts))
    world = int(out["world"])
    seen = sum(int(p["ranks_seen"]) for p in parts)
    s1 = sum(int(p["rank_sum"]) for p in parts)
    s2 = sum(int(p["rank_sq_sum"]) for p in parts)
    ranks_ok = seen == world and s1 == world * (world - 1) // 2 and s2 == (world - 1) * world * (2 * world - 1) // 6
    workers_expected = world if out.get("workers_done", "0") != "0" else 0
    ok = all(p["ok"] == "1" for p in parts) and (ranks_ok or workers_expected == 0)
    out["ok"] = "1" if ok else "0"
    out["ranks_unique"] = "1" if ranks_ok else "0"
    print("RESULT " + " ".join(f"{k}={v}" for k, v in out.items()))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
