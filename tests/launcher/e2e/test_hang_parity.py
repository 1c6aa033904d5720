#!/usr/bin/env python3
"""A hang is a worker failure like any other: the same JSON events, `ddprun status` last
failure and metrics after a hang restart (--hang_timeout) as after a crash restart.

Run: test_hang_parity.py <path to ddprun> [unittest names] (harness.py says more).
"""
import json
import re
import unittest
import urllib.request

import harness
from harness import HANG_GUARD, StatusJob, free_port

# Every worker ticks its progress file (hang.h's page: word 1 is the counter) and says
# "ready <pid> attempt <n>", then waits for the file named by its argument. Once "<arg>.fail"
# exists, rank 1 of attempt 0 crashes (exit 3) or stops ticking, as MODE says.
WORKER = ("import mmap, os, struct, sys, time\n"
          "MODE = {mode!r}\n"
          "attempt = os.environ['TORCHELASTIC_RESTART_COUNT']\n"
          "fd = os.open(os.environ['DDPRUN_PROGRESS_FILE'], os.O_RDWR)\n"
          "page = mmap.mmap(fd, 4096)\n"
          "print('ready', os.getpid(), 'attempt', attempt, flush=True)\n"
          "ticks = 0\n"
          "while not os.path.exists(sys.argv[1]):\n"
          "    if os.environ['RANK'] == '1' and attempt == '0' and os.path.exists(sys.argv[1] + '.fail'):\n"
          "        if MODE == 'crash':\n"
          "            sys.exit(3)\n"
          "        time.sleep(3600)\n"
          "    ticks += 1\n"
          "    struct.pack_into('<Q', page, 8, ticks)\n"
          "    time.sleep(0.05)\n")


def metric(text, name, labels):
    m = re.search(rf"^{name}{'{' + labels + '}' if labels else ''} ([0-9.e+]+)$", text, re.M)
    return float(m.group(1)) if m else None


class HangLikeFailure(unittest.TestCase):
    def restart_after(self, mode):
        """(worker_failed events, the status' agent, the metrics) of a job whose rank 1 fails
        by `mode` in attempt 0, read while attempt 1 runs."""
        port = free_port()
        job = StatusJob(self, WORKER.format(mode=mode),
                        extra=["--max_restarts=1", "--hang_timeout=2", "--log_format=json", f"--metrics_port={port}"])
        job.pids(0)
        open(job.stop + ".fail", "w").close()
        job.pids(1)
        agent = json.loads(job.status("--json", f"--rdzv_id={job.run_id}").stdout)["agents"][0]
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=HANG_GUARD) as r:
            metrics = r.read().decode()
        rc, err = job.end()
        self.assertEqual(rc, 0, err)
        ours = [json.loads(l) for l in err.splitlines() if l.startswith("{")]
        failed = [r for r in ours if r.get("event") == "worker_failed"]
        return failed, agent, metrics

    def test_a_hang_restart_reports_what_a_crash_restart_does(self):
        seen = {mode: self.restart_after(mode) for mode in ("crash", "hang")}
        for mode, (failed, agent, metrics) in seen.items():
            with self.subTest(mode=mode):
                self.assertEqual(len(failed), 1, f"{mode}: one worker_failed event: {failed}")
                f = failed[0]
                self.assertEqual((f["level"], f["rank"], f["fields"]["local_rank"], f["fields"]["attempt"]),
                                 ("warning", 1, 1, 0))
                self.assertIn("worker r1", f["message"])
                self.assertIsNotNone(agent["last_failure"], f"{mode}: `ddprun status` shows the last failure")
                self.assertEqual(agent["last_failure"]["rank"], 1)
                self.assertIn("(attempt 0)", agent["last_failure"]["what"])
                self.assertEqual((agent["attempt"], agent["restarts_used"]), (1, 1))
                self.assertEqual(metric(metrics, "ddprun_restarts_total", 'cause="worker_failure"'), 1.0, metrics)
                self.assertEqual(metric(metrics, "ddprun_attempt", ""), 1.0, metrics)
        crash, hang = seen["crash"], seen["hang"]
        self.assertEqual(crash[0][0]["fields"]["exit_code"], 3)
        self.assertEqual((crash[0][0]["fields"]["cause"], hang[0][0]["fields"]["cause"]), ("exit_code", "hang"))
        self.assertIn("exit code 3", crash[1]["last_failure"]["what"])
        self.assertIn("hung", hang[1]["last_failure"]["what"])
        self.assertEqual(metric(crash[2], "ddprun_worker_failures_total", 'cause="exit_code"'), 1.0)
        self.assertEqual(metric(hang[2], "ddprun_worker_failures_total", 'cause="hang"'), 1.0)
        # The same keys in both events.
        keys = [set(r[0][0]["fields"]) for r in (crash, hang)]
        self.assertEqual(keys[0], keys[1])


if __name__ == "__main__":
    harness.main()
