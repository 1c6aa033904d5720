#!/usr/bin/env python3
"""End-to-end tests of the ddprun binary: real processes, signals, files.

Usage: test_launcher.py <path to ddprun> [unittest names, e.g. Exit.test_true_exits_0]

Synchronisation is by events (a worker's "ready" line on ddprun's stdout, a pidfd becoming
readable), never by sleeping; time bounds only guard against hangs.
"""
import json
import os
import re
import selectors
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import unittest

DDPRUN = None
PY = sys.executable
HANG_GUARD = 60.0
# Linux 6.11+ drops a task's seccomp filters as it starts to exit: ddprun's early exit watch works
# there, unless this environment forbids a seccomp listener (ddprun then says so with -v).
EXIT_WATCH_KERNEL = tuple(int(x) for x in os.uname().release.split(".")[:2]) >= (6, 11)
_exit_watch_here = None


def own_status(field):
    """A number from this process's /proc/self/status (workers inherit seccomp filters and
    no_new_privs from whatever this test already runs under, e.g. a container)."""
    import re
    return int(re.search(field + r":\s*(\d+)", open("/proc/self/status").read()).group(1))


def exit_watch_here():
    global _exit_watch_here
    if _exit_watch_here is None:
        p = run(["-v", "--nproc_per_node=1", "--no_python", "true"])
        _exit_watch_here = EXIT_WATCH_KERNEL and "no early exit watch" not in p.stderr
        if EXIT_WATCH_KERNEL and not _exit_watch_here:
            print("note: seccomp listeners are not allowed here; exit-watch checks expect it off", file=sys.stderr)
    return _exit_watch_here


def run(args, env=None, timeout=HANG_GUARD, cwd=None):
    full_env = dict(os.environ)
    full_env.update(env or {})
    t0 = time.monotonic()
    p = subprocess.run([DDPRUN] + args, capture_output=True, text=True, env=full_env,
                       timeout=timeout, cwd=cwd)
    p.elapsed = time.monotonic() - t0
    return p


def run_dir(log_dir, run_id):
    """The one run directory <log_dir>/<run_id>_<unique> (torchrun's layout)."""
    import glob
    found = glob.glob(os.path.join(glob.escape(log_dir), glob.escape(run_id) + "_*"))
    assert len(found) == 1, f"expected one run directory for {run_id} in {log_dir}: {found}"
    return found[0]


def worker(code):
    """ddprun args running `code` under this Python, without the .py rule."""
    return ["--no_python", PY, "-c", code]


class Live:
    """ddprun running in the background; read its stdout line by line with a deadline."""

    def __init__(self, args, env=None):
        full_env = dict(os.environ)
        full_env.update(env or {})
        self.p = subprocess.Popen([DDPRUN] + args, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                  env=full_env)
        self.lines = []
        self._buf = b""
        self.sel = selectors.DefaultSelector()
        self.sel.register(self.p.stdout, selectors.EVENT_READ)

    def wait_for(self, predicate, timeout=HANG_GUARD):
        deadline = time.monotonic() + timeout
        while True:
            hits = [l for l in self.lines if predicate(l)]
            if hits:
                return hits
            left = deadline - time.monotonic()
            if left <= 0:
                raise AssertionError(f"timed out waiting; stdout so far: {self.lines}")
            if not self.sel.select(left):
                continue
            chunk = os.read(self.p.stdout.fileno(), 65536)
            if not chunk:
                raise AssertionError(f"ddprun's stdout closed; lines: {self.lines}; "
                                     f"stderr: {self.p.stderr.read().decode()}")
            self._buf += chunk
            *full, self._buf = self._buf.split(b"\n")
            self.lines += [l.decode() for l in full]

    def wait_ready(self, n):
        return self.wait_for(lambda l: False) if n < 0 else self._wait_n(n)

    def _wait_n(self, n):
        deadline = time.monotonic() + HANG_GUARD
        while sum(1 for l in self.lines if "ready" in l) < n:
            try:
                self.wait_for(lambda l, c=len(self.lines): False, timeout=0.01)
            except AssertionError:
                if time.monotonic() > deadline:
                    raise
        return [l for l in self.lines if "ready" in l]

    def finish(self, timeout=HANG_GUARD):
        out, err = self.p.communicate(timeout=timeout)
        tail = (self._buf + out).decode().split("\n")
        self.lines += [l for l in tail if l]
        return self.p.returncode, err.decode()


def wait_pid_gone(pid, timeout):
    """True when `pid` has exited within `timeout` (pidfd: no polling)."""
    try:
        fd = os.pidfd_open(pid)
    except ProcessLookupError:
        return True
    try:
        sel = selectors.DefaultSelector()
        sel.register(fd, selectors.EVENT_READ)
        return bool(sel.select(timeout))
    finally:
        os.close(fd)


def pid_alive(pid):
    try:
        with open(f"/proc/{pid}/stat") as f:
            # Z: a zombie; X/x: being reaped this very moment (its /proc entry lingers briefly).
            return f.read().rsplit(")", 1)[1].split()[0] not in ("Z", "X", "x")
    except (FileNotFoundError, ProcessLookupError):  # gone between open and read: ESRCH
        return False


def kill_if_alive(pid):
    if pid_alive(pid):
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


READY_AND_WAIT = (
    "import os, signal, sys\n"
    "def on_term(s, f):\n"
    "    print('got', signal.Signals(s).name, os.environ['RANK'], flush=True); sys.exit(0)\n"
    "signal.signal(signal.SIGTERM, on_term)\n"
    "print('ready pid', os.getpid(), flush=True)\n"
    "while True: signal.pause()\n"
)


class Exit(unittest.TestCase):
    def test_true_exits_0(self):
        p = run(["--nproc_per_node=2", "--no_python", "true"])
        self.assertEqual(p.returncode, 0, p.stderr)
        self.assertIn("workers started in", p.stderr)
        self.assertNotIn("FAILED", p.stderr)

    def test_exit_code_and_summary_name_the_rank(self):
        code = ("import os, sys, signal\n"
                "if os.environ['RANK'] == '1':\n"
                "    print('about to fail: bad batch 42', file=sys.stderr); sys.exit(3)\n"
                "signal.pause()\n")
        p = run(["--nproc_per_node=2"] + worker(code))
        self.assertEqual(p.returncode, 3, p.stderr)
        summary = p.stderr[p.stderr.rindex("FAILED"):]
        self.assertIn("worker rank 1 (local rank 1", summary)
        self.assertIn("exit code 3", summary)
        self.assertIn("about to fail: bad batch 42", summary)
        self.assertIn("[r1]: about to fail", p.stderr)
        # The summary is the last thing printed.
        self.assertTrue(p.stderr.rstrip().endswith("=" * 72), p.stderr)
        self.assertLess(p.elapsed, 20)  # rank 0 was stopped, not waited for

    def test_sigkilled_worker_is_named_sigkill(self):
        p = run(["--nproc_per_node=1"] + worker("import os, signal; os.kill(os.getpid(), signal.SIGKILL)"))
        self.assertEqual(p.returncode, 128 + 9)
        self.assertIn("signal SIGKILL (9)", p.stderr[p.stderr.rindex("FAILED"):])

    def test_workers_carry_the_exit_watch_filter_unless_off(self):
        code = ("import re\n"
                "print('filters', re.search(r'Seccomp_filters:\\s*(\\d+)', open('/proc/self/status').read()).group(1))\n")
        on = run(["--nproc_per_node=1"] + worker(code))
        off = run(["--nproc_per_node=1", "--early_exit_watch=0"] + worker(code))
        self.assertEqual(on.returncode, 0, on.stderr)
        self.assertEqual(off.returncode, 0, off.stderr)
        base = own_status("Seccomp_filters")
        self.assertIn("[r0]: filters %d" % (base + (1 if exit_watch_here() else 0)), on.stdout)
        self.assertIn("[r0]: filters %d" % base, off.stdout)

    def test_exit_watch_sets_no_new_privs_only_without_cap_sys_admin(self):
        code = ("import re\n"
                "s = open('/proc/self/status').read()\n"
                "print('nnp', re.search(r'NoNewPrivs:\\s*(\\d)', s).group(1),"
                " 'filters', re.search(r'Seccomp_filters:\\s*(\\d+)', s).group(1))\n")
        if os.geteuid() != 0:
            self.skipTest("needs root: runs ddprun once as root and once as nobody")
        as_root = run(["--nproc_per_node=1"] + worker(code))
        self.assertEqual(as_root.returncode, 0, as_root.stderr)
        base, base_nnp = own_status("Seccomp_filters"), own_status("NoNewPrivs")
        watch = 1 if exit_watch_here() else 0
        self.assertIn("[r0]: nnp %d filters %d" % (base_nnp, base + watch), as_root.stdout)  # no need for it
        setpriv = "/usr/bin/setpriv"
        nobody = [setpriv, "--reuid", "65534", "--regid", "65534", "--clear-groups", DDPRUN]
        if (not os.path.exists(setpriv) or not os.path.exists("/usr/bin/python3")
                or subprocess.run(nobody + ["--help"], capture_output=True).returncode != 0):
            self.skipTest("setpriv or /usr/bin/python3 missing, or ddprun not reachable as nobody from here")
        with tempfile.TemporaryDirectory() as d:
            os.chmod(d, 0o777)
            for flag, want in (([], "nnp %d filters %d" % (1 if watch else base_nnp, base + watch)),
                               (["--early_exit_watch=0"], "nnp %d filters %d" % (base_nnp, base))):
                # The system Python: this one may live where nobody cannot read.
                p = subprocess.run(nobody + ["--nproc_per_node=1"] + flag + ["--no_python", "/usr/bin/python3", "-c", code],
                                   capture_output=True,
                                   text=True, timeout=HANG_GUARD, cwd=d)
                self.assertEqual(p.returncode, 0, p.stderr)
                self.assertIn("[r0]: " + want, p.stdout)

    def test_exit_seen_as_it_begins_then_reaped(self):
        # 512 MiB touched: the kernel takes tens of ms to free it before the exit can be reaped.
        # Attempt 1 runs on for a while, so the old worker's reap is logged too.
        code = ("import os, time\n"
                "if os.environ['TORCHELASTIC_RESTART_COUNT'] == '0':\n"
                "    b = b'x' * (512 << 20)\n"
                "    os.kill(os.getpid(), 9)\n"
                "time.sleep(1)\n")
        p = run(["-v", "--nproc_per_node=1", "--max_restarts=1"] + worker(code))
        self.assertEqual(p.returncode, 0, p.stderr)
        self.assertIn("failed: signal SIGKILL (9)", p.stderr)
        if exit_watch_here():
            self.assertIn("ended: signal SIGKILL (9)", p.stderr)
            self.assertIn("(seen as it began to exit)", p.stderr)
            self.assertRegex(p.stderr, r"reaped [0-9.]+ ms after its exit was seen")
            self.assertNotIn("killing orphan", p.stderr)
        off = run(["-v", "--nproc_per_node=1", "--early_exit_watch=0"] +
                  worker("import os; b = b'x' * (64 << 20); os.kill(os.getpid(), 9)"))
        self.assertEqual(off.returncode, 128 + 9, off.stderr)
        self.assertIn("signal SIGKILL (9)", off.stderr[off.stderr.rindex("FAILED"):])
        self.assertNotIn("seen as it began to exit", off.stderr)

    def test_sigsegv_is_named(self):
        p = run(["--nproc_per_node=1"] + worker("import os, signal; os.kill(os.getpid(), signal.SIGSEGV)"))
        self.assertEqual(p.returncode, 128 + 11)
        self.assertIn("SIGSEGV", p.stderr[p.stderr.rindex("FAILED"):])

    def test_error_file_is_shown(self):
        code = ("import json, os, sys\n"
                "json.dump({'message': {'message': 'ValueError: loss is nan', 'extraInfo': {"
                "'py_callstack': 'Traceback (most recent call last):\\n  File \"train.py\", line 7\\n"
                "ValueError: loss is nan', 'timestamp': '1700000000'}}}, "
                "open(os.environ['TORCHELASTIC_ERROR_FILE'], 'w'))\n"
                "sys.exit(1)\n")
        p = run(["--nproc_per_node=1"] + worker(code))
        self.assertEqual(p.returncode, 1)
        summary = p.stderr[p.stderr.rindex("FAILED"):]
        self.assertIn("error file", summary)
        self.assertIn("message: ValueError: loss is nan", summary)
        self.assertIn('File "train.py", line 7', summary)

    def test_restart_after_failure_on_attempt_0(self):
        code = ("import os, sys\n"
                "n = os.environ['TORCHELASTIC_RESTART_COUNT']\n"
                "print('count', n, 'max', os.environ['TORCHELASTIC_MAX_RESTARTS'], flush=True)\n"
                "sys.exit(4 if n == '0' and os.environ['RANK'] == '1' else 0)\n")
        p = run(["--nproc_per_node=2", "--max_restarts=1"] + worker(code))
        self.assertEqual(p.returncode, 0, p.stderr)
        self.assertIn("[r1]: count 1 max 1", p.stdout)
        self.assertIn("[r0]: count 1 max 1", p.stdout)
        self.assertIn("restarting the worker group: attempt 1", p.stderr)

    def test_restart_budget_spent(self):
        # Each attempt gets past joining the store (ADD init/ +1, then wait until every worker
        # did, as PyTorch's clients do), then fails: every restart of the budget is used.
        code = ("import os, socket, struct, time\n"
                "s = socket.create_connection((os.environ['MASTER_ADDR'], int(os.environ['MASTER_PORT'])))\n"
                "add = lambda d: s.sendall(bytes([4]) + struct.pack('<Q', 5) + b'init/' + struct.pack('<q', d))\n"
                "s.sendall(bytes([0, 0xCE, 0xF7, 0x85, 0x3C]))  # VALIDATE, once\n"
                "add(1)\n"
                "assert len(s.recv(8)) == 8\n"
                "for _ in range(2000):\n"
                "    add(0)\n"
                "    if struct.unpack('<q', s.recv(8))[0] >= int(os.environ['WORLD_SIZE']): break\n"
                "    time.sleep(0.005)\n"
                "print('attempt', os.environ['TORCHELASTIC_RESTART_COUNT'], flush=True)\n"
                "raise SystemExit(6)\n")
        p = run(["--nproc_per_node=2", "--max-restarts=2"] + worker(code))
        self.assertEqual(p.returncode, 6)
        for n in range(3):
            self.assertIn(f"attempt {n}", p.stdout)
        self.assertIn("attempt 2 (max_restarts 2)", p.stderr)

    def test_failure_before_progress_twice_is_not_retried(self):
        # An import error fails the same way every time: two attempts, not the whole budget.
        p = run(["--nproc_per_node=2", "--max-restarts=5"] +
                worker("import os; print('attempt', os.environ['TORCHELASTIC_RESTART_COUNT']); import no_such_module"))
        self.assertEqual(p.returncode, 1)
        self.assertIn("attempt 1", p.stdout)
        self.assertNotIn("attempt 2", p.stdout)
        self.assertIn("not retried: attempts 0 and 1", p.stderr)
        self.assertIn("No module named 'no_such_module'", p.stderr)


class ExitBarrier(unittest.TestCase):
    # rank 0 prints and exits 0; rank 1 prints its pid and hangs (ignoring SIGTERM when asked).
    CODE = ("import os, signal, sys, time\n"
            "if os.environ['RANK'] == '0':\n"
            "    print('done', flush=True); sys.exit(0)\n"
            "if os.environ.get('IGNORE_TERM'): signal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
            "print('hanging', os.getpid(), flush=True)\n"
            "while True: time.sleep(3600)\n")

    def check(self, p, pid):
        self.assertEqual(p.returncode, 124, p.stderr)
        self.assertIn("[r0]: done", p.stdout)
        self.assertRegex(p.stderr, r"r0 exited 0 and 1 s later \(--exit_barrier_timeout\) still running: "
                                   r"r1 \(local rank 1, pid %d\); stopping them" % pid)
        self.assertIn("EXIT BARRIER TIMEOUT: r0 exited 0", p.stderr)
        self.assertIn("exit code 124", p.stderr)
        self.assertNotIn("restart", p.stderr)
        self.assertFalse(pid_alive(pid))

    def test_a_hanging_rank_is_named_and_stopped(self):
        p = run(["--nproc_per_node=2", "--max_restarts=3", "--exit_barrier_timeout=1"] + worker(self.CODE))
        pid = int(re.search(r"\[r1\]: hanging (\d+)", p.stdout).group(1))
        self.check(p, pid)

    def test_a_straggler_ignoring_sigterm_gets_sigkill_after_the_grace(self):
        p = run(["--nproc_per_node=2", "--exit_barrier_timeout=1", "--shutdown_timeout=1"] + worker(self.CODE),
                env={"IGNORE_TERM": "1"})
        pid = int(re.search(r"\[r1\]: hanging (\d+)", p.stdout).group(1))
        self.check(p, pid)

    def test_off_by_default_and_finishing_in_time_is_success(self):
        # Both exit 0 well within the barrier: nothing is stopped.
        p = run(["--nproc_per_node=2", "--exit_barrier_timeout=600"] + worker("print('ok', flush=True)"))
        self.assertEqual(p.returncode, 0, p.stderr)
        self.assertNotIn("exit_barrier", p.stderr)


class Signals(unittest.TestCase):
    def test_sigterm_is_forwarded_to_workers(self):
        d = Live(["--nproc_per_node=2"] + worker(READY_AND_WAIT))
        d.wait_ready(2)
        d.p.send_signal(signal.SIGTERM)
        rc, err = d.finish()
        self.assertEqual(rc, 128 + signal.SIGTERM, err)
        self.assertIn("[r0]: got SIGTERM 0", d.lines)
        self.assertIn("[r1]: got SIGTERM 1", d.lines)
        self.assertIn("stopped by SIGTERM", err)

    def test_sigint_forwarded_as_sigint(self):
        code = READY_AND_WAIT.replace("signal.SIGTERM, on_term", "signal.SIGINT, on_term")
        d = Live(["--nproc_per_node=1", "--signals-to-handle=SIGINT,SIGTERM"] + worker(code))
        d.wait_ready(1)
        d.p.send_signal(signal.SIGINT)
        rc, err = d.finish()
        self.assertEqual(rc, 128 + signal.SIGINT, err)
        self.assertIn("[r0]: got SIGINT 0", d.lines)

    def test_signal_ignored_by_parent_stays_ignored(self):
        # Like nohup: ddprun started with SIGHUP ignored neither stops on SIGHUP nor makes its
        # workers stop on one.
        code = ("import os, signal, sys\n"
                "print('ready', signal.getsignal(signal.SIGHUP) == signal.SIG_IGN, flush=True)\n"
                "sys.stdin.read()\n")
        full_env = dict(os.environ)
        p = subprocess.Popen([DDPRUN, "--nproc_per_node=1"] + worker(code), stdin=subprocess.PIPE,
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=full_env,
                             preexec_fn=lambda: signal.signal(signal.SIGHUP, signal.SIG_IGN))
        first = p.stdout.readline().decode()
        self.assertEqual(first.strip(), "[r0]: ready True")
        p.send_signal(signal.SIGHUP)
        p.stdin.close()  # the worker ends normally once its stdin closes
        p.stdin = None
        out, err = p.communicate(timeout=HANG_GUARD)
        self.assertEqual(p.returncode, 0, err.decode())

    def test_sigkill_of_ddprun_kills_workers(self):
        d = Live(["--nproc_per_node=2"] + worker(READY_AND_WAIT))
        ready = d.wait_ready(2)
        pids = [int(l.split()[-1]) for l in ready]
        d.p.kill()
        d.p.wait(timeout=HANG_GUARD)
        for pid in pids:
            self.assertTrue(wait_pid_gone(pid, 10), f"worker {pid} survived ddprun's SIGKILL")

    def test_sigkill_of_ddprun_kills_grandchildren_too(self):
        code = ("import os, signal, subprocess\n"
                "g = subprocess.Popen(['sleep', '300'])\n"
                "print('ready grandchild', g.pid, flush=True)\n"
                "while True: signal.pause()\n")
        d = Live(["--nproc_per_node=2"] + worker(code))
        ready = d.wait_ready(2)
        pids = [int(l.split()[-1]) for l in ready]
        d.p.kill()
        d.p.wait(timeout=HANG_GUARD)
        for pid in pids:
            self.assertTrue(wait_pid_gone(pid, 10), f"grandchild {pid} survived ddprun's SIGKILL")

    def test_worker_ignoring_sigterm_gets_sigkill_after_shutdown_timeout(self):
        # Rank 1 fails only once rank 0 ignores SIGTERM (handshake over a FIFO).
        code = ("import os, signal, sys\n"
                "fifo = os.environ['HANDSHAKE']\n"
                "if os.environ['RANK'] == '1':\n"
                "    open(fifo).read(); sys.exit(2)\n"
                "signal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
                "with open(fifo, 'w') as f: f.write('ignoring')\n"
                "while True: signal.pause()\n")
        with tempfile.TemporaryDirectory() as d:
            fifo = os.path.join(d, "fifo")
            os.mkfifo(fifo)
            t0 = time.monotonic()
            p = run(["--nproc_per_node=2", "--shutdown_timeout=1"] + worker(code), env={"HANDSHAKE": fifo})
            elapsed = time.monotonic() - t0
        self.assertEqual(p.returncode, 2, p.stderr)
        self.assertGreaterEqual(elapsed, 1.0)  # the grace was given
        self.assertLess(elapsed, 15)           # and then SIGKILL
        self.assertIn("worker rank 1", p.stderr[p.stderr.rindex("FAILED"):])

    def test_grace_then_sigkill_on_signal(self):
        code = READY_AND_WAIT.replace("signal.signal(signal.SIGTERM, on_term)",
                                      "signal.signal(signal.SIGTERM, signal.SIG_IGN)")
        d = Live(["--nproc_per_node=1", "--shutdown-timeout=0.5"] + worker(code))
        pid = int(d.wait_ready(1)[0].split()[-1])
        t0 = time.monotonic()
        d.p.send_signal(signal.SIGTERM)
        rc, err = d.finish()
        self.assertEqual(rc, 128 + signal.SIGTERM)
        self.assertGreaterEqual(time.monotonic() - t0, 0.5)
        self.assertTrue(wait_pid_gone(pid, 5))


PREEMPTIBLE = (
    "import os, signal, sys\n"
    "def on_usr1(s, f):\n"
    "    print('checkpoint', os.environ['RANK'], flush=True); sys.exit(99)\n"
    "def on_term(s, f):\n"
    "    print('got SIGTERM', os.environ['RANK'], flush=True); sys.exit(1)\n"
    "signal.signal(signal.SIGUSR1, on_usr1)\n"
    "signal.signal(signal.SIGTERM, on_term)\n"
    "print('ready pid', os.getpid(), flush=True)\n"
    "print('ready pid', os.getpid(), file=sys.stderr, flush=True)\n"
    "while True: signal.pause()\n"
)


class Preemption(unittest.TestCase):
    """Slurm's warning (SIGUSR1), a worker that stopped for one (exit 99): exit 99, no restart."""

    def assert_preempted(self, rc, err):
        self.assertEqual(rc, 99, err)
        summary = err[err.rindex("=" * 72 + "\n", 0, err.rindex("=" * 72)):]
        self.assertIn("PREEMPTED", summary, err)
        self.assertNotIn("FAILED", err)
        self.assertNotIn("restarting", err)

    def test_sigusr1_reaches_every_worker_and_exits_99_without_a_restart(self):
        d = Live(["--nproc_per_node=2", "--max_restarts=2"] + worker(PREEMPTIBLE))
        d.wait_ready(2)
        d.p.send_signal(signal.SIGUSR1)
        rc, err = d.finish()
        self.assert_preempted(rc, err)
        self.assertIn("[r0]: checkpoint 0", d.lines)
        self.assertIn("[r1]: checkpoint 1", d.lines)
        self.assertFalse([l for l in d.lines if "got SIGTERM" in l], d.lines)
        self.assertIn("received SIGUSR1 (a preemption signal)", err)
        self.assertIn("worker r1 stopped for the preemption: exit code 99", err)

    def test_after_the_grace_the_ordinary_stop(self):
        code = PREEMPTIBLE.replace("sys.exit(99)", "pass").replace("'checkpoint'", "'warned'").replace(
            "sys.exit(1)", "sys.exit(0)")
        d = Live(["--nproc_per_node=1", "--preempt-grace=0.5"] + worker(code))
        d.wait_ready(1)
        t0 = time.monotonic()
        d.p.send_signal(signal.SIGUSR1)
        rc, err = d.finish()
        self.assertGreaterEqual(time.monotonic() - t0, 0.5)  # the grace was given
        self.assert_preempted(rc, err)
        self.assertIn("[r0]: warned 0", d.lines)
        self.assertIn("[r0]: got SIGTERM 0", d.lines)  # then SIGTERM, as any stop

    def test_a_worker_that_dies_of_the_signal_is_no_failure(self):
        code = "import os, signal\nprint('ready', flush=True)\nwhile True: signal.pause()\n"
        d = Live(["--nproc_per_node=2", "--max_restarts=1"] + worker(code))
        d.wait_ready(2)
        d.p.send_signal(signal.SIGUSR1)
        rc, err = d.finish()
        self.assert_preempted(rc, err)
        self.assertIn("ended during the preemption with signal SIGUSR1", err)

    def test_a_worker_exiting_99_stops_the_job_the_others_unsignalled(self):
        # Rank 1 stops for a preemption by itself (its ranks agreed); rank 0 follows once rank 1
        # is gone, and is sent nothing meanwhile. "Gone" = reaped by the agent (no /proc entry,
        # not even a zombie): the agent has then acted on rank 1's exit, so rank 0's is the
        # second one it sees (its FIFO's EOF alone came before that under load).
        code = ("import os, sys, time\n"
                "fifo = os.environ['HANDSHAKE']\n"
                "if os.environ['RANK'] == '1':\n"
                "    f = open(fifo, 'w'); f.write(str(os.getpid())); f.flush(); sys.exit(99)\n"
                "import signal\n"
                "signal.signal(signal.SIGTERM, lambda s, f: (print('got SIGTERM', flush=True), sys.exit(1)))\n"
                "peer = int(open(fifo).read())\n"
                "deadline = time.monotonic() + 60\n"
                "while os.path.exists(f'/proc/{peer}') and time.monotonic() < deadline: time.sleep(0.01)\n"
                "print('peer gone', flush=True); sys.exit(99)\n")
        with tempfile.TemporaryDirectory() as tmp:
            fifo = os.path.join(tmp, "fifo")
            os.mkfifo(fifo)
            p = run(["--nproc_per_node=2", "--max_restarts=3"] + worker(code), env={"HANDSHAKE": fifo})
        self.assert_preempted(p.returncode, p.stderr)
        self.assertIn("[r0]: peer gone", p.stdout)
        self.assertNotIn("got SIGTERM", p.stdout)
        self.assertIn("worker r1 stopped for a preemption (exit code 99)", p.stderr)
        self.assertIn("the workers stopped for a preemption (a worker exited 99)", p.stderr)

    def test_sigterm_whose_workers_stop_with_99_exits_99(self):
        code = PREEMPTIBLE.replace("print('got SIGTERM', os.environ['RANK'], flush=True); sys.exit(1)",
                                   "print('checkpoint on SIGTERM', flush=True); sys.exit(99)")
        d = Live(["--nproc_per_node=1"] + worker(code))
        d.wait_ready(1)
        d.p.send_signal(signal.SIGTERM)
        rc, err = d.finish()
        self.assert_preempted(rc, err)
        self.assertIn("[r0]: checkpoint on SIGTERM", d.lines)
        self.assertIn("stopped by SIGTERM", err)

    def test_preempt_signals_none_leaves_sigusr1_alone(self):
        d = Live(["--nproc_per_node=1", "--preempt_signals=none"] + worker(PREEMPTIBLE))
        pid = int(d.wait_ready(1)[0].split()[-1])
        d.p.send_signal(signal.SIGUSR1)
        rc, _ = d.finish()
        self.assertEqual(rc, -signal.SIGUSR1)  # its default action, as torchrun's
        self.assertTrue(wait_pid_gone(pid, 10))

    def test_every_node_signalled_as_slurm_does_exits_99_on_every_node(self):
        port = free_port()
        c10d = ["--nnodes=2", "--rdzv_backend=c10d", f"--rdzv_endpoint=127.0.0.1:{port}", "--rdzv_id=pre",
                "--rdzv_conf=last_call_timeout=1,join_timeout=60", "--max_restarts=2"]
        a = Agent(c10d + worker(PREEMPTIBLE))
        a.wait_err("hosting the rendezvous")
        b = Agent(c10d + worker(PREEMPTIBLE))
        a.wait_err("ready pid")
        b.wait_err("ready pid")
        a.p.send_signal(signal.SIGUSR1)
        b.p.send_signal(signal.SIGUSR1)
        rb, ob, eb = b.finish()
        ra, oa, ea = a.finish()
        self.assert_preempted(ra, ea)
        self.assert_preempted(rb, eb)
        self.assertEqual(sorted(l.split()[-1] for l in (oa + ob).splitlines() if "checkpoint" in l), ["0", "1"],
                         oa + ob)


class Hygiene(unittest.TestCase):
    def test_grandchildren_are_reaped(self):
        # One grandchild stays in the worker's process group, one escapes it with setsid.
        code = ("import os, subprocess\n"
                "a = subprocess.Popen(['sleep', '300'])\n"
                "b = subprocess.Popen(['setsid', 'sleep', '301'])\n"
                "print('grandchildren', a.pid, b.pid, flush=True)\n")
        p = run(["--nproc_per_node=1"] + worker(code))
        self.assertEqual(p.returncode, 0, p.stderr)
        line = next(l for l in p.stdout.splitlines() if "grandchildren" in l)
        for pid in map(int, line.split()[-2:]):
            self.assertTrue(wait_pid_gone(pid, 10), f"grandchild {pid} left running")
            self.assertFalse(pid_alive(pid))

    def test_workers_have_own_process_group_and_no_extra_fds(self):
        code = ("import os\n"
                "print('pg', os.getpgid(0) == os.getpid(), 'fds', sorted(int(f) for f in os.listdir('/proc/self/fd')), flush=True)\n")
        p = run(["--nproc_per_node=2"] + worker(code))
        self.assertEqual(p.returncode, 0, p.stderr)
        for r in range(2):
            line = next(l for l in p.stdout.splitlines() if l.startswith(f"[r{r}]: pg"))
            self.assertIn("pg True", line)
            fds = json.loads(line.split("fds ")[1])
            self.assertLessEqual(set(fds) - {0, 1, 2}, {3}, line)  # 3: listdir's own fd


class Environment(unittest.TestCase):
    def test_worker_environment(self):
        code = ("import json, os\n"
                "keys = ['RANK','LOCAL_RANK','GROUP_RANK','ROLE_RANK','ROLE_NAME','LOCAL_WORLD_SIZE',"
                "'WORLD_SIZE','GROUP_WORLD_SIZE','ROLE_WORLD_SIZE','MASTER_ADDR','MASTER_PORT',"
                "'TORCHELASTIC_RESTART_COUNT','TORCHELASTIC_MAX_RESTARTS','TORCHELASTIC_RUN_ID',"
                "'TORCHELASTIC_USE_AGENT_STORE','TORCHELASTIC_ERROR_FILE','TORCH_NCCL_ASYNC_ERROR_HANDLING',"
                "'NCCL_ASYNC_ERROR_HANDLING','OMP_NUM_THREADS','TORCHELASTIC_SIGNALS_TO_HANDLE',"
                "'NCCL_NVLS_ENABLE','FROM_PARENT']\n"
                "print('ENV', json.dumps({k: os.environ.get(k) for k in keys}), flush=True)\n")
        with tempfile.TemporaryDirectory() as d:
            p = run(["--nproc_per_node=3", "--max_restarts=2", "--rdzv_id=job7", "--role=trainer",
                     "--master_port=0", "--log_dir", d] + worker(code), env={"FROM_PARENT": "yes"})
            self.assertEqual(p.returncode, 0, p.stderr)
            envs = {}
            for line in p.stdout.splitlines():
                prefix, _, rest = line.partition(": ENV ")
                if rest:
                    envs[prefix] = json.loads(rest)
            self.assertEqual(sorted(envs), ["[r0]", "[r1]", "[r2]"])
            ports = set()
            for r in range(3):
                e = envs[f"[r{r}]"]
                expect = {"RANK": str(r), "LOCAL_RANK": str(r), "GROUP_RANK": "0", "ROLE_RANK": str(r),
                          "ROLE_NAME": "trainer", "LOCAL_WORLD_SIZE": "3", "WORLD_SIZE": "3",
                          "GROUP_WORLD_SIZE": "1", "ROLE_WORLD_SIZE": "3", "MASTER_ADDR": "127.0.0.1",
                          "TORCHELASTIC_RESTART_COUNT": "0", "TORCHELASTIC_MAX_RESTARTS": "2",
                          "TORCHELASTIC_RUN_ID": "job7", "TORCHELASTIC_USE_AGENT_STORE": "True",
                          "TORCH_NCCL_ASYNC_ERROR_HANDLING": "1", "NCCL_ASYNC_ERROR_HANDLING": None,
                          "OMP_NUM_THREADS": "1", "NCCL_NVLS_ENABLE": None,  # NCCL's default stays
                          "TORCHELASTIC_SIGNALS_TO_HANDLE": "SIGTERM,SIGINT,SIGHUP,SIGQUIT",
                          "FROM_PARENT": "yes"}
                for k, v in expect.items():
                    self.assertEqual(e[k], v, f"rank {r} {k}")
                self.assertEqual(e["TORCHELASTIC_ERROR_FILE"],
                                 os.path.join(run_dir(d, "job7"), "attempt_0", str(r), "error.json"))
                ports.add(e["MASTER_PORT"])
            self.assertEqual(len(ports), 1)
            self.assertNotEqual(ports.pop(), "0")

    def test_unless_set_variables_are_kept(self):
        p = run(["--nproc_per_node=2"] +
                worker("import os; print(os.environ['OMP_NUM_THREADS'], os.environ['NCCL_NVLS_ENABLE'])"),
                env={"OMP_NUM_THREADS": "7", "NCCL_NVLS_ENABLE": "1"})
        self.assertIn("[r0]: 7 1", p.stdout)

    def test_pet_environment_variables(self):
        p = run(worker("import os; print('ws', os.environ['WORLD_SIZE'], os.environ['TORCHELASTIC_RUN_ID'])"),
                env={"PET_NPROC_PER_NODE": "3", "PET_RDZV_ID": "pet"})
        self.assertEqual(p.returncode, 0, p.stderr)
        self.assertIn("[r2]: ws 3 pet", p.stdout)

    def test_py_entry_point_runs_under_python_exec(self):
        with tempfile.TemporaryDirectory() as d:
            script = os.path.join(d, "hello.py")
            with open(script, "w") as f:
                f.write("import sys; print('argv', sys.argv[1:], 'unbuffered', '-u' in sys.orig_argv)\n")
            p = run(["--nproc_per_node=1", script, "--x", "1"], env={"PYTHON_EXEC": PY})
            self.assertEqual(p.returncode, 0, p.stderr)
            self.assertIn("[r0]: argv ['--x', '1'] unbuffered True", p.stdout)

    def test_run_path_entry_point(self):
        with tempfile.TemporaryDirectory() as d:
            script = os.path.join(d, "job")  # no .py: --run_path still runs it as Python
            with open(script, "w") as f:
                f.write("import sys; print('run_path', __name__, sys.argv)\n")
            p = run(["--run_path", script, "b"], env={"PYTHON_EXEC": PY})
            self.assertEqual(p.returncode, 0, p.stderr)
            self.assertIn(f"[r0]: run_path __main__ ['{script}', 'b']", p.stdout)

    def test_module_entry_point(self):
        with tempfile.TemporaryDirectory() as d:
            os.makedirs(os.path.join(d, "pkg"))
            open(os.path.join(d, "pkg", "__init__.py"), "w").close()
            with open(os.path.join(d, "pkg", "job.py"), "w") as f:
                f.write("import sys; print('module', __name__, sys.argv[1:])\n")
            p = run(["-m", "pkg.job", "a"], env={"PYTHON_EXEC": PY, "PYTHONPATH": d})
            self.assertEqual(p.returncode, 0, p.stderr)
            self.assertIn("[r0]: module __main__ ['a']", p.stdout)


class Console(unittest.TestCase):
    CODE = ("import os, sys\n"
            "print('out of', os.environ['RANK'], flush=True)\n"
            "print('err of', os.environ['RANK'], file=sys.stderr, flush=True)\n")

    # A peer that sends garbage to the job's store for ~2.5 s (the server rate-limits its
    # warnings to one a second): the job's console gets one line about it, -v gets the rest.
    GARBAGE = ("import os, socket, time\n"
               "end = time.monotonic() + 2.5\n"
               "n = 0\n"
               "while time.monotonic() < end:\n"
               "    s = socket.create_connection((os.environ['MASTER_ADDR'], int(os.environ['MASTER_PORT'])))\n"
               "    s.sendall(bytes([200]))\n"
               "    s.settimeout(30); s.recv(1); s.close(); n += 1\n"
               "print('sent', n, flush=True)\n")

    def test_bad_peers_of_the_store_put_one_line_on_the_console(self):
        p = run(["--nproc_per_node=1"] + worker(self.GARBAGE))
        self.assertEqual(p.returncode, 0, p.stderr)
        lines = [l for l in p.stderr.splitlines() if "closing connection" in l]
        self.assertEqual(len(lines), 1, p.stderr)
        self.assertIn("only with -v", lines[0])
        p = run(["-v", "--nproc_per_node=1"] + worker(self.GARBAGE))
        self.assertEqual(p.returncode, 0, p.stderr)
        self.assertGreaterEqual(len([l for l in p.stderr.splitlines() if "closing connection" in l]), 2, p.stderr)

    def test_local_ranks_filter(self):
        p = run(["--nproc_per_node=3", "--local_ranks_filter=1"] + worker(self.CODE))
        self.assertEqual(p.returncode, 0, p.stderr)
        self.assertEqual([l for l in p.stdout.splitlines()], ["[r1]: out of 1"])
        self.assertIn("[r1]: err of 1", p.stderr)
        self.assertNotIn("[r0]", p.stderr)

    def test_log_dir_redirects_and_tee(self):
        with tempfile.TemporaryDirectory() as d:
            # rank 0: both streams to files only; rank 1: stdout to file and console.
            p = run(["--nproc_per_node=2", "--log_dir", d, "-r", "0:3", "-t", "1:1",
                     "--rdzv_id", "logs"] + worker(self.CODE))
            self.assertEqual(p.returncode, 0, p.stderr)
            base = os.path.join(run_dir(d, "logs"), "attempt_0")
            self.assertEqual(open(os.path.join(base, "0", "stdout.log")).read(), "out of 0\n")
            self.assertEqual(open(os.path.join(base, "0", "stderr.log")).read(), "err of 0\n")
            self.assertEqual(open(os.path.join(base, "1", "stdout.log")).read(), "out of 1\n")
            self.assertFalse(os.path.exists(os.path.join(base, "1", "stderr.log")))
            self.assertNotIn("[r0]", p.stdout + p.stderr.split("FAILED")[0])
            self.assertIn("[r1]: out of 1", p.stdout)
            self.assertIn("[r1]: err of 1", p.stderr)

    def test_log_dir_per_attempt(self):
        with tempfile.TemporaryDirectory() as d:
            p = run(["--max_restarts=1", "--log-dir", d, "--tee=3"] +
                    worker("import os; print('try', os.environ['TORCHELASTIC_RESTART_COUNT']); "
                           "raise SystemExit(os.environ['TORCHELASTIC_RESTART_COUNT'] == '0')"))
            self.assertEqual(p.returncode, 0, p.stderr)
            for n in range(2):
                with open(os.path.join(run_dir(d, "none"), f"attempt_{n}", "0", "stdout.log")) as f:
                    self.assertEqual(f.read(), f"try {n}\n")

    def test_partial_last_line_is_printed(self):
        p = run(worker("import sys; sys.stdout.write('no newline')"))
        self.assertEqual(p.stdout, "[r0]: no newline\n")


class LogDisk(unittest.TestCase):
    """--log_dir on a full filesystem: a 64 KiB tmpfs mounted in a private mount namespace
    (root, as CI runs), so nothing outside this test sees it."""
    LINES = 20000  # ~2.4 MB per stream and rank, far past the 64 KiB disk
    CODE = ("import os, sys\n"
            "r = os.environ['RANK']\n"
            "for i in range(%d):\n"
            "    print(f'o{r} {i} ' + 'x' * 100)\n"
            "    print(f'e{r} {i} ' + 'y' * 100, file=sys.stderr)\n"
            "sys.stdout.flush(); sys.stderr.flush()\n"
            "raise SystemExit(int(os.environ.get('EXIT_WITH', '0')))\n" % LINES)

    def run_on_full_disk(self, nproc, extra_env=None):
        if os.geteuid() != 0 or not shutil.which("unshare"):
            self.skipTest("needs root and unshare(1) for a private tmpfs (CI has both)")
        d = tempfile.mkdtemp()
        self.addCleanup(shutil.rmtree, d, True)
        logs = os.path.join(d, "logs")
        os.mkdir(logs)
        script = ('mount -t tmpfs -o size=64k ddprun-test "$1" && shift && "$@"; rc=$?; '
                  # the files as they were left, copied out of the namespace before it goes
                  'cp -r "$LOGS"/. "$OUT"/; exit $rc')
        out = os.path.join(d, "copy")
        os.mkdir(out)
        env = dict(os.environ, LOGS=logs, OUT=out, **(extra_env or {}))
        p = subprocess.run(["unshare", "-m", "sh", "-c", script, "sh", logs, DDPRUN, f"--nproc_per_node={nproc}",
                            "--log_dir", logs, "-r", "3", "--rdzv_id", "full"] + worker(self.CODE),
                           capture_output=True, text=True, env=env, timeout=HANG_GUARD * 3)
        return p, run_dir(out, "full")

    def assert_nothing_lost(self, p, rdir, nproc):
        for rank in range(nproc):
            for tag, console, name in (("o", p.stdout, "stdout.log"), ("e", p.stderr, "stderr.log")):
                path = os.path.join(rdir, "attempt_0", str(rank), name)
                in_file = read_text(path).splitlines() if os.path.exists(path) else []
                seen = {l.split()[1] for l in in_file if l.startswith(f"{tag}{rank} ") and len(l.split()) == 3
                        and len(l.split()[2]) == 100}
                prefix = f"[r{rank}]: {tag}{rank} "
                seen |= {l[len(prefix):].split()[0] for l in console.splitlines() if l.startswith(prefix)}
                missing = self.LINES - len(seen)
                self.assertEqual(missing, 0, f"{missing} lines of r{rank} {name} in neither file nor console")

    def test_full_log_disk_is_reported_and_nothing_is_lost(self):
        p, rdir = self.run_on_full_disk(2)
        self.assertEqual(p.returncode, 74, p.stderr[-3000:])
        self.assert_nothing_lost(p, rdir, 2)
        warnings = [l for l in p.stderr.splitlines() if "cannot write log file" in l]
        self.assertEqual(len(warnings), 4, warnings)  # once per file, not once per write
        for rank in range(2):
            for name in ("stdout.log", "stderr.log"):
                self.assertEqual(sum(f"/attempt_0/{rank}/{name} (ENOSPC" in w for w in warnings), 1, warnings)
        self.assertIn("LOGS INCOMPLETE", p.stderr)
        # Redirected (-r 3): the console got a stream from its file's first failure on; the
        # summary says exactly which lines each file alone has (none when its first write
        # failed), and the console has the rest.
        file_only = 0
        for rank in range(2):
            for tag, console, name in (("o", p.stdout, "stdout.log"), ("e", p.stderr, "stderr.log")):
                said = [l for l in p.stderr.splitlines() if f"/attempt_0/{rank}/{name}: ENOSPC" in l]
                self.assertEqual(len(said), 1, p.stderr[-3000:])
                m = re.search(r"lines 1-(\d+) of the stream are in this file only, the console has every line "
                              r"from line (\d+) on", said[0])
                n = int(m.group(1)) if m else 0
                if m:
                    self.assertEqual(int(m.group(2)), n + 1)
                file_only += n
                in_file = read_text(os.path.join(rdir, "attempt_0", str(rank), name)).splitlines()
                self.assertEqual(in_file[:n], [f"{tag}{rank} {i} " + ("x" if tag == "o" else "y") * 100
                                               for i in range(n)])
                prefix = f"[r{rank}]: {tag}{rank} "
                on_console = [int(l[len(prefix):].split()[0]) for l in console.splitlines() if l.startswith(prefix)]
                self.assertEqual(on_console, list(range(n, self.LINES)), f"r{rank} {name}")
        self.assertGreater(file_only, 0)  # 64 KiB of lines went to the files first
        self.assertNotIn("the console got every line", p.stderr)
        self.assertIn("each file below says which lines it alone has", p.stderr)
        self.assertIn("the workers succeeded; exit code 74", p.stderr)

    def test_a_failed_run_keeps_its_code_and_reports_the_lost_logs(self):
        # One worker: a second one would be stopped (SIGTERM) before it wrote everything.
        p, rdir = self.run_on_full_disk(1, {"EXIT_WITH": "3"})
        self.assertEqual(p.returncode, 3, p.stderr[-3000:])
        self.assert_nothing_lost(p, rdir, 1)
        self.assertIn("FAILED: worker rank", p.stderr)
        self.assertIn("LOGS INCOMPLETE", p.stderr)


class Ports(unittest.TestCase):
    def test_busy_default_port_falls_back_to_a_free_one(self):
        # Hold 29500 when we can; when another process has it, hold another port and make it
        # the default through ddprun's test seam (29500's holder may let go any time).
        blocker = socket.socket()
        env = {}
        try:
            blocker.bind(("", 29500))
        except OSError:
            blocker.bind(("", 0))
            env["DDPRUN_DEFAULT_STORE_PORT"] = str(blocker.getsockname()[1])
        blocker.listen()
        held = blocker.getsockname()[1]
        try:
            p = run(worker("import os; print('port', os.environ['MASTER_PORT'])"), env=env)
            self.assertEqual(p.returncode, 0, p.stderr)
            port = p.stdout.split("port ")[1].strip()
            self.assertNotEqual(port, str(held))
            self.assertIn(f"port {held} is taken", p.stderr)
        finally:
            blocker.close()

    def test_busy_explicit_port_is_an_error(self):
        blocker = socket.socket()
        blocker.bind(("", 0))
        blocker.listen()
        port = blocker.getsockname()[1]
        try:
            p = run([f"--master_port={port}", "--no_python", "true"])
            self.assertNotEqual(p.returncode, 0)
            self.assertIn(f"port {port}", p.stderr)
        finally:
            blocker.close()

    def test_store_is_reachable_by_workers(self):
        code = ("import os, socket\n"
                "s = socket.create_connection((os.environ['MASTER_ADDR'], int(os.environ['MASTER_PORT'])), 5)\n"
                "print('connected'); s.close()\n")
        p = run(["--nproc_per_node=2", "--standalone"] + worker(code))
        self.assertEqual(p.returncode, 0, p.stderr)
        self.assertEqual(p.stdout.count("connected"), 2)


    def test_c10d_single_node_hosts_the_store_on_the_endpoint_port(self):
        for _ in range(3):  # the port is free when picked; a test beside this one may take it before ddprun
            with socket.socket() as s:
                s.bind(("", 0))
                port = s.getsockname()[1]
            p = run(["--rdzv_backend=c10d", f"--rdzv-endpoint=localhost:{port}", "--nnodes=1:1"] +
                    worker("import os; print('store', os.environ['MASTER_ADDR'], os.environ['MASTER_PORT'])"))
            if "in use" not in p.stderr:
                break
        self.assertEqual(p.returncode, 0, p.stderr)
        self.assertIn(f"[r0]: store 127.0.0.1 {port}", p.stdout)


# Overlapped restart: rank 1 of attempt 0 fails once rank 0 ignores SIGTERM (FIFO handshake);
# rank 0 then prints a tick every 20 ms until it is SIGKILLed. Workers leave JSON marks
# (CLOCK_MONOTONIC time, pid) in $MARKS; attempt 1's workers note whether the old rank 0 was
# still alive when they started, and with WAIT_OLD its rank 0 waits (pidfd) for it to go.
OVERLAP_WORKER = r"""
import json, os, select, signal, subprocess, sys, time
marks = os.environ['MARKS']
attempt, rank = os.environ['TORCHELASTIC_RESTART_COUNT'], os.environ['RANK']
def mark(name, **kw):
    kw.update(t=time.monotonic(), pid=os.getpid())
    tmp = os.path.join(marks, name + '.tmp')
    with open(tmp, 'w') as f: json.dump(kw, f)
    os.rename(tmp, os.path.join(marks, name))
def state(pid):
    try:
        with open('/proc/%d/stat' % pid) as f: return f.read().rsplit(')', 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError): return 'gone'  # gone between open and read: ESRCH
def alive(pid):  # Z: a zombie; X: being reaped by ddprun at this very moment (/proc still lists it)
    return state(pid) not in ('gone', 'Z', 'X', 'x')
if attempt == '0':
    if rank == '1':
        open(os.path.join(marks, 'fifo')).read()  # returns once rank 0 ignores SIGTERM
        mark('fail1'); sys.exit(3)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    if os.environ.get('GRANDCHILD'):
        g = subprocess.Popen(['sleep', '300'], preexec_fn=lambda: signal.signal(signal.SIGTERM, signal.SIG_IGN))
        mark('grandchild', gpid=g.pid)
    mark('old0')
    with open(os.path.join(marks, 'fifo'), 'w') as f: f.write('ignoring SIGTERM')
    for i in range(3000):  # 60 s at most: SIGKILL ends it long before
        print('old r0 tick', i, flush=True); time.sleep(0.02)
    sys.exit(7)
with open(os.path.join(marks, 'old0')) as f: old = json.load(f)['pid']
mark('new' + rank, old_alive=alive(old))
print('new', rank, 'started', flush=True)
if rank == '0' and os.environ.get('WAIT_OLD'):
    try:
        fd = os.pidfd_open(old)
        select.select([fd], [], [], 30)
    except ProcessLookupError:
        pass
    mark('old0_gone', still_alive=alive(old), state=state(old))
"""


class Restart(unittest.TestCase):
    GRACE = 5.0  # leaves a slow, loaded CI host room to start the replacements inside it

    def setUp(self):
        self.dir = tempfile.TemporaryDirectory()
        self.marks = os.path.join(self.dir.name, "marks")
        os.makedirs(self.marks)
        os.mkfifo(os.path.join(self.marks, "fifo"))
        self.script = os.path.join(self.dir.name, "worker.py")
        with open(self.script, "w") as f:
            f.write(OVERLAP_WORKER)

    def tearDown(self):
        self.dir.cleanup()

    def mark(self, name):
        with open(os.path.join(self.marks, name)) as f:
            return json.load(f)

    def args(self, *extra, grace=GRACE):
        return (["--nproc_per_node=2", "--max_restarts=1", f"--shutdown_timeout={grace}"] + list(extra) +
                ["--no_python", PY, self.script])

    def test_overlap_starts_replacements_before_the_old_worker_is_gone(self):
        logs = os.path.join(self.dir.name, "logs")
        p = run(self.args("--log_dir", logs, "--tee=1", "--rdzv_id=ov"),
                env={"MARKS": self.marks, "WAIT_OLD": "1"})
        self.assertEqual(p.returncode, 0, p.stderr)  # attempt 1's verdict, not the old rank 0's
        fail, old0, gone = self.mark("fail1"), self.mark("old0"), self.mark("old0_gone")
        new = [self.mark("new0"), self.mark("new1")]
        for n in new:
            self.assertTrue(n["old_alive"], "a replacement started only after the old rank 0 was gone")
            self.assertLess(n["t"], gone["t"])
            self.assertLess(n["t"] - fail["t"], self.GRACE, "the replacement waited for the grace period")
        self.assertFalse(gone["still_alive"], gone)
        # SIGKILLed after --shutdown_timeout (it ignores SIGTERM), not before, not much after.
        self.assertGreaterEqual(gone["t"] - fail["t"], self.GRACE)
        self.assertLess(gone["t"] - fail["t"], self.GRACE + 8)
        self.assertIn(f"attempt 0's worker(s) r0 (pid {old0['pid']}) still running", p.stderr)
        self.assertIn("(--shutdown_timeout): SIGKILL", p.stderr)
        self.assertIn("restarting the worker group: attempt 1", p.stderr)
        self.assertNotIn("FAILED", p.stderr)
        # The old rank 0 went on printing, with its prefix, after the replacements started ...
        out = p.stdout.splitlines()
        first_new = min(i for i, l in enumerate(out) if l in ("[r0]: new 0 started", "[r1]: new 1 started"))
        late_ticks = [l for l in out[first_new:] if l.startswith("[r0]: old r0 tick")]
        self.assertTrue(late_ticks, p.stdout)
        self.assertFalse([l for l in out if "old r0 tick" in l and not l.startswith("[r0]: old r0 tick")])
        # ... and into its own attempt's log file, not attempt 1's.
        with open(os.path.join(run_dir(logs, "ov"), "attempt_0", "0", "stdout.log")) as f:
            old_log = f.read().splitlines()
        self.assertEqual(old_log, [l[len("[r0]: "):] for l in out if l.startswith("[r0]: old r0 tick")])
        with open(os.path.join(run_dir(logs, "ov"), "attempt_1", "0", "stdout.log")) as f:
            self.assertEqual(f.read(), "new 0 started\n")
        self.assertFalse(pid_alive(old0["pid"]))

    def test_overlap_off_waits_for_the_old_group(self):
        p = run(self.args("--overlap_restart=0"), env={"MARKS": self.marks, "WAIT_OLD": "1"})
        self.assertEqual(p.returncode, 0, p.stderr)
        fail = self.mark("fail1")
        for n in (self.mark("new0"), self.mark("new1")):
            self.assertFalse(n["old_alive"], "a replacement started while the old rank 0 ran")
            self.assertGreaterEqual(n["t"] - fail["t"], self.GRACE)  # the grace, then SIGKILL, then start
        self.assertNotIn("still stopping in the background", p.stderr)
        self.assertNotIn("still running", p.stderr)
        self.assertFalse(pid_alive(self.mark("old0")["pid"]))

    def test_overlap_off_from_the_environment(self):
        p = run(self.args(), env={"MARKS": self.marks, "PET_OVERLAP_RESTART": "false"})
        self.assertEqual(p.returncode, 0, p.stderr)
        self.assertFalse(self.mark("new0")["old_alive"])

    def test_ddprun_exit_kills_a_retiring_worker(self):
        # Attempt 1 succeeds at once; the old rank 0 would have 30 s of grace left.
        t0 = time.monotonic()
        p = run(self.args(grace=30), env={"MARKS": self.marks})
        self.assertEqual(p.returncode, 0, p.stderr)
        self.assertLess(time.monotonic() - t0, 20)
        self.assertTrue(self.mark("new0")["old_alive"])
        self.assertFalse(pid_alive(self.mark("old0")["pid"]), "the retiring worker outlived ddprun")

    def test_signal_while_retiring_stops_everything(self):
        d = Live(self.args(grace=30), env={"MARKS": self.marks, "WAIT_OLD": "1"})
        d.wait_for(lambda l: l == "[r0]: new 0 started")
        old = self.mark("old0")["pid"]
        self.assertTrue(pid_alive(old))
        d.p.send_signal(signal.SIGTERM)
        rc, err = d.finish()
        self.assertEqual(rc, 128 + signal.SIGTERM, err)
        self.assertIn("stopped by SIGTERM", err)
        self.assertFalse(pid_alive(old), "the retiring worker outlived ddprun")

    def test_sigkill_of_ddprun_kills_retiring_groups(self):
        # The old rank 0's child ignores SIGTERM too: only the guardian can kill it.
        d = Live(self.args(grace=30), env={"MARKS": self.marks, "WAIT_OLD": "1", "GRANDCHILD": "1"})
        d.wait_for(lambda l: l == "[r0]: new 0 started")
        old, grandchild = self.mark("old0")["pid"], self.mark("grandchild")["gpid"]
        self.addCleanup(kill_if_alive, grandchild)  # when the test fails: leave nothing behind
        self.assertTrue(pid_alive(old) and pid_alive(grandchild))
        d.p.kill()
        d.p.wait(timeout=HANG_GUARD)
        d.p.stdout.close()
        d.p.stderr.close()
        self.assertTrue(wait_pid_gone(old, 10), "the retiring worker survived ddprun's SIGKILL")
        self.assertTrue(wait_pid_gone(grandchild, 10), "the retiring worker's child survived ddprun's SIGKILL")


class BadInput(unittest.TestCase):
    def check_usage_error(self, args, *words):
        with tempfile.TemporaryDirectory() as d:
            marker = os.path.join(d, "started")
            p = run(args + ["--no_python", "touch", marker] if args and args[-1] != "--" else args)
            self.assertEqual(p.returncode, 2, p.stderr)
            self.assertEqual(len(p.stderr.strip().splitlines()), 1, p.stderr)
            for w in words:
                self.assertIn(w, p.stderr)
            self.assertFalse(os.path.exists(marker), "a worker was started")
            self.assertEqual(p.stdout, "")

    def test_unknown_flag(self):
        self.check_usage_error(["--bogus"], "--bogus")

    def test_bad_nproc(self):
        self.check_usage_error(["--nproc_per_node=abc"], "--nproc_per_node", "cpu, gpu or auto")

    def test_bad_nnodes(self):
        self.check_usage_error(["--nnodes=3:2"], "--nnodes", "MIN:MAX")

    def test_elastic_range_needs_c10d(self):
        self.check_usage_error(["--nnodes=2:3"], "--rdzv_backend=c10d")

    def test_bad_tee(self):
        self.check_usage_error(["--tee=7"], "--tee")

    def test_bad_overlap_restart(self):
        self.check_usage_error(["--overlap_restart=maybe"], "--overlap_restart", "maybe")

    def test_empty_flag_value_is_refused_not_taken_from_the_next_argument(self):
        for flag in ("--rdzv_token_file=", "--rdzv_id=", "--log_dir="):
            self.check_usage_error([flag], flag, "empty value")

    def test_bad_rdzv_id_is_refused_before_the_log_directory_is_made(self):
        with tempfile.TemporaryDirectory() as d:
            logs = os.path.join(d, "logs")
            for bad_id in ("a\tb", "j" * 129):
                self.check_usage_error(["--log_dir", logs, "--rdzv_id", bad_id], "--rdzv_id")
                self.assertFalse(os.path.exists(logs), os.listdir(d))

    def test_missing_entry_point(self):
        p = run(["--nproc_per_node=2"])
        self.assertEqual(p.returncode, 2)
        self.assertIn("entry point", p.stderr)
        self.assertEqual(len(p.stderr.strip().splitlines()), 1)

    def test_program_not_found(self):
        p = run(["--no_python", "no-such-program-ddprun"])
        self.assertEqual(p.returncode, 2)
        self.assertIn("no-such-program-ddprun", p.stderr)

    def test_help(self):
        p = run(["--help"])
        self.assertEqual(p.returncode, 0)
        self.assertIn("--nproc-per-node", p.stdout)
        # The exit-code table (README's "Exit codes" says the same).
        self.assertIn("Exit codes:", p.stdout)
        for code in ("74 the workers succeeded but log files lost output", "124 --exit_barrier_timeout"):
            self.assertIn(code, " ".join(p.stdout.split()))


def read_text(path):
    with open(path) as f:
        return f.read()


def fake_gpu_machine(root, gpus):
    """A fake /proc + /sys under `root` for --numa-binding (DDPRUN_SYSFS_ROOT): `gpus` is a list of
    (pci address, numa node); node N's cpulist is nodes[N]."""
    def write(rel, text):
        os.makedirs(os.path.dirname(os.path.join(root, rel)), exist_ok=True)
        with open(os.path.join(root, rel), "w") as f:
            f.write(text)
    for pci, node, cpus in gpus:
        write(f"proc/driver/nvidia/gpus/{pci}/information", f"Model: \t\t NVIDIA H200\nGPU UUID: \t GPU-{pci}\n")
        write(f"sys/bus/pci/devices/{pci}/numa_node", f"{node}\n")
        write(f"sys/devices/system/node/node{node}/cpulist", ",".join(map(str, cpus)) + "\n")


class Parity(unittest.TestCase):
    """torchrun 2.11's behaviour, matched."""

    def test_non_executable_script_without_py_runs_with_python(self):
        with tempfile.TemporaryDirectory() as d:
            script = os.path.join(d, "job")
            with open(script, "w") as f:
                f.write("import sys; print('python ran', sys.argv[1:])\n")
            os.chmod(script, 0o644)
            p = run(["--nproc_per_node=1", script, "a"], env={"PYTHON_EXEC": PY})
            self.assertEqual(p.returncode, 0, p.stderr)
            self.assertIn("[r0]: python ran ['a']", p.stdout)
            # The start line says which interpreter (path and version).
            version = "%d.%d" % sys.version_info[:2]
            self.assertIn(f"Python workers: {PY} (Python {version}", p.stderr)

    def test_programs_say_no_interpreter(self):
        p = run(["--no_python", "true"])
        self.assertEqual(p.returncode, 0, p.stderr)
        self.assertNotIn("Python workers", p.stderr)

    def test_directory_and_non_executable_with_no_python_say_what_they_are(self):
        with tempfile.TemporaryDirectory() as d:
            script = os.path.join(d, "job")
            open(script, "w").close()
            os.chmod(script, 0o644)
            for args, words in (([d], ["is a directory without __main__.py"]),
                                (["--no_python", d], ["is a directory"]),
                                (["--no_python", script], ["exists but is not executable", "chmod +x"])):
                p = run(args)
                self.assertEqual(p.returncode, 2, p.stderr)
                self.assertNotIn("cannot find", p.stderr)
                for w in words:
                    self.assertIn(w, p.stderr)

    def test_missing_module_says_how_to_pick_another_python(self):
        p = run(worker("import ddprun_no_such_module_xyz"))
        self.assertNotEqual(p.returncode, 0)
        self.assertNotIn("PYTHON_EXEC", p.stderr)  # --no_python: ddprun did not pick the interpreter
        with tempfile.TemporaryDirectory() as d:
            script = os.path.join(d, "imp.py")
            with open(script, "w") as f:
                f.write("import ddprun_no_such_module_xyz\n")
            p = run([script], env={"PYTHON_EXEC": PY})
            self.assertEqual(p.returncode, 1, p.stderr)
            summary = p.stderr[p.stderr.index("FAILED"):]
            self.assertIn("No module named", summary)
            self.assertIn("PYTHON_EXEC", summary)
            self.assertIn(PY, summary)

    def test_second_run_with_the_same_log_dir_keeps_the_first(self):
        import glob
        with tempfile.TemporaryDirectory() as d:
            for n in range(2):
                p = run(["--log_dir", d, "--tee=1"] + worker(f"print('run {n}')"))
                self.assertEqual(p.returncode, 0, p.stderr)
            runs = sorted(glob.glob(os.path.join(d, "none_*")))
            self.assertEqual(len(runs), 2, runs)
            texts = sorted(read_text(os.path.join(r, "attempt_0", "0", "stdout.log")) for r in runs)
            self.assertEqual(texts, ["run 0\n", "run 1\n"])

    def test_duplicate_filters_copy_matching_teed_lines(self):
        code = ("import os, sys\n"
                "r = os.environ['RANK']\n"
                "print('apple', r); print('pear', r); print('or,ange', r)\n"
                "print('apple err', r, file=sys.stderr)\n")
        with tempfile.TemporaryDirectory() as d:
            # Rank 2 is tee'd but hidden by --local_ranks_filter: not copied, as in torchrun.
            p = run(["--nproc_per_node=3", "--log_dir", d, "--rdzv_id=f", "--tee=1", "--local_ranks_filter=0,1",
                     "--duplicate-stdout-filters", "apple,or,,ange", "--duplicate_stderr_filters=apple"] + worker(code))
            self.assertEqual(p.returncode, 0, p.stderr)
            attempt = os.path.join(run_dir(d, "f"), "attempt_0")
            got = sorted(read_text(os.path.join(attempt, "filtered_stdout.log")).splitlines())
            self.assertEqual(got, ["[r0]: apple 0", "[r0]: or,ange 0", "[r1]: apple 1", "[r1]: or,ange 1"])
            # stderr was not tee'd: nothing copied; the file exists (empty), as torchrun makes it.
            self.assertEqual(read_text(os.path.join(attempt, "filtered_stderr.log")), "")

    def test_logs_specs_and_event_log_handler_are_accepted(self):
        p = run(["--logs-specs=custom", "--event_log_handler=console"] + worker("print('ran')"))
        self.assertEqual(p.returncode, 0, p.stderr)
        self.assertIn("[r0]: ran", p.stdout)
        self.assertIn("--logs_specs=custom", p.stderr)
        self.assertIn("--event_log_handler=console", p.stderr)

    def test_numa_binding_binds_each_rank_to_its_gpus_node(self):
        allowed = sorted(os.sched_getaffinity(0))
        a, b = allowed[0], allowed[-1]
        code = "import os; print('cpus', sorted(os.sched_getaffinity(0)))"
        with tempfile.TemporaryDirectory() as root:
            # Listed out of PCI order: local rank 0 is the lower address (node 1 here).
            fake_gpu_machine(root, [("0000:c1:00.0", 0, [a]), ("0000:18:00.0", 1, [b])])
            p = run(["--nproc_per_node=2", "--numa-binding=node"] + worker(code), env={"DDPRUN_SYSFS_ROOT": root})
            self.assertEqual(p.returncode, 0, p.stderr)
            self.assertIn(f"[r0]: cpus [{b}]", p.stdout)
            self.assertIn(f"[r1]: cpus [{a}]", p.stdout)
            # CUDA_VISIBLE_DEVICES picks and orders the GPUs.
            p = run(["--nproc_per_node=1", "--numa_binding=node"] + worker(code),
                    env={"DDPRUN_SYSFS_ROOT": root, "CUDA_VISIBLE_DEVICES": "1"})
            self.assertEqual(p.returncode, 0, p.stderr)
            self.assertIn(f"[r0]: cpus [{a}]", p.stdout)

    def test_numa_binding_without_gpus_fails_before_any_worker(self):
        with tempfile.TemporaryDirectory() as root:
            marker = os.path.join(root, "started")
            p = run(["--numa-binding=node", "--no_python", "touch", marker], env={"DDPRUN_SYSFS_ROOT": root})
            self.assertEqual(p.returncode, 1, p.stderr)
            self.assertIn("no NVIDIA GPU visible", p.stderr)
            self.assertIn("drop --numa-binding", p.stderr)
            self.assertFalse(os.path.exists(marker))


# ---- coordination: one path for one node and many ----

def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Agent:
    """ddprun in the background; its stderr read line by line with a deadline (the log lines
    are the events the tests wait for)."""

    def __init__(self, args, env=None):
        full_env = dict(os.environ)
        full_env.update(env or {})
        self.p = subprocess.Popen([DDPRUN] + args, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                  env=full_env)
        self.err = b""

    def wait_err(self, text, timeout=HANG_GUARD):
        deadline = time.monotonic() + timeout
        sel = selectors.DefaultSelector()
        sel.register(self.p.stderr, selectors.EVENT_READ)
        while text.encode() not in self.err:
            left = deadline - time.monotonic()
            if left <= 0:
                raise AssertionError(f"timed out waiting for {text!r}; stderr: {self.err.decode()}")
            if sel.select(left):
                chunk = os.read(self.p.stderr.fileno(), 65536)
                if not chunk:
                    raise AssertionError(f"stderr closed before {text!r}; stderr: {self.err.decode()}")
                self.err += chunk
        sel.close()

    def finish(self, timeout=HANG_GUARD):
        out, err = self.p.communicate(timeout=timeout)
        self.err += err
        return self.p.returncode, out.decode(), self.err.decode()

    def interrupt_and_time(self, signo=signal.SIGINT):
        t0 = time.monotonic()
        self.p.send_signal(signo)
        rc, out, err = self.finish(timeout=30)
        return rc, err, time.monotonic() - t0


def agent_protocol_frame(msg_type, fields):
    import struct
    payload = bytes([msg_type]) + struct.pack("<Q", len(fields))
    for k, v in fields.items():
        k, v = k.encode(), str(v).encode()
        payload += struct.pack("<Q", len(k)) + k + struct.pack("<Q", len(v)) + v
    return struct.pack("<I", len(payload)) + payload


def read_frame(sock):
    import struct
    def exact(n):
        b = b""
        while len(b) < n:
            c = sock.recv(n - len(b))
            if not c:
                raise AssertionError("the rendezvous closed the connection")
            b += c
        return b
    n = struct.unpack("<I", exact(4))[0]
    body = exact(n)
    t, count = body[0], struct.unpack("<Q", body[1:9])[0]
    fields, off = {}, 9
    for _ in range(count):
        kl = struct.unpack("<Q", body[off:off + 8])[0]; off += 8
        k = body[off:off + kl].decode(); off += kl
        vl = struct.unpack("<Q", body[off:off + 8])[0]; off += 8
        fields[k] = body[off:off + vl].decode(); off += vl
    return t, fields


def where_lines(out):
    """[rank, world size, MASTER_PORT, restart count] of every 'where' line (prefixes cut)."""
    # Only the workers' own lines ("where R W PORT N"): other output may contain the word too.
    return [list(m.groups()) for m in re.finditer(r"\bwhere (\d+) (\d+) (\d+) (\d+)\b", out)]


WORKER_SAYS_WHERE = ("import os; print('where', os.environ['RANK'], os.environ['WORLD_SIZE'], os.environ['MASTER_PORT'],"
                     " os.environ['TORCHELASTIC_RESTART_COUNT'], flush=True)")


class Coordination(unittest.TestCase):
    def c10d(self, port, nnodes=2, extra=(), conf=""):
        return [f"--nnodes={nnodes}", "--rdzv_backend=c10d", f"--rdzv_endpoint=127.0.0.1:{port}",
                "--rdzv_id=e2e", "--rdzv_conf=last_call_timeout=1,join_timeout=60" + conf] + list(extra)

    def test_sigint_while_connecting_ends_within_a_second(self):
        port = free_port()  # nothing listens there; this agent does not host
        a = Agent([f"--nnodes=2", "--rdzv_backend=c10d", f"--rdzv_endpoint=127.0.0.1:{port}",
                   "--rdzv_conf=is_host=0,join_timeout=600", "--no_python", "true"])
        a.wait_err("connecting to the rendezvous")
        rc, err, took = a.interrupt_and_time()
        self.assertEqual(rc, 128 + signal.SIGINT, err)
        self.assertLess(took, 3.0, err)  # the contract is 1 s; generous for a loaded CI host
        self.assertIn("received SIGINT", err)
        self.assertIn("stopped while connecting to the rendezvous endpoint", err)

    def test_sigterm_while_joining_a_round_that_never_fills(self):
        port = free_port()
        a = Agent(["-v"] + self.c10d(port) + ["--no_python", "true"])
        a.wait_err("joining the next round")
        rc, err, took = a.interrupt_and_time(signal.SIGTERM)
        self.assertEqual(rc, 128 + signal.SIGTERM, err)
        self.assertLess(took, 3.0, err)
        self.assertIn("stopped by SIGTERM", err)

    def test_sigint_while_the_host_waits_for_the_other_nodes(self):
        # A second "node" speaks the agent protocol by hand: it joins, succeeds, and keeps its
        # connection, so the hosting agent waits for it at the end (bounded at 60 s).
        port = free_port()
        a = Agent(self.c10d(port, conf=",heartbeat_timeout=300") + ["--no_python", "true"])
        a.wait_err("hosting the rendezvous")
        s = socket.create_connection(("127.0.0.1", port))
        s.sendall(bytes([0]) + (0x52504444).to_bytes(4, "little"))
        s.sendall(agent_protocol_frame(1, {"run_id": "e2e", "node_id": "fake", "host": "127.0.0.1",
                                           "local_world_size": 1, "min_nodes": 2, "max_nodes": 2,
                                           "last_call_ms": 1000, "join_timeout_ms": 60000,
                                           "heartbeat_timeout_ms": 300000}))
        t, f = read_frame(s)
        self.assertEqual(t, 20, f)  # ROUND
        s.sendall(agent_protocol_frame(4, {"round": f["round"]}))  # SUCCEEDED
        a.wait_err("waiting for the other nodes to finish")
        rc, err, took = a.interrupt_and_time()
        s.close()
        self.assertLess(took, 3.0, err)
        self.assertIn("not waiting for the other nodes", err)
        self.assertEqual(rc, 0, err)  # the job itself succeeded

    def test_unparsable_endpoint_is_a_usage_error(self):
        p = run(["--nnodes=2", "--rdzv_backend=c10d", "--rdzv_endpoint=::::garbage:::", "--no_python", "true"])
        self.assertEqual(p.returncode, 2, p.stderr)
        self.assertIn("expected HOST[:PORT]", p.stderr)

    def two_agents(self, port, first_extra=(), second_extra=()):
        a = Agent(self.c10d(port, extra=first_extra) + worker(WORKER_SAYS_WHERE))
        b = Agent(self.c10d(port, extra=second_extra) + worker(WORKER_SAYS_WHERE))
        ra, oa, ea = a.finish()
        rb, ob, eb = b.finish()
        self.assertEqual((ra, rb), (0, 0), ea + eb)
        self.assertEqual(sorted(w[0] for w in where_lines(oa + ob)), ["0", "1"], oa + ob)
        return ea, eb

    def test_two_agents_on_one_host_join_a_standing_ddprund(self):
        ddprund = os.path.join(os.path.dirname(os.path.dirname(DDPRUN)), "rendezvous", "ddprund")
        if not os.path.exists(ddprund):
            self.skipTest(f"no ddprund at {ddprund}")
        port = free_port()
        d = subprocess.Popen([ddprund, "--host", "127.0.0.1", "--port", str(port)], stdout=subprocess.DEVNULL,
                             stderr=subprocess.DEVNULL)
        try:
            deadline = time.monotonic() + HANG_GUARD
            while True:  # listening yet? (a connect, not a sleep, decides)
                try:
                    socket.create_connection(("127.0.0.1", port)).close()
                    break
                except OSError:
                    if time.monotonic() > deadline:
                        raise
                    time.sleep(0.02)
            ea, eb = self.two_agents(port)
            self.assertIn("joining the rendezvous served there as a client", ea)
            self.assertIn("joining the rendezvous served there as a client", eb)
        finally:
            d.kill()
            d.wait()

    def test_two_agents_on_one_host_the_first_hosts(self):
        port = free_port()
        a = Agent(self.c10d(port) + worker(WORKER_SAYS_WHERE))
        a.wait_err("hosting the rendezvous")
        b = Agent(self.c10d(port) + worker(WORKER_SAYS_WHERE))
        rb, ob, eb = b.finish()
        ra, oa, ea = a.finish()
        self.assertEqual((ra, rb), (0, 0), ea + eb)
        self.assertIn("joining the rendezvous served there as a client", eb)
        self.assertEqual(sorted(w[0] for w in where_lines(oa + ob)), ["0", "1"], oa + ob)

    def test_is_host_given_with_the_port_taken_is_a_clear_error(self):
        port = free_port()
        a = Agent(self.c10d(port) + ["--no_python", "true"])
        a.wait_err("hosting the rendezvous")
        p = run(self.c10d(port, conf=",is_host=1") + ["--no_python", "true"])
        a.p.send_signal(signal.SIGINT)
        a.finish()
        self.assertEqual(p.returncode, 1, p.stderr)
        self.assertIn("cannot listen there", p.stderr)

    def test_a_node_with_another_max_restarts_is_refused_naming_both(self):
        port = free_port()
        a = Agent(self.c10d(port, extra=["--max_restarts=3"]) + ["--no_python", "true"])
        a.wait_err("hosting the rendezvous")
        p = run(self.c10d(port, extra=["--max_restarts=1"]) + ["--no_python", "true"])
        a.p.send_signal(signal.SIGINT)
        a.finish()
        self.assertEqual(p.returncode, 1, p.stderr)
        self.assertIn("--max_restarts: the job runs with 3, this agent asked for 1", p.stderr)

    def test_static_multi_node_keeps_master_port_in_every_attempt(self):
        port = free_port()
        code = (WORKER_SAYS_WHERE + "\nimport sys\n"
                "sys.exit(3 if os.environ['TORCHELASTIC_RESTART_COUNT'] == '0' and os.environ['RANK'] == '1' else 0)")
        args = lambda n: ["--nnodes=2", f"--node_rank={n}", "--master_addr=127.0.0.1", f"--master_port={port}",
                          "--max_restarts=1"] + worker(code)
        a = Agent(args(0))
        b = Agent(args(1))
        ra, oa, ea = a.finish()
        rb, ob, eb = b.finish()
        self.assertEqual((ra, rb), (0, 0), ea + eb)
        seen = where_lines(oa + ob)
        # rank 0 of attempt 0 may be stopped before it prints: rank 1 fails at once
        self.assertTrue({("1", "0"), ("0", "1"), ("1", "1")} <= {(w[0], w[3]) for w in seen}, oa + ob)
        self.assertEqual({w[2] for w in seen}, {str(port)}, oa + ob)

    def test_an_import_error_says_why_it_stops_with_restarts_left(self):
        p = run(["--nproc_per_node=2", "--max_restarts=3"] + worker("import no_such_module"))
        self.assertEqual(p.returncode, 1)
        self.assertIn("not retried: attempts 0 and 1", p.stderr)
        self.assertIn("2 of 3 restarts left unused", p.stderr)
        self.assertNotIn("no restarts left", p.stderr)


    def test_a_single_node_store_answers_no_rendezvous_and_listens_on_loopback(self):
        code = ("import os, socket, struct\n"
                "s = socket.create_connection((os.environ['MASTER_ADDR'], int(os.environ['MASTER_PORT'])), 5)\n"
                "body = bytes([1]) + struct.pack('<Q', 1) + struct.pack('<Q', 6) + b'run_id' + struct.pack('<Q', 1) + b'x'\n"
                "s.sendall(bytes([0]) + (0x52504444).to_bytes(4, 'little') + struct.pack('<I', len(body)) + body)\n"
                "s.settimeout(10)\n"
                "try:\n"
                "    got = s.recv(100)\n"
                "except ConnectionResetError:\n"
                "    got = b''\n"
                "print('answer', len(got), flush=True)\n"
                # the listeners on MASTER_PORT (state 0A), by local address, while the store runs
                "port = '%04X' % int(os.environ['MASTER_PORT'])\n"
                "ls = [l.split()[1].split(':')[0] for f in ('/proc/net/tcp', '/proc/net/tcp6') for l in open(f)\n"
                "      if l.split()[1].endswith(':' + port) and l.split()[3] == '0A']\n"
                "print('listeners', ' '.join(ls), flush=True)\n")
        p = run(["-v"] + worker(code))
        self.assertEqual(p.returncode, 0, p.stderr)
        self.assertIn("[r0]: answer 0", p.stdout)  # closed, no ROUND
        self.assertIn("[r0]: listeners 0100007F", p.stdout)  # 127.0.0.1 only (one per I/O thread)
        listeners = p.stdout.split("listeners ")[1].split("\n")[0].split()
        self.assertEqual(set(listeners), {"0100007F"}, p.stdout)


if __name__ == "__main__":
    DDPRUN = os.path.abspath(sys.argv.pop(1))
    unittest.main(verbosity=2)
