#!/usr/bin/env python3
"""Preemption under the real launcher: `ddprun --nproc_per_node=2 train`, stopped mid-run the way
Slurm stops a job, must end with a checkpoint of the same step on every rank and exit code 99
(ddprun's and the workers'), without a restart; rerun, it must resume from that checkpoint and
end with the same final_param_checksum as an uninterrupted run.

  usage: preempt_ddprun.py <ddprun> <train> agent|one_rank|sigterm|two_nodes
    agent:     SIGUSR1 to ddprun (Slurm's --signal=USR1@T / scancel --signal=USR1 reach the agent)
    one_rank:  SIGUSR1 to rank 1 only (the ranks' agreement carries it to rank 0)
    sigterm:   SIGTERM to ddprun (preemption or time limit without a warning signal)
    two_nodes: two agents of a c10d job (one rank each, on loopback), SIGUSR1 to the first agent
               only: no message between the agents, the ranks' agreement stops the other node

"Mid-run" without racing the run's end: train --wait-for-signal-at-step blocks the chosen ranks
after step STOP until its stop handler has run (the flag polled), and says so on stdout; the test signals
once it has read that line. No sleeps; time bounds only guard against hangs.
"""
import glob
import os
import re
import signal
import subprocess
import sys
import tempfile
import threading

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "pylib"))
from ddprun_testlib import free_port  # noqa: E402

HANG_GUARD = 240
STOP = 25
COMMON = ["--width", "32", "--depth", "1", "--samples", "400", "--batch", "10", "--epochs", "3",
          "--momentum", "0.9", "--device", "cpu"]


def fail(msg, *logs):
    print("FAIL:", msg)
    for name, text in logs:
        print(f"----- {name} -----\n{text}")
    sys.exit(1)


def checksum(text):
    m = re.findall(r"final_param_checksum=([0-9a-f]+)", text)
    return m[-1] if m else None


def children(pid):
    out = []
    for f in glob.glob(f"/proc/{pid}/task/*/children"):
        out += [int(x) for x in open(f).read().split()]
    return out


def rank_pid(ddprun_pid, rank):
    for c in children(ddprun_pid):
        try:
            env = open(f"/proc/{c}/environ", "rb").read().split(b"\0")
        except OSError:
            continue
        if f"RANK={rank}".encode() in env and os.path.basename(os.readlink(f"/proc/{c}/exe")) == "train":
            return c
    return None


def read_until_waiting(p, ranks, what):
    """Lines of p's stdout until every rank in `ranks` said it waits for a stop signal."""
    waiting, lines = set(ranks), []
    for line in p.stdout:
        lines.append(line.rstrip("\n"))
        m = re.search(r"rank (\d): waiting for a stop signal after step (\d+)", line)
        if m:
            waiting.discard(int(m.group(1)))
            if not waiting:
                return lines
    p.kill()
    fail(f"{what}: the ranks never reached the wait point", ("stdout", "\n".join(lines)))


def run_one_node(args, mode, err_path):
    with open(err_path, "w") as err_file:
        p = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=err_file, text=True)
        lines = read_until_waiting(p, (0, 1) if mode != "one_rank" else (1,), "ddprun")
        if mode == "one_rank":
            pid = rank_pid(p.pid, 1)
            if pid is None:
                p.kill()
                fail("rank 1's process not found among ddprun's children")
            os.kill(pid, signal.SIGUSR1)
        else:
            p.send_signal(signal.SIGTERM if mode == "sigterm" else signal.SIGUSR1)
        rest, _ = p.communicate(timeout=HANG_GUARD)
    return "\n".join(lines) + "\n" + rest, open(err_path).read(), p.returncode


def run_two_nodes(ddprun, train, train_args, tmp):
    port = free_port()
    agent = [ddprun, "--nnodes=2", "--nproc_per_node=1", "--rdzv_backend=c10d", f"--rdzv_endpoint=127.0.0.1:{port}",
             "--rdzv_id=preempt", "--rdzv_conf=last_call_timeout=1,join_timeout=120", "--max_restarts=3", train]
    agent += COMMON + train_args
    errs = [open(os.path.join(tmp, f"node{i}.err"), "w+") for i in (0, 1)]
    # The first hosts the rendezvous (its log says so before the second starts).
    a = subprocess.Popen(agent, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    for line in a.stderr:
        errs[0].write(line)
        if "hosting the rendezvous" in line:
            break
    b = subprocess.Popen(agent, stdout=subprocess.PIPE, stderr=errs[1], text=True)
    drain = threading.Thread(target=lambda: errs[0].write(a.stderr.read()))
    drain.start()
    lines_a = read_until_waiting(a, (0,), "node 0")
    lines_b = []
    a.send_signal(signal.SIGUSR1)  # node 0's agent only
    out_b, _ = b.communicate(timeout=HANG_GUARD)
    out_a = a.stdout.read()
    a.wait(timeout=HANG_GUARD)
    drain.join()
    err = ""
    for f in errs:
        f.seek(0)
        err += f.read()
        f.close()
    out = "\n".join(lines_a + lines_b) + "\n" + out_a + out_b
    rc = a.returncode if a.returncode == b.returncode else f"{a.returncode} and {b.returncode}"
    return out, err, rc


def main():
    ddprun, train, mode = sys.argv[1], sys.argv[2], sys.argv[3]
    tmp = tempfile.mkdtemp(prefix="ddprun-preempt-")
    ck = os.path.join(tmp, "ck")
    base = [ddprun, "--nproc_per_node=2", "--master_port=0", "--max_restarts=3", train] + COMMON

    clean = subprocess.run(base, capture_output=True, text=True, timeout=HANG_GUARD)
    want = checksum(clean.stdout)
    if clean.returncode != 0 or not want:
        fail("the uninterrupted run failed", ("stdout", clean.stdout), ("stderr", clean.stderr))

    # The ranks that block after step STOP until signalled (the others wait in the agreement).
    wait_rank = {"one_rank": ["--wait-rank", "1"], "two_nodes": ["--wait-rank", "0"]}.get(mode, [])
    wait = ["--wait-for-signal-at-step", str(STOP)] + wait_rank
    ck_args = ["--checkpoint-dir", ck, "--checkpoint-every", "7"]
    err_path = os.path.join(tmp, "preempted.err")
    if mode == "two_nodes":
        out, err, rc = run_two_nodes(ddprun, train, ck_args + wait, tmp)
    else:
        out, err, rc = run_one_node(base + ck_args + wait, mode, err_path)
    logs = (("stdout", out), ("stderr", err))
    if rc != 99:
        fail(f"ddprun exited {rc}, expected 99 (preempted)", *logs)
    stops = re.findall(r"\[(?:n\d )?r(\d)\]: \[train\] rank \d: stopping after step (\d+) for a preemption \(([^)]*)\)", out)
    if sorted(r for r, _, _ in stops) != ["0", "1"]:
        fail(f"expected both ranks to report their stop, got {stops}", *logs)
    if {s for _, s, _ in stops} != {str(STOP)}:
        fail(f"the ranks did not stop after the same step {STOP}: {stops}", *logs)
    why = {r: w for r, _, w in stops}
    expected = {"agent": ("SIGUSR1 here", "SIGUSR1 here"), "sigterm": ("SIGTERM here", "SIGTERM here"),
                "one_rank": ("asked by another rank", "SIGUSR1 here"),
                "two_nodes": ("SIGUSR1 here", "asked by another rank")}[mode]
    if (why["0"], why["1"]) != expected:
        fail(f"who asked: {why}, expected {expected}", *logs)
    ckpt = os.path.join(ck, f"ckpt-{STOP:012d}.ddpck")
    if not os.path.exists(ckpt):
        fail(f"no checkpoint of step {STOP}: {sorted(os.listdir(ck))}", *logs)
    if err.count("PREEMPTED") != (2 if mode == "two_nodes" else 1) or "FAILED" in err or "restarting" in err:
        fail("ddprun's summary should say PREEMPTED, without a failure or a restart", *logs)

    resumed = subprocess.run(base + ["--checkpoint-dir", ck, "--checkpoint-every", "7"], capture_output=True,
                             text=True, timeout=HANG_GUARD)
    got = checksum(resumed.stdout)
    rlogs = (("stdout", resumed.stdout), ("stderr", resumed.stderr))
    if resumed.returncode != 0:
        fail(f"the rerun exited {resumed.returncode}", *rlogs)
    if f"[train] resumed from step {STOP} " not in resumed.stdout:
        fail(f"the rerun did not resume from step {STOP}", *rlogs)
    print(f"uninterrupted: {want}\nresumed:       {got}")
    if got != want:
        fail("MISMATCH", *rlogs)
    print(f"OK ({mode}): both ranks stopped after step {STOP}, exit 99, checkpoint; resumed bit-identically")
    subprocess.run(["rm", "-rf", tmp])


if __name__ == "__main__":
    main()
