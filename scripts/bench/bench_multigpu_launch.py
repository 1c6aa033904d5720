"""Launch and restart timing for scripts/bench/bench_multigpu.sh: ddprun vs torchrun, each with a
PyTorch NCCL worker (scripts/bench/bench_multigpu_nccl_worker.py) and with ddprun's `train`, all
`--nproc_per_node=N --max_restarts=1`. One run measures both:
  launch   exec of the launcher -> every rank of attempt 0 past its first collective
  restart  SIGKILL of rank N-1 (after its first collective) -> every rank of attempt 1 past its
           first collective again; also -> every replacement started (Python worker only)
Python worker: ranks append timestamps to a file; the driver SIGKILLs rank N-1 by pid once all
ranks of attempt 0 wrote theirs. `train`: rank N-1 SIGKILLs itself before step 1 (its own
`--fail-at-step 1 --fail-mode kill`, after the initial broadcasts and step 0's all-reduces);
t_kill = when its "injected fault" line is read; "first collective done" = when rank 0's
"[train] world=" line (printed after the initial broadcasts completed, which needs every
rank's NCCL communicator) is read from the launcher's output. Lines are timestamped as they
are read (a thread per pipe). Runs are interleaved round-robin; each is bounded by --timeout
(then SIGTERM, 5 s, SIGKILL of its process group and of every worker pid it reported) and no
run starts after --budget seconds. One JSON line per run goes to --out.
  python3 scripts/bench/bench_multigpu_launch.py --nproc N --ddprun BIN/ddprun --train BIN/train --out F
"""
import argparse
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from benchlib import free_port  # noqa: E402

SAFE_ENV = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1", "NVSHMEM_DISABLE_NVLS": "1"}


def build_cmd(launcher, worker, a, port):
    n = a.nproc
    if launcher == "ddprun":
        cmd = [a.ddprun, f"--nproc_per_node={n}", "--max_restarts=1", "--master_addr=127.0.0.1", f"--master_port={port}"]
    else:
        cmd = [a.py, "-m", "torch.distributed.run", f"--nproc_per_node={n}", "--max_restarts=1",
               "--monitor_interval=0.1", "--master_addr=127.0.0.1", f"--master_port={port}"]
    if worker == "py":
        cmd += [a.worker]
    else:
        if launcher == "torchrun":
            cmd += ["--no-python"]
        cmd += [a.train, "--device", "cuda" if a.backend == "nccl" else "cpu", "--samples", str(20 * n * 4), "--batch", "20", "--epochs", "1",
                "--fail-at-step", "1", "--fail-rank", str(n - 1), "--fail-mode", "kill", "--timeout", "20"]
    return cmd


def read_ts(path):
    recs = []
    try:
        with open(path) as f:
            for line in f:
                try:
                    recs.append(json.loads(line))
                except ValueError:
                    pass
    except FileNotFoundError:
        pass
    return recs


def one_run(launcher, worker, run, a, workdir):
    d = os.path.join(workdir, f"{launcher}-{worker}-{run}")
    os.makedirs(d, exist_ok=True)
    ts = os.path.join(d, "ts.jsonl")
    port = free_port()
    cmd = build_cmd(launcher, worker, a, port)
    env = dict(os.environ, BENCH_MG_TS=ts, BENCH_MG_MODE="restart", PYTHONUNBUFFERED="1", PYTHON_EXEC=a.py, BENCH_MG_BACKEND=a.backend,
               DDPRUN_STORE_TIMEOUT_S=str(a.store_timeout),
               **SAFE_ENV)
    res = dict(launcher=launcher, worker=worker, run=run, nproc=a.nproc, error=None, cmd=" ".join(cmd))
    lines = []  # (t, stream, text)
    lock = threading.Lock()
    t_exec = time.time()
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, stdin=subprocess.DEVNULL, env=env,
                         start_new_session=True)

    def reader(stream, name):
        for raw in iter(stream.readline, b""):
            with lock:
                lines.append((time.time(), name, raw.decode(errors="replace").rstrip("\n")))

    ths = [threading.Thread(target=reader, args=(p.stdout, "out"), daemon=True),
           threading.Thread(target=reader, args=(p.stderr, "err"), daemon=True)]
    for th in ths:
        th.start()
    deadline = t_exec + a.timeout
    n = a.nproc

    def wait_for(pred):
        while time.time() < deadline:
            v = pred()
            if v is not None:
                return v
            if p.poll() is not None:
                time.sleep(0.2)  # let the readers drain
                return pred()
            time.sleep(0.002)
        return None

    def attempt_recs(k):
        r = [x for x in read_ts(ts) if x.get("attempt") == k]
        return r if len(r) >= n else None

    world_re = re.compile(r"\[train\] world=")
    fault_re = re.compile(r"injected fault")

    def line_times(rx):
        with lock:
            return [t for t, _, s in lines if rx.search(s)]

    try:
        if worker == "py":
            a0 = wait_for(lambda: attempt_recs(0))
            if a0 is None:
                raise RuntimeError("attempt 0 did not get every rank past its first collective")
            res["launch_s"] = max(x["t_first"] for x in a0) - t_exec
            res["launch_init_s"] = max(x["t_init"] for x in a0) - t_exec
            victim = [x for x in a0 if x["rank"] == n - 1][0]
            t_kill = time.time()
            os.kill(victim["pid"], signal.SIGKILL)
            a1 = wait_for(lambda: attempt_recs(1))
            if a1 is None:
                raise RuntimeError("attempt 1 did not get every rank past its first collective")
            res["restart_s"] = max(x["t_first"] for x in a1) - t_kill
            res["restart_started_s"] = max(x["t_start"] for x in a1) - t_kill
        else:
            w0 = wait_for(lambda: (line_times(world_re) or None))
            if w0 is None:
                raise RuntimeError("rank 0 never printed '[train] world=' (first collective)")
            res["launch_s"] = w0[0] - t_exec
            tk = wait_for(lambda: (line_times(fault_re) or None))
            if tk is None:
                raise RuntimeError("no 'injected fault' line from rank %d" % (n - 1))
            t_kill = tk[0]
            w1 = wait_for(lambda: ([t for t in line_times(world_re) if t > t_kill] or None))
            if w1 is None:
                raise RuntimeError("attempt 1's rank 0 never printed '[train] world='")
            res["restart_s"] = w1[0] - t_kill
        rc = p.wait(timeout=max(1.0, deadline - time.time()))
        res["rc"] = rc
        if rc != 0:
            res["error"] = f"launcher exit {rc} after the measurements"
    except (RuntimeError, subprocess.TimeoutExpired) as e:
        res["error"] = str(e) if str(e) else "timed out"
    finally:
        if p.poll() is None:
            res.setdefault("error", None)
            res["error"] = res["error"] or f"still running after {a.timeout:.0f} s"
            try:
                p.send_signal(signal.SIGTERM)
                p.wait(timeout=5)
            except subprocess.TimeoutExpired:
                pass
            try:
                os.killpg(p.pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
        left = 0
        for x in read_ts(ts):  # workers that outlived their launcher: by pid, one by one
            try:
                os.kill(x["pid"], 0)
                os.kill(x["pid"], signal.SIGKILL)
                left += 1
            except (ProcessLookupError, PermissionError):
                pass
        res["leftover_workers_killed"] = left
        res["wall_s"] = time.time() - t_exec
        for th in ths:
            th.join(timeout=2)
        with open(os.path.join(d, "output.log"), "w") as f:
            for t, name, s in lines:
                f.write(f"{t - t_exec:9.4f} {name} {s}\n")
        if res["error"]:
            with lock:
                res["tail"] = [s for _, _, s in lines[-8:]]
    return res


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--nproc", type=int, required=True)
    p.add_argument("--ddprun", default="ddprun")
    p.add_argument("--train", default="train")
    p.add_argument("--py", default=sys.executable)
    p.add_argument("--worker", default=os.path.join(HERE, "bench_multigpu_nccl_worker.py"))
    p.add_argument("--combos", default="ddprun:py,torchrun:py,ddprun:train,torchrun:train")
    p.add_argument("--runs", type=int, default=2)
    p.add_argument("--timeout", type=float, default=60, help="seconds per run (a healthy one takes < 30 s)")
    p.add_argument("--store-timeout", type=int, default=20,
                   help="DDPRUN_STORE_TIMEOUT_S for train: its store waits during init end with an error, not a hang")
    p.add_argument("--budget", type=float, default=240)
    p.add_argument("--workdir", default="")
    p.add_argument("--out", required=True)
    p.add_argument("--backend", default="nccl", choices=["nccl", "gloo"], help="gloo: CPU workers (tests the driver)")
    p.add_argument("--dry-run", action="store_true", help="print the command lines and exit")
    a = p.parse_args(argv)
    if a.nproc < 1:
        p.error("--nproc must be >= 1")
    combos = []
    for c in a.combos.split(","):
        l, _, w = c.partition(":")
        if l not in ("ddprun", "torchrun") or w not in ("py", "train"):
            p.error(f"--combos: bad {c!r} (launcher:worker, launcher ddprun|torchrun, worker py|train)")
        combos.append((l, w))
    if a.dry_run:
        for l, w in combos:
            print(f"{l}:{w}: " + " ".join(build_cmd(l, w, a, 29500)))
        return 0
    workdir = a.workdir or os.path.join(os.path.dirname(os.path.abspath(a.out)), "launch-runs")
    os.makedirs(workdir, exist_ok=True)
    t0 = time.time()
    failed = 0
    with open(a.out, "a") as out:
        for run in range(a.runs):
            order = combos[run % len(combos):] + combos[:run % len(combos)]  # rotate the order each round
            for l, w in order:
                if time.time() - t0 > a.budget:
                    res = dict(launcher=l, worker=w, run=run, nproc=a.nproc, error="skipped: over the time budget")
                else:
                    res = one_run(l, w, run, a, workdir)
                failed += bool(res.get("error"))
                out.write(json.dumps(res) + "\n")
                out.flush()
                msg = " ".join(f"{k}={res[k]:.3f}" for k in ("launch_s", "restart_s") if k in res)
                print(f"  {l:8s} {w:5s} run {run}: {msg} {'ERROR: ' + res['error'] if res.get('error') else ''}",
                      flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
