#!/usr/bin/env python3
"""--hang_timeout, `ddprun dump` and the progress ticks, with real processes.

Usage: test_hang.py <ddprun> <python with torch> <mode> [train binary]
  torch:   a gloo job whose rank 1 sleeps after its all-reduce while rank 0 waits in the next
           one: ddprun names rank 1 (not rank 0), py-spy's stack shows the sleeping line, the
           group restarts and finishes
  train:   the worker runtime's `train --hang-at-step`: the same with native stacks
  gdb:     `ddprun dump` of a hung `train` job (no --hang_timeout) when gdb is the only tool on
           PATH: gdb's stacks, the hung frame in rank 1's; then the job is stopped by its signal
  dump:    `ddprun dump` on a healthy job prints every rank's stack and changes nothing (same
           result as without it, no restart); with no job running it says so (exit 1)
  never:   a job that never ticks: said once, no hang, exit 0; without the flag nothing said
  usage:   --hang_timeout=abc is a usage error (exit 2)
  flight:  --nccl_flight_recorder: PyTorch's flight-recorder variables point into the run's log
           directory (a user's own value wins), and the failure summary lists what landed there
Exit 77 (ctest: skipped) only when that Python does not exist.
"""
import glob
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
WORKER = os.path.join(HERE, "hang_worker.py")
GUARD = 240


def check(cond, what):
    if not cond:
        print("FAILED:", what, file=sys.stderr)
        sys.exit(1)
    print("ok:", what)


def run(cmd, env, timeout=GUARD, cwd=None):
    print("$", " ".join(cmd), flush=True)
    p = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=timeout, cwd=cwd)
    print(p.stdout)
    print(p.stderr, file=sys.stderr)
    return p


def hang_line():
    with open(WORKER) as f:
        for n, line in enumerate(f, 1):
            if "HANG_LINE" in line:
                return n
    raise AssertionError("no HANG_LINE in the worker")


def one_run_dir(log_dir):
    found = glob.glob(os.path.join(log_dir, "*_*"))
    check(len(found) == 1, f"one run directory in {log_dir}: {found}")
    return found[0]


def check_hang_named(p, log_dir, pattern_in_stack):
    check(re.search(r"hang: r1 \(local rank 1, pid \d+\) made no progress for \d+ s", p.stderr) is not None,
          "rank 1 is named as hung")
    check(re.search(r"r0 \(local rank 0, pid \d+\) made no progress", p.stderr) is None,
          "rank 0 (waiting in the collective) is not named as hung")
    check(re.search(r"the others: r0 at tick \d+", p.stderr) is not None, "what rank 0 was doing is said")
    run_dir = one_run_dir(log_dir)
    stacks = os.path.join(run_dir, "stacks", "hang_attempt_0")
    check(sorted(os.listdir(stacks)) == ["r0.txt", "r1.txt"], f"every local rank's stack saved in {stacks}")
    r1 = open(os.path.join(stacks, "r1.txt")).read()
    check(re.search(pattern_in_stack, r1) is not None, f"rank 1's saved stack shows /{pattern_in_stack}/")
    check(re.search(pattern_in_stack, p.stderr.split("stack of the stuck rank(s)")[-1]) is not None,
          "the stuck rank's stack is printed")
    check("restarting the worker group: attempt 1" in p.stderr, "the group restarted")
    check(p.returncode == 0, f"the job finished after the restart (exit {p.returncode})")


def mode_torch(ddprun, python, env, tmp):
    log_dir = os.path.join(tmp, "logs")
    cwd = os.path.join(tmp, "cwd")
    os.mkdir(cwd)
    # --max_restarts=1: warm spares too (their environment has no progress file of its own).
    p = run([ddprun, "--nproc_per_node=2", "--max_restarts=1", "--hang_timeout=3", "--log_dir", log_dir,
             "--rdzv_id", "hangjob", WORKER, "--steps", "12", "--hang-rank", "1", "--hang-step", "5"], env, cwd=cwd)
    check(os.listdir(cwd) == [], f"nothing written to the working directory ({os.listdir(cwd)})")
    check_hang_named(p, log_dir, rf"hang_worker\.py:{hang_line()}\)")
    check(re.search(r"stacks of every local rank saved in .* by py-spy$", p.stderr, re.M) is not None,
          "the dump says it used py-spy")
    check(re.search(r"\[r0\]: result \S+ attempt 1", p.stdout) is not None, "rank 0 finished attempt 1")


def mode_train(ddprun, train, env, tmp):
    log_dir = os.path.join(tmp, "logs")
    p = run([ddprun, "--nproc_per_node=2", "--max_restarts=1", "--hang_timeout=3", "--log_dir", log_dir,
             "--rdzv_id", "trainhang", train, "--epochs", "1", "--samples", "512", "--batch", "16", "--width", "16",
             "--hang-at-step", "5", "--fail-rank", "1"], env)
    check_hang_named(p, log_dir, r"injected_hang")
    check(re.search(r"stacks of every local rank saved in .* by (eu-stack|gdb)$", p.stderr, re.M) is not None,
          "native stacks, and the tool is named")


def mode_gdb(ddprun, train, env, tmp):
    gdb = shutil.which("gdb")
    check(gdb is not None, "gdb is installed (scripts/setup_deps.sh)")
    only = os.path.join(tmp, "only-gdb")
    os.mkdir(only)
    os.symlink(gdb, os.path.join(only, "gdb"))
    env = dict(env, DDPRUN_RUNS_DIR=os.path.join(tmp, "runs"))
    log_dir = os.path.join(tmp, "logs")
    cmd = [ddprun, "--nproc_per_node=2", "--log_dir", log_dir, "--rdzv_id", "gdbjob", train, "--epochs", "1",
           "--samples", "512", "--batch", "16", "--width", "16", "--hang-at-step", "2", "--fail-rank", "1"]
    print("$", " ".join(cmd), flush=True)
    job = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
    try:
        deadline = time.monotonic() + GUARD
        for line in job.stdout:
            print(line, end="")
            if "injected hang before step 2" in line:
                break
            if time.monotonic() > deadline:
                check(False, "rank 1 reached its hang in time")
        d = run([ddprun, "dump", "gdbjob"], dict(env, PATH=only), timeout=120)
        check(d.returncode == 0, "ddprun dump exits 0")
        check(re.search(r"saved in .*, by gdb$", d.stdout, re.M) is not None, "gdb took the stacks, and is named")
        r1 = d.stdout.split("==== r1 (local rank 1")[-1]
        check("injected_hang" in r1, "rank 1's native stack shows the hung frame")
        job.send_signal(signal.SIGINT)
        rest, _ = job.communicate(timeout=GUARD)
        print(rest)
    finally:
        if job.poll() is None:
            job.kill()
    check(job.returncode == 130, f"the job was stopped by its SIGINT, not by the dump (exit {job.returncode})")


def mode_dump(ddprun, python, env, tmp):
    env = dict(env, DDPRUN_RUNS_DIR=os.path.join(tmp, "runs"))
    none = run([ddprun, "dump"], env)
    check(none.returncode == 1 and "no running ddprun job" in none.stderr, "no running job: exit 1 and says so")
    bad = run([ddprun, "dump", "--frobnicate"], env)
    check(bad.returncode == 2 and "usage: ddprun dump" in bad.stderr, "a bad option: exit 2 with the usage")
    reference = run([ddprun, "--nproc_per_node=2", "--hang_timeout=30", WORKER, "--steps", "8"], env)
    check(reference.returncode == 0, "the reference run succeeded")
    expected = re.search(r"\[r0\]: (result \S+ attempt 0)", reference.stdout).group(1)
    go = os.path.join(tmp, "go")
    log_dir = os.path.join(tmp, "logs")
    cmd = [ddprun, "--nproc_per_node=2", "--hang_timeout=30", "--log_dir", log_dir, "--rdzv_id", "healthy",
           WORKER, "--steps", "8", "--wait-file", go]
    print("$", " ".join(cmd), flush=True)
    job = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    try:
        deadline = time.monotonic() + GUARD
        out = []
        for line in job.stdout:
            out.append(line)
            if "ready" in line:
                break
            if time.monotonic() > deadline:
                check(False, "the job got ready in time")
        d = run([ddprun, "dump"], env, timeout=60)
        check(d.returncode == 0, "ddprun dump on the running job exits 0")
        check("==== r0 (local rank 0" in d.stdout and "==== r1 (local rank 1" in d.stdout, "every rank's stack")
        check("hang_worker.py" in d.stdout, "the stacks show the worker's script")
        run_dir = one_run_dir(log_dir)
        check(f"saved in {run_dir}/stacks/dump_" in d.stdout, "it says where the stacks were saved")
        by_id = run([ddprun, "dump", "healthy"], env, timeout=60)
        check(by_id.returncode == 0 and "==== r1" in by_id.stdout, "ddprun dump RUN_ID finds the job")
        by_dir = run([ddprun, "dump", run_dir], env, timeout=60)
        check(by_dir.returncode == 0 and "==== r0" in by_dir.stdout, "ddprun dump RUN_DIR finds the job")
        open(go, "w").close()
        rest, err = job.communicate(timeout=GUARD)
    finally:
        if job.poll() is None:
            job.kill()
    stdout = "".join(out) + rest
    print(stdout)
    print(err, file=sys.stderr)
    check(job.returncode == 0, f"the dumped job succeeded (exit {job.returncode})")
    check(f"[r0]: {expected}" in stdout, f"same result as without the dump ({expected})")
    check("restarting" not in err and "hang:" not in err, "no restart, no hang")
    check(not os.listdir(os.path.join(tmp, "runs")), "the agent's link is gone after the run")


def mode_never(ddprun, python, env, tmp):
    p = run([ddprun, "--nproc_per_node=2", "--hang_timeout=1", "--no_python", python, "-c",
             "import time; time.sleep(3.5)"], env)
    check(p.returncode == 0, "a job that never ticks is not stopped")
    check(p.stderr.count("no worker has reported progress") == 1, "and it is said once")
    check("hang:" not in p.stderr, "no hang")
    # Without the flag every worker still has its progress file (the end-of-run table's step
    # statistics), but nothing watches it and nothing is said about ticks.
    p = run([ddprun, "--nproc_per_node=1", "--no_python", python, "-c",
             "import os, time; f = os.environ['DDPRUN_PROGRESS_FILE']; run = f.rsplit('/', 3)[0]\n"
             "print('progress file', os.path.exists(f), "
             "any(e.startswith(run) for e in os.environ.get('PYTHONPATH', '').split(':')), flush=True)\n"
             "time.sleep(1.5)"], env)
    check(p.returncode == 0 and "[r0]: progress file True False" in p.stdout,
          "without --hang_timeout: a progress file, no PYTHONPATH entry")
    check("no worker has reported progress" not in p.stderr, "and no word about ticks")


def mode_usage(ddprun, python, env, tmp):
    p = run([ddprun, "--hang_timeout=abc", "--no_python", "true"], env)
    check(p.returncode == 2 and "--hang_timeout" in p.stderr and "seconds" in p.stderr,
          "--hang_timeout=abc: exit 2, naming the flag and what it takes")
    p = run([ddprun, "--hang_timeout=0.5", "--no_python", "true"], env)
    check(p.returncode == 2 and ">= 1" in p.stderr, "--hang_timeout=0.5: exit 2 (at least a second)")


FLIGHT_WORKER = """
import os
rank = os.environ["RANK"]
print("env", rank, os.environ["TORCH_NCCL_TRACE_BUFFER_SIZE"], os.environ["TORCH_NCCL_DUMP_ON_TIMEOUT"],
      os.environ["TORCH_NCCL_DEBUG_INFO_TEMP_FILE"], flush=True)
with open(os.environ["TORCH_NCCL_DEBUG_INFO_TEMP_FILE"] + rank, "w") as f:
    f.write("trace")
if rank == "0":  # fail once rank 1 has written its file (its dump must not race the stop)
    import time
    while not os.path.exists(os.environ["TORCH_NCCL_DEBUG_INFO_TEMP_FILE"] + "1"):
        time.sleep(0.01)
    raise SystemExit(3)
"""


def mode_flight(ddprun, python, env, tmp):
    log_dir = os.path.join(tmp, "logs")
    p = run([ddprun, "--nproc_per_node=2", "--nccl_flight_recorder", "--log_dir", log_dir, "--no_python",
             sys.executable, "-c", FLIGHT_WORKER], dict(env, TORCH_NCCL_TRACE_BUFFER_SIZE="77"))
    run_dir = one_run_dir(log_dir)
    trace_dir = os.path.join(run_dir, "nccl_trace")
    check(re.search(rf"env 0 77 1 {re.escape(trace_dir)}/rank_$", p.stdout, re.M) is not None,
          "the variables point into <run dir>/nccl_trace/ (the user's buffer size kept)")
    check(p.returncode == 3, "the worker's failure code")
    check(f"NCCL flight recorder dumps (2) in {trace_dir}" in p.stderr, "the summary points to the dumps")
    check(f"{trace_dir}/rank_0" in p.stderr and f"{trace_dir}/rank_1" in p.stderr, "and lists them")
    plain = run([ddprun, "--nproc_per_node=1", "--no_python", sys.executable, "-c",
                 "import os; print(sorted(k for k in os.environ if k.startswith(('TORCH_NCCL_TRACE', "
                 "'TORCH_NCCL_DUMP', 'TORCH_NCCL_DEBUG_INFO'))))"], env)
    check("[r0]: []" in plain.stdout, "without the flags, none of these variables is set")


def main():
    ddprun, python, mode = sys.argv[1:4]
    if not os.path.exists(python):
        print(f"SKIPPED: {python} does not exist (scripts/setup_deps.sh creates the torch 2.x venv)")
        sys.exit(77)
    ddprun, python = os.path.abspath(ddprun), os.path.abspath(python)
    if len(sys.argv) > 4:
        sys.argv[4] = os.path.abspath(sys.argv[4])
    env = dict(os.environ, PYTHON_EXEC=python, PYTHONUNBUFFERED="1")
    env.pop("DDPRUN_DEFAULT_PYTHON", None)
    tmp = tempfile.mkdtemp(prefix="ddprun-hang-")
    try:
        if mode in ("train", "gdb"):
            (mode_train if mode == "train" else mode_gdb)(ddprun, sys.argv[4], env, tmp)
        else:
            {"torch": mode_torch, "dump": mode_dump, "never": mode_never, "usage": mode_usage,
             "flight": mode_flight}[mode](
                ddprun, python, env, tmp)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
