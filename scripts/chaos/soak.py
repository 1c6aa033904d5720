#!/usr/bin/env python3
"""Chaos soak: the C++ `train` example on CPU across 3 ddprun agents (each its own network
namespace, 2 workers each) with a standing ddprund on a fourth, checkpointing, while faults
are injected one at a time: SIGKILL of a random worker, SIGKILL of a random agent, a node's
link cut, /dev/shm filled, the log disk filled, the standing ddprund restarted. At the
end the parameters must be bit-identical to an uninterrupted run of the same job, no process,
listening port or /dev/shm entry of ours may be left, and every fault is accounted for.

  soak.py --build BUILD_DIR [--duration S] [--faults a,b,...] [--seed N] [--report PATH]

Needs root (network and mount namespaces). Bounded: the chaos phase stops injecting at
--duration and the whole run is abandoned (exit 1) at --duration + --grace seconds.
Exit status: 0 all checks held; 1 a check failed (the report says which); 77 not root.

How a fault is accounted for: it is "survived" when, after its window (the link is back, the
filler file removed; a kill has none), the job writes a checkpoint newer than both the newest
at injection and the newest at the window's end. "Time lost" is the wall time from the
injection to that checkpoint less the time the uninterrupted run took for the same number of
steps: it counts the stall, the restart and the steps redone from the last checkpoint.
Agents that exit because of a fault are restarted at once, as a cluster scheduler resubmits a
job: the job has a fixed 3 nodes (so the parameters can be bit-identical), and ddprun ends a
job that falls below its minimum node count (a killed agent, a node cut off past the
heartbeat timeout). Each fault says how it was handled: "ddprun" (a restart inside the job,
or nothing needed), or "resubmitted" (agents restarted by this script; listed).
"""
import argparse
import glob
import json
import os
import random
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "..", "tests", "multinode"))
from netns import Cluster, sh  # noqa: E402

ALL_FAULTS = ["kill_worker", "kill_agent", "link_down", "fill_shm", "fill_logs", "restart_ddprund"]
DEFAULT_FAULTS = list(ALL_FAULTS)
NODES = 3          # agents; node 0 of the cluster is ddprund's
NPROC = 2          # workers per agent (two, so each node's workers share /dev/shm)
SHM_BYTES = 64 << 20
LOG_BYTES = 4 << 20
CKPT_RE = re.compile(r"ckpt-(\d{12})")


def log(msg):
    print(f"[soak {time.strftime('%H:%M:%S')}] {msg}", flush=True)


def children(pid):
    try:
        out = []
        for t in os.listdir(f"/proc/{pid}/task"):
            with open(f"/proc/{pid}/task/{t}/children") as f:
                out += [int(x) for x in f.read().split()]
        return out
    except (FileNotFoundError, ProcessLookupError):
        return []


def newest_step(ckpt_dir):
    steps = [int(m.group(1)) for n in os.listdir(ckpt_dir) if (m := CKPT_RE.match(n))]
    return max(steps, default=-1)


class Agent:
    """One agent: `sh` in the node's namespace with a private mount namespace (its own
    /dev/shm and log disk, tmpfs), running ddprun; sh lists /dev/shm after ddprun exits."""

    def __init__(self, soak, node, incarnation):
        self.soak, self.node, self.incarnation = soak, node, incarnation
        self.logdir = os.path.join(soak.tmp, f"logs-n{node}")
        os.makedirs(self.logdir, exist_ok=True)
        self.shm_report = os.path.join(soak.tmp, f"shm-left-n{node}-{incarnation}")
        self.out_path = os.path.join(soak.tmp, f"agent-n{node}-{incarnation}.log")
        argv = [soak.ddprun, "--nnodes=3", "--rdzv_backend=c10d",
                f"--rdzv_endpoint={soak.cluster.addr(0)}:29400", f"--rdzv_id={soak.run_id}",
                f"--nproc_per_node={NPROC}", "--max_restarts=1000", "--log_dir", self.logdir, "-t", "3",
                "--rdzv_conf=join_timeout=120,last_call_timeout=1",
                soak.train] + soak.train_args
        script = (f'mount -t tmpfs -o size={SHM_BYTES} ddprun-chaos-shm /dev/shm && '
                  f'mount -t tmpfs -o size={LOG_BYTES} ddprun-chaos-log "$LOGDIR" || exit 99; '
                  '"$@"; rc=$?; ls -A /dev/shm > "$SHM_REPORT"; exit $rc')
        env = dict(os.environ, LOGDIR=self.logdir, SHM_REPORT=self.shm_report)
        self.out = open(self.out_path, "w")
        self.p = subprocess.Popen(["ip", "netns", "exec", soak.cluster.nodes[node], "unshare", "-m",
                                   "--propagation", "private", "sh", "-c", script, "sh"] + argv,
                                  stdout=self.out, stderr=subprocess.STDOUT, env=env)
        self.started = time.monotonic()

    def ddprun_pid(self):
        """ddprun itself (the child of sh), or None once it is gone."""
        for c in children(self.p.pid):
            try:
                if os.path.basename(os.readlink(f"/proc/{c}/exe")) == "ddprun":
                    return c
            except OSError:
                pass
        return None

    def worker_pids(self):
        pid = self.ddprun_pid()
        return children(pid) if pid else []

    def output(self):
        with open(self.out_path, errors="replace") as f:
            return f.read()

    def in_ns(self, *argv, check=False):
        """Runs argv in this agent's mount namespace (through its sh)."""
        return subprocess.run(["nsenter", "-t", str(self.p.pid), "-m"] + list(argv), capture_output=True,
                              text=True, check=check)


class Soak:
    def __init__(self, args):
        self.args = args
        self.rng = random.Random(args.seed)
        self.ddprun = os.path.join(args.build, "launcher", "ddprun")
        self.ddprund = os.path.join(args.build, "rendezvous", "ddprund")
        self.train = os.path.join(args.build, "worker_runtime", "train")
        for b in (self.ddprun, self.ddprund, self.train):
            if not os.access(b, os.X_OK):
                sys.exit(f"soak: {b} is not built (cmake --build {args.build})")
        self.tmp = tempfile.mkdtemp(prefix="ddprun-chaos-")
        self.ckpt = os.path.join(self.tmp, "ckpt")
        self.cluster = Cluster(f"c{os.getpid() % 10000}")
        for _ in range(NODES + 1):
            self.cluster.add_node()
        self.ddprund_p = None
        self.agents = {}
        self.faults = []
        self.problems = []

    # ---- the cluster ----
    def start_ddprund(self):
        self.ddprund_p = self.cluster.spawn(0, [self.ddprund, "--port", "29400"])

    def link(self, node, up):
        sh("ip", "-n", self.cluster.switch, "link", "set", f"p{node}", "up" if up else "down")

    def run_job(self, run_id, ckpt_dir, chaos, epochs):
        """Runs the job once; with chaos, injects faults until it ends. Returns the agents'
        final outputs and exit codes."""
        self.run_id = run_id
        os.makedirs(ckpt_dir, exist_ok=True)
        self.train_args = ["--device", "cpu", "--width", str(self.args.width), "--depth", "2",
                           "--samples", str(self.args.samples), "--batch", "20", "--epochs", str(epochs),
                           "--momentum", "0.9", "--checkpoint-dir", ckpt_dir,
                           "--checkpoint-every", str(self.args.checkpoint_every), "--keep-checkpoints", "0"]
        incarnations = {n: 0 for n in range(1, NODES + 1)}
        self.agents = {n: Agent(self, n, 0) for n in range(1, NODES + 1)}
        finished = {}  # node -> exit code of its last incarnation, once the job is over
        t0 = time.monotonic()
        deadline = t0 + self.args.duration + self.args.grace
        next_fault = t0 + self.args.first_fault
        pending = None  # the fault being recovered from
        done = False
        while True:
            now = time.monotonic()
            if now > deadline:
                self.problems.append(f"{run_id}: not finished {self.args.duration + self.args.grace:.0f} s after its start")
                for a in self.agents.values():
                    a.p.kill()
                break
            step = newest_step(ckpt_dir)
            if pending and "step_after_window" not in pending and now >= pending["t"] + pending["window_s"]:
                pending["step_after_window"] = step
            if pending and "step_after_window" in pending and step > max(pending["step_at"], pending["step_after_window"]):
                took = now - pending["t"]
                pending["recovered_after_s"] = round(took, 2)
                pending["time_lost_s"] = round(max(0.0, took - (step - pending["step_at"]) * self.s_per_step), 2)
                pending["survived"] = True
                pending["handled_by"] = "resubmitted" if pending.get("agent_restarts") else "ddprun"
                if pending["kind"] == "fill_logs":
                    a = self.agents[pending["node"]]
                    pending["ddprun_warned"] = "cannot write log file" in a.output()
                log(f"  recovered from {pending['kind']} after {pending['recovered_after_s']} s (checkpoint {step})")
                pending = None
            # Agents that ended: a success (0, or 74 when its log disk was filled) ends the job
            # for that node; anything else is a fault's doing: restart it unless the job is over.
            for n, a in list(self.agents.items()):
                rc = a.p.poll()
                if rc is None or n in finished:
                    continue
                if rc in (0, 74) or done:
                    finished[n] = rc
                    done = True
                    continue
                cause = pending or (self.faults[-1] if self.faults else None)
                log(f"  agent n{n} exited {rc}; restarting it")
                if cause is not None:
                    cause.setdefault("agent_restarts", []).append({"node": n, "exit_code": rc})
                else:
                    self.problems.append(f"{run_id}: agent n{n} exited {rc} with no fault injected")
                incarnations[n] += 1
                self.agents[n] = Agent(self, n, incarnations[n])
            if len(finished) == NODES:
                break
            if done and all(a.p.poll() is not None for a in self.agents.values()):
                for n, a in self.agents.items():
                    finished.setdefault(n, a.p.returncode)
                break
            if (chaos and not done and pending is None and now >= next_fault and
                    now - t0 < self.args.duration and step >= 0):
                pending = self.inject(step)
                next_fault = now + self.rng.uniform(self.args.interval / 2, self.args.interval * 1.5)
            time.sleep(0.05)
        if pending:
            # The job finished inside the fault's window: survived, if it finished well.
            ok = finished and all(c in (0, 74) for c in finished.values())
            pending["survived"] = bool(ok)
            if ok:
                took = time.monotonic() - pending["t"]
                pending["recovered_after_s"] = round(took, 2)
                pending["time_lost_s"] = round(max(0.0, took - (newest_step(ckpt_dir) - pending["step_at"]) *
                                                   self.s_per_step), 2)
                pending["handled_by"] = ("resubmitted" if pending.get("agent_restarts") else "ddprun") + " (job ended)"
        outputs = {n: a.output() for n, a in self.agents.items()}
        return finished, outputs, time.monotonic() - t0

    # ---- faults ----
    def inject(self, step):
        kind = self.rng.choice(self.args.faults)
        node = self.rng.randint(1, NODES)
        if kind == "fill_logs":
            # Rank 0 prints (once per epoch): fill the disk of the node that hosts it, so that
            # writes do fail (the summary and exit code 74 must then say so).
            node = next((n for n, a in self.agents.items() if "r0]: " in a.output()[-20000:]), node)
        a = self.agents[node]
        f = {"kind": kind, "node": node, "t": time.monotonic(), "step_at": step,
             "at_s": round(time.monotonic() - self.t_chaos, 2), "window_s": 0.0}
        if kind == "kill_worker":
            pids = a.worker_pids()
            if not pids:
                return None  # between attempts: try again on the next turn
            pid = self.rng.choice(pids)
            os.kill(pid, signal.SIGKILL)
            f["what"] = f"SIGKILL worker pid {pid} on n{node}"
        elif kind == "kill_agent":
            pid = a.ddprun_pid()
            if not pid:
                return None
            os.kill(pid, signal.SIGKILL)
            f["what"] = f"SIGKILL agent pid {pid} on n{node}"
        elif kind == "link_down":
            secs = self.rng.uniform(2, 8)
            self.link(node, False)
            threading.Timer(secs, self.link, (node, True)).start()
            f["window_s"] = secs
            f["what"] = f"n{node}'s link down for {secs:.1f} s"
        elif kind in ("fill_shm", "fill_logs"):
            where = "/dev/shm/chaos-fill" if kind == "fill_shm" else os.path.join(a.logdir, "chaos-fill")
            secs = self.rng.uniform(3, 10)
            r = a.in_ns("dd", "if=/dev/zero", f"of={where}", "bs=64k")  # until ENOSPC
            df = a.in_ns("df", "--output=avail", os.path.dirname(where)).stdout.split()[-1:]
            threading.Timer(secs, a.in_ns, ("rm", "-f", where)).start()
            f["window_s"] = secs
            if kind == "fill_shm":
                # A running attempt has its segments already: restart one into the full disk.
                pids = a.worker_pids()
                if pids:
                    os.kill(self.rng.choice(pids), signal.SIGKILL)
                    f["what_extra"] = "; a worker SIGKILLed so the next attempt starts on it"
            f["what"] = f"{os.path.dirname(where)} on n{node} filled ({df[0] if df else '?'} KiB left) for {secs:.1f} s"
            if r.returncode == 0:
                f["what"] += " (dd did not hit ENOSPC?)"
            f["what"] += f.pop("what_extra", "")
        elif kind == "restart_ddprund":
            # The standing daemon is SIGKILLed and started again on the same port; the agents
            # reconnect and the daemon rebuilds the job's round from their re-joins.
            self.ddprund_p.kill()
            self.ddprund_p.wait()
            self.start_ddprund()
            f["what"] = "ddprund SIGKILLed and restarted"
        log(f"fault {len(self.faults) + 1}: {f['what']} (newest checkpoint: step {step})")
        self.faults.append(f)
        return f

    # ---- checks ----
    def leftovers(self):
        """Our processes, listening ports and /dev/shm entries still there (agents are gone)."""
        left = []
        binaries = {os.path.realpath(b) for b in (self.ddprun, self.train)}
        # Only this soak's copies: every process it starts lives in one of its namespaces (other
        # tests may run the same binaries on this host at the same time).
        ours = set()
        for ns in self.cluster.nodes + [self.cluster.switch]:
            try:
                ours.add(f"net:[{os.stat(os.path.join('/run/netns', ns)).st_ino}]")
            except OSError:
                pass
        for p in glob.glob("/proc/[0-9]*/exe"):
            try:
                pid_dir = os.path.dirname(p)
                if (os.path.realpath(os.readlink(p)) in binaries
                        and os.readlink(os.path.join(pid_dir, "ns", "net")) in ours):
                    left.append(f"process {p.split('/')[2]} ({os.readlink(p)})")
            except OSError:
                pass
        for i, ns in enumerate(self.cluster.nodes):
            pids = sh("ip", "netns", "pids", ns, check=False).stdout.split()
            if i == 0:
                pids = [p for p in pids if int(p) != self.ddprund_p.pid]
            left += [f"process {p} in {ns}" for p in pids]
            ports = sh("ip", "netns", "exec", ns, "ss", "-Htln", check=False).stdout.split("\n")
            ports = [l.split()[3] for l in ports if l.strip()]
            if i == 0:
                ports = [p for p in ports if not p.endswith(":29400")]
            left += [f"listening {p} in {ns}" for p in ports]
        for f in glob.glob(os.path.join(self.tmp, "shm-left-*")):
            entries = [e for e in open(f).read().split() if e != "chaos-fill"]
            left += [f"/dev/shm/{e} left by {os.path.basename(f)[9:]}" for e in entries]
        return left

    def run(self):
        rep = {"seed": self.args.seed, "faults_enabled": self.args.faults}
        try:
            self.start_ddprund()
            epochs = self.args.epochs
            if epochs == 0:
                # Sized to this machine: the uninterrupted job should last about 1.2 x --duration,
                # so faults keep coming for the whole --duration (each one only lengthens it).
                # The rate comes from the checkpoints' times (start-up excluded).
                calib = 20
                cdir = os.path.join(self.tmp, "ckpt-calibrate")
                self.run_job("calibrate", cdir, False, calib)
                ck = sorted((int(m.group(1)), os.path.getmtime(os.path.join(cdir, n)))
                            for n in os.listdir(cdir) if (m := CKPT_RE.match(n)))
                steps_per_epoch = ck[-1][0] / calib if ck else 1
                s_per_step = (ck[-1][1] - ck[0][1]) / max(1, ck[-1][0] - ck[0][0]) if len(ck) > 1 else 0.01
                epochs = max(calib, int(1.2 * self.args.duration / (s_per_step * steps_per_epoch)) + 1)
                log(f"calibration: {s_per_step * 1000:.2f} ms per step: the job gets {epochs} epochs")
            rep["epochs"] = epochs
            log("uninterrupted run")
            codes, outs, base_s = self.run_job("clean", os.path.join(self.tmp, "ckpt-clean"), False, epochs)
            want = checksum(outs)
            steps = newest_step(os.path.join(self.tmp, "ckpt-clean"))
            self.s_per_step = base_s / max(1, steps)
            rep.update(clean_s=round(base_s, 2), clean_checksum=want, clean_codes=codes, steps=steps)
            log(f"uninterrupted: {base_s:.1f} s, {steps} steps, checksum {want}, exit codes {codes}")
            if want is None or any(c != 0 for c in codes.values()):
                self.problems.append("the uninterrupted run did not succeed")
            log("chaos run")
            self.t_chaos = time.monotonic()
            codes, outs, chaos_s = self.run_job("chaos", self.ckpt, True, epochs)
            got = checksum(outs)
            rep.update(chaos_s=round(chaos_s, 2), chaos_checksum=got, chaos_codes=codes)
            if got != want:
                self.problems.append(f"parameters differ: {got} after the chaos, {want} without")
            bad = {n: c for n, c in codes.items() if c not in (0, 74)}
            if bad:
                self.problems.append(f"agents ended with {bad}")
            for n, c in codes.items():
                if c == 74 and not any(f["kind"] == "fill_logs" and f["node"] == n for f in self.faults):
                    self.problems.append(f"n{n} exited 74 (logs lost) though its log disk was never filled")
                if c == 74 and "LOGS INCOMPLETE" not in outs[n]:
                    self.problems.append(f"n{n} exited 74 without the summary saying why")
            for f in self.faults:
                f.pop("t", None)
            rep["faults"] = self.faults
            rep["clean_ms_per_step"] = round(self.s_per_step * 1000, 3)
            time.sleep(0.5)  # the agents' exits are seen; ports close with them
            rep["leftovers"] = self.leftovers()
            if rep["leftovers"]:
                self.problems.append(f"left behind: {rep['leftovers']}")
            if self.ddprund_p.poll() is not None:
                self.problems.append(f"ddprund exited {self.ddprund_p.returncode} during the soak")
        finally:
            for a in self.agents.values():
                if a.p.poll() is None:
                    a.p.kill()
            self.cluster.close()
        if len(self.faults) < self.args.min_faults:
            self.problems.append(f"only {len(self.faults)} fault(s) injected, fewer than --min-faults "
                                 f"{self.args.min_faults} (the job ended first)")
        not_survived = [f for f in self.faults if not f.get("survived")]
        if not_survived:
            self.problems.append(f"{len(not_survived)} fault(s) not recovered from")
        rep["problems"] = self.problems
        return rep


def checksum(outputs):
    for out in outputs.values():
        m = re.findall(r"final_param_checksum=([0-9a-f]+)", out)
        if m:
            return m[-1]
    return None


def print_report(rep):
    print("\n== chaos soak report ==")
    print(f"uninterrupted: {rep.get('clean_s')} s, {rep.get('steps')} steps, checksum {rep.get('clean_checksum')}")
    print(f"chaos:         {rep.get('chaos_s')} s, checksum {rep.get('chaos_checksum')}, exit codes {rep.get('chaos_codes')}")
    faults = rep.get("faults", [])
    print(f"faults injected: {len(faults)}, survived: {sum(1 for f in faults if f.get('survived'))}")
    print(f"{'#':>3} {'at s':>7} {'kind':<12} {'recovered s':>11} {'lost s':>7} {'handled by':<12} what")
    for i, f in enumerate(faults, 1):
        restarts = ""
        if f.get("agent_restarts"):
            restarts = " (agents restarted: " + ", ".join(f"n{r['node']} exit {r['exit_code']}"
                                                          for r in f["agent_restarts"]) + ")"
        print(f"{i:>3} {f['at_s']:>7} {f['kind']:<12} {f.get('recovered_after_s', '-'):>11} "
              f"{f.get('time_lost_s', '-'):>7} {f.get('handled_by', 'NOT'):<12} {f['what']}{restarts}")
    by_kind = {}
    for f in faults:
        if f.get("survived"):
            by_kind.setdefault(f["kind"], []).append(f["time_lost_s"])
    for k, v in sorted(by_kind.items()):
        print(f"time lost, {k}: mean {sum(v) / len(v):.2f} s, max {max(v):.2f} s over {len(v)}")
    print(f"leftovers: {rep.get('leftovers') or 'none'}")
    print("RESULT: " + ("OK" if not rep["problems"] else "FAILED: " + "; ".join(rep["problems"])))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--build", required=True, help="build directory with ddprun, ddprund and train")
    ap.add_argument("--duration", type=float, default=300, help="seconds of fault injection (default 300)")
    ap.add_argument("--grace", type=float, default=300, help="seconds past --duration before giving up")
    ap.add_argument("--interval", type=float, default=8, help="mean seconds between faults (default 8)")
    ap.add_argument("--first-fault", type=float, default=3, help="seconds before the first fault")
    ap.add_argument("--faults", default=",".join(DEFAULT_FAULTS),
                    help=f"comma-separated, of {','.join(ALL_FAULTS)} (default: all)")
    ap.add_argument("--seed", type=int, default=int(time.time()) % 100000)
    ap.add_argument("--width", type=int, default=256)
    ap.add_argument("--samples", type=int, default=12000)
    ap.add_argument("--epochs", type=int, default=0,
                    help="the job's length; 0 (default): sized by a calibration run to last ~1.2 x --duration")
    ap.add_argument("--min-faults", type=int, default=1, help="fail when fewer faults were injected")
    ap.add_argument("--checkpoint-every", type=int, default=20)
    ap.add_argument("--report", help="also write the report as JSON here")
    ap.add_argument("--keep", action="store_true", help="keep the scratch directory (logs, checkpoints)")
    args = ap.parse_args()
    args.faults = [f for f in args.faults.split(",") if f]
    unknown = [f for f in args.faults if f not in ALL_FAULTS]
    if unknown or not args.faults:
        ap.error(f"--faults: unknown {unknown}; choose from {ALL_FAULTS}")
    if os.geteuid() != 0 or not shutil.which("ip") or not shutil.which("nsenter"):
        print("soak: needs root, ip(8) and nsenter(1) (network and mount namespaces); skipped", file=sys.stderr)
        return 77
    soak = Soak(args)
    log(f"seed {args.seed}, faults {args.faults}, scratch {soak.tmp}")
    rep = soak.run()
    print_report(rep)
    if args.report:
        with open(args.report, "w") as f:
            json.dump(rep, f, indent=1)
    if not args.keep:
        shutil.rmtree(soak.tmp, ignore_errors=True)
    return 0 if not rep["problems"] else 1


if __name__ == "__main__":
    sys.exit(main())
