"""Test hosts in network namespaces: a switch namespace with a bridge, and one namespace per
node wired to it with a veth pair. Addresses are in 198.18.0.0/24 (the benchmarking range),
which exists only inside these namespaces. Needs root (CI runs as root)."""
import os
import signal
import subprocess
import time

SUBNET = "198.18.0"


def sh(*argv, check=True):
    return subprocess.run(argv, check=check, capture_output=True, text=True)


class Cluster:
    def __init__(self, tag: str):
        self.tag = tag
        self.switch = f"ddpt{tag}sw"
        self.nodes = []  # namespace names
        self.procs = []
        sh("ip", "netns", "add", self.switch)
        sh("ip", "-n", self.switch, "link", "add", "br0", "type", "bridge")
        sh("ip", "-n", self.switch, "link", "set", "br0", "up")

    def add_node(self) -> int:
        i = len(self.nodes)
        ns = f"ddpt{self.tag}n{i}"
        sh("ip", "netns", "add", ns)
        sh("ip", "link", "add", "eth0", "netns", ns, "type", "veth", "peer", "name", f"p{i}", "netns", self.switch)
        sh("ip", "-n", self.switch, "link", "set", f"p{i}", "master", "br0")
        sh("ip", "-n", self.switch, "link", "set", f"p{i}", "up")
        sh("ip", "-n", ns, "addr", "add", f"{self.addr(i)}/24", "dev", "eth0")
        sh("ip", "-n", ns, "link", "set", "eth0", "up")
        sh("ip", "-n", ns, "link", "set", "lo", "up")
        self.nodes.append(ns)
        return i

    def addr(self, i: int) -> str:
        return f"{SUBNET}.{10 + i}"

    def spawn(self, i: int, argv, env=None, **kw):
        p = subprocess.Popen(["ip", "netns", "exec", self.nodes[i]] + list(argv), env=env,
                             stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, **kw)
        self.procs.append(p)
        return p

    def link_down(self, i: int):
        sh("ip", "-n", self.switch, "link", "set", f"p{i}", "down")

    def close(self):
        for p in self.procs:
            if p.poll() is None:
                p.kill()
        for ns in self.nodes + [self.switch]:
            pids = sh("ip", "netns", "pids", ns, check=False).stdout.split()
            for pid in pids:
                try:
                    os.kill(int(pid), signal.SIGKILL)
                except (ProcessLookupError, ValueError):
                    pass
        for p in self.procs:
            try:
                p.wait(timeout=10)
            except subprocess.TimeoutExpired:
                pass
        for ns in self.nodes + [self.switch]:
            sh("ip", "netns", "del", ns, check=False)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def wait_for(pred, timeout, what):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if pred():
            return
        time.sleep(0.05)
    raise AssertionError(f"timed out after {timeout}s waiting for {what}")
