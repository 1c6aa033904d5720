#!/usr/bin/env python3
"""Preemption: Slurm's warning signal (SIGUSR1) and workers that stop for one (exit 99):
exit 99 and no restart, on one node and on two.

Run: test_preemption.py <path to ddprun> [unittest names] (harness.py says more).
"""
import os
import signal
import tempfile
import time
import unittest

import harness
from harness import run, worker, Live, wait_pid_gone, Agent, free_port


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
                "    open(os.environ['DDPRUN_PREEMPT_FILE'], 'w').write('preempted\\ncheckpoint step 7\\n')\n"
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
        self.assertIn("to resume from the checkpoint its workers saved (r1: step 7)", p.stderr)

    def test_exit_99_without_a_preemption_is_an_ordinary_failure(self):
        # No preemption signal and no announcement: 99 is the script's own code, and the restart
        # the user asked for is spent.
        code = ("import os, sys\n"
                "print('attempt', os.environ['TORCHELASTIC_RESTART_COUNT'], flush=True)\n"
                "sys.exit(99 if os.environ['TORCHELASTIC_RESTART_COUNT'] == '0' else 0)\n")
        p = run(["--nproc_per_node=2", "--max_restarts=1"] + worker(code))
        self.assertEqual(p.returncode, 0, p.stderr)
        self.assertIn("[r0]: attempt 1", p.stdout)
        self.assertNotIn("PREEMPTED", p.stderr)

    def test_a_preemption_without_a_saved_checkpoint_says_so(self):
        d = Live(["--nproc_per_node=1"] + worker(PREEMPTIBLE))
        d.wait_ready(1)
        d.p.send_signal(signal.SIGUSR1)
        rc, err = d.finish()
        self.assert_preempted(rc, err)
        self.assertIn("no worker of this node said it saved a checkpoint", err)
        self.assertNotIn("to resume from the checkpoint", err)

    def test_sigterm_whose_workers_stop_with_99_exits_99(self):
        code = PREEMPTIBLE.replace("print('got SIGTERM', os.environ['RANK'], flush=True); sys.exit(1)",
                                   "print('checkpoint on SIGTERM', flush=True); "
                                   "open(os.environ['DDPRUN_PREEMPT_FILE'], 'w').write('preempted\\n'); sys.exit(99)")
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


if __name__ == "__main__":
    harness.main()
