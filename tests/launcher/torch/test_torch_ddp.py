#!/usr/bin/env python3
"""Real PyTorch (gloo DDP) under ddprun: tests/launcher/train_ddp.py with 2 workers.

Usage: test_torch_ddp.py <ddprun> <python with torch> {train|restart|keyspace|preempt}
(preempt: torch/preempt_ddp.py, the README's recipe for a PyTorch script, stopped by SIGUSR1.)
Exit 77 (ctest: skipped) only when that Python does not exist, saying why.
"""
import os
import re
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
TRAIN = os.path.join(os.path.dirname(HERE), "train_ddp.py")
HANG_GUARD = 280


def losses(stdout, attempt=None):
    """{attempt: [loss per epoch]} from rank 0's lines. With the overlapped restart (the
    default), the old attempt's rank 0 may still print a line after the new attempt's first
    one, with the same prefix: a line whose epoch is not the next one of the newest attempt
    but is the next one of the attempt before belongs to that attempt."""
    out, current = {}, 0
    for line in stdout.splitlines():
        m = re.match(r"\[r0\]: world_size 2 attempt (\d+)", line)
        if m:
            current = int(m.group(1))
            out[current] = []
        m = re.match(r"\[r0\]: epoch (\d+) loss ([0-9.]+)$", line)
        if m:
            epoch, owner = int(m.group(1)), current
            mine = out.setdefault(current, [])
            if epoch != len(mine) and current - 1 in out and epoch == len(out[current - 1]):
                owner = current - 1
            out[owner].append(float(m.group(2)))
    return out


def run(ddprun, python, extra_flags, extra_args):
    env = dict(os.environ, PYTHON_EXEC=python)
    cmd = [ddprun, "--nproc_per_node=2"] + extra_flags + [TRAIN, "--epochs", "5"] + extra_args
    print("$", " ".join(cmd), flush=True)
    p = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=HANG_GUARD)
    print(p.stdout)
    print(p.stderr, file=sys.stderr)
    return p


def check(cond, what):
    if not cond:
        print("FAILED:", what, file=sys.stderr)
        sys.exit(1)
    print("ok:", what)


def main():
    ddprun, python, mode = sys.argv[1:4]
    if not os.path.exists(python):
        print(f"SKIPPED: {python} does not exist (scripts/setup_deps.sh creates the torch 2.x venv)")
        sys.exit(77)
    if mode == "train":
        p = run(ddprun, python, [], [])
        check(p.returncode == 0, f"ddprun exit code 0 (got {p.returncode})")
        l = losses(p.stdout)
        check(list(l) == [0] and len(l[0]) == 5, f"one attempt, 5 epochs of losses: {l}")
        check(l[0][-1] < 0.9 * l[0][0], f"the loss decreases: {l[0]}")
        check("[r1]:" not in p.stdout, "only rank 0 prints")
    elif mode == "restart":
        p = run(ddprun, python, ["--max_restarts=1"], ["--fail-rank", "1", "--fail-epoch", "2"])
        check(p.returncode == 0, f"ddprun exit code 0 after a restart (got {p.returncode})")
        check("signal SIGKILL" in p.stderr and "restarting the worker group: attempt 1" in p.stderr,
              "the SIGKILL was seen and the group restarted")
        l = losses(p.stdout)
        check(sorted(l) == [0, 1], f"two attempts: {l}")
        # Rank 1 dies as epoch 2 starts. Rank 0 printed epoch 0's loss before epoch 1's
        # all-reduces; epoch 1's line may be cut by the SIGTERM that follows rank 1's death at once.
        check(len(l[0]) in (1, 2) and len(l[1]) == 5, f"attempt 0 died at epoch 2, attempt 1 finished: {l}")
        check(l[1][:len(l[0])] == l[0], "attempt 1 repeats attempt 0 exactly (fresh store, same seed)")
        check(l[1][-1] < 0.9 * l[1][0], f"the loss decreases: {l[1]}")
    elif mode == "keyspace":
        # Attempt 0 stores a key through PyTorch's own TCPStore client and fails; attempt 1
        # must find the agent's store empty (PyTorch >= 2.6 uses no attempt prefix).
        code = ("import os, sys; from datetime import timedelta; import torch.distributed as dist\n"
                "s = dist.TCPStore(os.environ['MASTER_ADDR'], int(os.environ['MASTER_PORT']),"
                " is_master=False, timeout=timedelta(seconds=30))\n"
                "n = os.environ['TORCHELASTIC_RESTART_COUNT']\n"
                "key = 'leftover_' + os.environ['RANK']\n"
                "if n == '0':\n"
                "    s.add(key, 5); s.add('counter', 1); sys.exit(1)\n"
                "print('attempt', n, 'leftover', s.add(key, 0), 'counter', s.add('counter', 1), flush=True)\n")
        env = dict(os.environ, PYTHON_EXEC=python)
        p = subprocess.run([ddprun, "--nproc_per_node=2", "--max_restarts=1", "--no_python", python,
                            "-c", code], capture_output=True, text=True, env=env, timeout=HANG_GUARD)
        print(p.stdout)
        print(p.stderr, file=sys.stderr)
        check(p.returncode == 0, f"ddprun exit code 0 (got {p.returncode})")
        for r in range(2):
            line = next((l for l in p.stdout.splitlines() if l.startswith(f"[r{r}]: attempt 1")), "")
            check("leftover 0 " in line, f"rank {r} sees no key of attempt 0: {line!r}")
            check(line.endswith("counter 1") or line.endswith("counter 2"),
                  f"rank {r}: the counter restarted from zero: {line!r}")
    elif mode == "preempt":
        preempt(ddprun, python)
    else:
        sys.exit(f"unknown mode {mode}")


def preempt(ddprun, python):
    """SIGUSR1 to ddprun once both ranks are held after step 12: both stop after step 12, rank 0
    saves, exit 99 without a restart; the rerun resumes there and ends bit-identical to an
    uninterrupted run."""
    import signal
    import tempfile
    script = os.path.join(HERE, "preempt_ddp.py")
    env = dict(os.environ, PYTHON_EXEC=python)
    with tempfile.TemporaryDirectory() as tmp:
        def go(ck, extra=()):
            cmd = [ddprun, "--nproc_per_node=2", "--master_port=0", "--max_restarts=2", script,
                   "--checkpoint", os.path.join(tmp, ck)] + list(extra)
            return subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=HANG_GUARD)

        def digest(p):
            m = re.search(r"\[r0\]: final_step 25 param_sha256 ([0-9a-f]+)", p.stdout)
            return m.group(1) if m else None

        clean = go("clean.pt")
        print(clean.stdout, clean.stderr, sep="\n")
        want = digest(clean)
        check(clean.returncode == 0 and want, f"the uninterrupted run ends (exit {clean.returncode})")
        cmd = [ddprun, "--nproc_per_node=2", "--master_port=0", "--max_restarts=2", script,
               "--checkpoint", os.path.join(tmp, "ck.pt"), "--wait-for-signal-at-step", "12"]
        p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
        lines, waiting = [], {"0", "1"}
        for line in p.stdout:
            lines.append(line)
            m = re.search(r"rank (\d): waiting for a stop signal after step 12", line)
            if m:
                waiting.discard(m.group(1))
                if not waiting:
                    break
        p.send_signal(signal.SIGUSR1)
        out, err = p.communicate(timeout=HANG_GUARD)
        out = "".join(lines) + out
        print(out, err, sep="\n")
        check(p.returncode == 99, f"ddprun exits 99 when preempted (got {p.returncode})")
        stops = sorted(re.findall(r"\[r(\d)\]: rank \d: stopping after step (\d+) for a preemption \((\w+) here\)", out))
        check(stops == [("0", "12", "SIGUSR1"), ("1", "12", "SIGUSR1")], f"both ranks stop after step 12: {stops}")
        check("PREEMPTED" in err and "FAILED" not in err and "restarting" not in err,
              "the summary says PREEMPTED; no failure, no restart")
        resumed = go("ck.pt")
        print(resumed.stdout, resumed.stderr, sep="\n")
        check("[r0]: resumed from step 12" in resumed.stdout, "the rerun resumes from step 12")
        check(resumed.returncode == 0 and digest(resumed) == want,
              f"the rerun ends with the uninterrupted run's parameters ({digest(resumed)} vs {want})")


if __name__ == "__main__":
    main()
