"""Agents that prove their Slurm step with munge credentials (no token), for
attack_admission.py: a private munged (its own key and socket, reached through
DDPRUN_MUNGE_SOCKET) and the environment of an srun step that makes an agent use it.

An agent uses munge when it runs in an srun step (SLURM_JOB_ID and SLURM_STEP_ID set) with no
token, and munged answers; the agent that hosts the rendezvous then admits only agents whose
credential names the same job and step, and each connection's MAC key is the secret the
credential carries."""
import os
import shutil
import socket
import subprocess
import tempfile
import time

MUNGE_PROGS = ("munged", "munge", "mungekey")
JOB, STEP = "4242", "0"


def _which(prog):
    return shutil.which(prog) or shutil.which(prog, path="/usr/sbin:/sbin:/usr/bin")


def left_out(ddprun):
    """Why the munge variants cannot run here, or None."""
    missing = [p for p in MUNGE_PROGS if not _which(p)]
    if missing:
        return f"{', '.join(missing)} not installed (Debian's munge package)"
    with open(ddprun, "rb") as f:
        if b"was built without munge.h" in f.read():
            return f"{ddprun} was built without munge.h (libmunge-dev)"
    return None


def step_env(env, munge_socket, nnodes):
    """`env` as an agent of srun step JOB.STEP over `nnodes` nodes sees it, with no token."""
    env = {k: v for k, v in env.items() if not k.startswith("SLURM") and k != "DDPRUN_RDZV_TOKEN"}
    env.update(SLURM_JOB_ID=JOB, SLURM_STEP_ID=STEP, SLURM_STEP_NODELIST="localhost",
               SLURM_STEP_NUM_NODES=str(nnodes), DDPRUN_MUNGE_SOCKET=munge_socket)
    return env


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class PrivateMunged:
    """munged with a key of its own, on a socket of its own; stopped and removed on exit."""

    def __enter__(self):
        self.dir = tempfile.mkdtemp(prefix="ddprun-munge-")
        os.chmod(self.dir, 0o755)  # munged wants its socket's directory reachable by all
        self.socket = os.path.join(self.dir, "socket")
        key = os.path.join(self.dir, "munge.key")
        subprocess.run([_which("mungekey"), "--create", f"--keyfile={key}"], check=True)
        self.log = os.path.join(self.dir, "munged.log")
        self.proc = subprocess.Popen([_which("munged"), "--foreground", f"--socket={self.socket}",
                                      f"--key-file={key}", f"--pid-file={self.dir}/munged.pid",
                                      f"--seed-file={self.dir}/seed", f"--log-file={self.log}",
                                      "--num-threads=2"], stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 20
        while not os.path.exists(self.socket):
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.__exit__(None, None, None)
                raise RuntimeError("the private munged did not create its socket")
            time.sleep(0.05)
        return self

    def __exit__(self, *exc):
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        shutil.rmtree(self.dir, ignore_errors=True)
        return False
