"""What the benchmark scripts of scripts/bench share: free ports, launching a process and timing
the lines it prints, interleaved rounds under a time budget, JSON-lines results, medians and
Markdown tables. Import it from a script in this folder (the folder is on sys.path when the
script runs from it), or from elsewhere after sys.path.insert(0, "<repo>/scripts/bench").
"""
import json
import os
import signal
import statistics
import subprocess
import sys
import threading
import time

# free_port is the tests' own (tests/pylib), found from this file's place in the repository.
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "tests", "pylib"))
from ddprun_testlib import free_port  # noqa: E402,F401


def torch_version(python):
    """`python`'s torch version without the local suffix ("2.11.0"), or None without torch."""
    try:
        out = subprocess.run([python, "-c", "import torch, torch.distributed; print(torch.__version__)"],
                             capture_output=True, text=True, timeout=120)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return out.stdout.strip().split("+")[0] if out.returncode == 0 and out.stdout.strip() else None


class Launched:
    """A process started in a session of its own whose stderr lines are read as they come, each
    stamped with time.time() when read (self.lines: [(t, text)]). wait_for(pred) blocks until
    pred(lines) holds, the process exits or the deadline passes; finish() waits for the exit
    (killing the process group at the deadline) and returns the exit code."""

    def __init__(self, cmd, env=None, stdout=subprocess.DEVNULL):
        self.lines = []
        self.cv = threading.Condition()
        self.t0 = time.time()
        self.proc = subprocess.Popen(cmd, stdout=stdout, stderr=subprocess.PIPE, env=env, start_new_session=True)
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()

    def _read(self):
        for raw in iter(self.proc.stderr.readline, b""):
            with self.cv:
                self.lines.append((time.time(), raw.decode(errors="replace").rstrip("\n")))
                self.cv.notify_all()
        with self.cv:
            self.cv.notify_all()

    def wait_for(self, pred, deadline, poll=0.05):
        while time.time() < deadline and self.proc.poll() is None:
            with self.cv:
                if pred(self.lines):
                    return True
                self.cv.wait(poll)
        with self.cv:
            return pred(self.lines)

    def finish(self, deadline):
        """(exit code, timed out): at the deadline the process group is SIGKILLed."""
        timed_out = False
        try:
            rc = self.proc.wait(timeout=max(0.1, deadline - time.time()))
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            rc, timed_out = self.proc.wait(), True
        self.reader.join(5)
        return rc, timed_out

    def first_line(self, regex, since=0.0, also=lambda line: True):
        """(t, line) of the first line read at or after `since` that matches, or None."""
        return next(((t, l) for t, l in self.lines if t >= since and regex.search(l) and also(l)), None)

    def save(self, path):
        with open(path, "w") as f:
            f.writelines("%.6f %s\n" % l for l in self.lines)


def wait_for_file_int(path, deadline, alive=lambda: True, poll=0.002):
    """The integer a file holds once it exists (written atomically), or None at the deadline."""
    while time.time() < deadline and alive():
        try:
            with open(path) as f:
                return int(f.read())
        except (FileNotFoundError, ValueError):
            time.sleep(poll)
    return None


def read_jsonl(path):
    if not os.path.exists(path):
        return []
    with open(path) as f:
        return [json.loads(l) for l in f if l.strip()]


def append_jsonl(path, record):
    with open(path, "a") as f:
        f.write(json.dumps(record) + "\n")


def kill_leftovers(pids, cmdline_marker):
    """SIGKILLs those of `pids` still running whose command line holds `cmdline_marker` (bytes);
    returns them. For workers a launcher left behind (some start each in a session of its own)."""
    left = []
    for pid in pids:
        try:
            with open("/proc/%d/cmdline" % pid, "rb") as c:
                if cmdline_marker not in c.read():
                    continue
            os.kill(pid, signal.SIGKILL)
            left.append(pid)
        except (FileNotFoundError, ProcessLookupError):
            pass
    return left


def run_rounds(names, rounds, budget_s, run_one, log=print):
    """Runs run_one(name, round) for every name, `rounds` times, interleaved: round-robin with the
    order rotated each round, so no name always runs right after the same one. Whole rounds only:
    stops before a round that would end past budget_s seconds from this call."""
    start, round_s = time.time(), 0.0
    for i in range(rounds):
        spent = time.time() - start
        if i > 0 and spent + round_s > budget_s:
            log("  (time budget: %.0fs spent, a round takes ~%.0fs; stopping after %d of %d rounds)"
                % (spent, round_s, i, rounds))
            break
        r0 = time.time()
        for j in range(len(names)):
            run_one(names[(i + j) % len(names)], i)
        round_s = time.time() - r0


def median(values):
    values = list(values)
    return statistics.median(values) if values else None


def spread(values, fmt="%.0f"):
    """"min–max" of the values, "" for fewer than two."""
    values = list(values)
    return (fmt + "–" + fmt) % (min(values), max(values)) if len(values) > 1 else ""


def markdown_table(header, rows):
    """A Markdown table: a header row, the separator, one line per row (cells str()-ed)."""
    out = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    out += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
    return "\n".join(out)


def report_header(title, details):
    """The first lines of a report: '# title' and '# details; N cores, <UTC time> UTC'."""
    return "# %s\n# %s; %d cores, %s UTC" % (title, details, os.cpu_count() or 0,
                                             time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime()))
