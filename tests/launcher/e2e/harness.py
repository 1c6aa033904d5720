"""What the end-to-end tests of ddprun share: running the binary (to completion, or live with its
output read line by line against a deadline), watching processes, the workers' code.

Each test_*.py module here is run on its own, against one built binary:
    python3 tests/launcher/e2e/test_<concern>.py <path to ddprun> [unittest names, e.g. Exit.test_true_exits_0]
ctest runs one test per unittest.TestCase class, found in every test_*.py module (tests/launcher/
CMakeLists.txt): launcher.e2e.<Class>. A test module holds only TestCase classes; helpers go here.

Synchronisation is by events (a worker's "ready" line on ddprun's stdout, a pidfd becoming
readable), never by sleeping; time bounds only guard against hangs.
"""
import glob
import os
import re
import selectors
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import unittest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "pylib"))
# For the test modules: a free port, and the agent protocol written by hand.
from ddprun_testlib import (PYLIB, AGENT_HELLO, JOIN, SUCCEEDED, ROUND, agent_frame,  # noqa: E402,F401
                            read_agent_frame, free_port)

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


class Tmux:
    """One tmux server of our own (-L), one window running `command` in a shell, sized 150x40."""

    def __init__(self, command):
        self.sock = f"ddprun-test-{os.getpid()}-{time.monotonic_ns()}"
        self.dir = tempfile.mkdtemp(prefix="ddprun-tmux-")
        self.status = os.path.join(self.dir, "status")
        # The exit status goes to a file; the shell then waits, so the screen stays readable.
        shell = f"{command}; echo $? > {shlex.quote(self.status)}; sleep 600"
        self.tmux("new-session", "-d", "-s", "t", "-x", "150", "-y", "40", shell)

    def tmux(self, *args):
        return subprocess.run(["tmux", "-L", self.sock, "-f", "/dev/null"] + list(args), capture_output=True,
                              text=True, check=True, timeout=HANG_GUARD)

    def screen(self):
        return self.tmux("capture-pane", "-p", "-t", "t", "-S", "-200").stdout

    def keys(self, text):
        self.tmux("send-keys", "-t", "t", "-l", text)
        self.tmux("send-keys", "-t", "t", "Enter")

    def wait_screen(self, predicate, what, timeout=HANG_GUARD):
        deadline = time.monotonic() + timeout
        while True:
            s = self.screen()
            if predicate(s):
                return s
            if time.monotonic() > deadline:
                raise AssertionError(f"timed out waiting for {what}; the screen:\n{s}")
            time.sleep(0.02)

    def exit_status(self, timeout=HANG_GUARD):
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                with open(self.status) as f:
                    text = f.read().strip()
                if text:
                    return int(text)
            except FileNotFoundError:
                pass
            time.sleep(0.05)
        raise AssertionError(f"ddprun did not end; the screen:\n{self.screen()}")

    def close(self):
        subprocess.run(["tmux", "-L", self.sock, "kill-server"], capture_output=True)
        shutil.rmtree(self.dir, ignore_errors=True)


def in_terminal(args):
    """The shell command that runs ddprun with `args` (each quoted)."""
    return " ".join(shlex.quote(a) for a in [DDPRUN] + args)


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


def read_text(path):
    with open(path) as f:
        return f.read()


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


class StatusJob:
    """A job under ddprun for `ddprun status`, with a runtime directory of its own
    (XDG_RUNTIME_DIR, removed at the test's end); its workers run `code` with one argument, the
    file that stops them (`stop`). Workers print "ready <pid> attempt <n>" (see pids())."""

    def __init__(self, test, code, nproc=2, extra=(), xdg=None, env=None):
        self.xdg = xdg or tempfile.mkdtemp(prefix="ddprun-status-")
        test.addCleanup(shutil.rmtree, self.xdg, True)
        self.stop = os.path.join(self.xdg, "stop")
        self.run_id = f"status-{os.getpid()}-{time.monotonic_ns()}"
        self.live = Live([f"--nproc_per_node={nproc}", f"--rdzv_id={self.run_id}", *extra]
                         + worker(code) + [self.stop], env=dict(env or {}, XDG_RUNTIME_DIR=self.xdg))
        test.addCleanup(self.end)

    def pids(self, attempt=0, n=2):
        """{rank: pid} of the workers of `attempt`, once all `n` said they are ready."""
        pat = re.compile(rf"^\[r(\d+)\]: ready (\d+) attempt {attempt}$")
        self.live.wait_for(lambda _: sum(1 for x in self.live.lines if pat.match(x)) >= n)
        return {int(m.group(1)): int(m.group(2)) for m in map(pat.match, self.live.lines) if m}

    def status(self, *args, user=None):
        """`ddprun status args` of this job's runtime directory; `user`: as nobody (setpriv)."""
        cmd = (["setpriv", "--reuid=nobody", "--regid=nogroup", "--clear-groups"] if user else []) + \
            [DDPRUN, "status", *args]
        return subprocess.run(cmd, capture_output=True, text=True, timeout=HANG_GUARD,
                              env=dict(os.environ, XDG_RUNTIME_DIR=self.xdg))

    def end(self):
        """Stops the workers; (ddprun's exit code, its stderr)."""
        open(self.stop, "w").close()
        if self.live.p.poll() is None:
            try:
                return self.live.finish()
            except subprocess.TimeoutExpired:
                self.live.p.kill()
                self.live.p.wait()
        return self.live.p.returncode, ""


GUARD = 45.0          # Guarded: a hang is the failure; nothing is timed otherwise
# Guarded: the agent's resident memory stays far below this, sanitized builds included (a
# flood passes it within a second). No RLIMIT_AS: ASan and TSan reserve terabytes of address space.
RSS_CAP = 512 << 20


class Guarded:
    """ddprun in the background, its stdout and stderr collected, its resident memory sampled;
    killed (and the test failed) when it outlives GUARD or passes RSS_CAP."""

    def __init__(self, test, args, env=None):
        self.test = test
        self.p = subprocess.Popen([DDPRUN] + args, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                  env=dict(os.environ, **(env or {})))
        test.addCleanup(self.close)
        self.out, self.err = [], []
        self.readers = [threading.Thread(target=self._drain, args=(s, buf), daemon=True)
                        for s, buf in ((self.p.stdout, self.out), (self.p.stderr, self.err))]
        for t in self.readers:
            t.start()
        self.peak_rss = 0

    @staticmethod
    def _drain(stream, buf):
        for chunk in iter(lambda: stream.read1(65536), b""):
            buf.append(chunk)

    def stdout(self):
        return b"".join(self.out).decode(errors="replace")

    def stderr(self):
        return b"".join(self.err).decode(errors="replace")

    def kill(self):
        if self.p.poll() is None:
            self.p.kill()
            self.p.wait()

    def close(self):
        self.kill()
        for t in self.readers:
            t.join(timeout=GUARD)
        self.p.stdout.close()
        self.p.stderr.close()

    def _sample(self):
        try:
            with open(f"/proc/{self.p.pid}/status") as f:
                for line in f:
                    if line.startswith("VmRSS:"):
                        self.peak_rss = max(self.peak_rss, int(line.split()[1]) * 1024)
        except (FileNotFoundError, ProcessLookupError):
            pass

    def wait_for(self, text):
        deadline = time.monotonic() + GUARD
        while text not in self.stdout():
            self._check(deadline, f"{text!r} on stdout")
            time.sleep(0.02)

    def _check(self, deadline, what):
        self._sample()
        if self.peak_rss > RSS_CAP:
            self.kill()
            self.test.fail(f"the agent's memory passed {RSS_CAP >> 20} MiB ({self.peak_rss >> 20} MiB) waiting for "
                           f"{what}; stderr: {self.stderr()[-2000:]}")
        if time.monotonic() > deadline:
            self.kill()
            self.test.fail(f"the agent still runs after {GUARD:g} s waiting for {what} (blocked?); "
                           f"stderr: {self.stderr()[-2000:]}")

    def finish(self):
        """(exit code, stderr) once the agent ends within GUARD with its memory small."""
        deadline = time.monotonic() + GUARD
        while self.p.poll() is None:
            self._check(deadline, "its end")
            time.sleep(0.02)
        for t in self.readers:
            t.join(timeout=GUARD)
        err = self.stderr()
        self.test.assertGreaterEqual(self.p.returncode, 0, f"the agent died of a signal; stderr: {err[-2000:]}")
        return self.p.returncode, err


def main():
    """Runs the calling module's tests against the ddprun named by the first argument."""
    global DDPRUN
    if len(sys.argv) < 2 or sys.argv[1].startswith("-"):
        sys.exit(f"usage: {os.path.basename(sys.argv[0])} <path to ddprun> [unittest names]")
    DDPRUN = os.path.abspath(sys.argv.pop(1))
    if not os.access(DDPRUN, os.X_OK):
        sys.exit(f"{DDPRUN} is not an executable: give the built ddprun (build/launcher/ddprun)")
    unittest.main(module="__main__", verbosity=2)
