#!/usr/bin/env python3
"""Knocks on a ddprun rendezvous with a munge credential, as an agent of another job or
another user would, and prints the server's answer (one line: the message type, then its
text).

    munge_probe.py --host H --port P --socket MUNGE_SOCKET [--job J --step S] [--decoder-uid U]

The credential is made by the `munge` command as the user running this script, for the job
and step given (default: this process's SLURM_JOB_ID and SLURM_STEP_ID, so inside another
job's srun step it is that job's), and may be decoded by uid U (default: this user)."""
import argparse
import os
import secrets
import socket
import subprocess
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "pylib"))
from ddprun_testlib import AGENT_HELLO, agent_frame as frame, parse_agent_frame  # noqa: E402

HELLO = 6
NAMES = {24: "ERROR", 25: "CHALLENGE", 26: "WELCOME"}


def first_frame(sock, timeout):
    sock.settimeout(timeout)
    buf = b""
    while True:
        try:
            chunk = sock.recv(65536)
        except (socket.timeout, ConnectionResetError):
            return None
        if not chunk:
            return None
        buf += chunk
        if (got := parse_agent_frame(buf)) is not None:
            return NAMES.get(got[0], str(got[0])), got[1]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--host", required=True)
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--socket", required=True)
    ap.add_argument("--job", default=os.environ.get("SLURM_JOB_ID", ""))
    ap.add_argument("--step", default=os.environ.get("SLURM_STEP_ID", ""))
    ap.add_argument("--decoder-uid", type=int, default=os.geteuid())
    a = ap.parse_args()
    nonce, secret = secrets.token_hex(32), secrets.token_hex(32)
    payload = f"ddprun-rdzv-munge-v1|{a.job}|{a.step}|{nonce}|{secret}"
    cred = subprocess.run(["munge", f"--socket={a.socket}", "--string", payload, f"--restrict-uid={a.decoder_uid}"],
                          capture_output=True, text=True, check=True).stdout.strip()
    deadline = time.monotonic() + 30
    while True:
        try:
            s = socket.create_connection((a.host, a.port), timeout=5)
            break
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.5)
    s.sendall(AGENT_HELLO + frame(HELLO, {"version": 2, "client_nonce": nonce, "munge": cred}))
    got = first_frame(s, 10)
    s.close()
    if got is None:
        print(f"uid {os.geteuid()} job {a.job} step {a.step}: no answer")
    else:
        print(f"uid {os.geteuid()} job {a.job} step {a.step}: {got[0]} {got[1].get('message', '')}")
    sys.stdout.flush()


if __name__ == "__main__":
    main()
