#!/usr/bin/env python3
"""Stores and rendezvous: the store's port, c10d on one node and on many (agents on this host,
a standing ddprund, an agent protocol peer written by hand).

Run: test_coordination.py <path to ddprun> [unittest names] (harness.py says more).
"""
import os
import re
import signal
import socket
import subprocess
import time
import unittest

import harness
from harness import HANG_GUARD, run, worker, Agent, free_port
from harness import PYLIB, AGENT_HELLO, JOIN, SUCCEEDED, ROUND, agent_frame, read_agent_frame


class Ports(unittest.TestCase):
    def test_busy_default_port_falls_back_to_a_free_one(self):
        # Hold 29500 when we can; when another process has it, hold another port and make it
        # the default through ddprun's test seam (29500's holder may let go any time).
        blocker = socket.socket()
        env = {}
        try:
            blocker.bind(("", 29500))
        except OSError:
            blocker.bind(("", 0))
            env["DDPRUN_DEFAULT_STORE_PORT"] = str(blocker.getsockname()[1])
        blocker.listen()
        held = blocker.getsockname()[1]
        try:
            p = run(worker("import os; print('port', os.environ['MASTER_PORT'])"), env=env)
            self.assertEqual(p.returncode, 0, p.stderr)
            port = p.stdout.split("port ")[1].strip()
            self.assertNotEqual(port, str(held))
            self.assertIn(f"port {held} is taken", p.stderr)
        finally:
            blocker.close()

    def test_busy_explicit_port_is_an_error(self):
        blocker = socket.socket()
        blocker.bind(("", 0))
        blocker.listen()
        port = blocker.getsockname()[1]
        try:
            p = run([f"--master_port={port}", "--no_python", "true"])
            self.assertNotEqual(p.returncode, 0)
            self.assertIn(f"port {port}", p.stderr)
        finally:
            blocker.close()

    def test_store_is_reachable_by_workers(self):
        code = ("import os, socket\n"
                "s = socket.create_connection((os.environ['MASTER_ADDR'], int(os.environ['MASTER_PORT'])), 5)\n"
                "print('connected'); s.close()\n")
        p = run(["--nproc_per_node=2", "--standalone"] + worker(code))
        self.assertEqual(p.returncode, 0, p.stderr)
        self.assertEqual(p.stdout.count("connected"), 2)

    def test_c10d_single_node_hosts_the_store_on_the_endpoint_port(self):
        for _ in range(3):  # the port is free when picked; a test beside this one may take it before ddprun
            port = free_port("")
            p = run(["--rdzv_backend=c10d", f"--rdzv-endpoint=localhost:{port}", "--nnodes=1:1"] +
                    worker("import os; print('store', os.environ['MASTER_ADDR'], os.environ['MASTER_PORT'])"))
            if "in use" not in p.stderr:
                break
        self.assertEqual(p.returncode, 0, p.stderr)
        self.assertIn(f"[r0]: store 127.0.0.1 {port}", p.stdout)


def where_lines(out):
    """[rank, world size, MASTER_PORT, restart count] of every 'where' line (prefixes cut)."""
    # Only the workers' own lines ("where R W PORT N"): other output may contain the word too.
    return [list(m.groups()) for m in re.finditer(r"\bwhere (\d+) (\d+) (\d+) (\d+)\b", out)]


WORKER_SAYS_WHERE = ("import os; print('where', os.environ['RANK'], os.environ['WORLD_SIZE'], os.environ['MASTER_PORT'],"
                     " os.environ['TORCHELASTIC_RESTART_COUNT'], flush=True)")


class Coordination(unittest.TestCase):
    def c10d(self, port, nnodes=2, extra=(), conf=""):
        return [f"--nnodes={nnodes}", "--rdzv_backend=c10d", f"--rdzv_endpoint=127.0.0.1:{port}",
                "--rdzv_id=e2e", "--rdzv_conf=last_call_timeout=1,join_timeout=60" + conf] + list(extra)

    def test_sigint_while_connecting_ends_within_a_second(self):
        port = free_port()  # nothing listens there; this agent does not host
        a = Agent(["--nnodes=2", "--rdzv_backend=c10d", f"--rdzv_endpoint=127.0.0.1:{port}",
                   "--rdzv_conf=is_host=0,join_timeout=600", "--no_python", "true"])
        a.wait_err("connecting to the rendezvous")
        rc, err, took = a.interrupt_and_time()
        self.assertEqual(rc, 128 + signal.SIGINT, err)
        self.assertLess(took, 3.0, err)  # the contract is 1 s; generous for a loaded CI host
        self.assertIn("received SIGINT", err)
        self.assertIn("stopped while connecting to the rendezvous endpoint", err)

    def test_sigterm_while_joining_a_round_that_never_fills(self):
        port = free_port()
        a = Agent(["-v"] + self.c10d(port) + ["--no_python", "true"])
        a.wait_err("joining the next round")
        rc, err, took = a.interrupt_and_time(signal.SIGTERM)
        self.assertEqual(rc, 128 + signal.SIGTERM, err)
        self.assertLess(took, 3.0, err)
        self.assertIn("stopped by SIGTERM", err)

    def test_sigint_while_the_host_waits_for_the_other_nodes(self):
        # A second "node" speaks the agent protocol by hand: it joins, succeeds, and keeps its
        # connection, so the hosting agent waits for it at the end (bounded at 60 s).
        port = free_port()
        a = Agent(self.c10d(port, conf=",heartbeat_timeout=300") + ["--no_python", "true"])
        a.wait_err("hosting the rendezvous")
        s = socket.create_connection(("127.0.0.1", port))
        s.sendall(AGENT_HELLO)
        s.sendall(agent_frame(JOIN, {"run_id": "e2e", "node_id": "fake", "host": "127.0.0.1",
                                           "local_world_size": 1, "min_nodes": 2, "max_nodes": 2,
                                           "last_call_ms": 1000, "join_timeout_ms": 60000,
                                           "heartbeat_timeout_ms": 300000}))
        t, f = read_agent_frame(s)
        self.assertEqual(t, ROUND, f)
        s.sendall(agent_frame(SUCCEEDED, {"round": f["round"]}))
        a.wait_err("waiting for the other nodes to finish")
        rc, err, took = a.interrupt_and_time()
        s.close()
        self.assertLess(took, 3.0, err)
        self.assertIn("not waiting for the other nodes", err)
        self.assertEqual(rc, 0, err)  # the job itself succeeded

    def test_unparsable_endpoint_is_a_usage_error(self):
        p = run(["--nnodes=2", "--rdzv_backend=c10d", "--rdzv_endpoint=::::garbage:::", "--no_python", "true"])
        self.assertEqual(p.returncode, 2, p.stderr)
        self.assertIn("expected HOST[:PORT]", p.stderr)

    def two_agents(self, port, first_extra=(), second_extra=()):
        a = Agent(self.c10d(port, extra=first_extra) + worker(WORKER_SAYS_WHERE))
        b = Agent(self.c10d(port, extra=second_extra) + worker(WORKER_SAYS_WHERE))
        ra, oa, ea = a.finish()
        rb, ob, eb = b.finish()
        self.assertEqual((ra, rb), (0, 0), ea + eb)
        self.assertEqual(sorted(w[0] for w in where_lines(oa + ob)), ["0", "1"], oa + ob)
        return ea, eb

    def standing_ddprund(self, port):
        """A standing ddprund on 127.0.0.1:port, listening when this returns (the caller kills it)."""
        ddprund = os.path.join(os.path.dirname(os.path.dirname(harness.DDPRUN)), "rendezvous", "ddprund")
        if not os.path.exists(ddprund):
            self.skipTest(f"no ddprund at {ddprund}")
        d = subprocess.Popen([ddprund, "--host", "127.0.0.1", "--port", str(port)], stdout=subprocess.DEVNULL,
                             stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + HANG_GUARD
        while True:  # listening yet? (a connect, not a sleep, decides)
            try:
                socket.create_connection(("127.0.0.1", port)).close()
                return d
            except OSError:
                if time.monotonic() > deadline:
                    d.kill()
                    raise
                time.sleep(0.02)

    def test_two_agents_on_one_host_join_a_standing_ddprund(self):
        port = free_port()
        d = self.standing_ddprund(port)
        try:
            ea, eb = self.two_agents(port)
            self.assertIn("joining the rendezvous served there as a client", ea)
            self.assertIn("joining the rendezvous served there as a client", eb)
        finally:
            d.kill()
            d.wait()

    def test_one_node_joins_a_standing_ddprund(self):
        # torchrun --nnodes=1 with c10d joins the store already serving the endpoint.
        port = free_port()
        d = self.standing_ddprund(port)
        try:
            p = run(self.c10d(port, nnodes=1, extra=["--nproc_per_node=2"]) + worker(WORKER_SAYS_WHERE))
        finally:
            d.kill()
            d.wait()
        self.assertEqual(p.returncode, 0, p.stderr)
        self.assertNotIn("cannot host the store", p.stderr)
        self.assertIn(f"connecting to the rendezvous of job e2e at 127.0.0.1:{port}", p.stderr)
        self.assertEqual(sorted(w[:2] for w in where_lines(p.stdout)), [["0", "2"], ["1", "2"]], p.stdout)

    def test_one_node_with_is_host_false_is_a_client(self):
        # Nothing listens yet: the agent waits for the server instead of hosting a store itself.
        port = free_port()
        a = Agent(self.c10d(port, nnodes=1, conf=",is_host=false") + worker(WORKER_SAYS_WHERE))
        a.wait_err(f"connecting to the rendezvous of job e2e at 127.0.0.1:{port}")
        d = self.standing_ddprund(port)
        try:
            r, out, err = a.finish()
        finally:
            d.kill()
            d.wait()
        self.assertEqual(r, 0, err)
        self.assertNotIn("hosting", err)
        self.assertEqual([w[:2] for w in where_lines(out)], [["0", "1"]], out)

    def test_two_agents_on_one_host_the_first_hosts(self):
        port = free_port()
        a = Agent(self.c10d(port) + worker(WORKER_SAYS_WHERE))
        a.wait_err("hosting the rendezvous")
        b = Agent(self.c10d(port) + worker(WORKER_SAYS_WHERE))
        rb, ob, eb = b.finish()
        ra, oa, ea = a.finish()
        self.assertEqual((ra, rb), (0, 0), ea + eb)
        self.assertIn("joining the rendezvous served there as a client", eb)
        self.assertEqual(sorted(w[0] for w in where_lines(oa + ob)), ["0", "1"], oa + ob)

    def test_is_host_given_with_the_port_taken_is_a_clear_error(self):
        port = free_port()
        a = Agent(self.c10d(port) + ["--no_python", "true"])
        a.wait_err("hosting the rendezvous")
        p = run(self.c10d(port, conf=",is_host=1") + ["--no_python", "true"])
        a.p.send_signal(signal.SIGINT)
        a.finish()
        self.assertEqual(p.returncode, 1, p.stderr)
        self.assertIn("cannot listen there", p.stderr)

    def test_a_node_with_another_max_restarts_is_refused_naming_both(self):
        port = free_port()
        a = Agent(self.c10d(port, extra=["--max_restarts=3"]) + ["--no_python", "true"])
        a.wait_err("hosting the rendezvous")
        p = run(self.c10d(port, extra=["--max_restarts=1"]) + ["--no_python", "true"])
        a.p.send_signal(signal.SIGINT)
        a.finish()
        self.assertEqual(p.returncode, 1, p.stderr)
        self.assertIn("--max_restarts: the job runs with 3, this agent asked for 1", p.stderr)

    def test_static_multi_node_keeps_master_port_in_every_attempt(self):
        port = free_port()
        code = (WORKER_SAYS_WHERE + "\nimport sys\n"
                "sys.exit(3 if os.environ['TORCHELASTIC_RESTART_COUNT'] == '0' and os.environ['RANK'] == '1' else 0)")
        args = lambda n: ["--nnodes=2", f"--node_rank={n}", "--master_addr=127.0.0.1", f"--master_port={port}",
                          "--max_restarts=1"] + worker(code)
        a = Agent(args(0))
        b = Agent(args(1))
        ra, oa, ea = a.finish()
        rb, ob, eb = b.finish()
        self.assertEqual((ra, rb), (0, 0), ea + eb)
        seen = where_lines(oa + ob)
        # rank 0 of attempt 0 may be stopped before it prints: rank 1 fails at once
        self.assertTrue({("1", "0"), ("0", "1"), ("1", "1")} <= {(w[0], w[3]) for w in seen}, oa + ob)
        self.assertEqual({w[2] for w in seen}, {str(port)}, oa + ob)

    def test_an_import_error_says_why_it_stops_with_restarts_left(self):
        p = run(["--nproc_per_node=2", "--max_restarts=3"] + worker("import no_such_module"))
        self.assertEqual(p.returncode, 1)
        self.assertIn("not retried: attempts 0 and 1", p.stderr)
        self.assertIn("2 of 3 restarts left unused", p.stderr)
        self.assertNotIn("no restarts left", p.stderr)

    def test_a_single_node_store_answers_no_rendezvous_and_listens_on_loopback(self):
        code = ("import os, socket, sys\n"
                f"sys.path.insert(0, {PYLIB!r})\n"
                "from ddprun_testlib import AGENT_HELLO, JOIN, agent_frame\n"
                "s = socket.create_connection((os.environ['MASTER_ADDR'], int(os.environ['MASTER_PORT'])), 5)\n"
                "s.sendall(AGENT_HELLO + agent_frame(JOIN, {'run_id': 'x'}))\n"
                "s.settimeout(10)\n"
                "try:\n"
                "    got = s.recv(100)\n"
                "except ConnectionResetError:\n"
                "    got = b''\n"
                "print('answer', len(got), flush=True)\n"
                # the listeners on MASTER_PORT (state 0A), by local address, while the store runs
                "port = '%04X' % int(os.environ['MASTER_PORT'])\n"
                "ls = [l.split()[1].split(':')[0] for f in ('/proc/net/tcp', '/proc/net/tcp6') for l in open(f)\n"
                "      if l.split()[1].endswith(':' + port) and l.split()[3] == '0A']\n"
                "print('listeners', ' '.join(ls), flush=True)\n")
        p = run(["-v"] + worker(code))
        self.assertEqual(p.returncode, 0, p.stderr)
        self.assertIn("[r0]: answer 0", p.stdout)  # closed, no ROUND
        self.assertIn("[r0]: listeners 0100007F", p.stdout)  # 127.0.0.1 only (one per I/O thread)
        listeners = p.stdout.split("listeners ")[1].split("\n")[0].split()
        self.assertEqual(set(listeners), {"0100007F"}, p.stdout)


if __name__ == "__main__":
    harness.main()
