#!/usr/bin/env python3
"""The end-of-run resource table and its JSON lines for the attempt that ended, however it
ended (a failure with no restart left, a restart, a preemption, a hang): every rank of the node,
the failed one marked; and a hang's own JSON event.

Run: test_attempt_usage.py <path to ddprun> [unittest names] (harness.py says more).
"""
import json
import os
import re
import signal
import tempfile
import unittest

import harness
from harness import Live, run, worker

# Rank 1 fails at once, as an import error does; rank 0 would sleep for a minute.
IMPORT_ERROR = ("import os, time\n"
                "if os.environ['RANK'] == '1':\n"
                "    import no_such_module_here\n"
                "time.sleep(60)\n")
# Both ranks burn 1 s of CPU in attempt 0, then rank 1 fails (exit 3); in attempt 1 rank 1
# fails at once (exit 4).
BURN_THEN_FAIL = ("import os, sys, time\n"
                  "if os.environ['TORCHELASTIC_RESTART_COUNT'] == '0':\n"
                  "    t = time.process_time()\n"
                  "    while time.process_time() - t < 1.0: pass\n"
                  "if os.environ['RANK'] == '1':\n"
                  "    sys.exit(3 if os.environ['TORCHELASTIC_RESTART_COUNT'] == '0' else 4)\n"
                  "time.sleep(60)\n")
# Each rank ticks its progress file (hang.h's page, word 1); rank 1 stops after a few ticks.
HANG = ("import mmap, os, struct, time\n"
        "fd = os.open(os.environ['DDPRUN_PROGRESS_FILE'], os.O_RDWR)\n"
        "page = mmap.mmap(fd, 4096)\n"
        "for ticks in range(1, 100000):\n"
        "    if os.environ['RANK'] == '1' and ticks > 5: time.sleep(3600)\n"
        "    struct.pack_into('<Q', page, 8, ticks)\n"
        "    time.sleep(0.05)\n")


def table(stderr):
    """(attempt, {rank: row cells}, the row lines, the 'earlier attempts' line or '') of the one table."""
    lines = stderr.splitlines()
    head = [i for i, l in enumerate(lines) if re.match(r"^\[ddprun\] info: resource use of attempt \d+ on ", l)]
    assert len(head) == 1, f"expected one resource table:\n{stderr}"
    i = head[0]
    attempt = int(re.search(r"attempt (\d+)", lines[i]).group(1))
    rows, text, earlier = {}, {}, ""
    for l in lines[i + 2:]:
        if l.startswith("    earlier attempts:"):
            earlier = l
            break
        if not re.match(r"^    r\d+ ", l):
            break
        rows[int(l.split()[0][1:])] = l.split()
        text[int(l.split()[0][1:])] = l
    return attempt, rows, text, earlier


def usage_events(stderr):
    """{rank: fields} of the rank_usage JSON lines, and every line that is not JSON."""
    events, not_json = {}, []
    for l in stderr.splitlines():
        try:
            r = json.loads(l)
        except ValueError:
            not_json.append(l)
            continue
        if r.get("event") == "rank_usage":
            assert r["rank"] not in events, f"two rank_usage lines for r{r['rank']}:\n{stderr}"
            events[r["rank"]] = r["fields"]
    return events, not_json


class AttemptUsage(unittest.TestCase):
    def assert_failed_rank_marked(self, stderr, failed_rank, what, attempt=0, ranks=(0, 1)):
        got_attempt, rows, text, _ = table(stderr)
        self.assertEqual(got_attempt, attempt, stderr)
        self.assertEqual(sorted(rows), list(ranks), stderr)
        for r in ranks:
            if r == failed_rank:
                self.assertTrue(text[r].endswith("<- failed: " + what), stderr)
            else:
                self.assertNotIn("failed", text[r], stderr)

    def assert_failed_rank_in_json(self, stderr, failed_rank, what, attempt=0, ranks=(0, 1)):
        events, _ = usage_events(stderr)
        self.assertEqual(sorted(events), list(ranks), stderr)
        for r, f in events.items():
            self.assertEqual(f["attempt"], attempt, stderr)
            self.assertEqual(f["failed"], r == failed_rank, stderr)
            self.assertEqual(f.get("failure"), what if r == failed_rank else None, stderr)
            self.assertTrue(f["measured"], stderr)
            self.assertIn("cpu_s", f)

    def test_import_error_without_restarts_lists_every_rank(self):
        args = ["--nproc_per_node=2", "--max_restarts=0"] + worker(IMPORT_ERROR)
        p = run(args)
        self.assertEqual(p.returncode, 1, p.stderr)
        self.assert_failed_rank_marked(p.stderr, 1, "exit code 1")
        p = run(["--log_format=json"] + args)
        self.assertEqual(p.returncode, 1, p.stderr)
        self.assert_failed_rank_in_json(p.stderr, 1, "exit code 1")

    def test_program_failure_lists_every_rank(self):
        args = ["--nproc_per_node=2", "--max_restarts=0", "--no_python", "sh", "-c",
                'if [ "$RANK" = 1 ]; then exit 1; fi; exec sleep 60']
        p = run(args)
        self.assertEqual(p.returncode, 1, p.stderr)
        self.assert_failed_rank_marked(p.stderr, 1, "exit code 1")
        p = run(["--log_format=json"] + args)
        self.assertEqual(p.returncode, 1, p.stderr)
        self.assert_failed_rank_in_json(p.stderr, 1, "exit code 1")

    def test_after_a_restart_the_table_is_the_last_attempts(self):
        args = ["--nproc_per_node=2", "--max_restarts=1"] + worker(BURN_THEN_FAIL)
        p = run(args)
        self.assertEqual(p.returncode, 4, p.stderr)
        self.assert_failed_rank_marked(p.stderr, 1, "exit code 4", attempt=1)
        _, rows, _, earlier = table(p.stderr)
        # Attempt 0's ranks burnt 1 s of CPU each: totalled apart, not in the rows.
        m = re.match(r"^    earlier attempts: 2 workers, ([0-9.]+) s of CPU$", earlier)
        self.assertIsNotNone(m, p.stderr)
        self.assertGreaterEqual(float(m.group(1)), 1.9, p.stderr)
        for r in rows.values():
            self.assertLess(float(r[3]), 0.95, p.stderr)
        p = run(["--log_format=json"] + args)
        self.assertEqual(p.returncode, 4, p.stderr)
        self.assert_failed_rank_in_json(p.stderr, 1, "exit code 4", attempt=1)
        for f in usage_events(p.stderr)[0].values():
            self.assertLess(f["cpu_s"], 0.95, p.stderr)

    def test_preemption_lists_every_rank(self):
        code = "import signal\nprint('ready', flush=True)\nwhile True: signal.pause()\n"
        for fmt in ("text", "json"):
            with self.subTest(fmt=fmt):
                d = Live([f"--log_format={fmt}", "--nproc_per_node=2", "--preempt_signals=SIGTERM"] + worker(code))
                d.wait_ready(2)
                d.p.send_signal(signal.SIGTERM)
                rc, err = d.finish()
                self.assertEqual(rc, 99, err)
                if fmt == "text":
                    attempt, rows, text, _ = table(err)
                    self.assertEqual((attempt, sorted(rows)), (0, [0, 1]), err)
                    self.assertFalse([l for l in text.values() if "failed" in l], err)
                    self.assertNotIn("-", [r[1] for r in rows.values()], err)  # every rank measured
                else:
                    events, _ = usage_events(err)
                    self.assertEqual(sorted(events), [0, 1], err)
                    self.assertEqual({(f["failed"], f["measured"]) for f in events.values()}, {(False, True)}, err)


class HangEvent(unittest.TestCase):
    def test_a_hang_is_one_json_event_and_no_raw_stack_text(self):
        with tempfile.TemporaryDirectory() as logs:
            p = run(["--log_format=json", "--nproc_per_node=2", "--max_restarts=0", "--hang_timeout=2",
                     "--log_dir", logs] + worker(HANG))
            self.assertNotEqual(p.returncode, 0, p.stderr)
            events, not_json = usage_events(p.stderr)
            self.assertEqual(not_json, [], "every line of ddprun's stderr is JSON")
            recs = [json.loads(l) for l in p.stderr.splitlines()]
            hang = [r for r in recs if r["event"] == "hang"]
            self.assertEqual(len(hang), 1, p.stderr)
            f = hang[0]["fields"]
            self.assertEqual((hang[0]["level"], f["attempt"], f["stuck_ranks"]), ("error", 0, "1"), p.stderr)
            ticks = dict(t.split("=") for t in f["ticks"].split(","))
            self.assertEqual(sorted(ticks), ["r0", "r1"], f)
            self.assertGreater(int(ticks["r0"]), int(ticks["r1"]), f)
            self.assertEqual(f["timeout_s"], 2)
            self.assertTrue(os.path.isdir(f["stacks_dir"]), f)
            self.assertTrue(f["stacks_dir"].startswith(logs), f)
            failed = [r for r in recs if r["event"] == "worker_failed"]
            self.assertEqual([(r["rank"], r["fields"]["cause"]) for r in failed], [(1, "hang")], p.stderr)
            self.assertEqual(sorted(events), [0, 1], p.stderr)
            self.assertEqual((events[1]["failed"], events[1]["failure"]), (True, "hung"), p.stderr)
            self.assertFalse(events[0]["failed"], p.stderr)
            # The stacks stay in their folder: no line of the stream is a stack's text.
            self.assertNotIn("stack of the stuck rank(s)", p.stderr)


if __name__ == "__main__":
    harness.main()
