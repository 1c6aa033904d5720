"""A stranger on the network who knows a job's run id and rendezvous endpoint, for the
intruder scenarios of test_multinode.py. It speaks the agents' protocol
(docs/RENDEZVOUS.md) by hand and tries, in a loop until --seconds pass:

  wrong_token   the token handshake with a wrong token, then JOIN / FAILURE / LEAVE anyway
  no_token      JOIN straight away (no HELLO), as an agent of an open rendezvous would
  huge_world    a JOIN declaring 2^31-1 local workers (once, before the real agents: --once)
  join_leave    JOIN then LEAVE, over and over (used to spend a job's restart budget)
  forge_failure JOIN then a FAILURE for rounds 0..3 full of terminal escapes and fake lines
  store         a PyTorch TCPStore client against the workers' store (--store_port)

Prints one line per attempt: what the server answered. Only the standard library (and torch
for `store`)."""
import argparse
import hashlib
import hmac
import os
import socket
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "pylib"))
from ddprun_testlib import AGENT_HELLO, agent_frame as frame, parse_agent_frame  # noqa: E402

JOIN, FAILURE, LEAVE, HELLO, AUTH = 1, 3, 5, 6, 7
NAMES = {20: "ROUND", 21: "RESTART", 22: "JOB_DONE", 23: "JOB_FAILED", 24: "ERROR", 25: "CHALLENGE", 26: "WELCOME"}
FAKE = "\x1b[2J\x1b[H\x1b]0;pwned\x07\n[ddprun] info: all workers succeeded\n\x1b[32mOK\x1b[0m"


def read_frames(sock, timeout):
    """Frames until the server closes the connection or `timeout` passes without one."""
    sock.settimeout(timeout)
    buf, out = b"", []
    while True:
        try:
            chunk = sock.recv(65536)
        except (socket.timeout, ConnectionResetError):
            break
        if not chunk:
            break
        buf += chunk
        while (got := parse_agent_frame(buf)) is not None:
            mtype, fields, buf = got
            out.append((NAMES.get(mtype, str(mtype)), fields))
            if mtype in (24, 25, 26):  # an answer to the handshake: stop waiting for more
                return out
    return out


def join_fields(args, lws=1):
    return {"run_id": args.run_id, "node_id": "intruder", "host": args.my_addr, "local_world_size": lws,
            "min_nodes": args.min_nodes or args.nnodes, "max_nodes": args.nnodes, "max_restarts": args.max_restarts,
            "last_call_ms": 2000, "join_timeout_ms": 20000, "heartbeat_timeout_ms": 5000}


def connect(args):
    # The endpoint may not listen yet (its agent is starting): retry, bounded.
    deadline = time.monotonic() + 30
    while True:
        try:
            return socket.create_connection((args.host, args.port), timeout=5)
        except OSError:
            if time.monotonic() >= deadline:
                raise
            time.sleep(0.1)


def attempt(args, mode):
    s = connect(args)
    try:
        s.sendall(AGENT_HELLO)
        if mode == "wrong_token":
            nc = os.urandom(32).hex()
            s.sendall(frame(HELLO, {"version": 2, "client_nonce": nc}))
            got = read_frames(s, 3)
            ch = dict(got[0][1]) if got and got[0][0] == "CHALLENGE" else {}
            ns = ch.get("server_nonce", "")
            proof = hmac.new(b"not the job's token at all", f"ddprun-rdzv-v1 agent|{ns}|{nc}".encode(),
                             hashlib.sha256).hexdigest()
            s.sendall(frame(AUTH, {"proof": proof}))
            got += read_frames(s, 3)
            attacks = [frame(JOIN, join_fields(args)), frame(FAILURE, {"round": 0, "exit_code": 1, "stderr_tail": FAKE}),
                       frame(LEAVE, {})]
            try:
                for a in attacks:
                    s.sendall(a)
            except OSError:
                pass
            got += read_frames(s, 1)
            return got
        if mode == "huge_world":
            s.sendall(frame(JOIN, join_fields(args, lws=2**31 - 1)))
            return read_frames(s, 2)
        if mode in ("no_token", "join_leave"):
            s.sendall(frame(JOIN, join_fields(args)))
            got = read_frames(s, 0.5)
            try:
                s.sendall(frame(LEAVE, {}))
            except OSError:
                pass
            return got
        if mode == "forge_failure":
            try:
                s.sendall(frame(JOIN, join_fields(args)))
                for r in range(4):
                    s.sendall(frame(FAILURE, {"round": r, "global_rank": 0, "exit_code": 1,
                                              "signal": "\x1b[31mSIGKILL", "stderr_tail": FAKE}))
            except OSError:
                pass  # refused and closed already: what it said is still readable
            return read_frames(s, 0.5)
        raise SystemExit(f"unknown mode {mode}")
    finally:
        s.close()


def try_store(args):
    import datetime
    import torch.distributed as dist
    try:
        st = dist.TCPStore(args.host, args.store_port, is_master=False, timeout=datetime.timedelta(seconds=4))
        st.set("intruder", "was here")  # a legacy SET has no reply: only the GET shows it was served
        st.get("intruder")
        print("store: ACCEPTED a stranger's set and get", flush=True)
    except Exception as e:  # noqa: BLE001 — any failure to use the store is the expected outcome
        print(f"store: refused ({type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''})", flush=True)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--host", required=True)
    ap.add_argument("--port", type=int, default=29400)
    ap.add_argument("--my_addr", default="198.18.0.99")
    ap.add_argument("--run_id", default="job")
    ap.add_argument("--nnodes", type=int, default=2)  # the job's max nodes
    ap.add_argument("--min_nodes", type=int, default=0)  # 0: = --nnodes
    ap.add_argument("--max_restarts", type=int, default=3)
    ap.add_argument("--seconds", type=float, default=6)
    ap.add_argument("--once", action="store_true")
    ap.add_argument("--store_port", type=int, default=0)
    ap.add_argument("modes", nargs="+")
    args = ap.parse_args()
    if "store" in args.modes:
        try_store(args)
        return
    end = time.monotonic() + args.seconds
    while True:
        for mode in args.modes:
            try:
                got = attempt(args, mode)
            except OSError as e:
                got = [("closed", {"error": str(e)})]
            print(f"{mode}: " + "; ".join(f"{t} {f.get('message', f.get('reason', ''))!r}" for t, f in got), flush=True)
        if args.once or time.monotonic() >= end:
            break
        time.sleep(0.2)


if __name__ == "__main__":
    sys.exit(main())
