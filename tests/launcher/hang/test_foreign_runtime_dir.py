#!/usr/bin/env python3
"""`ddprun dump` and `ddprun status` when another local user made the runtime directory first.

/tmp/ddprun-<uid> is absent after a reboot until a user's first job, so anyone can make it. Here
the attacker (uid 65534) plants /tmp/ddprun-<victim>/runs/<pid> -> a fake run directory whose
`workers` file names an interpreter in the attacker's directory, beside which sits a `py-spy`
(and an `eu-stack` and a `gdb`) that leaves a marker when it runs, and pids of the attacker's
own processes. The victim's `ddprun dump` and `ddprun status` must refuse with the path and the
fix, and no marker may appear. Also: XDG_RUNTIME_DIR of the victim's own is preferred; a link
in the victim's own runs directory to the attacker's run directory is not followed; a run
directory given on the command line is read only when it is the victim's; a real job of the
victim is dumped and shown, with the tools from PATH (not from its `workers` file, even when
that names the attacker's interpreter) and a pid that is not the agent's child left out.

Usage: test_foreign_runtime_dir.py <ddprun> <victim: root | user>
Root only (77 otherwise): it re-runs itself in a private mount namespace (unshare -m) with a
fresh tmpfs on /tmp, so the host's /tmp is not changed, and drops to other uids with setpriv.
"""
import os
import shutil
import signal
import subprocess
import sys
import time

ATTACKER = 65534
GUARD = 120
SAFE_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"


def check(cond, what):
    if not cond:
        print("FAILED:", what, file=sys.stderr)
        sys.exit(1)
    print("ok:", what)


def as_uid(uid, cmd):
    return cmd if uid == 0 else ["setpriv", f"--reuid={uid}", f"--regid={uid}", "--clear-groups"] + cmd


def run(uid, cmd, env, timeout=GUARD, cwd="/"):
    print(f"$ (uid {uid})", " ".join(cmd), flush=True)
    p = subprocess.run(as_uid(uid, cmd), capture_output=True, text=True, env=env, timeout=timeout, cwd=cwd)
    print(p.stdout)
    print(p.stderr, file=sys.stderr)
    return p


def attacker_write(path, text, mode):
    with open(path, "w") as f:
        f.write(text)
    os.chmod(path, mode)
    os.chown(path, ATTACKER, ATTACKER)


def attacker_dir(path, mode=0o755):
    os.mkdir(path)
    os.chmod(path, mode)
    os.chown(path, ATTACKER, ATTACKER)


class Planted:
    """The attacker's fake job: two of its own processes, a run directory, tools that leave a
    marker, and /tmp/ddprun-<victim>/runs/<fake agent pid> pointing at it."""

    def __init__(self, victim):
        self.procs = [subprocess.Popen(as_uid(ATTACKER, ["sleep", "600"])) for _ in range(2)]
        self.agent, self.worker = (p.pid for p in self.procs)
        os.mkdir("/tmp/markers")
        os.chmod("/tmp/markers", 0o1777)
        attacker_dir("/tmp/evil")
        attacker_dir("/tmp/evil/bin")
        for tool in ("python", "py-spy", "eu-stack", "gdb"):
            attacker_write(f"/tmp/evil/bin/{tool}", f"#!/bin/sh\ntouch /tmp/markers/{tool}-ran-as-$(id -u)\n", 0o755)
        attacker_dir("/tmp/evil/job_fake", 0o777)  # the victim's dump could write its stacks there
        self.workers = (f"agent_pid {self.agent}\nrun_id evil\nattempt 0\npython /tmp/evil/bin/python\n"
                        f"rank 0 0 {self.worker}\n")
        attacker_write("/tmp/evil/job_fake/workers", self.workers, 0o644)
        self.top = f"/tmp/ddprun-{victim}"
        attacker_dir(self.top)
        attacker_dir(self.top + "/runs")
        os.symlink("/tmp/evil/job_fake", f"{self.top}/runs/{self.agent}")
        os.lchown(f"{self.top}/runs/{self.agent}", ATTACKER, ATTACKER)

    def markers(self):
        return os.listdir("/tmp/markers")

    def close(self):
        for p in self.procs:
            p.kill()
            p.wait()


def victim_env(uid, home, **extra):
    env = {"PATH": SAFE_PATH, "HOME": home, "LANG": "C.UTF-8"}
    env.update(extra)
    return env


def refusals(ddprun, uid, planted, env):
    top = planted.top
    d = run(uid, [ddprun, "dump"], env)
    check(d.returncode == 1, "ddprun dump refuses (exit 1)")
    check(f"ddprun dump: error: {top} belongs to uid {ATTACKER}, not to this user (uid {uid})" in d.stderr,
          "it names the directory, its owner and the caller")
    check(f"remove it (rm -rf {top}" in d.stderr, "and says what to do")
    d = run(uid, [ddprun, "dump", "evil"], env)
    check(d.returncode == 1 and f"{top} belongs to uid {ATTACKER}" in d.stderr, "ddprun dump RUN_ID refuses too")
    d = run(uid, [ddprun, "dump", "/tmp/evil/job_fake"], env)
    check(d.returncode == 1 and f"/tmp/evil/job_fake belongs to uid {ATTACKER}" in d.stderr,
          "a run directory of another user given on the command line is not read")
    os.symlink("/tmp/evil/job_fake", "/tmp/evil/latest")
    d = run(uid, [ddprun, "dump", "/tmp/evil/latest"], env)
    check(d.returncode == 1 and f"/tmp/evil/job_fake belongs to uid {ATTACKER}" in d.stderr,
          "a link given on the command line is followed, and where it leads is checked")
    s = run(uid, [ddprun, "status"], env)
    check(s.returncode == 1, "ddprun status refuses (exit 1)")
    check(f"ddprun status: error: {top} belongs to uid {ATTACKER}, not to this user (uid {uid})" in s.stderr,
          "ddprun status names the directory and its owner")
    check(not planted.markers(), f"none of the attacker's programs ran ({planted.markers()})")


def xdg_preferred(ddprun, uid, planted, home):
    xdg = os.path.join(home, "xdg")
    os.mkdir(xdg, 0o700)
    os.chown(xdg, uid, uid)
    env = victim_env(uid, home, XDG_RUNTIME_DIR=xdg)
    d = run(uid, [ddprun, "dump"], env)
    check(d.returncode == 1 and f"no running ddprun job of this user on this host (none in {xdg}/ddprun/runs)"
          in d.stderr, "with XDG_RUNTIME_DIR of its own, ddprun dump looks there, not in /tmp/ddprun-<uid>")
    s = run(uid, [ddprun, "status"], env)
    check(s.returncode == 1 and f"looked in {xdg}/ddprun" in s.stderr, "and so does ddprun status")
    check(not planted.markers(), "nothing of the attacker's ran")


def own_runs_dir_links_out(ddprun, uid, planted, home):
    runs = os.path.join(home, "runs")
    os.mkdir(runs, 0o700)
    os.chown(runs, uid, uid)
    link = os.path.join(runs, str(planted.agent))
    os.symlink("/tmp/evil/job_fake", link)
    os.lchown(link, uid, uid)
    d = run(uid, [ddprun, "dump"], victim_env(uid, home, DDPRUN_RUNS_DIR=runs))
    check(d.returncode == 1, "a link of the victim's own runs directory to another user's run: no job (exit 1)")
    check(f"not read: {link} -> /tmp/evil/job_fake: /tmp/evil/job_fake belongs to uid {ATTACKER}" in d.stderr,
          "the link is named, with why it is not followed")
    check(not planted.markers(), "nothing of the attacker's ran")


def real_job(ddprun, uid, planted, home):
    """The victim's own job, after the victim removed nothing: with XDG_RUNTIME_DIR of its own."""
    xdg = os.path.join(home, "xdg")
    env = victim_env(uid, home, XDG_RUNTIME_DIR=xdg, PYTHON_EXEC="/usr/bin/python3", PYTHONUNBUFFERED="1")
    script = os.path.join(home, "job.py")
    with open(script, "w") as f:
        f.write("import time\nprint('ready', flush=True)\ntime.sleep(600)\n")
    logs = os.path.join(home, "logs")
    job = subprocess.Popen(as_uid(uid, [ddprun, "--nproc_per_node=1", "--log_dir", logs, "--rdzv_id", "mine",
                                        script]),
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, cwd=home)
    try:
        deadline = time.monotonic() + GUARD
        for line in job.stdout:
            print(line, end="")
            if "ready" in line:
                break
            check(time.monotonic() < deadline, "the job got ready in time")
        run_dirs = [os.path.join(logs, n) for n in os.listdir(logs) if n.startswith("mine_")]
        check(len(run_dirs) == 1, f"one run directory: {run_dirs}")
        workers = os.path.join(run_dirs[0], "workers")
        check(os.stat(workers).st_mode & 0o077 == 0, "the agent writes its workers file 0600")
        # The victim's own record, made to name the attacker's interpreter and one of the
        # attacker's processes as a worker: neither is used.
        with open(workers) as f:
            text = f.read()
        tampered = "".join("python /tmp/evil/bin/python\n" if l.startswith("python ") else l + "\n"
                           for l in text.splitlines()) + f"rank 9 9 {planted.worker}\n"
        with open(workers + ".new", "w") as f:
            f.write(tampered)
        os.chown(workers + ".new", uid, uid)
        os.chmod(workers + ".new", 0o600)
        os.rename(workers + ".new", workers)
        # From the attacker's directory, with the working directory on PATH (an empty entry).
        d = run(uid, [ddprun, "dump"], dict(env, PATH=":" + SAFE_PATH), cwd="/tmp/evil/bin")
        check(d.returncode == 0, "the victim's own job is dumped (exit 0)")
        check("==== r0 (local rank 0" in d.stdout, "its worker's stack is shown")
        check(f"r9 (pid {planted.worker}) is not a live worker of agent" in d.stderr,
              "a pid that is not the agent's child is left out, and said so")
        check("==== r9" not in d.stdout, "and not dumped")
        check(not planted.markers(), "the interpreter named in the file is not where the tools come from, nor "
                                     "a relative PATH entry")
        latest = os.path.join(home, "latest")
        os.symlink(run_dirs[0], latest)
        d = run(uid, [ddprun, "dump", latest], env)
        check(d.returncode == 0 and "==== r0 (local rank 0" in d.stdout, "a link to the victim's own run directory")
        s = run(uid, [ddprun, "status"], env)
        check(s.returncode == 0 and "job mine" in s.stdout, "ddprun status shows the job")
        job.send_signal(signal.SIGTERM)
        job.communicate(timeout=GUARD)
    finally:
        if job.poll() is None:
            job.kill()
            job.wait()


def agent_with_foreign_dir(ddprun, uid, planted, home):
    env = victim_env(uid, home, PYTHONUNBUFFERED="1")
    p = run(uid, [ddprun, "--nproc_per_node=1", "--log_dir", os.path.join(home, "logs2"), "--no_python",
                  "/bin/true"], env)
    check(p.returncode == 0, "a job still runs when /tmp/ddprun-<uid> is another user's")
    check(f"`ddprun status` cannot see this job: {planted.top} belongs to uid {ATTACKER}" in p.stderr,
          "the agent says the status socket is not made there")
    check(f"`ddprun dump` without an argument will not find this run: {planted.top} belongs to uid {ATTACKER}"
          in p.stderr, "nor the runs link")
    check(sorted(os.listdir(planted.top + "/runs")) == [str(planted.agent)], "nothing was added to it")


def inside(ddprun, victim):
    uid = 0 if victim == "root" else 4242
    home = "/tmp/victim"
    os.mkdir(home, 0o700)
    os.chown(home, uid, uid)
    planted = Planted(uid)
    try:
        refusals(ddprun, uid, planted, victim_env(uid, home))
        agent_with_foreign_dir(ddprun, uid, planted, home)
        xdg_preferred(ddprun, uid, planted, home)
        own_runs_dir_links_out(ddprun, uid, planted, home)
        real_job(ddprun, uid, planted, home)
    finally:
        planted.close()


def main():
    ddprun, victim = os.path.abspath(sys.argv[1]), sys.argv[2]
    if len(sys.argv) > 3 and sys.argv[3] == "--inside":
        inside(ddprun, victim)
        return
    if os.geteuid() != 0 or not shutil.which("setpriv") or not shutil.which("unshare"):
        print("SKIPPED: needs root, setpriv and unshare (another user, a private /tmp)")
        sys.exit(77)
    # A private mount namespace with a fresh /tmp: everything made there goes with it.
    p = subprocess.run(["unshare", "-m", "--propagation", "private", "sh", "-c",
                        'mount -t tmpfs -o mode=1777 tmpfs /tmp && exec "$@"', "sh", sys.executable,
                        os.path.abspath(__file__), ddprun, victim, "--inside"], timeout=600)
    sys.exit(p.returncode)


if __name__ == "__main__":
    main()
