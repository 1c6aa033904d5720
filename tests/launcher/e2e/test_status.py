#!/usr/bin/env python3
"""`ddprun status`: the table and the JSON (checked against the schema in launcher/README.md) of
real running jobs, a restart seen in the columns, --watch redrawing in place inside tmux, the
owner-only socket refusing another user, a stale socket of a SIGKILLed agent.

Each test gives its agents and its `ddprun status` a runtime directory of its own
(XDG_RUNTIME_DIR), so jobs of other tests on this host never show.

Run: test_status.py <path to ddprun> [unittest names] (harness.py says more).
"""
import json
import os
import re
import shutil
import signal
import socket
import stat
import subprocess
import tempfile
import threading
import time
import unittest
import urllib.request

import harness
from harness import HANG_GUARD, StatusJob, Tmux, free_port

README = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "..", "launcher", "README.md")

# Each worker says "ready <pid> attempt <n>", then waits for the file named by its argument.
# Rank 1 of attempt 0 exits 3 once the file "<arg>.fail" exists.
WAIT = ("import os, sys, time\n"
        "attempt = os.environ['TORCHELASTIC_RESTART_COUNT']\n"
        "print('ready', os.getpid(), 'attempt', attempt, flush=True)\n"
        "while not os.path.exists(sys.argv[1]):\n"
        "    if os.environ['RANK'] == '1' and attempt == '0' and os.path.exists(sys.argv[1] + '.fail'):\n"
        "        sys.exit(3)\n"
        "    time.sleep(0.05)\n")

NOBODY = ["setpriv", "--reuid=nobody", "--regid=nogroup", "--clear-groups"]


def schema_rows():
    """The documented fields of `ddprun status --json`: {dotted name: type text}."""
    text = harness.read_text(README)
    section = text[text.index("## ddprun status"):]
    section = section[:section.index("\n## ", 1)]
    rows = dict(re.findall(r"^\| `([a-z_\[\]\.]+)` \| ([a-z ]+?) \|", section, re.M))
    assert rows, "no schema table found under launcher/README.md's '## ddprun status'"
    return rows


def type_ok(value, doc):
    kinds = {"string": str, "integer": int, "number": (int, float), "array": list, "object": dict}
    if value is None:
        return doc.endswith("or null")
    want = kinds[doc.replace(" or null", "")]
    return isinstance(value, want) and not isinstance(value, bool)


class StatusLocal(unittest.TestCase):
    def test_table_and_json_of_a_running_job(self):
        job = StatusJob(self, WAIT)
        pids = job.pids()
        p = job.status("--json")
        self.assertEqual(p.returncode, 0, p.stderr)
        doc = json.loads(p.stdout)
        rows = schema_rows()
        # Every documented field is there with its documented type, and nothing else.
        self.assertEqual(set(doc), {k for k in rows if "." not in k})
        self.assertEqual(doc["version"], 1)
        self.assertEqual(len(doc["agents"]), 1, doc)
        agent = doc["agents"][0]
        agent_fields = {k.split(".", 1)[1] for k in rows if k.startswith("agents[].") and k.count(".") == 1}
        self.assertEqual(set(agent), agent_fields)
        for k, v in agent.items():
            self.assertTrue(type_ok(v, rows["agents[]." + k]), f"{k}={v!r} is not {rows['agents[].' + k]}")
        rank_fields = {k.split(".")[2] for k in rows if k.startswith("agents[].ranks[].")}
        for r in agent["ranks"]:
            self.assertEqual(set(r), rank_fields)
            for k, v in r.items():
                self.assertTrue(type_ok(v, rows["agents[].ranks[]." + k]), f"{k}={v!r}")
        self.assertEqual(agent["run_id"], job.run_id)
        self.assertEqual(agent["agent_pid"], job.live.p.pid)
        self.assertEqual(agent["state"], "running")
        self.assertEqual((agent["attempt"], agent["restarts_used"], agent["restarts_left"]), (0, 0, 0))
        self.assertIsNone(agent["last_failure"])
        self.assertEqual({r["rank"]: r["pid"] for r in agent["ranks"]}, pids)
        for r in agent["ranks"]:
            self.assertEqual(r["state"], "running")
            self.assertGreater(r["rss_bytes"], 1 << 20)  # a Python interpreter
            # No rate over less than a second of the worker's life: null until there is one.
            self.assertTrue(r["cpu_percent"] is None or r["cpu_percent"] >= 0, r)
        # The socket: owner-only, in an owner-only directory.
        d = os.path.join(job.xdg, "ddprun")
        self.assertEqual(stat.S_IMODE(os.stat(d).st_mode), 0o700)
        sock = os.path.join(d, f"{job.live.p.pid}.sock")
        self.assertTrue(stat.S_ISSOCK(os.stat(sock).st_mode))
        self.assertEqual(stat.S_IMODE(os.stat(sock).st_mode), 0o600)

        t = job.status()
        self.assertEqual(t.returncode, 0, t.stderr)
        lines = t.stdout.splitlines()
        self.assertRegex(lines[0], r"^NODE +RANK +PID +STATE +ATTEMPT +RESTARTS +UPTIME +CPU% +RSS +LAST FAILURE$")
        self.assertEqual(lines[1], f"job {job.run_id}")
        for rank, pid in pids.items():
            self.assertRegex(t.stdout, rf"\n0 \(\S+\) +{rank} +{pid} +running +0 +0 used, 0 left ")

        # The job ends: its socket goes, and status says how to start one.
        rc, _ = job.end()
        self.assertEqual(rc, 0)
        self.assertFalse(os.path.exists(sock))
        p = job.status()
        self.assertEqual(p.returncode, 1)
        self.assertIn("no running ddprun job", p.stderr)
        self.assertIn("start one with `ddprun --nproc_per_node=N", p.stderr)

    def test_a_restart_shows_in_attempt_restarts_and_last_failure(self):
        job = StatusJob(self, WAIT, extra=["--max_restarts=2"])
        before = job.pids(0)
        open(job.stop + ".fail", "w").close()
        after = job.pids(1)
        self.assertNotEqual(before, after)
        agent = json.loads(job.status("--json", f"--rdzv_id={job.run_id}").stdout)["agents"][0]
        self.assertEqual((agent["attempt"], agent["restarts_used"], agent["restarts_left"], agent["max_restarts"]),
                         (1, 1, 1, 2))
        self.assertEqual(agent["last_failure"]["rank"], 1)
        self.assertIn("exit code 3", agent["last_failure"]["what"])
        self.assertEqual({r["rank"]: r["pid"] for r in agent["ranks"]}, after)
        t = job.status().stdout
        self.assertRegex(t, rf"\n.* 1 +{after[1]} +running +1 +1 used, 1 left .*r1: exit code 3 after [0-9.]+ s \(attempt 0\)\n")
        # Another run id: not this job.
        other = job.status("--rdzv_id=not-this-one")
        self.assertEqual(other.returncode, 1)
        self.assertIn("no running ddprun job with --rdzv_id not-this-one", other.stderr)

    def test_nothing_running_says_how_to_start_one(self):
        xdg = tempfile.mkdtemp(prefix="ddprun-status-")
        self.addCleanup(shutil.rmtree, xdg, True)
        for args in ([], ["--json"]):
            p = subprocess.run([harness.DDPRUN, "status", *args], capture_output=True, text=True,
                               timeout=HANG_GUARD, env=dict(os.environ, XDG_RUNTIME_DIR=xdg))
            self.assertEqual(p.returncode, 1)
            self.assertIn("no running ddprun job of this user on this host", p.stderr)
            self.assertIn(os.path.join(xdg, "ddprun"), p.stderr)
        self.assertEqual(json.loads(p.stdout), {"version": 1, "agents": []})

    def test_bad_arguments_and_help(self):
        p = subprocess.run([harness.DDPRUN, "status", "--interval", "0"], capture_output=True, text=True)
        self.assertEqual(p.returncode, 2)
        self.assertIn("--interval 0: give seconds, at least 0.1", p.stderr)
        p = subprocess.run([harness.DDPRUN, "status", "--frobnicate"], capture_output=True, text=True)
        self.assertEqual(p.returncode, 2)
        self.assertIn("unknown argument --frobnicate", p.stderr)
        p = subprocess.run([harness.DDPRUN, "status", "--help"], capture_output=True, text=True)
        self.assertEqual(p.returncode, 0)
        for word in ("--json", "--watch", "--interval", "--rdzv_id", "--rdzv_endpoint", "--rdzv_token_file",
                     "0700", "0600"):
            self.assertIn(word, p.stdout)
        p = subprocess.run([harness.DDPRUN, "status", "--rdzv_endpoint=head:29400"], capture_output=True, text=True)
        self.assertEqual(p.returncode, 2)
        self.assertIn("--rdzv_endpoint needs --rdzv_id", p.stderr)
        p = subprocess.run([harness.DDPRUN, "status", "--rdzv_endpoint=::::garbage:::", "--rdzv_id=x"],
                           capture_output=True, text=True)
        self.assertEqual(p.returncode, 2, p.stderr)
        self.assertIn("ddprun status: error: ", p.stderr)
        p = subprocess.run([harness.DDPRUN, "--help"], capture_output=True, text=True)
        self.assertIn("ddprun status [--json] [--watch]", p.stdout)

    def test_a_killed_agent_leaves_no_job_behind(self):
        job = StatusJob(self, WAIT)
        job.pids()
        sock = os.path.join(job.xdg, "ddprun", f"{job.live.p.pid}.sock")
        self.assertTrue(os.path.exists(sock))
        job.live.p.kill()
        job.live.p.wait()
        job.live.p.stdout.close()
        job.live.p.stderr.close()
        self.assertTrue(os.path.exists(sock))  # nobody removed it
        p = job.status()
        self.assertEqual(p.returncode, 1, p.stdout)
        self.assertIn("no running ddprun job", p.stderr)
        self.assertFalse(os.path.exists(sock))  # the stale socket was cleaned up

    def test_an_unsafe_runtime_directory_is_not_used(self):
        xdg = tempfile.mkdtemp(prefix="ddprun-status-")
        os.mkdir(os.path.join(xdg, "ddprun"), 0o755)
        os.chmod(os.path.join(xdg, "ddprun"), 0o755)
        job = StatusJob(self, WAIT, xdg=xdg)
        job.pids()
        rc, err = job.end()
        self.assertEqual(rc, 0, err)
        self.assertIn("`ddprun status` cannot see this job", err)
        self.assertIn("has mode 0755, open to other users: chmod 700", err)


@unittest.skipUnless(os.geteuid() == 0 and shutil.which("setpriv"), "needs root and setpriv (another user: nobody)")
class StatusOtherUser(unittest.TestCase):
    def test_another_user_is_refused(self):
        job = StatusJob(self, WAIT)
        pids = job.pids()
        os.chmod(job.xdg, 0o755)  # only ddprun's own directory guards the socket now
        d = os.path.join(job.xdg, "ddprun")
        sock = os.path.join(d, f"{job.live.p.pid}.sock")
        # The owner sees the job.
        self.assertIn(str(pids[0]), job.status().stdout)
        # Another user's `ddprun status` never looks in this user's directory: with this
        # XDG_RUNTIME_DIR (not theirs) it reads /tmp/ddprun-<their uid>/.
        p = job.status(user=True)
        self.assertEqual(p.returncode, 1, p.stdout)
        self.assertIn("no running ddprun job of this user on this host (looked in /tmp/ddprun-65534", p.stderr)
        self.assertNotIn(str(pids[0]), p.stdout + p.stderr)
        # Even with the directory and the socket opened to everyone, the agent checks the
        # caller's uid (SO_PEERCRED) and answers nothing but a refusal.
        os.chmod(d, 0o755)
        os.chmod(sock, 0o666)
        raw = subprocess.run(NOBODY + [harness.PY, "-c",
                                       "import socket, sys\n"
                                       "s = socket.socket(socket.AF_UNIX)\n"
                                       "s.connect(sys.argv[1])\n"
                                       "data = b''\n"
                                       "while True:\n"
                                       "    c = s.recv(65536)\n"
                                       "    if not c: break\n"
                                       "    data += c\n"
                                       "sys.stdout.write(data.decode())\n", sock],
                             capture_output=True, text=True, timeout=HANG_GUARD)
        self.assertEqual(raw.returncode, 0, raw.stderr)
        self.assertTrue(raw.stdout.startswith("refused: this ddprun agent"), raw.stdout)
        self.assertNotIn(str(pids[0]), raw.stdout)
        self.assertNotIn("ranks", raw.stdout)
        # The same raw read as the owner gets the snapshot: the check above can fail.
        with socket.socket(socket.AF_UNIX) as s:
            s.connect(sock)
            data = b""
            while chunk := s.recv(65536):
                data += chunk
        self.assertEqual(json.loads(data)["run_id"], job.run_id)


    def test_a_socket_of_another_user_is_not_believed(self):
        # In nobody's own socket directory, a socket that root serves (an impostor): nobody's
        # `ddprun status` checks who serves it (SO_PEERCRED) and reads nothing from it.
        xdg = tempfile.mkdtemp(prefix="ddprun-status-")
        self.addCleanup(shutil.rmtree, xdg, True)
        d = os.path.join(xdg, "ddprun")
        os.mkdir(d, 0o700)
        for path in (xdg, d):
            os.chown(path, 65534, 65534)
        path = os.path.join(d, "1.sock")
        srv = socket.socket(socket.AF_UNIX)
        self.addCleanup(srv.close)
        srv.bind(path)
        os.chmod(path, 0o666)
        srv.listen()
        fake = json.dumps({"run_id": "impostor", "node_rank": 0, "agent_pid": 1, "attempt": 0, "ranks": []})

        def serve():
            conn, _ = srv.accept()
            with conn:
                try:
                    conn.sendall(fake.encode())
                except OSError:
                    pass  # the reader hung up first: what it should do
        server = threading.Thread(target=serve, daemon=True)
        server.start()
        p = subprocess.run(NOBODY + [harness.DDPRUN, "status", "--json"], capture_output=True, text=True,
                           timeout=HANG_GUARD, env=dict(os.environ, XDG_RUNTIME_DIR=xdg))
        server.join(HANG_GUARD)
        self.assertEqual(p.returncode, 1, p.stdout)
        self.assertEqual(json.loads(p.stdout)["agents"], [])
        self.assertIn(f"{path}: served by another user (uid 0): not read", p.stderr)
        self.assertNotIn("impostor", p.stdout)


class StatusGpu(unittest.TestCase):
    """The GPU columns and the metrics' GPU series through NVML loaded at run time, here a
    stand-in libnvidia-ml.so.1 (tests/launcher/fake_nvml) that answers from a file."""

    def test_gpu_columns_and_series_from_nvml(self):
        fake = os.environ.get("DDPRUN_TEST_FAKE_NVML_DIR") or os.path.join(
            os.path.dirname(os.path.dirname(harness.DDPRUN)), "tests", "launcher", "fake_nvml")
        self.assertTrue(os.path.exists(os.path.join(fake, "libnvidia-ml.so.1")), f"build fake_nvml first: {fake}")
        state = tempfile.NamedTemporaryFile("w", prefix="ddprun-nvml-", delete=False)
        self.addCleanup(os.unlink, state.name)
        port = free_port()
        job = StatusJob(self, WAIT, extra=[f"--metrics_port={port}"],
                        env={"LD_LIBRARY_PATH": fake, "DDPRUN_FAKE_NVML_STATE": state.name})
        pids = job.pids()
        # Rank 0 on GPU 0, rank 1 on GPU 1 (beside another user's process, not the job's).
        state.write(f"gpu 0 37\ngpu 1 64\nproc 0 {pids[0]} {1 << 30}\nproc 1 {pids[1]} {2 << 30}\n"
                    f"proc 1 {os.getpid()} 5\n")
        state.close()
        agent = json.loads(job.status("--json").stdout)["agents"][0]
        got = {r["rank"]: (r["gpu_index"], r["gpu_utilization_percent"], r["gpu_memory_bytes"]) for r in agent["ranks"]}
        self.assertEqual(got, {0: (0, 37.0, 1 << 30), 1: (1, 64.0, 2 << 30)})
        t = job.status().stdout
        self.assertRegex(t.splitlines()[0], r" RSS +GPU +GPU% +GPU MEM +LAST FAILURE$")
        self.assertRegex(t, rf"\n.* 1 +{pids[1]} +running .* 1 +64% +2\.0 GiB +-\n")
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=HANG_GUARD) as r:
            metrics = r.read().decode()
        self.assertIn('ddprun_worker_gpu_utilization_ratio{rank="0",local_rank="0"} 0.37', metrics)
        self.assertIn(f'ddprun_worker_gpu_memory_bytes{{rank="1",local_rank="1"}} {2 << 30}', metrics)


@unittest.skipUnless(shutil.which("tmux"), "tmux is not installed (scripts/setup_deps.sh installs it)")
class StatusWatch(unittest.TestCase):
    def visible(self, t):
        return t.tmux("capture-pane", "-p", "-t", "t").stdout  # the screen, without the scrollback

    def wait_visible(self, t, predicate, what):
        deadline = time.monotonic() + HANG_GUARD
        while True:
            s = self.visible(t)
            if predicate(s):
                return s
            if time.monotonic() > deadline:
                raise AssertionError(f"timed out waiting for {what}; the screen:\n{s}")
            time.sleep(0.05)

    def test_watch_redraws_the_table_in_place(self):
        job = StatusJob(self, WAIT, extra=["--max_restarts=1"])
        before = job.pids(0)
        t = Tmux(f"XDG_RUNTIME_DIR={job.xdg} " + harness.in_terminal(["status", "--watch", "--interval", "0.2",
                                                                      f"--rdzv_id={job.run_id}"]))
        self.addCleanup(t.close)
        row = lambda rank, pid, attempt: re.compile(rf"^.* {rank} +{pid} +running +{attempt} ", re.M)  # noqa: E731
        self.wait_visible(t, lambda s: all(row(r, p, 0).search(s) for r, p in before.items()), "attempt 0's rows")
        open(job.stop + ".fail", "w").close()
        after = job.pids(1)
        s = self.wait_visible(t, lambda s: all(row(r, p, 1).search(s) for r, p in after.items())
                              and "r1: exit code 3" in s, "attempt 1's rows and the failure")
        # Redrawn in place: one header, one table, none of attempt 0's rows left on the screen.
        self.assertEqual(s.count("ddprun status, every 0.2 s"), 1, s)
        self.assertEqual(len(re.findall(r"^NODE +RANK", s, re.M)), 1, s)
        self.assertNotIn(f" {before[1]} ", s)
        self.assertIn("1 used, 0 left", s)
        # The job ends: the screen says so, and --watch goes on until interrupted.
        job.end()
        self.wait_visible(t, lambda s: "no running ddprun job" in s, "the end of the job")
        # Ctrl-C, as a user ends it: SIGINT to ddprun status alone (the pane's shell then
        # records its exit status).
        shell = int(t.tmux("list-panes", "-t", "t", "-F", "#{pane_pid}").stdout.split()[0])
        children = harness.read_text(f"/proc/{shell}/task/{shell}/children").split()
        self.assertEqual(len(children), 1, children)
        os.kill(int(children[0]), signal.SIGINT)
        self.assertEqual(t.exit_status(), 130)


if __name__ == "__main__":
    harness.main()
