"""The token handshake and the sealed messages keep their bytes on the wire: the transcripts
recorded in handshake_transcripts.txt (fixed inputs, and one agent against a real ddprund) are
recomputed by this build (every proof, binding and MAC, byte for byte), the live one's agent
side is replayed against a real ddprund of this build, and the proofs and MACs are checked once
more by Python's hmac module, which shares no code with ddprun.

usage: handshake_compat.py --ddprund PATH --tool PATH [--record FILE]
  --record FILE  write FILE from this build instead (the transcripts a later build is held to)
"""
import argparse
import hashlib
import hmac
import os
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "pylib"))
from ddprun_testlib import parse_agent_frame  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
RECORDED = os.path.join(HERE, "handshake_transcripts.txt")
LIVE_TOKEN = "the live transcript's token, 16+ bytes"


class Ddprund:
    def __init__(self, binary):
        self.token = tempfile.NamedTemporaryFile("w", prefix="ddprun-token-", delete=False)
        self.token.write(LIVE_TOKEN + "\n")
        self.token.close()
        os.chmod(self.token.name, 0o600)
        self.proc = subprocess.Popen([binary, "--host", "127.0.0.1", "--port", "0", "--rdzv_token_file",
                                      self.token.name], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
        line = self.proc.stdout.readline()
        if not line.startswith("ddprund listening on "):
            self.close()
            raise SystemExit(f"FAIL: unexpected first line from ddprund: {line!r}")
        self.port = int(line.rsplit(":", 1)[1])

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def close(self):
        self.proc.kill()
        self.proc.wait()
        os.unlink(self.token.name)


def run(cmd):
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
    sys.stderr.write(r.stderr)
    if r.returncode != 0:
        raise SystemExit(f"FAIL: {' '.join(cmd)} exited {r.returncode}")
    return r.stdout


def mac(key, data):
    return hmac.new(key, data, hashlib.sha256)


def python_check(path):
    """Every proof and MAC of every transcript, by Python's hmac (the frame layout by hand)."""
    token, frames, n = None, [], 0

    def finish():
        nonlocal n
        if token is None:
            return
        parsed = [parse_agent_frame(bytes.fromhex(h)) for _, h in frames[1:]]
        nc = parsed[0][1]["client_nonce"]
        ch = parsed[1][1]
        ns = ch["server_nonce"]
        assert ch["server_proof"] == mac(token, f"ddprun-rdzv-v1 server|{nc}|{ns}".encode()).hexdigest()
        binding = f"ddprun-rdzv-v3 challenge|{nc}|{ns}|standing={ch.get('standing', '0')}|version={ch['version']}"
        assert ch["binding"] == mac(token, binding.encode()).hexdigest()
        assert parsed[2][1]["proof"] == mac(token, f"ddprun-rdzv-v1 agent|{ns}|{nc}".encode()).hexdigest()
        key = mac(token, f"ddprun-rdzv-v2 session|{nc}|{ns}".encode()).digest()
        for (side, h) in frames[5:]:
            raw = bytes.fromhex(h)
            mtype, fields, _ = parse_agent_frame(raw)
            # The MAC covers the frame without its mac field: re-frame it with the fields in key order.
            rest = {k: v for k, v in fields.items() if k != "mac"}
            body = bytes([mtype]) + len(rest).to_bytes(8, "little")
            for k in sorted(rest):
                for b in (k.encode(), rest[k].encode()):
                    body += len(b).to_bytes(8, "little") + b
            label = b"agent->server|" if side == "a>" else b"server->agent|"
            frame = len(body).to_bytes(4, "little") + body
            assert fields["mac"] == mac(key, label + frame).hexdigest(), f"MAC of {h[:40]}..."
            n += 1

    with open(path) as f:
        for line in f:
            key, _, val = line.strip().partition(" ")
            if key == "transcript":
                finish()
                token, frames = None, []
            elif key == "token":
                token = bytes.fromhex(val)
            elif key in ("a>", "s>"):
                frames.append((key, val))
    finish()
    assert n > 0
    print(f"ok: Python's hmac agrees with {n} recorded MACs and every proof")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--ddprund", required=True)
    ap.add_argument("--tool", required=True)
    ap.add_argument("--record")
    a = ap.parse_args()
    if a.record:
        text = "# Recorded by handshake_compat.py --record; checked by every later build.\n"
        text += run([a.tool, "fixed"])
        with Ddprund(a.ddprund) as d:
            text += run([a.tool, "live", str(d.port)])
        with open(a.record, "w") as f:
            f.write(text)
        print(f"recorded {a.record}")
        return
    python_check(RECORDED)
    print(run([a.tool, "check", RECORDED]), end="")
    with Ddprund(a.ddprund) as d:
        print(run([a.tool, "replay", str(d.port), RECORDED]), end="")
    print("PASS")


if __name__ == "__main__":
    main()
