#!/usr/bin/env python3
"""ddprun's hostlist parser (hostlist.h) against Slurm's own, `scontrol show hostnames`.

scontrol expands a hostlist without any Slurm daemon; it only needs a slurm.conf to start, so
a two-line one is written to a temporary directory. Usage: hostlist_vs_scontrol.py HOSTLIST_EXPAND
(the tests/slurm/hostlist_expand driver). Exits 77 when scontrol is not installed.

Three groups of expressions:
  SAME       both expand them, to the same names in the same order (also many random ones);
  BOTH_BAD   both reject them;
  OURS_ONLY  the documented differences (hostlist.h): text after the last bracket group, which
             Slurm 22.05 rejects and we accept, and forms 22.05 accepts only by accident
             ("n[1-]" -> n1, "n[ 1-2]" -> n01 n02), which we reject.
"""
import os
import random
import shutil
import subprocess
import sys
import tempfile

SAME = [
    "n1", "gpu[01-04,07]", "gpu[01-04,07],cpu3", "a-[1-2]-b[3,5]", "a[1-2]b[3,5]", "a[1-2]-b[3,5]",
    "n[9-11]", "n[09-11]", "n[1-3,2]", "n1,n1", "n[1-2],m[3-4]", "n[1-2][3-4]", "n[0001-0003]",
    "n[98-101]", "n[1-2]-[3-4]", "n[1-2],,m", " n1 , n2", "n1 n2", "n-1", "n[01-2]", "n[1-02]", "n[007]",
    "[1-2]", "n[99999999999]", "n[0-0]", "n[1,1-3]", "a.b[1-2]", "n[1-2],", ",n1",
    "n[1-2],x[01-03,07-08],y9,z", "rack[1-2]-node[001-002]", "node-[1-3]", "n1-2", "n[1-2]\tm",
    "rack[01-02]-[1-2]-gpu[001-002]", "a[1-2]b[1-2]c[1-2]d[1,2]", "a[1,3]-[5-6]-[7,9]-[1-2]", "x[0-65535]", "cn[0000-0999],gn[0-3]", "", "a,b,c",
]
BOTH_BAD = [
    "n[010-8]", "n[]", "n[a-b]", "n[5-3]", "n[1-2,]", "n[,1]", "n[1--2]", "n[-1]", "n[1-2]]", "n[[1]]",
    "n[0-99999]", "n[1-2 ]", "n[1-3]-[a]", "x[1-1000000]", "n[1-2]x]",
]
OURS_ONLY = {
    # expression: what we give (None = an error)
    "n[001-003]x": ["n001x", "n002x", "n003x"],
    "n[001-003]x,cpu3": ["n001x", "n002x", "n003x", "cpu3"],
    "x[1-2]y[3-4]z": ["x1y3z", "x1y4z", "x2y3z", "x2y4z"],
    "n[1-2]-x": ["n1-x", "n2-x"],
    "a-[1-2]b": ["a-1b", "a-2b"],
    "gpu[01-04,07],cpu3,n[001-003]x,a-[1-2]-b[3,5]":
        ["gpu01", "gpu02", "gpu03", "gpu04", "gpu07", "cpu3", "n001x", "n002x", "n003x",
         "a-1-b3", "a-1-b5", "a-2-b3", "a-2-b5"],
    "n[1-]": None, "n[ 1-2]": None, "n[+1]": None, "n]1": None, "n[1": None,
}


def random_expressions(rng, count):
    out = []
    for _ in range(count):
        items = []
        for _ in range(rng.randint(1, 4)):
            name = rng.choice(["n", "gpu", "rack-", "a.b", "cn", "x-y-"])
            groups = rng.randint(0, 4)
            for g in range(groups):
                ranges = []
                small = groups > 2  # keep the product small
                for _ in range(rng.randint(1, 1 if small else 3)):
                    width = rng.choice([1, 1, 2, 3, 4])
                    lo = rng.randint(0, 120)
                    lo_s = str(lo).zfill(width)
                    if rng.random() < 0.4:
                        ranges.append(lo_s)
                    else:
                        ranges.append(f"{lo_s}-{lo + rng.randint(0, 2 if small else 12)}")
                name += "[" + ",".join(ranges) + "]"
                if g + 1 < groups:
                    name += rng.choice(["-", "r", "", "-s"])
            if groups == 0:
                name += str(rng.randint(0, 999))
            items.append(name)
        out.append(",".join(items))
    return out


def run_ours(driver, exprs):
    r = subprocess.run([driver], input="".join(e + "\n" for e in exprs), capture_output=True, text=True,
                       check=True, timeout=120)
    lines = r.stdout.split("\n")[:len(exprs)]
    out = []
    for line in lines:
        if line.startswith("OK"):
            out.append(line[2:].split())
        else:
            out.append(None)
    return out


def run_scontrol(conf_env, expr):
    r = subprocess.run(["scontrol", "show", "hostnames", expr], capture_output=True, text=True, env=conf_env,
                       timeout=60)
    # 22.05 prints "Invalid hostlist: ..." on stdout with exit status 0.
    if r.returncode != 0 or "Invalid hostlist" in r.stdout or "Invalid hostlist" in r.stderr:
        return None
    return r.stdout.split()


def main():
    if len(sys.argv) != 2:
        print(__doc__)
        return 2
    if not shutil.which("scontrol"):
        print("SKIP: scontrol is not installed (scripts/setup_deps.sh installs slurm-client)")
        return 77
    driver = sys.argv[1]
    tmp = tempfile.mkdtemp(prefix="ddprun-hostlist-")
    try:
        conf = os.path.join(tmp, "slurm.conf")
        with open(conf, "w") as f:
            f.write("ClusterName=hostlist\nSlurmctldHost=localhost\n")
        env = dict(os.environ, SLURM_CONF=conf)
        failures = []
        rng = random.Random(13)
        same = SAME + random_expressions(rng, 150)
        ours = run_ours(driver, same + BOTH_BAD + list(OURS_ONLY))
        for i, expr in enumerate(same):
            theirs = run_scontrol(env, expr)
            if theirs is None or ours[i] != theirs:
                failures.append(f"{expr!r}: scontrol {theirs if theirs is None else theirs[:8]} ours "
                                f"{ours[i] if ours[i] is None else ours[i][:8]}")
        for j, expr in enumerate(BOTH_BAD):
            theirs = run_scontrol(env, expr)
            mine = ours[len(same) + j]
            if theirs is not None or mine is not None:
                failures.append(f"{expr!r}: expected both to reject; scontrol {theirs} ours {mine}")
        for k, (expr, want) in enumerate(OURS_ONLY.items()):
            theirs = run_scontrol(env, expr)
            mine = ours[len(same) + len(BOTH_BAD) + k]
            if mine != want:
                failures.append(f"{expr!r}: ours {mine}, documented {want}")
            if theirs == mine:
                failures.append(f"{expr!r}: listed as a difference but scontrol agrees now ({theirs}); "
                                "move it to SAME or BOTH_BAD")
        total = len(same) + len(BOTH_BAD) + len(OURS_ONLY)
        if failures:
            print(f"FAIL: {len(failures)} of {total} expressions differ:")
            for f in failures:
                print("  " + f)
            return 1
        print(f"OK: {total} expressions ({len(same)} expanded alike, {len(BOTH_BAD)} rejected by both, "
              f"{len(OURS_ONLY)} documented differences)")
        return 0
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
