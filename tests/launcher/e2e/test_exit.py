#!/usr/bin/env python3
"""How workers' exits end a run: exit codes and the failure summary, the early exit watch,
restarts and their budget, the exit barrier.

Run: test_exit.py <path to ddprun> [unittest names] (harness.py says more).
"""
import os
import re
import subprocess
import tempfile
import unittest

import harness
from harness import HANG_GUARD, own_status, exit_watch_here, run, worker, pid_alive


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
        nobody = [setpriv, "--reuid", "65534", "--regid", "65534", "--clear-groups", harness.DDPRUN]
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
        self.assertIn("a clean store for this attempt", p.stderr)
        self.assertNotIn("keyspace", p.stderr)  # the store's internals stay out of users' lines

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


    def test_a_slow_transient_failure_spends_the_restarts_asked_for(self):
        # Fails after 2.5 s twice, then succeeds (no torch.distributed, no store): torchrun
        # retries it, and so does ddprun: only quick, identical failures are deterministic.
        code = ("import os, sys, time\n"
                "n = int(os.environ['TORCHELASTIC_RESTART_COUNT'])\n"
                "print('attempt', n, flush=True)\n"
                "time.sleep(2.5)\n"
                "sys.exit(3 if n < 2 else 0)\n")
        p = run(["--nproc_per_node=1", "--max-restarts=3"] + worker(code))
        self.assertEqual(p.returncode, 0, p.stderr)
        self.assertIn("attempt 2", p.stdout)

    def test_retry_deterministic_spends_every_restart(self):
        p = run(["--nproc_per_node=1", "--max-restarts=2", "--retry_deterministic"] +
                worker("import os; print('attempt', os.environ['TORCHELASTIC_RESTART_COUNT']); import no_such_module"))
        self.assertEqual(p.returncode, 1)
        self.assertIn("attempt 2", p.stdout)
        self.assertNotIn("not retried", p.stderr)


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


if __name__ == "__main__":
    harness.main()
