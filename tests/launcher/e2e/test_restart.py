#!/usr/bin/env python3
"""Overlapped restarts: the next attempt starts while the old workers are being stopped, and
nothing outlives ddprun.

Run: test_restart.py <path to ddprun> [unittest names] (harness.py says more).
"""
import json
import os
import signal
import tempfile
import time
import unittest

import harness
from harness import PY, HANG_GUARD, run, run_dir, Live, wait_pid_gone, pid_alive, kill_if_alive


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


if __name__ == "__main__":
    harness.main()
