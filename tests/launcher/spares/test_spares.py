#!/usr/bin/env python3
"""Warm spare interpreters against real processes: ddprun, Python, PyTorch.

Usage: test_spares.py <ddprun> <python with torch> {identity|module|traceback|resume|killed_spare|agent_killed}
  identity      probe_worker.py (2 ranks) prints what it can observe; rank 1 of attempt 0 is SIGKILLed once
                both spares are ready: attempt 1 (from spares) must match attempt 0 (cold) but for
                TORCHELASTIC_RESTART_COUNT, TORCHELASTIC_ERROR_FILE, DDPRUN_PREEMPT_FILE and
                DDPRUN_PROGRESS_FILE
  module        the same with `-m probe_worker`
  identity_cuda the same with --spare_cuda=1, the probe importing torch and using CUDA (where there is
                a GPU) first: on a GPU host the spare of local rank 0 warms GPU 0 (its ready line says
                so, with the memory it holds) and the worker it becomes still observes what a cold
                one does, torch's CUDA and process-group state included; without one, each spare
                says once why it did not warm a GPU and serves the restart as usual
  traceback     attempt 1 raises: its traceback from a spare equals a cold restart's (--warm_spares=0)
  resume        ddp_resume.py (gloo DDP with checkpoints) killed mid-run resumes from spares and ends
                with the same weights as with --warm_spares=0
  killed_spare  rank 1's spare is SIGKILLed before the restart: the restart starts r1 cold, says so, succeeds
  agent_killed  SIGKILL of ddprun: no spare (nor worker) outlives it
  main_thread_import  a preload that calls signal.signal, at --spare_priority=idle: imported again on the main thread
  two_nodes     two agents (static, --nnodes=2) on this host: each node's restart starts from its spare
  bad_preload   --preload of a module that does not exist: spares turn off with the reason, the restart is cold
  exclusive_cuda  --spare_cuda=1 on GPUs in EXCLUSIVE_PROCESS mode (a stand-in libcuda.so.1): no context, one
                warning, the spares serve CPU-warm
  starved_idle  spares still importing at idle priority 17 s after their start: the restart is cold and its
                line names --spare_priority=normal
  idle_threads  a preload that starts a thread, at --spare_priority=idle: the spare imports again at normal
                priority, so no thread of the worker it becomes runs at SCHED_IDLE
Waits are for events (log lines, files, exits), each bounded by a generous timeout.
Exit 77 (ctest: skipped) only when that Python does not exist.
"""
import atexit
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "..", "pylib"))
from ddprun_testlib import free_port  # noqa: E402
TIMEOUT = 240  # seconds, any one wait (a loaded 2-core box imports torch in 5-60 s)
_made = []


def mkdtemp(prefix):
    d = tempfile.mkdtemp(prefix=prefix)
    _made.append(d)
    return d


atexit.register(lambda: [shutil.rmtree(d, ignore_errors=True) for d in _made])
READY_RE = re.compile(r"warm spare for local rank (\d+) ready: pid (\d+)")


def check(cond, what):
    if not cond:
        print("FAILED:", what, file=sys.stderr)
        sys.exit(1)
    print("ok:", what, flush=True)


class Launch:
    """ddprun in its own session; stdout and stderr collected line by line as they come."""

    def __init__(self, ddprun, python, flags, entry, cwd=None, base=("--nproc_per_node=2", "--max_restarts=1")):
        self.tmp = mkdtemp(prefix="spares-test-")
        self.pids = os.path.join(self.tmp, "pids")
        os.mkdir(self.pids)
        env = dict(os.environ, PYTHON_EXEC=python, PROBE_PIDFILE_DIR=self.pids)
        self.cmd = [ddprun, "-v"] + list(base) + flags + entry
        print("$", " ".join(self.cmd), flush=True)
        self.p = subprocess.Popen(self.cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env, cwd=cwd,
                                  start_new_session=True)
        self.out, self.err = [], []
        self.cv = threading.Condition()
        self.readers = [threading.Thread(target=self._read, args=(s, l), daemon=True)
                        for s, l in ((self.p.stdout, self.out), (self.p.stderr, self.err))]
        for t in self.readers:
            t.start()

    def _read(self, stream, lines):
        for raw in iter(stream.readline, b""):
            with self.cv:
                lines.append(raw.decode(errors="replace").rstrip("\n"))
                self.cv.notify_all()
        with self.cv:
            self.cv.notify_all()

    def wait_for(self, what, cond):
        deadline = time.monotonic() + TIMEOUT
        with self.cv:
            while not cond():
                left = deadline - time.monotonic()
                if left <= 0 or (self.p.poll() is not None and not any(t.is_alive() for t in self.readers)):
                    self.dump()
                    check(False, "waited for " + what)
                self.cv.wait(min(left, 0.5))

    def spares_ready(self):
        """{local rank: pid} of the spares seen ready."""
        return {int(m.group(1)): int(m.group(2)) for m in map(READY_RE.search, self.err) if m}

    def wait_ready(self, n=2):
        self.wait_for("%d warm spare(s) ready" % n, lambda: len(self.spares_ready()) == n)
        return self.spares_ready()

    def pid_of_rank(self, lr):
        path = os.path.join(self.pids, str(lr))
        deadline = time.monotonic() + TIMEOUT
        while not os.path.exists(path):  # written by the worker itself, atomically
            check(time.monotonic() < deadline and self.p.poll() is None, "rank %d of attempt 0 wrote its pid" % lr)
            time.sleep(0.05)
        with open(path) as f:
            return int(f.read())

    def finish(self):
        try:
            rc = self.p.wait(timeout=TIMEOUT)
        except subprocess.TimeoutExpired:
            os.killpg(self.p.pid, signal.SIGKILL)
            self.dump()
            check(False, "ddprun finished")
        for t in self.readers:
            t.join(30)
        self.dump()
        return rc

    def dump(self):
        print("--- stdout\n" + "\n".join(l[:300] for l in self.out))
        print("--- stderr\n" + "\n".join(l[:300] for l in self.err), flush=True)


def probe_records(lines):
    """{(attempt, local rank): record} from probe_worker.py's JSON lines ("[rN]: {...}")."""
    out = {}
    for line in lines:
        m = re.match(r"\[r(\d)\]: (\{.*)", line)
        if m:
            rec = json.loads(m.group(2))
            out[(int(rec["environ"]["TORCHELASTIC_RESTART_COUNT"]), int(m.group(1)))] = rec
    return out


ALLOWED_ENV = ("TORCHELASTIC_RESTART_COUNT", "TORCHELASTIC_ERROR_FILE", "DDPRUN_PREEMPT_FILE", "DDPRUN_PROGRESS_FILE")


def same_but_attempt(cold, warm, rank, gpu_warm=False):
    """Fails on any difference between two probe records but the per-attempt variables. With
    gpu_warm (the spare made the CUDA context and ran NCCL before the script), close-on-exec
    descriptors and the number of threads are left out: which the driver, torch and NCCL opened
    and started, and at which numbers, depends on who initialised them first (documented under
    --spare_cuda). Inherited descriptors (what a subprocess gets) are still compared one by
    one, and every thread must run at SCHED_OTHER."""
    def strip_env(rec):
        rec = dict(rec)
        rec["environ"] = {k: v for k, v in rec["environ"].items() if k not in ALLOWED_ENV}
        for key in ("c_environ", "child_env"):
            rec[key] = sorted(kv for kv in rec[key] if kv.split("=", 1)[0] not in ALLOWED_ENV)
        if gpu_warm:
            rec["fds"] = {fd: d for fd, d in rec["fds"].items() if not d.endswith(" cloexec")}
            rec["threads_sched"] = sorted(set(rec["threads_sched"]))
        return rec
    if gpu_warm:
        print("  r%d: close-on-exec descriptors: cold %d, spare %d; threads: cold %d, spare %d" % (
            rank, sum(d.endswith(" cloexec") for d in cold["fds"].values()),
            sum(d.endswith(" cloexec") for d in warm["fds"].values()),
            len(cold["threads_sched"]), len(warm["threads_sched"])))
    a, b = strip_env(cold), strip_env(warm)
    diffs = {k: (a[k], b.get(k)) for k in a if a[k] != b.get(k)}
    for k, (x, y) in diffs.items():
        print("  r%d %s:\n    cold  %s\n    spare %s" % (rank, k, str(x)[:600], str(y)[:600]))
    check(not diffs, "r%d: a worker from a spare observes what a cold one does (%d keys compared)" % (rank, len(a)))
    for key in ("environ", "c_environ", "child_env"):
        env = cold[key] if key == "environ" else dict(kv.split("=", 1) for kv in cold[key])
        env2 = warm[key] if key == "environ" else dict(kv.split("=", 1) for kv in warm[key])
        check(env2.get("TORCHELASTIC_RESTART_COUNT") == "1" and env.get("TORCHELASTIC_RESTART_COUNT") == "0",
              "r%d %s: TORCHELASTIC_RESTART_COUNT is the attempt's" % (rank, key))
        check("attempt_1" in env2["TORCHELASTIC_ERROR_FILE"], "r%d %s: the error file is attempt 1's" % (rank, key))
        check(env2.get("DDPRUN_PROGRESS_FILE") == os.path.join(os.path.dirname(env2["TORCHELASTIC_ERROR_FILE"]), "progress")
              and os.path.exists(env2["DDPRUN_PROGRESS_FILE"]),
              "r%d %s: the progress file is attempt 1's, beside its error file" % (rank, key))


def kill_rank1_after_ready(run):
    ready = run.wait_ready()
    run.pid_of_rank(0)  # rank 0 of attempt 0 printed its record too (before its pid file)
    pid = run.pid_of_rank(1)
    os.kill(pid, signal.SIGKILL)
    return ready


def has_gpu():
    try:
        import ctypes
        cu = ctypes.CDLL("libcuda.so.1")
        n = ctypes.c_int(0)
        return cu.cuInit(0) == 0 and cu.cuDeviceGetCount(ctypes.byref(n)) == 0 and n.value > 0
    except OSError:
        return False


def identity(ddprun, python, module, cuda=False):
    logs = mkdtemp(prefix="spares-logs-")
    flags = ["--spare_priority=normal", "--log_dir", logs, "--tee=3"]
    if cuda:
        flags.append("--spare_cuda=1")
        os.environ["PROBE_TORCH"] = "1"  # the probe workers inherit it through ddprun
    entry = (["-m", "probe_worker"] if module else [os.path.join(HERE, "probe_worker.py")]) + ["a", "b c"]
    run = Launch(ddprun, python, flags + (["--module"] if module else []),
                 entry[1:] if module else entry, cwd=HERE if module else None)
    ready = kill_rank1_after_ready(run)
    rc = run.finish()
    check(rc == 0, "ddprun exit code 0 (got %s)" % rc)
    check(any("2 of 2 from warm spares" in l for l in run.err), "the restart says both workers came from spares")
    recs = probe_records(run.out)
    check(sorted(recs) == [(0, 0), (0, 1), (1, 0), (1, 1)], "four probe records (2 attempts x 2 ranks): %s" % sorted(recs))
    for r in (0, 1):
        check(recs[(1, r)]["argv"][1:] == ["a", "b c"], "r%d argv %s" % (r, recs[(1, r)]["argv"]))
        same_but_attempt(recs[(0, r)], recs[(1, r)], r, gpu_warm=cuda and has_gpu())
    # The attempt-1 workers are the spares' processes (pids seen in the ready lines).
    worker_pids = {int(m.group(1)) for m in (re.search(r"worker r\d \(pid (\d+)\) ended: exit code 0", l) for l in run.err) if m}
    check(set(ready.values()) <= worker_pids, "attempt 1 ran in the spares' processes %s (workers %s)" % (ready, worker_pids))
    # The spares' output went to attempt 1's log files (the agent's relay, as for a cold worker).
    for r in (0, 1):
        files = [os.path.join(dp, f) for dp, _, fs in os.walk(logs) for f in fs
                 if f == "stdout.log" and dp.endswith(os.path.join("attempt_1", str(r)))]
        check(len(files) == 1, "r%d: one attempt_1 stdout.log (%s)" % (r, files))
        with open(files[0]) as f:
            check(json.loads(f.readline())["environ"]["TORCHELASTIC_RESTART_COUNT"] == "1",
                  "r%d: attempt 1's stdout.log holds what the worker from a spare printed" % r)
    started = [l for l in run.err if re.search(r"warm spare for local rank \d started: pid", l)]
    check(len(started) == 4, "the used spares were replaced once attempt 1 ran (%d spares started)" % len(started))
    if cuda:
        for r in (0, 1):
            ts = recs[(1, r)]["torch_state"]
            check(ts is not None and not ts["dist_initialized"] and ts["process_groups"] == 0
                  and not ts["cuda_initialized_at_start"],
                  "r%d: no process group, CUDA not initialised for torch at the start (%s)" % (r, ts))
        warm = [l for l in run.err if re.search(r"warm spare for local rank 0 ready: .*GPU 0 warm: context", l)]
        skipped = [l for l in run.err if "did not warm its GPU" in l]
        if has_gpu():
            check(len(warm) >= 1, "the spare of local rank 0 warmed GPU 0 (%d ready lines say so)" % len(warm))
            check(all("NCCL set-up" in l for l in warm), "its ready line times NCCL's set-up: %s" % warm[:1])
            check(all(re.search(r"holds \d+ MiB of GPU|GPU memory unknown", l) for l in warm),
                  "its ready line gives the GPU memory it holds: %s" % warm[:1])
            ts = recs[(1, 0)]["torch_state"]
            check(ts.get("current_device") == 0 and ts.get("memory_allocated", 0) > 0,
                  "r0 from the GPU-warm spare: device 0 current, its own tensor allocated (%s)" % ts)
        else:
            check(not warm, "no GPU here: no spare says it warmed one")
            check(len(skipped) == 1, "no GPU here: one warning says why the spares did not warm one (%s)" % skipped)
            check(re.search(r"no NVIDIA driver|built without CUDA|did not initialise|GPU\(s\) visible", skipped[0]),
                  "the warning gives the reason: " + skipped[0])


def traceback_lines(lines):
    return [l for l in lines if l.startswith("[r0]:")]


def traceback(ddprun, python):
    entry = [os.path.join(HERE, "raise_worker.py")]
    results = {}
    for spares in ("1", "0"):
        run = Launch(ddprun, python, ["--warm_spares=" + spares, "--spare_priority=normal"], entry)
        if spares == "1":
            kill_rank1_after_ready(run)
        else:
            os.kill(run.pid_of_rank(1), signal.SIGKILL)
        rc = run.finish()
        check(rc == 1, "warm_spares=%s: ddprun exit code 1 (got %s)" % (spares, rc))
        results[spares] = traceback_lines(run.err)
        if spares == "1":
            check(any("2 of 2 from warm spares" in l for l in run.err), "the restart used both spares")
    check(results["1"] and results["1"] == results["0"],
          "rank 0's traceback from a spare equals a cold start's:\n  %s\n  vs\n  %s" %
          ("\n  ".join(results["1"]), "\n  ".join(results["0"])))


def resume(ddprun, python):
    finals = {}
    for spares in ("1", "0"):
        tmp = mkdtemp(prefix="spares-resume-")
        gate = os.path.join(tmp, "gate")
        entry = [os.path.join(HERE, "ddp_resume.py"), os.path.join(tmp, "ckpt.pt"), gate]
        run = Launch(ddprun, python, ["--warm_spares=" + spares, "--spare_priority=normal"], entry)
        if spares == "1":
            run.wait_ready()
        run.wait_for("rank 1 at the gate", lambda: any("[r1]: waiting for the gate" in l for l in run.out))
        open(gate, "w").close()
        rc = run.finish()
        check(rc == 0, "warm_spares=%s: ddprun exit code 0 (got %s)" % (spares, rc))
        check(any("[r0]: attempt 1 resumes at epoch 3" in l for l in run.out), "attempt 1 resumed at epoch 3")
        if spares == "1":
            check(any("2 of 2 from warm spares" in l for l in run.err), "the restart used both spares")
        finals[spares] = ([l for l in run.out if "[r0]: epoch" in l or "final weights" in l])
    check(finals["1"] == finals["0"] and any("final weights" in l for l in finals["1"]),
          "same losses and final weights as a cold restart:\n  %s" % "\n  ".join(finals["1"]))


def killed_spare(ddprun, python):
    run = Launch(ddprun, python, ["--spare_priority=normal"], [os.path.join(HERE, "probe_worker.py")])
    ready = run.wait_ready()
    os.kill(ready[1], signal.SIGKILL)
    run.wait_for("the agent noticed the spare's death",
                 lambda: any("warm spare for local rank 1 (pid %d) killed by SIGKILL" % ready[1] in l for l in run.err))
    os.kill(run.pid_of_rank(1), signal.SIGKILL)
    rc = run.finish()
    check(rc == 0, "ddprun exit code 0 (got %s)" % rc)
    line = next((l for l in run.err if "restarting the worker group: attempt 1" in l), "")
    check("1 of 2 from warm spares" in line and "started cold: r1 (its spare (pid %d) killed by SIGKILL)" % ready[1] in line,
          "the restart line says r1 started cold and why: %s" % line)
    recs = probe_records(run.out)
    check((1, 0) in recs and (1, 1) in recs, "both ranks of attempt 1 ran")


def idle_threads(ddprun, python, preload="threads_at_import"):
    run = Launch(ddprun, python, ["--preload=" + preload, "--spare_priority=idle"],
                 [os.path.join(HERE, "probe_worker.py")])
    kill_rank1_after_ready(run)
    rc = run.finish()
    check(rc == 0, "ddprun exit code 0 (got %s)" % rc)
    check(any("importing again at normal priority" in l for l in run.err),
          "the spares saw their import could not stay on the idle thread and imported again")
    check(any("2 of 2 from warm spares" in l for l in run.err), "the restart used both spares")
    recs = probe_records(run.out)
    if preload != "threads_at_import":
        check(all(recs[(1, r)]["signals"]["SIGUSR2"] == "<Handlers.SIG_IGN: 1>" for r in (0, 1)),
              "the preload's signal handler is in place (documented: preloads ran)")
        return
    for r in (0, 1):
        check(recs[(1, r)]["threads_sched"] == [0, 0],
              "r%d: its threads (main, the module's) run at SCHED_OTHER: %s" % (r, recs[(1, r)]["threads_sched"]))


def starved_idle(ddprun, python):
    """Spares still importing at idle priority long after their start: the restart goes cold and
    its line says why, and what to do (--spare_priority=normal)."""
    run = Launch(ddprun, python, ["--preload=slow_import", "--spare_priority=idle"], [os.path.join(HERE, "probe_worker.py")])
    pid = run.pid_of_rank(1)
    run.wait_for("both spares started", lambda: sum("warm spare for local rank" in l and "started: pid" in l
                                                    for l in run.err) == 2)
    time.sleep(17)  # past the 15 s after which a spare still importing at idle priority is likely starved
    check(not run.spares_ready(), "no spare is ready yet (their import sleeps 60 s)")
    os.kill(pid, signal.SIGKILL)
    rc = run.finish()
    check(rc == 0, "ddprun exit code 0 (got %s)" % rc)
    line = next((l for l in run.err if "restarting the worker group: attempt 1" in l), "")
    check("started cold" in line and "still importing" in line, "the restart started cold and says why: " + line)
    check("at idle priority" in line and "--spare_priority=normal" in line, "and names the fix: " + line)


def exclusive_cuda(ddprun, python):
    """--spare_cuda=1 on GPUs in EXCLUSIVE_PROCESS compute mode (the stand-in libcuda.so.1 of
    tests/launcher/fake_cuda, first on LD_LIBRARY_PATH, says so): no spare creates a context;
    one warning says why; the spares still serve the restart, CPU-warm."""
    fake = os.environ.get("DDPRUN_TEST_FAKE_CUDA_DIR")
    if not fake or has_gpu():
        print("skipped: needs the stand-in libcuda (DDPRUN_TEST_FAKE_CUDA_DIR) and no real GPU")
        sys.exit(77)
    os.environ["LD_LIBRARY_PATH"] = fake + (":" + os.environ["LD_LIBRARY_PATH"] if os.environ.get("LD_LIBRARY_PATH") else "")
    os.environ.update(DDPRUN_FAKE_CUDA_GPUS="2", DDPRUN_FAKE_CUDA_COMPUTE_MODE="3")
    run = Launch(ddprun, python, ["--spare_priority=normal", "--spare_cuda=1"], [os.path.join(HERE, "probe_worker.py")])
    kill_rank1_after_ready(run)
    rc = run.finish()
    check(rc == 0, "ddprun exit code 0 (got %s)" % rc)
    warned = [l for l in run.err if "did not warm its GPU" in l]
    check(len(warned) == 1, "one warning for the run (%d)" % len(warned))
    check("is in EXCLUSIVE_PROCESS compute mode" in warned[0] and "--spare_cuda=0" in warned[0],
          "it names the compute mode and the flag: " + warned[0])
    ready = [l for l in run.err if re.search(r"warm spare for local rank \d ready: ", l)]
    check(len(ready) >= 2 and all("GPU not warmed: device" in l and "EXCLUSIVE_PROCESS" in l for l in ready[:2]),
          "both spares' ready lines say why their GPU was not warmed: %s" % ready[:2])
    check(not any("GPU 0 warm" in l or "GPU 1 warm" in l for l in run.err), "no spare says it warmed a GPU")
    check(any("2 of 2 from warm spares" in l for l in run.err), "the restart still used both spares")


def bad_preload(ddprun, python):
    run = Launch(ddprun, python, ["--preload=no_such_module_for_spares", "--spare_priority=normal"],
                 [os.path.join(HERE, "probe_worker.py")])
    run.wait_for("spares turned off", lambda: any("warm spares off for this run" in l for l in run.err))
    os.kill(run.pid_of_rank(1), signal.SIGKILL)
    rc = run.finish()
    check(rc == 0, "ddprun exit code 0: a failed preload is no failure of the job (got %s)" % rc)
    off = next(l for l in run.err if "warm spares off for this run" in l)
    check("could not import no_such_module_for_spares" in off, "the warning names the preload: " + off)
    check(any("ModuleNotFoundError" in l for l in run.err), "and shows the spare's error")
    line = next((l for l in run.err if "restarting the worker group: attempt 1" in l), "")
    check("started cold: warm spares are off" in line, "the restart says it started cold and why: " + line)
    recs = probe_records(run.out)
    check((1, 0) in recs and (1, 1) in recs, "both ranks of attempt 1 ran")


def two_nodes(ddprun, python):
    """Two agents (static rendezvous, one worker each) on this host: both restart from their spares."""
    port = free_port()
    runs = [Launch(ddprun, python, ["--spare_priority=normal"], [os.path.join(HERE, "probe_worker.py")],
                   base=("--nnodes=2", "--node_rank=%d" % n, "--master_addr=127.0.0.1", "--master_port=%d" % port,
                         "--nproc_per_node=1", "--max_restarts=1")) for n in (0, 1)]
    for r in runs:
        r.wait_ready(1)
    os.kill(runs[1].pid_of_rank(0), signal.SIGKILL)  # node 1's worker (global rank 1)
    for n, r in enumerate(runs):
        rc = r.finish()
        check(rc == 0, "node %d: ddprun exit code 0 (got %s)" % (n, rc))
        line = next((l for l in r.err if "restarting the worker group: attempt 1" in l), "")
        check("1 of 1 from warm spares" in line, "node %d restarted from its spare: %s" % (n, line))


def alive(pid):
    try:
        with open("/proc/%d/stat" % pid) as f:
            return f.read().split(") ")[1][0] != "Z"
    except FileNotFoundError:
        return False


def agent_killed(ddprun, python):
    run = Launch(ddprun, python, ["--spare_priority=normal"], [os.path.join(HERE, "probe_worker.py")])
    ready = run.wait_ready()
    workers = [run.pid_of_rank(0), run.pid_of_rank(1)]
    check(all(alive(p) for p in list(ready.values()) + workers), "spares and workers run")
    os.kill(run.p.pid, signal.SIGKILL)
    run.p.wait()
    deadline = time.monotonic() + TIMEOUT
    left = list(ready.values()) + workers
    while left and time.monotonic() < deadline:
        left = [p for p in left if alive(p)]
        time.sleep(0.05)
    check(not left, "no spare or worker outlives a SIGKILLed agent (left: %s)" % left)


def main():
    ddprun, python, mode = sys.argv[1:4]
    if not os.path.exists(python):
        print("SKIPPED: %s does not exist (scripts/setup_deps.sh creates the torch 2.x venv)" % python)
        sys.exit(77)
    {"identity": lambda: identity(ddprun, python, False),
     "module": lambda: identity(ddprun, python, True),
     "identity_cuda": lambda: identity(ddprun, python, False, cuda=True),
     "traceback": lambda: traceback(ddprun, python),
     "resume": lambda: resume(ddprun, python),
     "killed_spare": lambda: killed_spare(ddprun, python),
     "agent_killed": lambda: agent_killed(ddprun, python),
     "idle_threads": lambda: idle_threads(ddprun, python),
     "bad_preload": lambda: bad_preload(ddprun, python),
     "two_nodes": lambda: two_nodes(ddprun, python),
     "main_thread_import": lambda: idle_threads(ddprun, python, "signal_at_import"),
     "starved_idle": lambda: starved_idle(ddprun, python),
     "exclusive_cuda": lambda: exclusive_cuda(ddprun, python)}[mode]()


if __name__ == "__main__":
    main()
