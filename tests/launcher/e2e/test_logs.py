#!/usr/bin/env python3
"""Workers' output: the console prefixes and filters, --log_dir with redirects and tee, and a
full log disk.

Run: test_logs.py <path to ddprun> [unittest names] (harness.py says more).
"""
import json
import os
import re
import shutil
import subprocess
import tempfile
import unittest

import harness
from harness import HANG_GUARD, run, run_dir, worker, read_text


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
    # The first 50 lines of each stream (5 KiB) come alone, so they reach the files before the
    # flood fills the disk, however the agent's reads happen to chunk the rest.
    CODE = ("import os, sys, time\n"
            "r = os.environ['RANK']\n"
            "for i in range(%d):\n"
            "    print(f'o{r} {i} ' + 'x' * 100)\n"
            "    print(f'e{r} {i} ' + 'y' * 100, file=sys.stderr)\n"
            "    if i == 49: sys.stdout.flush(); sys.stderr.flush(); time.sleep(0.3)\n"
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
        p = subprocess.run(["unshare", "-m", "sh", "-c", script, "sh", logs, harness.DDPRUN, f"--nproc_per_node={nproc}",
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


class JsonLogs(unittest.TestCase):
    """--log_format=json: ddprun's own lines on stderr are JSON lines of one schema; workers'
    lines keep their own format."""
    MEMBERS = ["time", "level", "host", "node", "rank", "event", "message", "fields"]
    # Rank 1 fails with exit code 3 on attempt 0; every rank succeeds on attempt 1.
    CODE = ("import os, sys\n"
            "print('out of', os.environ['RANK'], flush=True)\n"
            "print('{\\\"not\\\": \\\"ours\\\"}', file=sys.stderr, flush=True)\n"
            "if os.environ['RANK'] == '1' and os.environ['TORCHELASTIC_RESTART_COUNT'] == '0': sys.exit(3)\n")

    def records(self, stderr):
        """ddprun's JSON lines, checked against the schema; the workers' lines apart."""
        ours, theirs = [], []
        for line in stderr.splitlines():
            if line.startswith("[r"):
                theirs.append(line)
                continue
            rec = json.loads(line)  # every other line is one JSON object
            self.assertEqual(list(rec), self.MEMBERS, line)
            self.assertRegex(rec["time"], r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{6}Z$")
            self.assertIn(rec["level"], ("debug", "info", "warning", "error", "critical"))
            self.assertTrue(rec["host"])
            self.assertTrue(rec["node"] is None or isinstance(rec["node"], int))
            self.assertTrue(rec["rank"] is None or isinstance(rec["rank"], int))
            self.assertIsInstance(rec["fields"], dict)
            ours.append(rec)
        return ours, theirs

    def test_a_restarted_job_as_json_lines(self):
        p = run(["--log_format=json", "--nproc_per_node=2", "--max_restarts=1", "--rdzv_id=jsonjob"] + worker(self.CODE))
        self.assertEqual(p.returncode, 0, p.stderr)
        ours, theirs = self.records(p.stderr)
        # The workers' lines are untouched, on both streams (rank 0's on attempt 0 may not come:
        # it can be stopped first).
        self.assertEqual(set(theirs), {'[r0]: {"not": "ours"}', '[r1]: {"not": "ours"}'})
        self.assertEqual(set(p.stdout.splitlines()), {"[r0]: out of 0", "[r1]: out of 1"})
        events = [r["event"] for r in ours]
        started = [r for r in ours if r["event"] == "attempt_started"]
        self.assertEqual([r["fields"]["attempt"] for r in started], [0, 1], events)
        for r in started:
            self.assertEqual((r["node"], r["fields"]["run_id"], r["fields"]["world_size"], r["fields"]["workers"]),
                             (0, "jsonjob", 2, 2))
            self.assertIsInstance(r["fields"]["rendezvous_ms"], (int, float))
        failed = [r for r in ours if r["event"] == "worker_failed"]
        self.assertEqual(len(failed), 1, events)
        f = failed[0]
        self.assertEqual((f["level"], f["rank"], f["node"], f["fields"]["exit_code"], f["fields"]["attempt"],
                          f["fields"]["local_rank"], f["fields"]["config_error"]), ("warning", 1, 0, 3, 0, 1, False))
        self.assertIn("worker r1", f["message"])
        self.assertIn("restart_notice", events)
        self.assertLess(events.index("worker_failed"), events.index("restart_notice"))
        self.assertEqual(events[-2:], ["job_succeeded", "agent_exit"])
        self.assertEqual(ours[-1]["fields"], {"exit_code": 0, "restarts": 1})

    def test_a_failed_job_ends_with_its_summary_as_one_line(self):
        code = "import sys; print('boom\\tdetail', file=sys.stderr, flush=True); sys.exit(7)"
        p = run(["--log_format", "json", "--nproc_per_node=1"] + worker(code))
        self.assertEqual(p.returncode, 7, p.stderr)
        ours, _ = self.records(p.stderr)
        summary = [r for r in ours if r["event"] == "summary"]
        self.assertEqual(len(summary), 1, p.stderr)
        self.assertEqual((summary[0]["level"], summary[0]["fields"]), ("error", {"exit_code": 7}))
        self.assertIn("FAILED: worker rank 0", summary[0]["message"])
        self.assertIn("boom\tdetail", summary[0]["message"])  # the worker's tail, escaped and read back
        self.assertEqual(ours[-1]["event"], "agent_exit")
        self.assertEqual(ours[-1]["fields"]["exit_code"], 7)

    def test_text_is_the_default_and_a_bad_value_is_refused(self):
        p = run(["--nproc_per_node=1", "--max_restarts=1"] + worker("import sys, os; sys.exit(0 if os.environ['TORCHELASTIC_RESTART_COUNT'] == '1' else 5)"))
        self.assertEqual(p.returncode, 0, p.stderr)
        self.assertIn("[ddprun] info: all 1 workers succeeded after 1 restart(s)", p.stderr)
        self.assertNotIn('{"time"', p.stderr)
        p = run(["--log_format=yaml", "--nproc_per_node=1"] + worker("pass"))
        self.assertEqual(p.returncode, 2, p.stderr)
        self.assertIn("--log_format", p.stderr)
        self.assertIn("text or json", p.stderr)
        # Set through the environment, as every flag can be.
        p = run(["--nproc_per_node=1"] + worker("pass"), env={"PET_LOG_FORMAT": "json"})
        self.assertEqual(p.returncode, 0, p.stderr)
        ours, _ = self.records(p.stderr)
        self.assertEqual([r["event"] for r in ours][-1], "agent_exit")


class UsageTable(unittest.TestCase):
    """The end-of-run table: each rank's wall and CPU time and peak memory, from the kernel's
    accounting of the reaped worker, and the all-reduce's share of the step and the part of it
    hidden behind backward, from the step statistics libddprun_worker leaves in the rank's
    progress file."""
    # Rank 1 touches 200 MiB and burns about half a second of CPU; rank 0 idles.
    CODE = ("import os, time\n"
            "if os.environ['RANK'] == '1':\n"
            "    b = bytearray(200 << 20)\n"
            "    for i in range(0, len(b), 4096): b[i] = 1\n"
            "    t = time.process_time()\n"
            "    while time.process_time() - t < 0.5: pass\n"
            "else:\n"
            "    time.sleep(0.3)\n")

    def test_text_table(self):
        p = run(["--nproc_per_node=2"] + worker(self.CODE))
        self.assertEqual(p.returncode, 0, p.stderr)
        lines = p.stderr.splitlines()
        head = [i for i, l in enumerate(lines) if l.startswith("[ddprun] info: resource use of attempt 0 on ")]
        self.assertEqual(len(head), 1, p.stderr)
        self.assertIn("(2 workers; no GPU sampled)", lines[head[0]])
        cols = lines[head[0] + 1].split()
        self.assertEqual(cols, ["rank", "wall", "CPU", "CPU/wall", "peak", "RSS"])
        rows = {l.split()[0]: l.split() for l in lines[head[0] + 2:head[0] + 4]}
        self.assertEqual(sorted(rows), ["r0", "r1"], p.stderr)
        cpu1 = float(rows["r1"][3])
        self.assertGreaterEqual(cpu1, 0.45, p.stderr)
        self.assertLess(float(rows["r0"][3]), cpu1, p.stderr)
        rss1 = float(rows["r1"][6]) * {"MiB": 1, "GiB": 1024}[rows["r1"][7]]
        self.assertGreaterEqual(rss1, 200, p.stderr)

    def test_gpu_columns_and_no_utilisation_warning_for_a_short_run(self):
        # NVML is a stand-in (tests/launcher/fake_nvml) answering from a file that each worker
        # fills itself: rank 0 on GPU 0 at 40%, rank 1 on GPU 1 at 95%; sampled every 2 s.
        fake = os.environ.get("DDPRUN_TEST_FAKE_NVML_DIR") or os.path.join(
            os.path.dirname(os.path.dirname(harness.DDPRUN)), "tests", "launcher", "fake_nvml")
        self.assertTrue(os.path.exists(os.path.join(fake, "libnvidia-ml.so.1")), f"build fake_nvml first: {fake}")
        with tempfile.TemporaryDirectory() as d:
            state = os.path.join(d, "nvml")
            open(state, "w").close()
            code = ("import os, time\n"
                    "r = int(os.environ['RANK'])\n"
                    "with open(os.environ['DDPRUN_FAKE_NVML_STATE'], 'a') as f:\n"
                    "    f.write(f'gpu {r} {40 if r == 0 else 95}\\nproc {r} {os.getpid()} {1 << 30}\\n')\n"
                    "time.sleep(5)\n")
            p = run(["--nproc_per_node=2"] + worker(code), env={"LD_LIBRARY_PATH": fake, "DDPRUN_FAKE_NVML_STATE": state})
        self.assertEqual(p.returncode, 0, p.stderr)
        lines = p.stderr.splitlines()
        head = [i for i, l in enumerate(lines) if "resource use of attempt 0" in l]
        self.assertEqual(len(head), 1, p.stderr)
        self.assertNotIn("no GPU sampled", lines[head[0]])
        self.assertEqual(lines[head[0] + 1].split()[-5:], ["RSS", "GPU", "GPU-s", "GPU", "util"])
        rows = {l.split()[0]: l.split() for l in lines[head[0] + 2:head[0] + 4]}
        self.assertEqual((rows["r0"][-4], rows["r0"][-1]), ("0", "40%"), p.stderr)
        self.assertEqual((rows["r1"][-4], rows["r1"][-1]), ("1", "95%"), p.stderr)
        self.assertGreater(float(rows["r1"][-3]), 1.0, p.stderr)  # GPU-seconds: 0.95 x at least 2 s
        # r0 ran at 40%, below --gpu_util_warn, but its GPU was sampled for seconds, not the
        # minute a judgement needs (mostly start-up): no warning (usage_report_test.cpp checks the
        # warning past that minute).
        self.assertFalse([l for l in lines if "mean GPU utilisation below" in l], p.stderr)

    def train(self):
        """libddprun_worker's example program (the all-reduce columns come from its Reducer)."""
        path = os.environ.get("DDPRUN_TEST_TRAIN") or os.path.join(
            os.path.dirname(os.path.dirname(harness.DDPRUN)), "worker_runtime", "train")
        self.assertTrue(os.access(path, os.X_OK), f"build train first: {path}")
        return path

    @staticmethod
    def percent(cell):
        """'25%' -> 25; the table's '<1%' and '>99%' -> 0.5 and 99.5."""
        return {"<1%": 0.5, ">99%": 99.5}.get(cell) or float(cell.rstrip("%"))

    def table(self, stderr, workers):
        lines = stderr.splitlines()
        head = [i for i, l in enumerate(lines) if "resource use of attempt 0 on " in l]
        self.assertEqual(len(head), 1, stderr)
        cols = lines[head[0] + 1].split()
        rows = {l.split()[0]: l.split() for l in lines[head[0] + 2:head[0] + 2 + workers]}
        return cols, rows

    def test_allreduce_columns_for_a_job_training_with_the_worker_library(self):
        train = self.train()
        # The shared-memory path with its fused step (here inline progress on few CPUs: nothing
        # hidden), and Gloo over TCP with the communication thread and an unfused step.
        for env, flags in (({}, []), ({"DDPRUN_SHM": "0"}, ["--fused-step", "0", "--progress", "thread"])):
            p = run(["--nproc_per_node=2", train, "--epochs", "3"] + flags, env=env)
            self.assertEqual(p.returncode, 0, p.stderr)
            cols, rows = self.table(p.stderr, 2)
            self.assertEqual(cols[-2:], ["all-reduce/step", "hidden"], p.stderr)
            self.assertEqual(sorted(rows), ["r0", "r1"], p.stderr)
            for r in rows.values():
                self.assertEqual(len(r), len(cols) + 2, p.stderr)  # "peak RSS" and its value are two words each
                share, hidden = self.percent(r[-2]), self.percent(r[-1])
                self.assertTrue(0 < share <= 100, p.stderr)
                self.assertTrue(0 <= hidden <= 100, p.stderr)
        # The same numbers in the JSON records, as fractions.
        p = run(["--log_format=json", "--nproc_per_node=2", train, "--epochs", "3"])
        self.assertEqual(p.returncode, 0, p.stderr)
        recs = [json.loads(l) for l in p.stderr.splitlines() if l.startswith("{")]
        usage = {r["rank"]: r["fields"] for r in recs if r["event"] == "rank_usage"}
        self.assertEqual(sorted(usage), [0, 1], p.stderr)
        for u in usage.values():
            self.assertTrue(0 < u["allreduce_share"] <= 1, u)
            self.assertTrue(0 <= u["allreduce_hidden"] <= 1, u)

    def test_a_worker_that_does_not_report_shows_a_dash(self):
        # Ranks 0 and 1 become a 2-rank `train` job of their own; rank 2 stays Python.
        train = self.train()
        code = ("import os, sys, time\n"
                "if os.environ['RANK'] != '2':\n"
                "    os.environ.update(WORLD_SIZE='2', LOCAL_WORLD_SIZE='2')\n"
                f"    os.execv({train!r}, [{train!r}, '--epochs', '3'])\n"
                "time.sleep(0.2)\n")
        p = run(["--nproc_per_node=3"] + worker(code))
        self.assertEqual(p.returncode, 0, p.stderr)
        cols, rows = self.table(p.stderr, 3)
        self.assertEqual(cols[-2:], ["all-reduce/step", "hidden"], p.stderr)
        self.assertEqual(rows["r2"][-2:], ["-", "-"], p.stderr)
        for r in ("r0", "r1"):
            self.assertTrue(0 < self.percent(rows[r][-2]) <= 100, p.stderr)
        # A Python job's workers get their progress file too (without --hang_timeout), and its
        # table has no such columns (test_text_table: none at all).
        p = run(["--nproc_per_node=1"] + worker("import os; print(os.path.basename(os.environ['DDPRUN_PROGRESS_FILE']))"))
        self.assertEqual(p.returncode, 0, p.stderr)
        self.assertIn("[r0]: progress", p.stdout)
        self.assertNotIn("all-reduce/step", p.stderr)

    def test_json_records_and_the_threshold_flag(self):
        p = run(["--log_format=json", "--nproc_per_node=2"] + worker(self.CODE))
        self.assertEqual(p.returncode, 0, p.stderr)
        recs = [json.loads(l) for l in p.stderr.splitlines() if l.startswith("{")]
        usage = {r["rank"]: r["fields"] for r in recs if r["event"] == "rank_usage"}
        self.assertEqual(sorted(usage), [0, 1], p.stderr)
        self.assertGreaterEqual(usage[1]["peak_rss_bytes"], 200 << 20)
        self.assertGreaterEqual(usage[1]["cpu_s"], 0.45)
        self.assertGreater(usage[0]["wall_s"], 0.25)
        self.assertNotIn("gpu_util_mean", usage[0])  # no GPU sampled here
        for bad in ("1.5", "-0.1", "high", ""):
            p = run([f"--gpu_util_warn={bad}", "--nproc_per_node=1"] + worker("pass"))
            self.assertEqual(p.returncode, 2, (bad, p.stderr))
            self.assertIn("--gpu_util_warn", p.stderr)


if __name__ == "__main__":
    harness.main()
