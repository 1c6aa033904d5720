#!/usr/bin/env python3
"""A real, private Slurm cluster on this machine, for the tests (needs root, as in CI).

    with SlurmCluster(nodes=2) as c:
        job = c.sbatch(["script.sh"], nodes=2)
        c.wait_job(job)

What it starts, all from a fresh temporary directory (nothing under /etc/slurm is read):
  * munged, as the munge user, on a private socket (<dir>/munge/socket) with the host's key
    /etc/munge/munge.key (created with `mungekey` when missing);
  * slurmctld and one slurmd per node (`slurmd -N <name>`), each in the foreground, on free
    ports (SlurmctldPort, one `Port=` per node), with a slurm.conf written for them:
    proctrack/linuxproc and task/none (no cgroups needed), select/cons_tres without GPUs.
Node names (`<prefix>1`, `<prefix>2`, ...) resolve through lines the harness appends to
/etc/hosts (each node its own loopback address 127.0.<x>.<n>) and removes at the end; lines
left by a harness that died are removed by the next one.

Every process of the cluster carries DDPRUN_SLURM_HARNESS=<token> in its environment (the
daemons get it from us; jobs get it because sbatch exports the submitter's environment), so
`processes()` finds whatever is still running, and stop() kills the rest by pid: after the
`with` block nothing of the cluster is left. Jobs see PATH=<dir>/bin, a copy of the system PATH
without scontrol, sinfo, squeue and sacct (compute nodes without the commands of the usual
glue), unless a test asks otherwise.

Run by hand: `python3 tests/slurm/cluster.py up` starts a cluster and prints SLURM_CONF to
export; Ctrl-C stops it. Exits 77 (ctest's skip code) when not root or Slurm is missing.
"""
import contextlib
import os
import pwd
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "pylib"))
from ddprun_testlib import free_port  # noqa: E402

SKIP = 77
HOSTS_FILE = "/etc/hosts"
HOSTS_MARK = "# ddprun-slurm-harness pid="
# What a batch script must not find on a compute node: the query commands people use for glue
# (`scontrol show hostnames`). srun, sbatch and scancel stay: batch scripts use them.
HIDDEN_FROM_JOBS = ("scontrol", "sinfo", "squeue", "sacct")


class Skip(Exception):
    pass


def require_environment():
    if os.geteuid() != 0:
        raise Skip("the Slurm cluster tests need root (munged, slurmd and /etc/hosts)")
    for prog in ("munged", "slurmctld", "slurmd", "sbatch", "scontrol"):
        if not shutil.which(prog, path="/usr/sbin:/usr/bin:/sbin:/bin"):
            raise Skip(f"{prog} is not installed (scripts/setup_deps.sh installs slurm-wlm and munge)")
    try:
        pwd.getpwnam("munge")
    except KeyError:
        raise Skip("no munge user (install the munge package)")


def pid_alive(pid):
    try:
        os.kill(pid, 0)
        return True
    except ProcessLookupError:
        return False
    except PermissionError:
        return True


def _edit_hosts(keep_line):
    with open(HOSTS_FILE) as f:
        lines = f.read().splitlines(keepends=True)
    kept = [l for l in lines if keep_line(l)]
    if kept != lines:
        # In place: /etc/hosts is often a bind mount that cannot be renamed over.
        with open(HOSTS_FILE, "w") as f:
            f.writelines(kept)


def _hosts_owner(line):
    m = re.search(re.escape(HOSTS_MARK) + r"(\d+)", line)
    return int(m.group(1)) if m else None


def environ_of(pid):
    try:
        with open(f"/proc/{pid}/environ", "rb") as f:
            data = f.read()
    except OSError:
        return {}
    env = {}
    for item in data.split(b"\0"):
        k, sep, v = item.partition(b"=")
        if sep:
            env[k.decode(errors="replace")] = v.decode(errors="replace")
    return env


def parent_of(pid):
    try:
        with open(f"/proc/{pid}/stat") as f:
            return int(f.read().rsplit(")", 1)[1].split()[1])
    except (OSError, IndexError, ValueError):
        return 0


def cmdline_of(pid):
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read().replace(b"\0", b" ").decode(errors="replace").strip()
    except OSError:
        return ""


class SlurmCluster:
    def __init__(self, nodes=2, cpus=2, prefix=None, keep_dir=False, extra_conf=""):
        self.nnodes = nodes
        self.cpus = cpus
        self.token = f"{os.getpid()}-{int(time.time() * 1000) % 100000000}"
        # Short, unique while this process lives, and a valid hostlist prefix.
        self.prefix = prefix or f"sl{os.getpid()}n"
        self.nodes = [f"{self.prefix}{i + 1}" for i in range(nodes)]
        self.keep_dir = keep_dir
        self.extra_conf = extra_conf
        self.dir = None
        self.daemons = {}  # name -> Popen
        self.hosts_added = False

    # ---- lifecycle -------------------------------------------------------------------------
    def __enter__(self):
        try:
            self.start()
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(self, *exc):
        self.stop()

    def start(self):
        require_environment()
        self.dir = tempfile.mkdtemp(prefix="ddprun-slurm-")
        os.chmod(self.dir, 0o755)  # the munge user must reach its socket below
        self._write_bin()
        self._add_hosts()
        self._start_munge()
        self._write_conf()
        self._start_slurm()

    def stop(self):
        # Jobs first, so that slurmstepd can clean up while slurmd still answers.
        if "slurmctld" in self.daemons and self.daemons["slurmctld"].poll() is None:
            with contextlib.suppress(Exception):
                self.run(["scancel", "--full", "--user=root"], check=False, timeout=30)
                deadline = time.monotonic() + 60
                while time.monotonic() < deadline and self.queue():
                    time.sleep(0.2)
        order = [n for n in self.daemons if n.startswith("slurmd")] + \
                [n for n in self.daemons if n == "slurmctld"] + [n for n in self.daemons if n == "munged"]
        for name in order:
            p = self.daemons[name]
            if p.poll() is None:
                p.terminate()
                try:
                    p.wait(timeout=30)
                except subprocess.TimeoutExpired:
                    p.kill()
                    p.wait()
        self.daemons.clear()
        # Whatever is left (a slurmstepd, a task of a job slurmd could not reach) goes by pid.
        if self.dir:
            for pid in self.processes():
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
            deadline = time.monotonic() + 30
            while self.processes() and time.monotonic() < deadline:
                time.sleep(0.1)
        if self.hosts_added:
            me = os.getpid()
            _edit_hosts(lambda l: _hosts_owner(l) != me)
            self.hosts_added = False
        if self.dir and not self.keep_dir:
            shutil.rmtree(self.dir, ignore_errors=True)

    # ---- setup pieces ----------------------------------------------------------------------
    def _write_bin(self):
        """<dir>/bin: every program of the system PATH but HIDDEN_FROM_JOBS."""
        bindir = os.path.join(self.dir, "bin")
        os.mkdir(bindir)
        seen = set()
        for d in os.environ.get("PATH", "/usr/bin:/bin").split(":"):
            if not os.path.isdir(d):
                continue
            for name in os.listdir(d):
                if name in seen or name in HIDDEN_FROM_JOBS:
                    continue
                seen.add(name)
                os.symlink(os.path.join(d, name), os.path.join(bindir, name))
        self.job_path = bindir

    def _add_hosts(self):
        # Drop lines of harnesses that are gone, then add ours.
        _edit_hosts(lambda l: _hosts_owner(l) is None or pid_alive(_hosts_owner(l)))
        self.addrs = {}
        sub = os.getpid() % 200 + 20
        with open(HOSTS_FILE, "a") as f:
            for i, n in enumerate(self.nodes):
                self.addrs[n] = f"127.0.{sub}.{i + 1}"
                f.write(f"{self.addrs[n]} {n} {HOSTS_MARK}{os.getpid()}\n")
        self.hosts_added = True
        for n in self.nodes:
            if socket.gethostbyname(n) != self.addrs[n]:
                raise RuntimeError(f"{n} does not resolve to {self.addrs[n]} after editing {HOSTS_FILE}")

    def _daemon(self, name, argv, **kw):
        log = open(os.path.join(self.dir, f"{name}.out"), "wb")
        env = dict(os.environ, DDPRUN_SLURM_HARNESS=self.token)
        p = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                             env=env, start_new_session=True, **kw)
        log.close()
        self.daemons[name] = p
        return p

    def _start_munge(self):
        key = "/etc/munge/munge.key"
        mu = pwd.getpwnam("munge")
        if not os.path.exists(key):
            os.makedirs("/etc/munge", exist_ok=True)
            subprocess.run(["mungekey", "--create", f"--keyfile={key}"], check=True)
            os.chown(key, mu.pw_uid, mu.pw_gid)
            os.chmod(key, 0o600)
        mdir = os.path.join(self.dir, "munge")
        os.mkdir(mdir, 0o755)
        os.chown(mdir, mu.pw_uid, mu.pw_gid)
        self.munge_socket = os.path.join(mdir, "socket")
        self._daemon("munged", ["runuser", "-u", "munge", "--", "/usr/sbin/munged", "--foreground",
                                f"--socket={self.munge_socket}", f"--key-file={key}",
                                f"--pid-file={mdir}/munged.pid", f"--seed-file={mdir}/seed",
                                f"--log-file={mdir}/munged.log", "--num-threads=2"])
        self._wait(lambda: os.path.exists(self.munge_socket), 30, "munged to create its socket",
                   os.path.join(mdir, "munged.log"), "munged")

    def _write_conf(self):
        d = self.dir
        self.ctld_port = free_port()
        self.node_ports = {n: free_port() for n in self.nodes}
        for sub in ("state", "spool"):
            os.mkdir(os.path.join(d, sub))
        for n in self.nodes:
            os.mkdir(os.path.join(d, "spool", n))
        conf = f"""# Written by tests/slurm/cluster.py for one test run.
ClusterName=ddprun
SlurmctldHost=localhost(127.0.0.1)
SlurmctldPort={self.ctld_port}
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket={self.munge_socket}
StateSaveLocation={d}/state
SlurmdSpoolDir={d}/spool/%n
SlurmctldPidFile={d}/slurmctld.pid
SlurmdPidFile={d}/slurmd.%n.pid
SlurmctldLogFile={d}/slurmctld.log
SlurmdLogFile={d}/slurmd.%n.log
SlurmctldDebug=info
SlurmdDebug=info
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
SchedulerType=sched/backfill
MpiDefault=none
ReturnToService=2
SwitchType=switch/none
JobCompType=jobcomp/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
SlurmdParameters=config_overrides
SlurmctldTimeout=60
SlurmdTimeout=300
InactiveLimit=0
MinJobAge=300
KillWait=10
Waittime=0
MessageTimeout=30
{self.extra_conf}
"""
        for n in self.nodes:
            conf += (f"NodeName={n} NodeAddr={self.addrs[n]} NodeHostname={n} Port={self.node_ports[n]} "
                     f"CPUs={self.cpus} RealMemory=1000 State=UNKNOWN\n")
        conf += f"PartitionName=debug Nodes=ALL Default=YES MaxTime=INFINITE State=UP OverSubscribe=NO\n"
        self.conf_path = os.path.join(d, "slurm.conf")
        with open(self.conf_path, "w") as f:
            f.write(conf)

    def _start_slurm(self):
        self._daemon("slurmctld", ["/usr/sbin/slurmctld", "-D", "-i", "-f", self.conf_path])
        self._wait(lambda: self.run(["scontrol", "ping"], check=False, timeout=20).returncode == 0, 60,
                   "slurmctld to answer", os.path.join(self.dir, "slurmctld.log"), "slurmctld")
        for n in self.nodes:
            self._daemon(f"slurmd.{n}", ["/usr/sbin/slurmd", "-D", "-N", n, "-f", self.conf_path])
        self._wait(self._all_idle, 120, "every node to be idle",
                   os.path.join(self.dir, "slurmctld.log"), None)

    def _all_idle(self):
        r = self.run(["sinfo", "-h", "-N", "-o", "%N %t"], check=False, timeout=20)
        states = dict(l.split() for l in r.stdout.splitlines() if l.strip())
        return r.returncode == 0 and all(states.get(n) == "idle" for n in self.nodes)

    def _wait(self, cond, timeout, what, log, daemon):
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if cond():
                return
            if daemon and self.daemons[daemon].poll() is not None:
                break
            time.sleep(0.2)
        tail = ""
        with contextlib.suppress(OSError):
            with open(log, errors="replace") as f:
                tail = "".join(f.readlines()[-30:])
        if daemon:
            with contextlib.suppress(OSError):
                with open(os.path.join(self.dir, f"{daemon}.out"), errors="replace") as f:
                    tail += f.read()[-3000:]
        raise RuntimeError(f"timed out waiting for {what}; log tail:\n{tail}")

    # ---- use -------------------------------------------------------------------------------
    def env(self, **extra):
        """The environment of a Slurm client command (and so of the jobs it submits)."""
        e = dict(os.environ)
        for k in list(e):
            if k.startswith(("SLURM_", "SBATCH_", "SRUN_", "SALLOC_")):
                del e[k]
        e.update(SLURM_CONF=self.conf_path, DDPRUN_SLURM_HARNESS=self.token)
        e.update({k: str(v) for k, v in extra.items()})
        return e

    def run(self, argv, check=True, timeout=60, env=None, **kw):
        prog = shutil.which(argv[0], path="/usr/bin:/usr/sbin:/bin:/sbin") or argv[0]
        r = subprocess.run([prog] + list(argv[1:]), capture_output=True, text=True, timeout=timeout,
                           env=env or self.env(), **kw)
        if check and r.returncode != 0:
            raise RuntimeError(f"{' '.join(argv)} failed ({r.returncode}): {r.stderr.strip()}")
        return r

    def sbatch(self, argv, job_env=None, path_without_slurm=True, **kw):
        """Submits; returns the job id. `job_env` is added to the job's environment; the job's PATH
        has no Slurm commands unless path_without_slurm=False."""
        extra = dict(job_env or {})
        if path_without_slurm:
            extra.setdefault("PATH", self.job_path)
        r = self.run(["sbatch", "--parsable"] + list(argv), env=self.env(**extra), **kw)
        return int(r.stdout.strip().split(";")[0])

    def queue(self):
        r = self.run(["squeue", "-h", "-o", "%i %T"], check=False, timeout=20)
        return [l.split() for l in r.stdout.splitlines() if l.strip()]

    def job_info(self, job):
        r = self.run(["scontrol", "-o", "show", "job", str(job)], check=False, timeout=20)
        if r.returncode != 0:
            return {}
        info = {}
        for m in re.finditer(r"(\w+)=(\S*)", r.stdout):
            info.setdefault(m.group(1), m.group(2))
        return info

    def wait_job(self, job, timeout=300, states=("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT",
                                                  "NODE_FAIL", "OUT_OF_MEMORY", "PREEMPTED", "BOOT_FAIL",
                                                  "DEADLINE")):
        """Waits until the job reaches one of `states`; returns its scontrol fields."""
        deadline = time.monotonic() + timeout
        info = {}
        while time.monotonic() < deadline:
            info = self.job_info(job)
            if info.get("JobState") in states:
                return info
            time.sleep(0.25)
        raise TimeoutError(f"job {job} still {info.get('JobState')} after {timeout}s")

    def wait_state(self, job, state, timeout=120):
        return self.wait_job(job, timeout=timeout, states=(state,))

    def processes(self, match=None):
        """Pids (not ours) whose environment carries this cluster's token (and `match`, a
        dict of further variables, if given)."""
        me = os.getpid()
        out = []
        for entry in os.listdir("/proc"):
            if not entry.isdigit() or int(entry) == me:
                continue
            env = environ_of(int(entry))
            if env.get("DDPRUN_SLURM_HARNESS") != self.token:
                continue
            if match and any(env.get(k) != v for k, v in match.items()):
                continue
            out.append(int(entry))
        return out

    def describe(self, pids):
        return "; ".join(f"{p}: {cmdline_of(p)[:120]}" for p in pids)

    def log(self, name):
        with contextlib.suppress(OSError):
            with open(os.path.join(self.dir, name), errors="replace") as f:
                return f.read()
        return ""


def main():
    if len(sys.argv) < 2 or sys.argv[1] != "up":
        print(__doc__)
        return 2
    try:
        with SlurmCluster(nodes=int(sys.argv[2]) if len(sys.argv) > 2 else 2, keep_dir=True) as c:
            print(f"export SLURM_CONF={c.conf_path}   # nodes: {' '.join(c.nodes)}; Ctrl-C stops", flush=True)
            with contextlib.suppress(KeyboardInterrupt):
                signal.pause()
    except Skip as e:
        print(f"SKIP: {e}")
        return SKIP
    return 0


if __name__ == "__main__":
    sys.exit(main())
