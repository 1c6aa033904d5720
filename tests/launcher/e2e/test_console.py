#!/usr/bin/env python3
"""The console as the workers' own terminal: progress bars that move, prompts that show, pdb on
the rank that gets stdin, --no_prefix, torchrun's --local-ranks-filter spelling, and workers in
sessions of their own.

Terminal checks run ddprun inside tmux (a real pseudo-terminal) and read the screen with
capture-pane; the rest read ddprun's pipes.

Run: test_console.py <path to ddprun> [unittest names] (harness.py says more).
"""
import os
import re
import shutil
import subprocess
import tempfile
import time
import unittest

import harness
from harness import HANG_GUARD, Live, Tmux, in_terminal, run, worker


@unittest.skipUnless(shutil.which("tmux"), "tmux is not installed (scripts/setup_deps.sh installs it)")
class Terminal(unittest.TestCase):
    BAR = ("import os, time\n"
           "from tqdm import tqdm\n"
           "for i in tqdm(range(24), desc='bar', mininterval=0, ncols=70):\n"
           "    time.sleep(0.12)\n"
           "print('done', flush=True)\n")

    def test_tqdm_bar_moves_with_its_prefix(self):
        t = Tmux(in_terminal(["--nproc_per_node=1"] + worker(self.BAR)))
        try:
            seen = set()
            deadline = time.monotonic() + HANG_GUARD
            while time.monotonic() < deadline:
                s = t.screen()
                if "[r0]: done" in s:
                    break
                seen.update(int(m) for m in re.findall(r"\[r0\]: bar:\s+(\d+)%", s))
                time.sleep(0.03)
            final = t.screen()
            self.assertEqual(t.exit_status(), 0, final)
            # The bar was seen at several states while it ran, on one prefixed line (it is
            # redrawn in place: the final screen has one bar line, at 100%).
            self.assertGreaterEqual(len(seen - {100}), 4, f"bar states seen while running: {sorted(seen)}\n{final}")
            bars = [line for line in final.splitlines() if "bar:" in line]
            self.assertEqual(len(bars), 1, final)
            self.assertRegex(bars[0], r"^\[r0\]: bar: 100%\|")
            self.assertIn("[r0]: done", final)
        finally:
            t.close()

    PDB = ("import os\n"
           "rank = int(os.environ['RANK'])\n"
           "x = 41 + rank\n"
           "if rank == 0:\n"
           "    breakpoint()\n"
           "print(f'rank {rank} done x={x}', flush=True)\n")

    def test_pdb_on_rank_0(self):
        t = Tmux(in_terminal(["--nproc_per_node=2"] + worker(self.PDB)))
        try:
            # pdb's prompt has no newline: it must show anyway, prefixed.
            t.wait_screen(lambda s: re.search(r"^\[r0\]: \(Pdb\)", s, re.M), "rank 0's (Pdb) prompt")
            t.wait_screen(lambda s: "[r1]: rank 1 done x=42" in s, "rank 1's line (it gets /dev/null)")
            # Each command waits for its prompt, as a user does.
            prompts = lambda s: s.count("(Pdb)")  # noqa: E731
            before = prompts(t.screen())
            t.keys("p x")
            t.wait_screen(lambda s: re.search(r"^\[r0\]: 41$", s, re.M) and prompts(s) > before, "pdb's answer to 'p x'")
            before = prompts(t.screen())
            t.keys("x = 100")
            t.wait_screen(lambda s: prompts(s) > before, "pdb's prompt after 'x = 100'")
            t.keys("c")
            s = t.wait_screen(lambda s: re.search(r"^\[r0\]: rank 0 done x=100$", s, re.M), "rank 0 to go on with x=100")
            self.assertEqual(t.exit_status(), 0, s)
        finally:
            t.close()

    def test_stdin_rank_picks_the_reader(self):
        code = ("import os, sys\n"
                "line = sys.stdin.readline()\n"
                "print(f'rank {os.environ[\"RANK\"]} read {line.strip()!r}', flush=True)\n")
        t = Tmux(in_terminal(["--nproc_per_node=2", "--stdin_rank=1"] + worker(code)))
        try:
            t.wait_screen(lambda s: "[r0]: rank 0 read ''" in s, "rank 0 to read end of file (/dev/null)")
            t.keys("typed here")
            s = t.wait_screen(lambda s: "[r1]: rank 1 read 'typed here'" in s, "rank 1 to read the typed line")
            self.assertEqual(t.exit_status(), 0, s)
        finally:
            t.close()


class Pipes(unittest.TestCase):
    CODE = ("import os, sys\n"
            "print('out of', os.environ['RANK'], flush=True)\n"
            "print('err of', os.environ['RANK'], file=sys.stderr, flush=True)\n")

    def test_no_prefix(self):
        p = run(["--nproc_per_node=2", "--no_prefix"] + worker(self.CODE))
        self.assertEqual(p.returncode, 0, p.stderr)
        self.assertEqual(sorted(p.stdout.splitlines()), ["out of 0", "out of 1"])
        self.assertIn("\nerr of 1\n", "\n" + p.stderr)

    def test_torchrun_spelling_of_local_ranks_filter(self):
        p = run(["--nproc_per_node=3", "--local-ranks-filter=0,2"] + worker(self.CODE))
        self.assertEqual(p.returncode, 0, p.stderr)
        self.assertEqual(sorted(p.stdout.splitlines()), ["[r0]: out of 0", "[r2]: out of 2"])

    def test_stdin_rank_on_a_pipe(self):
        code = "import os, sys; print('rank', os.environ['RANK'], 'read', repr(sys.stdin.read()), flush=True)"
        for flag, want in (("--stdin_rank=1", {"0": "''", "1": "'data\\n'"}),
                           ("--stdin_rank=none", {"0": "''", "1": "''"})):
            p = subprocess.run([harness.DDPRUN, "--nproc_per_node=2", flag] + worker(code), input="data\n",
                               capture_output=True, text=True, timeout=HANG_GUARD)
            self.assertEqual(p.returncode, 0, p.stderr)
            got = dict(re.findall(r"rank (\d) read (.*)", p.stdout))
            self.assertEqual(got, want, f"{flag}: {p.stdout}")

    def test_bad_stdin_rank(self):
        p = run(["--stdin_rank=first", "--no_python", "true"])
        self.assertEqual(p.returncode, 2)
        self.assertIn("stdin_rank", p.stderr)
        self.assertIn("or none", p.stderr)

    def test_prompt_and_bar_reach_the_pipe_before_their_line_ends(self):
        # The worker writes a prompt and a bar state without '\n', then waits for a file the test
        # makes only after it read both from ddprun's stdout.
        with tempfile.TemporaryDirectory() as d:
            go = os.path.join(d, "go")
            code = ("import os, sys, time\n"
                    "sys.stdout.write('Continue? '); sys.stdout.flush()\n"
                    f"while not os.path.exists({go!r}): time.sleep(0.01)\n"
                    "sys.stdout.write('yes\\n\\r 50%'); sys.stdout.flush()\n"
                    f"while not os.path.exists({go!r} + '2'): time.sleep(0.01)\n"
                    "sys.stdout.write('\\r100%\\n'); sys.stdout.flush()\n")
            live = Live(["--nproc_per_node=1"] + worker(code))
            try:
                raw = b""
                deadline = time.monotonic() + HANG_GUARD
                while b"[r0]: Continue? " not in raw:
                    self.assertLess(time.monotonic(), deadline, raw)
                    if live.sel.select(1):
                        raw += os.read(live.p.stdout.fileno(), 65536)
                open(go, "w").close()
                while b"\r[r0]:  50%" not in raw:
                    self.assertLess(time.monotonic(), deadline, raw)
                    if live.sel.select(1):
                        raw += os.read(live.p.stdout.fileno(), 65536)
                open(go + "2", "w").close()
                rest, err = live.p.communicate(timeout=HANG_GUARD)
                raw += rest
                self.assertEqual(live.p.returncode, 0, err)
                self.assertEqual(raw.decode(), "[r0]: Continue? yes\n\r[r0]:  50%\r[r0]: 100%\n")
            finally:
                if live.p.poll() is None:
                    live.p.kill()
                    live.p.wait()


class Sessions(unittest.TestCase):
    def test_each_worker_leads_its_own_session_and_autogroup(self):
        # torchrun starts workers with start_new_session: each worker leads a session and a
        # process group of its own, without a controlling terminal; the scheduler gives it an
        # autogroup of its own (the shell's autogroup no longer holds every worker). A process
        # that never left the boot session is in the default group, whose file reads empty.
        code = ("import os\n"
                "ag = (open('/proc/self/autogroup').read().split() or ['default'])[0] if os.path.exists('/proc/self/autogroup') else '-'\n"
                "print('rank', os.environ['RANK'], 'sid', os.getsid(0) == os.getpid(), 'pgrp', os.getpgrp() == os.getpid(),\n"
                "      'autogroup', ag, flush=True)\n")
        p = run(["--nproc_per_node=2"] + worker(code))
        self.assertEqual(p.returncode, 0, p.stderr)
        rows = re.findall(r"rank (\d) sid (\w+) pgrp (\w+) autogroup (\S+)", p.stdout)
        self.assertEqual(len(rows), 2, p.stdout)
        for rank, sid, pgrp, ag in rows:
            self.assertEqual((sid, pgrp), ("True", "True"), p.stdout)
        if os.path.exists("/proc/self/autogroup"):
            with open("/proc/self/autogroup") as f:
                mine = (f.read().split() or ["default"])[0]
            groups = {ag for *_, ag in rows}
            self.assertEqual(len(groups), 2, p.stdout)
            self.assertNotIn("default", groups, p.stdout)
            self.assertNotIn(mine, groups, p.stdout)


if __name__ == "__main__":
    harness.main()
