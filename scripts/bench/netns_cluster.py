"""A cluster of real launcher agents, one per network namespace, on this machine.

N node namespaces and one rendezvous namespace hang off a bridge in a switch namespace (the
helper of tests/multinode/netns.py; addresses in 198.18.0.0/24, which exist only inside these
namespaces). The rendezvous namespace runs the anchor: a standing ddprund with a rendezvous
token (--launcher ddprun), or a standing PyTorch TCPStore (--launcher torchrun, the c10d
rendezvous of torchrun from the PyTorch 2.11 venv). Every node runs one real agent with
--nproc_per_node P workers. Two phases on the same cluster:
  launch  workers record their rank and exit: launch -> every worker started, -> every agent
          exited; the rounds formed; the anchor's CPU seconds and peak RSS.
  kill    workers hold (a shared flock the harness releases) until every one started; then the
          last node fails (its agent and workers SIGKILLed): time to the survivors' new round
          (every one of their workers started again), then release -> the job's completion.
The worker is a bash script (`--no_python`) that appends one line per start; --worker train
then execs the C++ `train` example (CPU, a few steps, with a checkpoint to resume from).
--netem-delay adds `tc netem` delay on every node's interface (needs sch_netem).
--check turns the facts into assertions (the ctest): every rank unique per round, every agent
exits 0, the survivors finish after a node is killed. Needs root (CAP_NET_ADMIN) and `ip`."""
import argparse
import fcntl
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.abspath(os.path.join(HERE, "..", ".."))
sys.path.insert(0, os.path.join(ROOT, "tests", "multinode"))
from netns import Cluster, sh  # noqa: E402

PORT = 29400
TOKEN_BYTES = 24
SKIP = 77

WORKER_SH = r"""#!/bin/bash
printf '%s %s %s %s %s %s\n' "$EPOCHREALTIME" "${RANK:--}" "${WORLD_SIZE:--}" \
  "${TORCHELASTIC_RESTART_COUNT:--}" "${GROUP_RANK:--}" "${NC_NODE:--}" >>"$NC_OUT/records"
if [[ -n "${NC_HOLD:-}" ]]; then flock -s "$NC_HOLD" true; fi
if (($#)); then exec "$@"; fi
"""

STORE_PY = r"""import sys, time
from torch.distributed import TCPStore
s = TCPStore("0.0.0.0", int(sys.argv[1]), is_master=True, wait_for_workers=False)
print("listening", flush=True)
while True:
    time.sleep(3600)
"""


class Fail(Exception):
    pass


def parse(argv):
    p = argparse.ArgumentParser(prog="netns_cluster.sh", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("nodes", type=int, help="node namespaces, one agent each (2 or more)")
    p.add_argument("--nproc", type=int, default=1, help="workers per node (default 1)")
    p.add_argument("--launcher", choices=("ddprun", "torchrun"), default="ddprun")
    p.add_argument("--worker", choices=("trivial", "train"), default="trivial")
    p.add_argument("--train-steps", type=int, default=5, help="train: global steps (default 5)")
    p.add_argument("--netem-delay", default="", help="e.g. 100us: netem delay on every node's interface")
    p.add_argument("--phases", default="launch,kill", help="launch, kill or both (default launch,kill)")
    p.add_argument("--last-call", type=float, default=5.0,
                   help="rendezvous last_call_timeout, s (default 5; both launchers get it)")
    p.add_argument("--timeout", type=float, default=300.0, help="bound of every wait, s (default 300)")
    p.add_argument("--round-timeout", type=float, default=60.0,
                   help="kill phase: how long to wait for the survivors' new round, s (default 60)")
    p.add_argument("--build-dir", default=os.environ.get("DDPRUN_BUILD_DIR", os.path.join(ROOT, "build")))
    p.add_argument("--torch-venv", default=os.environ.get("DDPRUN_TORCH_VENV", os.path.join(ROOT, ".venv-torch2")),
                   help="the PyTorch venv whose torchrun runs (default .venv-torch2 of this tree)")
    p.add_argument("--check", action="store_true", help="assert correctness (exit 1 on a violation)")
    a = p.parse_args(argv)
    if a.nodes < 2:
        p.error("N must be 2 or more (the kill phase needs a survivor)")
    if a.nproc < 1:
        p.error("--nproc must be 1 or more")
    a.phases = [x for x in a.phases.split(",") if x]
    if not set(a.phases) <= {"launch", "kill"} or not a.phases:
        p.error("--phases takes launch, kill or launch,kill")
    return a


def preflight(a):
    """A clear one-line reason (and exit 77, a skip) when this machine cannot run the cluster."""
    if shutil.which("ip") is None:
        raise SystemExit(skip("`ip` (iproute2) is not installed: apt-get install iproute2"))
    if os.geteuid() != 0:
        raise SystemExit(skip("needs root (CAP_NET_ADMIN) to create network namespaces: run with sudo"))
    probe = f"ddpnc{os.getpid()}probe"
    r = sh("ip", "netns", "add", probe, check=False)
    if r.returncode != 0:
        raise SystemExit(skip(f"`ip netns add` failed ({r.stderr.strip()}): needs CAP_NET_ADMIN and CAP_SYS_ADMIN"))
    try:
        if a.netem_delay:
            if shutil.which("tc") is None:
                raise SystemExit(skip("--netem-delay needs `tc` (iproute2)"))
            r = sh("tc", "-n", probe, "qdisc", "add", "dev", "lo", "root", "netem", "delay", a.netem_delay,
                   check=False)
            if r.returncode != 0:
                raise SystemExit(skip(f"--netem-delay: tc netem failed ({r.stderr.strip()}); the kernel needs "
                                      "sch_netem (modprobe sch_netem, or a kernel with CONFIG_NET_SCH_NETEM)"))
    finally:
        sh("ip", "netns", "del", probe, check=False)
    need = [os.path.join(a.build_dir, "rendezvous", "ddprund"), os.path.join(a.build_dir, "launcher", "ddprun")]
    if a.launcher == "torchrun":
        need = [os.path.join(a.torch_venv, "bin", "torchrun"), os.path.join(a.torch_venv, "bin", "python")]
    if a.worker == "train":
        need.append(train_exe(a))
    for f in need:
        if not os.access(f, os.X_OK):
            how = ("create the PyTorch venv (scripts/setup_deps.sh) or pass --torch-venv" if "venv" in f else
                   "build it (cmake --build build --target ddprun ddprund train) or pass --build-dir")
            raise SystemExit(fail_line(f"{f} is missing: {how}"))


def skip(msg):
    print(f"netns_cluster: SKIP: {msg}", file=sys.stderr)
    return SKIP


def fail_line(msg):
    print(f"netns_cluster: {msg}", file=sys.stderr)
    return 2


def train_exe(a):
    return os.path.join(a.build_dir, "worker_runtime", "train")


def proc_pss(pid):
    """Proportional set size in MiB (shared pages split among their users), None when gone."""
    try:
        with open(f"/proc/{pid}/smaps_rollup") as f:
            return next(int(x.split()[1]) for x in f if x.startswith("Pss:")) / 1024
    except (OSError, StopIteration):
        return None


def proc_cpu_rss(pid):
    """(CPU seconds, peak RSS MiB) of a live process, None when it is gone."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        cpu = (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
        with open(f"/proc/{pid}/status") as f:
            hwm = next(int(x.split()[1]) for x in f if x.startswith("VmHWM:"))
        return cpu, hwm / 1024
    except (OSError, StopIteration, IndexError, ValueError):
        return None


class Env:
    """The cluster, its anchor and the files the workers write."""

    def __init__(self, a):
        self.a = a
        self.tmp = tempfile.mkdtemp(prefix="ddprun-netns-")
        os.chmod(self.tmp, 0o755)
        self.cluster = Cluster(f"nc{os.getpid() % 100000}")
        self.anchor = None

    def setup(self):
        """Separate from __init__ so that close() can undo a set-up cut short (Ctrl-C, an error)."""
        a = self.a
        self.cluster.add_node()  # namespace 0: the anchor (ddprund or the TCPStore)
        for _ in range(a.nodes):
            i = self.cluster.add_node()
            if a.netem_delay:
                sh("tc", "-n", self.cluster.nodes[i], "qdisc", "add", "dev", "eth0", "root", "netem",
                   "delay", a.netem_delay)
        self.worker = os.path.join(self.tmp, "worker.sh")
        with open(self.worker, "w") as f:
            f.write(WORKER_SH)
        os.chmod(self.worker, 0o755)
        self.token = os.path.join(self.tmp, "token")
        with open(os.open(self.token, os.O_WRONLY | os.O_CREAT, 0o600), "w") as f:
            f.write(os.urandom(TOKEN_BYTES).hex() + "\n")
        self.anchor = self.start_anchor()

    def start_anchor(self):
        if self.a.launcher == "ddprun":
            argv = [os.path.join(self.a.build_dir, "rendezvous", "ddprund"), "--port", str(PORT),
                    "--rdzv_token_file", self.token]
        else:
            argv = [os.path.join(self.a.torch_venv, "bin", "python"), "-c", STORE_PY, str(PORT)]
        p = self.cluster.spawn(0, argv)
        said = []
        while not said or "listening" not in said[-1]:
            said.append(p.stdout.readline())
            if not said[-1]:
                raise Fail(f"the anchor did not start: {''.join(said)[-2000:]}")
        threading.Thread(target=p.stdout.read, daemon=True).start()  # keep its pipe drained
        return p

    def close(self):
        self.cluster.close()
        if not os.environ.get("NC_KEEP"):  # NC_KEEP=1 keeps the workers' records to read
            shutil.rmtree(self.tmp, ignore_errors=True)


class Phase:
    """One job on the cluster: N agents started at once, their exits timed."""

    def __init__(self, env, name, hold):
        self.env, self.a, self.name = env, env.a, name
        self.out = os.path.join(env.tmp, name)
        os.makedirs(self.out)
        os.chmod(self.out, 0o777)
        self.hold = os.path.join(self.out, "hold") if hold else ""
        self.lock = None
        if hold:
            self.lock = open(self.hold, "w")
            fcntl.flock(self.lock, fcntl.LOCK_EX)
        self.agents, self.exits, self.outputs = {}, {}, {}

    def agent_argv(self, rid):
        a, ep = self.a, f"{self.env.cluster.addr(0)}:{PORT}"
        nn = f"{a.nodes - 1}:{a.nodes}"
        conf = f"last_call_timeout={a.last_call:g},join_timeout={a.timeout:g}"
        if a.launcher == "ddprun":
            argv = [os.path.join(a.build_dir, "launcher", "ddprun"), f"--nnodes={nn}",
                    f"--nproc_per_node={a.nproc}", "--rdzv_backend=c10d", f"--rdzv_endpoint={ep}",
                    f"--rdzv_id={rid}", f"--rdzv_conf={conf}", "--rdzv_token_file", self.env.token,
                    "--max_restarts=1", "--no_python", "--shutdown_timeout=5"]
        else:
            argv = [os.path.join(a.torch_venv, "bin", "torchrun"), f"--nnodes={nn}",
                    f"--nproc-per-node={a.nproc}", "--rdzv-backend=c10d", f"--rdzv-endpoint={ep}",
                    f"--rdzv-id={rid}", f"--rdzv-conf={conf}", "--max-restarts=1", "--no-python"]
        argv.append(self.env.worker)
        if a.worker == "train":
            argv += [train_exe(a), "--device", "cpu", "--width", "32", "--depth", "0", "--batch", "4",
                     "--samples", str(4 * a.nodes * a.nproc * 2), "--epochs", "1000",
                     "--max-steps", str(a.train_steps), "--threads", "1", "--checkpoint-dir",
                     os.path.join(self.out, "ckpt"), "--checkpoint-every", "1", "--log-every", "0"]
        return argv

    def start(self):
        self.t0 = time.monotonic()
        self.wall0 = time.time()
        for node in range(1, self.a.nodes + 1):
            env = dict(os.environ, NC_OUT=self.out, NC_NODE=str(node), NC_HOLD=self.hold,
                       PYTHONUNBUFFERED="1", OMP_NUM_THREADS="1")
            p = self.env.cluster.spawn(node, self.agent_argv(f"{self.name}{os.getpid()}"), env=env)
            self.agents[node] = p
            threading.Thread(target=self.reap, args=(node, p), daemon=True).start()

    def reap(self, node, p):
        self.outputs[node] = p.stdout.read()
        p.wait()
        self.exits[node] = (p.returncode, time.monotonic() - self.t0)

    def records(self):
        """(seconds since launch, rank, world, attempt, group_rank, node) of every worker start."""
        path = os.path.join(self.out, "records")
        if not os.path.exists(path):
            return []
        rows = []
        with open(path) as f:
            for line in f:
                t, rank, world, att, grank, node = line.split()
                rows.append((float(t) - self.wall0, rank, world, att, grank, int(node)))
        return rows

    def wait_for(self, pred, what, bound=None):
        bound = bound or self.a.timeout
        deadline = time.monotonic() + bound
        while time.monotonic() < deadline:
            if pred():
                return time.monotonic() - self.t0
            if not self.held_agents_alive():
                break
            time.sleep(0.02)
        raise Fail(f"{self.name}: no {what} within {bound:g}s; agents exited: {self.exits}")

    def held_agents_alive(self):
        return any(n not in self.exits for n in self.agents if n not in getattr(self, "killed", ()))

    def release(self):
        if self.lock:
            fcntl.flock(self.lock, fcntl.LOCK_UN)
            self.lock.close()
            self.lock = None

    def wait_exits(self, nodes):
        deadline = time.monotonic() + self.a.timeout
        while time.monotonic() < deadline and not all(n in self.exits for n in nodes):
            time.sleep(0.02)
        missing = [n for n in nodes if n not in self.exits]
        if missing:
            raise Fail(f"{self.name}: agents of nodes {missing} still running after {self.a.timeout:g}s")
        return max(self.exits[n][1] for n in nodes)

    def show_failures(self, nodes):
        for n in nodes:
            code = self.exits.get(n, (None,))[0]
            if code != 0:
                print(f"--- node {n} exit {code} ---\n{self.outputs.get(n, '')[-3000:]}", file=sys.stderr)


def rounds_of(recs):
    """{(attempt, world): [record, ...]} in the order the rounds started."""
    out = {}
    for r in sorted(recs):
        out.setdefault((r[3], r[2]), []).append(r)
    return out


def check_round(label, recs, world, errors):
    ranks = sorted(int(r[1]) for r in recs)
    if ranks != list(range(world)):
        errors.append(f"{label}: ranks {ranks[:20]}{'...' if len(ranks) > 20 else ''}, expected 0..{world - 1} once each")


def launch_phase(env, report, errors):
    a = env.a
    ph = Phase(env, "launch", hold=False)
    ph.start()
    world = a.nodes * a.nproc
    started = ph.wait_for(lambda: len(ph.records()) >= world, f"{world} worker starts")
    done = ph.wait_exits(list(ph.agents))
    recs = ph.records()
    rounds = rounds_of(recs)
    codes = [ph.exits[n][0] for n in sorted(ph.agents)]
    report["launch -> every worker started (s)"] = f"{started:.2f}"
    report["launch -> every agent exited (s)"] = f"{done:.2f}"
    report["rounds (attempt, world)"] = " ".join(f"({k[0]},{k[1]})" for k in rounds)
    report["agents exited 0"] = f"{codes.count(0)}/{len(codes)}"
    last = list(rounds)[-1] if rounds else None
    if last is None or int(last[1]) != world:
        errors.append(f"launch: the last round has world {last and last[1]}, expected {world}")
    else:
        check_round("launch", rounds[last], world, errors)
    if codes.count(0) != len(codes):
        errors.append(f"launch: agent exit codes {codes}")
        ph.show_failures(sorted(ph.agents))


def kill_phase(env, report, errors):
    a = env.a
    ph = Phase(env, "kill", hold=True)
    ph.start()
    world = a.nodes * a.nproc
    ph.wait_for(lambda: len(ph.records()) >= world, f"{world} worker starts")
    rss = [proc_cpu_rss(p.pid) for p in ph.agents.values()]
    rss = [x[1] for x in rss if x]
    pss = [x for x in (proc_pss(p.pid) for p in ph.agents.values()) if x]
    if rss and pss:
        report["agent peak RSS max (MiB); PSS sum of all agents (MiB)"] = f"{max(rss):.0f}; {sum(pss):.0f}"
    victim = a.nodes
    ph.killed = {victim}
    t_kill = time.monotonic() - ph.t0
    for pid in sh("ip", "netns", "pids", env.cluster.nodes[victim], check=False).stdout.split():
        try:
            os.kill(int(pid), signal.SIGKILL)
        except ProcessLookupError:
            pass
    survivors = [n for n in ph.agents if n != victim]
    new_world = (a.nodes - 1) * a.nproc

    def new_round():
        return [r for r in ph.records() if r[0] > 0 and r[2] == str(new_world) and r[3] != "0"]
    t_round = None
    try:
        t_round = ph.wait_for(lambda: len(new_round()) >= new_world, f"new round of {new_world} workers",
                              a.round_timeout)
        report["node killed -> survivors' new round, every worker started (s)"] = f"{t_round - t_kill:.2f}"
    except Fail as e:
        report["node killed -> survivors' new round"] = f"none ({e})"
        errors.append(str(e))
    t_rel = time.monotonic() - ph.t0
    ph.release()
    done = ph.wait_exits(survivors)
    codes = [ph.exits[n][0] for n in survivors]
    report["release -> job complete (s)"] = f"{done - t_rel:.2f}"
    report["survivor agents exited 0"] = f"{codes.count(0)}/{len(codes)}"
    if t_round is not None:
        check_round("after the kill", new_round(), new_world, errors)
    if codes.count(0) != len(codes):
        errors.append(f"kill: survivor agent exit codes {codes}")
        ph.show_failures(survivors)


def main(argv):
    a = parse(argv)
    preflight(a)

    def stop(signum, _frame):
        raise SystemExit(128 + signum)
    for s in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(s, stop)
    report, errors = {}, []
    t_setup = time.monotonic()
    env = Env(a)
    try:
        env.setup()
        report["cluster set-up (s)"] = f"{time.monotonic() - t_setup:.2f}"
        anchor0 = proc_cpu_rss(env.anchor.pid)
        for phase in a.phases:
            try:
                (launch_phase if phase == "launch" else kill_phase)(env, report, errors)
            except Fail as e:
                errors.append(str(e))
            now = proc_cpu_rss(env.anchor.pid)
            if now and anchor0:
                report[f"{phase}: anchor CPU (s) / peak RSS (MiB)"] = f"{now[0] - anchor0[0]:.2f} / {now[1]:.1f}"
                anchor0 = now
    finally:
        env.close()
    title = (f"{a.launcher}, {a.nodes} nodes x {a.nproc} workers ({a.worker}), "
             f"netem {a.netem_delay or 'none'}, {os.cpu_count()} cores, {time.strftime('%Y-%m-%d')}")
    print(f"# {title}")
    for k, v in report.items():
        print(f"{k}: {v}")
    for e in errors:
        print(f"ERROR: {e}", file=sys.stderr)
    return 1 if errors and a.check else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
