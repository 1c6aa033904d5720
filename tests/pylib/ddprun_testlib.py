"""What the Python tests share, whoever runs them (ctest, ddprun starting a worker, a Slurm
job, a benchmark script) and from whatever working directory: a free TCP port, and the framing
of the agent protocol (the rendezvous's own messages, rendezvous/include/ddprun/rdzv/agent_protocol.h).

Import it by this file's place, not the working directory's:
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "pylib"))
    from ddprun_testlib import free_port
(with as many ".." as the importing script sits below tests/). Standard library only: the
tests run it under Debian's Python 3.11 and under the PyTorch venvs' interpreters alike.
"""
import os
import socket
import struct

# This folder, for code that runs elsewhere (a worker started with `python -c`) to import from.
PYLIB = os.path.dirname(os.path.abspath(__file__))


def free_port(host="127.0.0.1"):
    """A TCP port that was free on `host` a moment ago (the kernel's pick for port 0). Another
    process may take it before the caller binds it: tests that can, retry."""
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


# ---- the agent protocol: a connection to the rendezvous port announces itself with AGENT_HELLO
# (a zero byte, then the magic "DDPR" as a little-endian u32), then sends frames: u32 length,
# u8 message type, u64 field count, each field a u64-length key and a u64-length value.

AGENT_MAGIC = 0x52504444
AGENT_HELLO = bytes([0]) + struct.pack("<I", AGENT_MAGIC)
JOIN, HEARTBEAT, FAILURE, SUCCEEDED, LEAVE = 1, 2, 3, 4, 5
ROUND, RESTART, JOB_DONE, JOB_FAILED, ERROR = 20, 21, 22, 23, 24


def _blob(x):
    b = x if isinstance(x, bytes) else str(x).encode()
    return struct.pack("<Q", len(b)) + b


def agent_frame(msg_type, fields):
    """One frame of the agent protocol; `fields` maps names to values (bytes as they are, any
    other value as its str())."""
    payload = bytes([msg_type]) + struct.pack("<Q", len(fields))
    payload += b"".join(_blob(k) + _blob(v) for k, v in fields.items())
    return struct.pack("<I", len(payload)) + payload


def parse_agent_frame(buf):
    """(message type, {field: value}, the bytes after it) of the frame at the start of `buf`, or
    None while `buf` holds less than a whole frame. Values are decoded leniently (a hostile or
    broken server's bytes are shown, not raised on)."""
    if len(buf) < 4 or len(buf) < 4 + struct.unpack("<I", buf[:4])[0]:
        return None
    n = struct.unpack("<I", buf[:4])[0]
    body, rest = buf[4:4 + n], buf[4 + n:]
    msg_type, count = body[0], struct.unpack("<Q", body[1:9])[0]
    fields, off = {}, 9
    for _ in range(count):
        kl = struct.unpack("<Q", body[off:off + 8])[0]
        k = body[off + 8:off + 8 + kl].decode(errors="replace")
        off += 8 + kl
        vl = struct.unpack("<Q", body[off:off + 8])[0]
        fields[k] = body[off + 8:off + 8 + vl].decode(errors="replace")
        off += 8 + vl
    return msg_type, fields, rest


def read_agent_frame(sock):
    """(message type, {field: value}) of the next frame on `sock` (blocking); AssertionError when
    the connection closes first."""
    buf = b""
    while (got := parse_agent_frame(buf)) is None:
        # Ask for no more than this frame: what follows it stays in the socket for the next call.
        want = (4 - len(buf)) if len(buf) < 4 else 4 + struct.unpack("<I", buf[:4])[0] - len(buf)
        chunk = sock.recv(want)
        if not chunk:
            raise AssertionError("the rendezvous closed the connection")
        buf += chunk
    return got[0], got[1]
