#!/usr/bin/env python3
"""Bad command lines: one line saying what to do, exit code 2, no worker started.

Run: test_usage.py <path to ddprun> [unittest names] (harness.py says more).
"""
import os
import socket
import tempfile
import unittest

import harness
from harness import run


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
        for flag in ("--rdzv_token_file=", "--master_port=", "--nnodes=", "--rdzv_backend="):
            self.check_usage_error([flag], flag, "empty value")

    def test_empty_flag_values_torchrun_runs_with_run_here_too(self):
        # torchrun 2.11 runs with these empty; the next argument stays the entry point.
        with tempfile.TemporaryDirectory() as d:
            marker = os.path.join(d, "started")
            p = run(["--rdzv_conf=", "--rdzv_id=", "--log_dir=", "--local_addr=", "--rdzv_endpoint=",
                     "--local_ranks_filter=", "--role=", "--no_python", "sh", "-c",
                     'echo "$TORCHELASTIC_RUN_ID/$ROLE_NAME/$MASTER_ADDR" > "$0"', marker])
            self.assertEqual(p.returncode, 0, p.stderr)
            run_id, role, master = harness.read_text(marker).strip().split("/")
            self.assertEqual(len(run_id), 36, run_id)  # a random id, as torchrun draws one
            self.assertEqual(role, "")
            self.assertEqual(master, "127.0.0.1")

    def test_bad_rdzv_id_is_refused_before_the_log_directory_is_made(self):
        with tempfile.TemporaryDirectory() as d:
            logs = os.path.join(d, "logs")
            for bad_id in ("a\tb", "j" * 129):
                self.check_usage_error(["--log_dir", logs, "--rdzv_id", bad_id], "--rdzv_id")
                self.assertFalse(os.path.exists(logs), os.listdir(d))

    def test_metrics_port_taken_names_it_and_what_to_do(self):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            s.listen()
            port = s.getsockname()[1]
            self.check_usage_error([f"--metrics_port={port}"], f"127.0.0.1:{port}", "--metrics_port", "0 picks a free one")

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


if __name__ == "__main__":
    harness.main()
