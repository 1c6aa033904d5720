# Shared helpers of the interop tests (run by Debian's python3 with torch 1.13 or by the
# torch 2.11 venv). Real processes, real sockets; every wait is bounded (hang guards only,
# never used as synchronisation).
import os
import select
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "pylib"))
from ddprun_testlib import free_port  # noqa: E402,F401 (for PyTorch 1.13's master store, which needs a port up front)

_children = []


def log(msg):
    print(msg, flush=True)


class TestFailure(AssertionError):
    pass


def check(cond, what):
    if not cond:
        raise TestFailure(what)
    log(f"  ok: {what}")


def check_eq(got, want, what):
    if got != want:
        raise TestFailure(f"{what}: got {got!r}, want {want!r}")
    log(f"  ok: {what} == {want!r}" if len(repr(want)) < 80 else f"  ok: {what}")


def expect_raises(fn, what, exc=Exception):
    try:
        fn()
    except exc as e:  # noqa: BLE001
        log(f"  ok: {what} raised {type(e).__name__}: {str(e).splitlines()[0][:120] if str(e) else ''}")
        return e
    raise TestFailure(f"{what}: expected an exception, none raised")


def install_watchdog(seconds):
    """Hang guard: the whole script fails (and kills its children) after `seconds`."""

    def on_alarm(signum, frame):  # noqa: ARG001
        sys.stderr.write(f"FAIL: watchdog: test still running after {seconds}s\n")
        sys.stderr.flush()
        kill_children()
        os._exit(1)

    signal.signal(signal.SIGALRM, on_alarm)
    signal.alarm(seconds)


def kill_children():
    for p in _children:
        if p.poll() is None:
            try:
                p.kill()
            except OSError:
                pass
    for p in _children:
        try:
            p.wait(timeout=5)
        except Exception:  # noqa: BLE001
            pass


def spawn(args, **kw):
    p = subprocess.Popen(args, **kw)
    _children.append(p)
    return p


def read_line_with_deadline(stream, deadline_s, what):
    """Reads one line from a pipe without blocking past the deadline."""
    fd = stream.fileno()
    buf = b""
    end = time.monotonic() + deadline_s
    while b"\n" not in buf:
        left = end - time.monotonic()
        if left <= 0:
            raise TestFailure(f"no line from {what} within {deadline_s}s (got {buf!r})")
        r, _, _ = select.select([fd], [], [], left)
        if not r:
            continue
        chunk = os.read(fd, 4096)
        if not chunk:
            raise TestFailure(f"{what} closed its output before printing a line (got {buf!r})")
        buf += chunk
    line, _, _rest = buf.partition(b"\n")
    return line.decode()


class Daemon:
    """ddprund as a separate process on 127.0.0.1, port 0. With `relay` (ddprun_store_relay's
    path), clients are given a store relay's port in front of it instead (host/port); the
    daemon's own port is store_port."""

    def __init__(self, binary, extra=(), relay=None):
        self.stderr_file = tempfile.NamedTemporaryFile(prefix="ddprund-", suffix=".log", delete=False)
        self.proc = spawn([binary, "--host", "127.0.0.1", "--port", "0", *extra],
                          stdout=subprocess.PIPE, stderr=self.stderr_file)
        line = read_line_with_deadline(self.proc.stdout, 30, "ddprund")
        prefix = "ddprund listening on "
        if not line.startswith(prefix):
            raise TestFailure(f"unexpected first line from ddprund: {line!r}")
        self.port = int(line.rsplit(":", 1)[1])
        self.host = "127.0.0.1"
        # ddprund logs to stdout too: keep draining it so a full pipe never blocks the daemon.
        self._stdout_chunks = []
        self._drain = threading.Thread(target=self._drain_stdout, daemon=True)
        self._drain.start()
        log(f"ddprund pid {self.proc.pid} listening on {self.host}:{self.port}")
        self.store_port = self.port
        self.relay = None
        if relay:
            self.relay_log = tempfile.NamedTemporaryFile(prefix="relay-", suffix=".log", delete=False)
            self.relay = spawn([relay, "--upstream", f"127.0.0.1:{self.store_port}"], stdout=subprocess.PIPE,
                               stderr=self.relay_log)
            line = read_line_with_deadline(self.relay.stdout, 30, "ddprun_store_relay")
            if not line.startswith("store relay listening on "):
                raise TestFailure(f"unexpected first line from ddprun_store_relay: {line!r}")
            self.port = int(line.rsplit(":", 1)[1])
            log(f"store relay pid {self.relay.pid} on {self.host}:{self.port} in front of ddprund")

    def _drain_stdout(self):
        fd = self.proc.stdout.fileno()
        while True:
            chunk = os.read(fd, 65536)
            if not chunk:
                return
            self._stdout_chunks.append(chunk)

    def alive(self):
        return self.proc.poll() is None

    def rss_kb(self):
        with open(f"/proc/{self.proc.pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1])
        raise TestFailure("no VmRSS in /proc status")

    def log_text(self):
        with open(self.stderr_file.name, "rb") as f:
            err = f.read()
        return (b"".join(self._stdout_chunks) + err).decode(errors="replace")

    def stop_relay(self):
        """Stops the relay (if any); returns its exit code and log."""
        if not self.relay:
            return 0, ""
        if self.relay.poll() is None:
            self.relay.send_signal(signal.SIGTERM)
            try:
                self.relay.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.relay.kill()
                self.relay.wait(timeout=5)
                raise TestFailure("ddprun_store_relay did not stop within 10s of SIGTERM")
        with open(self.relay_log.name, "rb") as f:
            text = f.read().decode(errors="replace")
        os.unlink(self.relay_log.name)
        return self.relay.returncode, text

    def stop(self):
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=5)
                raise TestFailure("ddprund did not stop within 10s of SIGTERM")
        rc = self.proc.returncode
        self._drain.join(timeout=5)
        return rc


def log_says(d, text, timeout=10.0):
    """Whether the daemon's output has a line with `text` within `timeout` s (its output is read
    by another thread: a line written just now may not have been read yet)."""
    deadline = time.monotonic() + timeout
    while True:
        if any(text in ln for ln in d.log_text().splitlines()):
            return True
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)


def torch_major_minor():
    import torch

    v = torch.__version__.split("+")[0]
    parts = v.split(".")
    return int(parts[0]), int(parts[1])


def run_main(main, watchdog_s):
    """Runs main() with a watchdog; prints PASS/FAIL, exits 0/1."""
    install_watchdog(watchdog_s)
    try:
        main()
    except Exception as e:  # noqa: BLE001
        import traceback

        traceback.print_exc()
        log(f"FAIL: {type(e).__name__}: {e}")
        kill_children()
        sys.exit(1)
    kill_children()
    log("PASS")
    sys.exit(0)


# ---- a raw-socket TCPStore client (for checks the PyTorch API cannot express and for hostile
# input). D2 codes by default; D0 = PyTorch 1.13's codes.
D2 = {"VALIDATE": 0, "SET": 1, "COMPARE_SET": 2, "GET": 3, "ADD": 4, "CHECK": 5, "WAIT": 6,
      "GETNUMKEYS": 7, "DELETE_KEY": 8, "APPEND": 9, "MULTI_GET": 10, "MULTI_SET": 11,
      "CANCEL_WAIT": 12, "PING": 13, "QUEUE_PUSH": 14, "QUEUE_POP": 15, "QUEUE_LEN": 16,
      "LIST_KEYS": 17}
D0 = {"SET": 0, "COMPARE_SET": 1, "GET": 2, "ADD": 3, "CHECK": 4, "WAIT": 5, "GETNUMKEYS": 6,
      "DELETE_KEY": 8}
MAGIC = bytes.fromhex("cef7853c")


def u64(n):
    return int(n).to_bytes(8, "little", signed=False)


def i64(n):
    return int(n).to_bytes(8, "little", signed=True)


def blob(b):
    if isinstance(b, str):
        b = b.encode()
    return u64(len(b)) + b


class RawConn:
    def __init__(self, host, port, dialect="D2", validate=True, timeout=10.0):
        self.codes = D2 if dialect == "D2" else D0
        self.sock = socket.create_connection((host, port), timeout=timeout)
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        if dialect == "D2" and validate:
            self.sock.sendall(b"\x00" + MAGIC)

    def send(self, data):
        self.sock.sendall(data)

    def op(self, name, *fields):
        self.sock.sendall(bytes([self.codes[name]]) + b"".join(fields))

    def recv_exact(self, n):
        out = b""
        while len(out) < n:
            chunk = self.sock.recv(n - len(out))
            if not chunk:
                raise EOFError(f"connection closed after {len(out)} of {n} bytes")
            out += chunk
        return out

    def recv_i64(self):
        return int.from_bytes(self.recv_exact(8), "little", signed=True)

    def recv_blob(self):
        n = int.from_bytes(self.recv_exact(8), "little")
        return self.recv_exact(n)

    def get(self, key):
        self.op("GET", blob(key))
        return self.recv_blob()

    def add(self, key, delta):
        self.op("ADD", blob(key), i64(delta))
        return self.recv_i64()

    def num_keys(self):
        self.op("GETNUMKEYS")
        return self.recv_i64()

    def is_closed_by_peer(self, within_s=10.0):
        """True when the peer closes (EOF or reset) within the bound; reads and drops bytes."""
        end = time.monotonic() + within_s
        while time.monotonic() < end:
            self.sock.settimeout(max(0.01, end - time.monotonic()))
            try:
                chunk = self.sock.recv(65536)
            except socket.timeout:
                return False
            except (ConnectionResetError, BrokenPipeError):
                return True
            if not chunk:
                return True
        return False

    def close(self):
        self.sock.close()
