#!/usr/bin/env python3
"""The files in a worker's run directory that the agent reads or writes (the progress file, the
preemption announcement, the error file, the stack dumps, the run record): whatever a worker
does to them (truncates one, replaces it with a FIFO or a link to /dev/zero), the agent neither
crashes, nor blocks, nor grows: it ends with its summary and the exit code the worker's exit
gives, its memory small.

Run: test_worker_files.py <path to ddprun> [unittest names] (harness.py says more).
"""
import os
import signal
import subprocess
import sys
import tempfile
import unittest

import harness
from harness import worker, Guarded, RSS_CAP


# Finds the worker's own paths: <run>/attempt_<n>/<local rank>/error.json.
PATHS = (
    "import os, sys, time\n"
    "err = os.environ['TORCHELASTIC_ERROR_FILE']\n"
    "rank_dir = os.path.dirname(err)\n"
    "run_dir = os.path.dirname(os.path.dirname(rank_dir))\n"
    "attempt = int(os.environ['TORCHELASTIC_RESTART_COUNT'])\n"
    "preempt = os.environ['DDPRUN_PREEMPT_FILE']\n"
    "progress = os.environ['DDPRUN_PROGRESS_FILE']\n"
    "def tick_for(seconds):\n"  # as ddprun.progress() does, through the file (a worker without the module)
    "    fd = os.open(progress, os.O_RDWR)\n"
    "    end, n = time.monotonic() + seconds, 0\n"
    "    while time.monotonic() < end:\n"
    "        n += 1; os.pwrite(fd, n.to_bytes(8, 'little'), 8); time.sleep(0.05)\n"
    "    os.close(fd)\n"
)


class WorkerFiles(unittest.TestCase):
    """A worker truncating its progress file, or leaving a FIFO or a link to /dev/zero where the
    agent reads or writes: the agent ends with its summary and the right exit code, memory small."""

    def setUp(self):
        self.log_dir = tempfile.mkdtemp(prefix="ddprun-wfiles-")
        self.addCleanup(subprocess.run, ["rm", "-rf", self.log_dir])

    def ddprun(self, flags, code, env=None):
        return Guarded(self, [f"--log_dir={self.log_dir}", "--nproc_per_node=1"] + flags + worker(PATHS + code), env)

    def assert_failed(self, rc, err, code):
        self.assertEqual(rc, code, err[-3000:])
        self.assertIn("FAILED", err, err[-3000:])
        summary = err[err.rindex("FAILED"):]
        self.assertIn(f"exit code {code}", summary, err[-3000:])

    def test_truncated_progress_file_the_agent_survives_restarts_and_sums_up(self):
        code = ("if attempt == 0:\n"
                "    tick_for(1.5)\n"
                "    os.truncate(progress, 0)\n"
                "    print('truncated', flush=True)\n"
                "    time.sleep(3)\n"  # the agent reads the counter about once a second meanwhile
                "sys.exit(3)\n")
        a = self.ddprun(["--hang_timeout=60", "--max_restarts=1"], code)
        rc, err = a.finish()
        self.assert_failed(rc, err, 3)
        self.assertIn("[r0]: truncated", a.stdout())
        self.assertIn("restarting", err)

    def test_truncated_progress_file_a_stall_is_still_a_hang(self):
        code = ("tick_for(3)\n"
                "os.truncate(progress, 0)\n"
                "print('truncated', flush=True)\n"
                "time.sleep(600)\n")
        a = self.ddprun(["--hang_timeout=2"], code)
        rc, err = a.finish()
        self.assertIn("hang: r0 (local rank 0", err)
        self.assertNotEqual(rc, 0, err)
        self.assertIn("FAILED", err)

    def test_a_fifo_where_the_stack_dump_goes_is_replaced(self):
        code = ("stacks = os.path.join(run_dir, 'stacks', 'hang_attempt_0')\n"
                "os.makedirs(stacks)\n"
                "os.mkfifo(os.path.join(stacks, 'r0.txt'))\n"
                "tick_for(3)\n"
                "time.sleep(600)\n")
        a = self.ddprun(["--hang_timeout=2"], code)
        rc, err = a.finish()
        self.assertIn("hang: r0 (local rank 0", err)
        self.assertNotEqual(rc, 0, err)
        run_dir = os.listdir(self.log_dir)
        self.assertEqual(len(run_dir), 1, run_dir)
        # The planted directory is left alone: the stacks go into a new one beside it.
        stacks = os.path.join(self.log_dir, run_dir[0], "stacks")
        made = sorted(d for d in os.listdir(stacks) if d.startswith("hang_attempt_0-"))
        self.assertEqual(len(made), 1, os.listdir(stacks))
        dump = os.path.join(stacks, made[0], "r0.txt")
        self.assertTrue(os.path.isfile(dump) and not os.path.islink(dump), dump)
        self.assertIn(os.path.join("stacks", made[0]), err)  # the summary names where they went
        with open(dump) as f:
            self.assertTrue(f.readline().startswith("# r0 (local rank 0"), dump)

    def test_a_fifo_for_the_run_record_is_replaced(self):
        code = ("if attempt == 0:\n"
                "    os.mkfifo(os.path.join(run_dir, 'workers.tmp'))\n"
                "    sys.exit(3)\n"
                "sys.exit(0)\n")
        a = self.ddprun(["--max_restarts=1"], code)
        rc, err = a.finish()
        self.assertEqual(rc, 0, err)
        self.assertIn("restarting", err)

    def test_preempt_file_a_fifo_then_sigterm_the_agent_ends(self):
        # The worker exits 99 (a preemption) without a valid announcement: the agent reads the
        # file then. A FIFO is no announcement; the agent ends as it does when no file is there.
        code = ("if os.environ.get('MAKE_FIFO'):\n"
                "    os.mkfifo(preempt)\n"
                "import signal\n"
                "signal.signal(signal.SIGTERM, lambda s, f: sys.exit(99))\n"
                "print('ready', flush=True)\n"
                "while True: signal.pause()\n")
        results = []
        for make_fifo in ("", "1"):
            a = self.ddprun([], code, {"MAKE_FIFO": make_fifo})
            a.wait_for("ready")
            a.p.send_signal(signal.SIGTERM)
            results.append(a.finish())
        (rc_plain, err_plain), (rc_fifo, err_fifo) = results
        self.assertEqual(rc_fifo, rc_plain, err_fifo)
        self.assertIn("received SIGTERM", err_fifo)
        self.assertIn("=" * 72, err_fifo)  # the summary

    def test_preempt_file_linked_to_dev_zero_memory_stays_small(self):
        code = ("os.symlink('/dev/zero', preempt)\n"
                "sys.exit(99)\n")
        a = self.ddprun([], code)
        rc, err = a.finish()
        # No announcement (a link is not followed): exit 99 alone is an ordinary failure.
        self.assert_failed(rc, err, 99)
        self.assertLess(a.peak_rss, RSS_CAP)
        print(f"note: the agent's resident memory peaked at {a.peak_rss / 2**20:.1f} MiB", file=sys.stderr)

    def test_error_file_a_fifo_the_failure_is_summed_up(self):
        code = ("os.mkfifo(err)\n"
                "sys.exit(3)\n")
        a = self.ddprun([], code)
        rc, err = a.finish()
        self.assert_failed(rc, err, 3)

    def test_error_file_linked_to_dev_zero_is_not_read(self):
        code = ("os.symlink('/dev/zero', err)\n"
                "sys.exit(3)\n")
        a = self.ddprun([], code)
        rc, err = a.finish()
        self.assert_failed(rc, err, 3)
        self.assertNotIn("content (not JSON)", err, err[-3000:])

    def test_a_flood_of_flight_recorder_files_is_counted_not_listed(self):
        code = ("d = os.path.join(run_dir, 'nccl_trace')\n"
                "for i in range(5000):\n"
                "    open(os.path.join(d, f'junk_{i:05}'), 'w').close()\n"
                "sys.exit(3)\n")
        a = self.ddprun(["--nccl_flight_recorder"], code)
        rc, err = a.finish()
        self.assert_failed(rc, err, 3)
        self.assertIn("NCCL flight recorder dumps (5000)", err, err[-3000:])
        self.assertIn(f"... and {5000 - 64} more", err, err[-3000:])
        self.assertLess(err.count("junk_"), 100, err[-3000:])


if __name__ == "__main__":
    harness.main()
