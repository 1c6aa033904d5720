#!/usr/bin/env python3
"""`ddprun doctor` and the preflight before a launch, against each failure made real: a small
/dev/shm in a private mount namespace, a CUDA_VISIBLE_DEVICES naming a GPU this node lacks, a
rendezvous host that resolves to 127.0.1.1 inside a network namespace, a 0644 token file, a
worker Python without torch. Each asserts the exact line and the exit code.

    usage: test_doctor.py <path to ddprun> [unittest names]   (root: namespaces and mounts)
"""
import ctypes
import json
import os
import shutil
import subprocess
import sys
import tempfile
import unittest

DDPRUN = None
OK, FAIL = "\u2713", "\u2717"
CPU_JOB = ["--no_python", "/bin/true"]  # no Python probe: the line under test stands alone


def driver_here():
    try:
        ctypes.CDLL("libnvidia-ml.so.1")
        return True
    except OSError:
        return False


def run(args, env=None, prefix=(), timeout=120, cwd=None):
    full = dict(os.environ)
    full.pop("CUDA_VISIBLE_DEVICES", None)
    full.update(env or {})
    return subprocess.run(list(prefix) + [DDPRUN] + args, capture_output=True, text=True, env=full, timeout=timeout,
                          cwd=cwd)


# /dev/shm of 8 MiB, in a mount namespace of its own (unshare -m makes mounts private).
SMALL_SHM = ["unshare", "-m", "sh", "-c", 'mount -t tmpfs -o size=8m tmpfs /dev/shm && exec "$@"', "sh"]


class Doctor(unittest.TestCase):
    def lines(self, p):
        return p.stdout.splitlines()

    def assert_line(self, p, line, code):
        self.assertIn(line, self.lines(p), p.stdout + p.stderr)
        self.assertEqual(p.returncode, code, p.stdout + p.stderr)

    def tmpdir(self):
        d = tempfile.mkdtemp(prefix="ddprun-doctor-")
        self.addCleanup(shutil.rmtree, d, ignore_errors=True)
        return d

    # ---- /dev/shm ----

    def test_small_shm_warns_for_a_cpu_job(self):
        p = run(["doctor", "--nproc_per_node=2"] + CPU_JOB, prefix=SMALL_SHM)
        self.assert_line(p, "! shm: /dev/shm has 8 MiB free of 8 MiB; 25 MiB wanted for 2 local ranks: ddprun's "
                            "shared-memory all-reduce falls back to Gloo over TCP", 0)
        self.assertIn("    fix: give it 25 MiB or more: a container with docker run --shm-size=1g (or --ipc=host); on a "
                      "host, mount -o remount,size=1g /dev/shm", self.lines(p))

    def test_small_shm_blocks_nccl(self):
        # 4 local ranks on GPUs: NCCL's shm transport wants 4 MiB per ordered pair (48 MiB).
        p = run(["doctor", "--nproc_per_node=4"] + CPU_JOB, env={"CUDA_VISIBLE_DEVICES": "0,1,2,3"}, prefix=SMALL_SHM)
        self.assert_line(p, f"{FAIL} shm: /dev/shm has 8 MiB free of 8 MiB; NCCL needs about 48 MiB for 4 local ranks", 1)

    def test_small_shm_preflight_warns_and_launches(self):
        p = run(["--nproc_per_node=2"] + CPU_JOB, prefix=SMALL_SHM)
        self.assertEqual(p.returncode, 0, p.stderr)
        self.assertIn("ddprun: warning: shm: /dev/shm has 8 MiB free of 8 MiB; 25 MiB wanted for 2 local ranks", p.stderr)
        p = run(["--no_preflight", "--nproc_per_node=2"] + CPU_JOB, prefix=SMALL_SHM)
        self.assertEqual(p.returncode, 0, p.stderr)
        self.assertNotIn("warning: shm", p.stderr)

    # ---- GPUs ----

    def test_cuda_visible_devices_names_a_missing_gpu(self):
        p = run(["doctor"] + CPU_JOB, env={"CUDA_VISIBLE_DEVICES": "99"})
        if driver_here():
            self.assertEqual(p.returncode, 1, p.stdout)
            self.assertTrue(any(l.startswith(f"{FAIL} gpus: CUDA_VISIBLE_DEVICES=99 names GPU '99', which this node does "
                                             "not have (it has ") for l in self.lines(p)), p.stdout)
        else:
            self.assert_line(p, f"{FAIL} gpus: no NVIDIA driver found (libnvidia-ml.so.1 cannot be loaded), but "
                                "CUDA_VISIBLE_DEVICES=99 asks for GPUs", 1)
        if not os.path.exists("/dev/nvidia0"):
            p = run(CPU_JOB, env={"CUDA_VISIBLE_DEVICES": "99"})
            self.assertIn("ddprun: warning: gpus: CUDA_VISIBLE_DEVICES=99 asks for GPUs, but this node has no NVIDIA GPU "
                          "device (/dev/nvidia*)", p.stderr)
            self.assertEqual(p.returncode, 0, p.stderr)

    def test_no_driver_and_no_gpus_asked_is_fine(self):
        if driver_here():
            self.skipTest("this node has an NVIDIA driver")
        p = run(["doctor"] + CPU_JOB)
        self.assert_line(p, f"{OK} gpus: no NVIDIA driver found: GPU checks skipped", 0)

    # ---- the rendezvous host ----

    def test_rendezvous_host_resolving_to_loopback(self):
        ns = f"ddprun-doctor-{os.getpid()}"
        host = f"rdzv-{os.getpid()}"
        etc = os.path.join("/etc/netns", ns)
        subprocess.run(["ip", "netns", "add", ns], check=True)
        self.addCleanup(subprocess.run, ["ip", "netns", "delete", ns])
        os.makedirs(etc, exist_ok=True)
        self.addCleanup(shutil.rmtree, etc, ignore_errors=True)
        with open(os.path.join(etc, "hosts"), "w") as f:
            f.write(f"127.0.0.1 localhost\n127.0.1.1 {host}\n")
        subprocess.run(["ip", "-n", ns, "link", "set", "lo", "up"], check=True)
        flags = ["--nnodes=2", "--rdzv_backend=c10d", f"--rdzv_endpoint={host}:29400"] + CPU_JOB
        p = run(["doctor"] + flags, prefix=["ip", "netns", "exec", ns])
        self.assert_line(p, f"{FAIL} rdzv_host: the rendezvous host {host} resolves to 127.0.1.1, a loopback address: "
                            "the other nodes cannot reach it there", 1)
        self.assertIn(f"{OK} rdzv_endpoint: {host}:29400 is this node; port 29400 is free", self.lines(p))
        p = run(["doctor", "--json"] + flags, prefix=["ip", "netns", "exec", ns])
        doc = json.loads(p.stdout)
        self.assertEqual((doc["ok"], doc["exit_code"], p.returncode), (False, 1, 1))
        self.assertEqual([c["status"] for c in doc["checks"] if c["item"] == "rdzv_host"], ["fail"])
        # Before a launch: the same finding as one warning line (from /etc/hosts, no DNS). A 0644
        # token makes the launch stop right after the preflight, without waiting for a peer.
        token = self.write_token(0o644)
        p = run([f"--rdzv_token_file={token}"] + flags, prefix=["ip", "netns", "exec", ns])
        self.assertIn(f"ddprun: warning: rdzv_host: the rendezvous host {host} resolves to 127.0.1.1, a loopback "
                      f"address: the other nodes cannot reach it there; fix: map {host} to this node's network address "
                      "in /etc/hosts (not 127.x), or give the rendezvous host as that address (--rdzv_endpoint or "
                      "--master_addr) (ddprun doctor checks more)", p.stderr.splitlines())
        self.assertEqual(p.returncode, 2, p.stderr)

    # ---- the token file ----

    def write_token(self, mode):
        path = os.path.join(self.tmpdir(), "token")
        with open(path, "w") as f:
            f.write("s3cret-token-of-32-bytes-or-more\n")
        os.chmod(path, mode)
        return path

    def test_token_file_0644(self):
        path = self.write_token(0o644)
        p = run(["doctor", f"--rdzv_token_file={path}"] + CPU_JOB)
        self.assert_line(p, f"{FAIL} token: --rdzv_token_file {path} has mode 0644: other users can read it, and the "
                            "launch refuses it", 1)
        self.assertIn(f"    fix: chmod 600 {path}", self.lines(p))
        # Before a launch: one warning line, then the launch itself refuses the file.
        p = run([f"--rdzv_token_file={path}", "--nnodes=2", "--rdzv_backend=c10d", "--rdzv_endpoint=127.0.0.1:1"] + CPU_JOB)
        self.assertIn(f"ddprun: warning: token: --rdzv_token_file {path} has mode 0644: other users can read it, and the "
                      f"launch refuses it; fix: chmod 600 {path} (ddprun doctor checks more)", p.stderr.splitlines())
        self.assertEqual(p.returncode, 2, p.stderr)

    def test_token_file_0600(self):
        path = self.write_token(0o600)
        p = run(["doctor", f"--rdzv_token_file={path}"] + CPU_JOB)
        self.assert_line(p, f"{OK} token: --rdzv_token_file {path}: mode 0600, yours", 0)

    # ---- the workers' Python ----

    def test_worker_python_without_torch(self):
        # The system Python without its site directories: no torch.
        python = os.path.join(self.tmpdir(), "python")
        with open(python, "w") as f:
            f.write(f"#!/bin/sh\nexec {sys.executable} -I -S \"$@\"\n")
        os.chmod(python, 0o755)
        p = run(["doctor", "train.py"], env={"PYTHON_EXEC": python})
        self.assert_line(p, f"{FAIL} python: the workers' Python {python} cannot import torch (ModuleNotFoundError: No "
                            "module named 'torch')", 1)
        self.assertIn(f"    fix: install torch into it ({python} -m pip install torch), or set PYTHON_EXEC to a Python "
                      "that has it", self.lines(p))

    def test_worker_python_with_torch(self):
        p = run(["doctor", "--nproc_per_node=1", "train.py"], env={"PYTHON_EXEC": sys.executable})
        self.assertTrue(any(l.startswith(f"{OK} python: the workers' Python {sys.executable} imports torch ")
                            for l in self.lines(p)), p.stdout)
        self.assertEqual(p.returncode, 0, p.stdout)

    def test_python_probe_ignores_the_working_directory(self):
        # Root's `ddprun doctor` in a shared directory where another user left a torch.py: the
        # probe imports torch from the workers' Python's own path, never from there.
        shared = self.tmpdir()
        os.chmod(shared, 0o1777)
        marker = os.path.join(shared, "torch.py-ran")
        planted = os.path.join(shared, "torch.py")
        with open(planted, "w") as f:
            f.write(f"open({marker!r}, 'w').close()\n__version__ = 'planted'\n")
        os.chown(planted, 65534, 65534)
        p = run(["doctor", "--nproc_per_node=1", "train.py"], env={"PYTHON_EXEC": sys.executable}, cwd=shared)
        self.assertFalse(os.path.exists(marker), p.stdout + p.stderr)
        self.assertNotIn("planted", p.stdout)
        self.assertTrue(any(l.startswith(f"{OK} python: the workers' Python {sys.executable} imports torch ") or
                            "No module named 'torch'" in l for l in self.lines(p)), p.stdout)

    def test_missing_python(self):
        p = run(["doctor", "train.py"], env={"PYTHON_EXEC": "/nonexistent/python"})
        self.assert_line(p, f"{FAIL} python: the workers' Python /nonexistent/python cannot be run: No such file or "
                            "directory", 1)

    # ---- the command line ----

    def test_bad_flag_is_a_usage_error(self):
        p = run(["doctor", "--nproc_per_node=zero"])
        self.assertEqual(p.returncode, 2, p.stderr)
        self.assertTrue(p.stderr.startswith("ddprun doctor: error: "), p.stderr)

    def test_json_is_one_object(self):
        p = run(["doctor", "--json"] + CPU_JOB)
        doc = json.loads(p.stdout)
        self.assertEqual(sorted(doc), ["checks", "exit_code", "ok"])
        for c in doc["checks"]:
            self.assertEqual(sorted(c), ["blocking", "fix", "found", "item", "status"])
            self.assertIn(c["status"], ("ok", "warning", "fail"))
        self.assertEqual(doc["exit_code"], p.returncode)
        # --json among the launch flags (after a flag's separate value) is the doctor's; after the
        # entry point it is the program's.
        p = run(["doctor", "--nproc_per_node", "2", "--json", "--no_python", "/bin/echo"])
        self.assertEqual(json.loads(p.stdout)["exit_code"], p.returncode)
        p = run(["doctor", "--no_python", "/bin/echo", "--json"])
        self.assertTrue(p.stdout.endswith("warnings\n") or p.stdout.endswith("warning\n"), p.stdout)


if __name__ == "__main__":
    if len(sys.argv) < 2:
        sys.exit(__doc__)
    DDPRUN = os.path.abspath(sys.argv[1])
    if os.geteuid() != 0:
        print("skipped: root is needed for the mount and network namespaces", file=sys.stderr)
        sys.exit(77)
    unittest.main(argv=[sys.argv[0]] + sys.argv[2:], verbosity=2)
