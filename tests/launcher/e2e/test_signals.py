#!/usr/bin/env python3
"""Signals to ddprun and what its workers get: forwarding, the shutdown grace, SIGKILL of
ddprun itself, and no process or descriptor left behind.

Run: test_signals.py <path to ddprun> [unittest names] (harness.py says more).
"""
import json
import os
import signal
import subprocess
import tempfile
import time
import unittest

import harness
from harness import HANG_GUARD, run, worker, Live, wait_pid_gone, pid_alive, READY_AND_WAIT


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
        p = subprocess.Popen([harness.DDPRUN, "--nproc_per_node=1"] + worker(code), stdin=subprocess.PIPE,
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


if __name__ == "__main__":
    harness.main()
