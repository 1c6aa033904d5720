#!/usr/bin/env python3
"""scripts/slurm/ on a real Slurm cluster (cluster.py: munged, slurmctld, two slurmd).

    test_slurm_cluster.py --ddprun DDPRUN --train TRAIN [--python PY] SCENARIO

Scenarios (each on a fresh cluster; every one also checks that no process of its jobs is
left once they ended):
  single    single_node.sbatch: one node, two train workers, the Slurm line names the run id;
            `srun -n1 ddprun` in a 2-node allocation stays one node; ddprun in the batch
            script of a 2-node job (no srun) runs on its node only and warns
  multi     multi_node.sbatch -N2: four train workers, node ranks 0 and 1 from Slurm, the
            first host as master; the job's PATH has no scontrol (checked by a job too)
  pytorch   pytorch_gloo.sbatch -N2: four PyTorch gloo ranks with equal parameters
  tasks     one_task_per_gpu.sbatch -N2: srun starts four `train` tasks, no ddprun; their
            final parameters equal multi_node.sbatch's (the same world under ddprun)
  scancel   multi_node.sbatch with a long training, scancel while the workers run
  munge     (3 nodes) multi_node.sbatch -N2 without a token: munge authenticates the agents; a credential
            from another job's srun step and one of another uid (nobody) are refused, and the job
            goes on (the multi scenario also checks that its agents use munge)
  elastic   elastic.sbatch -N2: the agent on the second node is killed (SIGKILL) after the
            first checkpoint; the first node's agent restarts its workers in a world of two,
            they resume from the checkpoint and finish
  requeue   requeue.sbatch -N2 once uninterrupted (the reference), once with `scancel
            --signal=USR1` after the first checkpoint: the script requeues the job, which runs
            again, resumes, and ends with the reference's parameters bit for bit. Every rank
            of both nodes stops after the same step, that step's checkpoint is written, ddprun
            exits 99 (its preemption code) and the requeued run resumes from that step.
Exits 77 when not root or Slurm is missing.
"""
import argparse
import os
import re
import signal
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import cluster as slurm  # noqa: E402

REPO = os.path.abspath(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
SCRIPTS = os.path.join(REPO, "scripts", "slurm")


class Failure(Exception):
    pass


def check(cond, what, out=""):
    if not cond:
        raise Failure(what + ("\n--- job output ---\n" + out[-6000:] if out else ""))


def submit(c, script, args, job_env, nodes, path_without_slurm=True):
    out = os.path.join(c.dir, "job-%j.out")
    job = c.sbatch([f"--nodes={nodes}", f"--output={out}", "--time=10"] + args + [os.path.join(SCRIPTS, script)],
                   job_env=job_env, cwd=REPO, path_without_slurm=path_without_slurm)
    return job, out.replace("%j", str(job))


def read(path):
    try:
        with open(path, errors="replace") as f:
            return f.read()
    except OSError:
        return ""


def wait_gone(c, job, timeout=90):
    """Every process of the job (tasks, workers, their children) has exited."""
    deadline = time.monotonic() + timeout
    left = []
    while time.monotonic() < deadline:
        left = c.processes({"SLURM_JOB_ID": str(job)})
        if not left:
            return
        time.sleep(0.2)
    raise Failure(f"job {job} ended but left processes: {c.describe(left)}")


def finished(c, job, path, timeout=300, want="COMPLETED"):
    info = c.wait_job(job, timeout=timeout)
    out = read(path)
    check(info.get("JobState") == want,
          f"job {job}: {info.get('JobState')} (exit {info.get('ExitCode')}, reason {info.get('Reason')}), "
          f"expected {want}", out + "\n--- slurmctld ---\n" + c.log("slurmctld.log")[-3000:])
    wait_gone(c, job)
    return out


def wait_for(cond, timeout, what, c=None, job=None, path=None):
    """Polls `cond`; fails at once when `job` (if given) ended before it held."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        v = cond()
        if v:
            return v
        if job is not None:
            state = c.job_info(job).get("JobState")
            if state not in ("PENDING", "CONFIGURING", "RUNNING", "COMPLETING", None):
                check(False, f"job {job} is {state} while waiting for {what}", read(path))
        time.sleep(0.2)
    check(False, f"timed out after {timeout}s waiting for {what}", read(path) if path else "")


def workers(c, job, train):
    return [p for p in c.processes({"SLURM_JOB_ID": str(job)}) if slurm.cmdline_of(p).startswith(train)]


def base_env(a, c=None):
    env = {"DDPRUN": a.ddprun, "TRAIN": a.train, "NPROC": "2"}
    if c is not None:
        env["DDPRUN_MUNGE_SOCKET"] = c.munge_socket  # this cluster's munged (Slurm's AuthInfo)
    return env


PROBE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "munge_probe.py")


def scenario_single(c, a):
    job, path = submit(c, "single_node.sbatch", [], base_env(a), 1)
    out = finished(c, job, path)
    check(f"ddprun: Slurm step {job}.0: --rdzv_id=slurm-{job}.0 (SLURM_JOB_ID.SLURM_STEP_ID)" in out,
          "no Slurm line with the derived run id", out)
    check("--nnodes" not in out, "a one-node step must stay single-node", out)
    check("[train] world=2 " in out and "final_param_checksum=" in out, "train did not run to the end", out)
    # `srun -n1` in a 2-node allocation: a one-node step, so one node.
    job = c.sbatch(["--nodes=2", f"--output={c.dir}/n1.out", "--wrap",
                    f"srun -N1 -n1 {a.ddprun} --nproc_per_node=2 {a.train} --epochs 1"])
    out = finished(c, job, f"{c.dir}/n1.out")
    check(f"ddprun: Slurm step {job}.0: --rdzv_id=slurm-{job}.0" in out and "--nnodes" not in out
          and "[train] world=2 " in out, "srun -n1 in a 2-node allocation must stay single-node", out)
    # ddprun in the batch script itself (no srun) of a 2-node job: this node only, and a warning.
    job = c.sbatch(["--nodes=2", f"--output={c.dir}/batch.out", "--wrap",
                    f"{a.ddprun} --nproc_per_node=2 {a.train} --epochs 1"])
    out = finished(c, job, f"{c.dir}/batch.out")
    check(f"running outside srun in Slurm job {job} of 2 nodes: only this node takes part" in out
          and "Slurm step" not in out and "[train] world=2 " in out, "the batch script case", out)


def scenario_multi(c, a):
    # The compute nodes' PATH (the job's) has no scontrol.
    probe = c.sbatch(["--nodes=2", f"--output={c.dir}/probe.out", "--wrap",
                      "srun bash -c '! command -v scontrol && echo no-scontrol-on-$SLURMD_NODENAME'"])
    job, path = submit(c, "multi_node.sbatch", [], base_env(a, c), 2)
    info = c.wait_job(probe, timeout=120)
    probe_text = read(f"{c.dir}/probe.out")
    check(info.get("JobState") == "COMPLETED" and all(f"no-scontrol-on-{n}" in probe_text for n in c.nodes),
          f"scontrol is on the job's PATH ({info.get('JobState')})", probe_text)
    out = finished(c, job, path)
    first = c.nodes[0]
    for rank in (0, 1):
        check(re.search(rf"ddprun: Slurm step {job}\.0: --nnodes=2 \(SLURM_STEP_NUM_NODES\), "
                        rf"--rdzv_id=slurm-{job}\.0 \([^)]*\), --node_rank={rank} \(SLURM_NODEID\), "
                        rf"--master_addr={first} \(first of SLURM_STEP_NODELIST\), --master_port=\d+ ", out),
              f"no Slurm line for node rank {rank}", out)
    check(len(re.findall(r"ddprun: Slurm step", out)) == 2, "the Slurm line must be printed once per agent", out)
    check("[train] world=4 " in out and "final_param_checksum=" in out, "train did not run as one world of 4", out)
    # No token: munge proved every agent a member of this step, and nothing said "open".
    check(out.count(f"admits only the agents of Slurm job {job} step 0 (munge credentials of uid 0)") == 2,
          "each agent must use munge authentication", out)
    check("open to anyone" not in out, "a munge-authenticated rendezvous is not open", out)


def scenario_munge(c, a):
    """A 2-node job authenticated by munge (no token) runs; a credential made in another job's
    srun step, and one of another uid claiming this job's step, are refused; the job goes on."""
    env = dict(base_env(a, c), EXTRA=LONG, EPOCHS="1000")
    job, path = submit(c, "multi_node.sbatch", [], env, 2)
    wait_for(lambda: len(workers(c, job, a.train)) == 4, 120, "four train workers", c, job, path)
    wait_for(lambda: "[train] world=4" in read(path), 120, "the training to start", c, job, path)
    pids = sorted(workers(c, job, a.train))
    out = read(path)
    m = re.search(r"--master_addr=(\S+) \(first of SLURM_STEP_NODELIST\), --master_port=(\d+)", out)
    check(m, "no rendezvous endpoint in the Slurm line", out)
    host, port = m.group(1), m.group(2)
    check("open to anyone" not in out and f"admits only the agents of Slurm job {job} step 0" in out,
          "the job must run with munge authentication", out)
    probe = ["--host", host, "--port", port, "--socket", c.munge_socket]
    # Another job's srun step: a genuine credential of the same user, for that job.
    other = c.sbatch(["--nodes=1", f"--output={c.dir}/other.out", "--wrap",
                      f"srun /usr/bin/python3 {PROBE} " + " ".join(probe)], path_without_slurm=False)
    check(c.wait_job(other, timeout=120).get("JobState") == "COMPLETED", "the other job's probe failed",
          read(f"{c.dir}/other.out"))
    said = read(f"{c.dir}/other.out")
    check(f"job {other} step 0: ERROR rendezvous refused: its munge credential is for Slurm job {other} step 0, and "
          f"this rendezvous is job {job} step 0's" in said, "another job's credential must be refused", said)
    # Another uid (nobody), claiming this job's step, its credential decodable by root.
    r = subprocess.run(["runuser", "-u", "nobody", "--", "/usr/bin/python3", PROBE] + probe +
                       ["--job", str(job), "--step", "0", "--decoder-uid", "0"],
                       capture_output=True, text=True, timeout=60)
    check("ERROR rendezvous refused: its munge credential is of uid 65534, and this rendezvous admits only uid 0"
          in r.stdout, "another uid's credential must be refused", r.stdout + r.stderr)
    # The job went on: the same four workers still train (nothing restarted).
    time.sleep(2)
    check(sorted(workers(c, job, a.train)) == pids and c.job_info(job).get("JobState") == "RUNNING",
          "the job must go on with its workers", read(path))
    c.run(["scancel", str(job)])
    c.wait_job(job, timeout=120)
    wait_gone(c, job)


def scenario_pytorch(c, a):
    env = dict(base_env(a), PYTHON_EXEC=a.python)
    job, path = submit(c, "pytorch_gloo.sbatch", [], env, 2)
    out = finished(c, job, path, timeout=400)
    lines = re.findall(r"rank (\d)/(\d) node (\d) host \S+: loss \S+ params (\S+)", out)
    check(sorted(l[0] for l in lines) == ["0", "1", "2", "3"] and {l[1] for l in lines} == {"4"},
          "expected ranks 0-3 of a world of 4", out)
    check({l[2] for l in lines} == {"0", "1"}, "expected workers on node ranks 0 and 1", out)
    check(len({l[3] for l in lines}) == 1, "parameters differ between ranks", out)


def scenario_tasks(c, a):
    job, path = submit(c, "one_task_per_gpu.sbatch", [], {"TRAIN": a.train}, 2)
    out = finished(c, job, path)
    check("[train] world=4 " in out and "final_param_checksum=" in out,
          "train tasks started by srun did not form a world of 4", out)
    check("ddprun" not in out, "no ddprun in this scenario", out)
    # The same world under ddprun (multi_node.sbatch, same train flags) ends with the same
    # parameters: srun's ranks are the ones ddprun would give.
    job, path = submit(c, "multi_node.sbatch", [], base_env(a), 2)
    under_ddprun = finished(c, job, path)
    check(checksum_of(out) and checksum_of(out) == checksum_of(under_ddprun),
          f"srun-only world ended with {checksum_of(out)}, the ddprun one with {checksum_of(under_ddprun)}",
          under_ddprun)


# A training that runs for minutes: ended by the test long before.
LONG = "--samples 200000 --width 128 --depth 2 --batch 32 --threads 1"


def scenario_scancel(c, a):
    env = dict(base_env(a), EXTRA=LONG, EPOCHS="1000")
    job, path = submit(c, "multi_node.sbatch", [], env, 2)
    wait_for(lambda: len(workers(c, job, a.train)) == 4, 120, "four train workers", c, job, path)
    wait_for(lambda: "[train] world=4" in read(path), 120, "the training to start", c, job, path)
    c.run(["scancel", str(job)])
    info = c.wait_job(job, timeout=120)
    check(info.get("JobState") == "CANCELLED", f"job {job}: {info.get('JobState')}, expected CANCELLED", read(path))
    wait_gone(c, job)


def scenario_elastic(c, a):
    ckpt = os.path.join(c.dir, "ckpt")
    # Slow enough that the second node is killed mid-job, short enough to finish on one node.
    extra = "--samples 16000 --width 1024 --depth 2 --batch 16 --threads 1 --log-every 50"
    env = dict(base_env(a), CKPT=ckpt, EXTRA=extra, EPOCHS="3", CKPT_EVERY="20")
    job, path = submit(c, "elastic.sbatch", [], env, 2)
    wait_for(lambda: len(workers(c, job, a.train)) == 4, 120, "four train workers", c, job, path)
    second = c.nodes[1]
    # The agent is the parent of that node's workers (ddprun also keeps a helper process).
    on_second = c.processes({"SLURM_JOB_ID": str(job), "SLURMD_NODENAME": second})
    agents = sorted({slurm.parent_of(p) for p in on_second if slurm.cmdline_of(p).startswith(a.train)})
    check(len(agents) == 1, f"expected one ddprun agent on {second}, found {c.describe(agents)}", read(path))
    # Found first, so that the kill follows the first checkpoint at once.
    wait_for(lambda: os.path.isdir(ckpt) and any(n.startswith("ckpt-") and n.endswith(".ddpck")
                                                for n in os.listdir(ckpt)), 240, "the first checkpoint", c, job, path)
    os.kill(agents[0], signal.SIGKILL)
    info = c.wait_job(job, timeout=400)
    out = read(path)
    # srun reports the killed task; what matters is that the survivor finished the training.
    after = out.split("[train] world=4", 1)[-1]
    check("[train] world=2 " in after, "the survivor did not restart its workers in a world of 2", out)
    check("[train] resumed from step" in after, "the survivors did not resume from the checkpoint", out)
    check("final_param_checksum=" in after, "the survivors did not finish the training", out)
    check(info.get("JobState") in ("COMPLETED", "FAILED"), f"job {job}: {info.get('JobState')}", out)
    print(f"elastic job ended {info.get('JobState')} (exit {info.get('ExitCode')}) after the survivor finished")
    wait_gone(c, job)


def checksum_of(out):
    sums = re.findall(r"final_param_checksum=([0-9a-f]+)", out)
    return sums[-1] if sums else None


def scenario_requeue(c, a):
    cfg = dict(base_env(a), EPOCHS="4", CKPT_EVERY="10",
               EXTRA="--samples 8000 --width 1024 --depth 2 --batch 16 --threads 1 --log-every 50")
    # Uninterrupted: the reference, and the script's plain path (no scontrol needed).
    job, path = submit(c, "requeue.sbatch", [], dict(cfg, CKPT=os.path.join(c.dir, "ck-ref")), 2)
    out = finished(c, job, path)
    check(f"job {job} run 0 on" in out and "requeueing" not in out and checksum_of(out), "plain run", out)
    reference = checksum_of(out)
    # Preempted mid-run: the script requeues (scontrol on its PATH), the job runs again and
    # resumes from the checkpoint.
    ckpt = os.path.join(c.dir, "ck-pre")
    job, path = submit(c, "requeue.sbatch", [], dict(cfg, CKPT=ckpt), 2, path_without_slurm=False)
    wait_for(lambda: len(workers(c, job, a.train)) == 4, 120, "four train workers", c, job, path)
    wait_for(lambda: os.path.isdir(ckpt) and any(n.endswith(".ddpck") for n in os.listdir(ckpt)), 240,
             "the first checkpoint", c, job, path)
    c.run(["scancel", "--signal=USR1", str(job)])
    # Slurm holds a requeued job back for a while (BeginTime about two minutes ahead): start it
    # now; what is tested is that it runs again and resumes, not Slurm's delay.
    wait_for(lambda: f"preempted: requeueing job {job}" in read(path), 240, "the script to requeue", c, job, path)
    wait_for(lambda: c.job_info(job).get("JobState") == "PENDING" or f"job {job} run 1 on" in read(path), 120,
             "the requeued job to be pending")
    # Forcing the start before the nodes have finished the first run makes slurmd refuse the new
    # launch ("Job credential revoked": the revocation and the new credential share a second).
    # Wait for the nodes to be idle, and for the clock to pass that second, as Slurm's own delay does.
    if f"job {job} run 1 on" not in read(path):
        wait_for(c._all_idle, 120, "the nodes to finish the first run", c, job, path)
        time.sleep(2.5)
        c.run(["scontrol", "update", f"JobId={job}", "StartTime=now"], check=False)
    out = finished(c, job, path, timeout=500)
    check(f"preempted: requeueing job {job}" in out, "the script did not requeue the job", out)
    check(f"job {job} run 1 on" in out, "the job did not run again", out)
    first, second = out.split(f"job {job} run 1 on", 1)
    # ddprun's preemption handling: every rank (2 nodes x 2) agreed on one step, rank 0 wrote
    # that step's checkpoint, and the requeued run starts from it.
    stops = re.findall(r"\[train\] rank (\d+): stopping after step (\d+) for a preemption", first)
    check(sorted(r for r, _ in stops) == ["0", "1", "2", "3"], f"ranks that stopped for the preemption: {stops}", out)
    steps = {st for _, st in stops}
    check(len(steps) == 1, f"the ranks stopped after different steps: {stops}", out)
    stop_step = steps.pop()
    check(f"[train] checkpoint of step {stop_step} written" in first, f"no checkpoint of step {stop_step}", out)
    check(re.search(rf"\[train\] resumed from step {stop_step}\b", second) is not None and checksum_of(second),
          f"the requeued run did not resume from step {stop_step}", out)
    # Resuming from train's checkpoint is bit-identical (worker runtime), preempted or not.
    check(checksum_of(second) == reference,
          f"resumed run ended with {checksum_of(second)}, the uninterrupted one with {reference}", out)


SCENARIOS = {"single": (1, scenario_single), "multi": (2, scenario_multi), "pytorch": (2, scenario_pytorch),
             "tasks": (2, scenario_tasks), "scancel": (2, scenario_scancel), "elastic": (2, scenario_elastic),
             "requeue": (2, scenario_requeue), "munge": (3, scenario_munge)}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--ddprun", required=True)
    ap.add_argument("--train", required=True)
    ap.add_argument("--python", default="/usr/bin/python3")
    ap.add_argument("--keep", action="store_true", help="keep the cluster's directory (logs)")
    ap.add_argument("scenario", choices=sorted(SCENARIOS))
    a = ap.parse_args()
    a.ddprun, a.train = os.path.abspath(a.ddprun), os.path.abspath(a.train)
    nodes, fn = SCENARIOS[a.scenario]
    if a.scenario == "pytorch" and not os.access(a.python, os.X_OK):
        print(f"SKIP: no Python at {a.python} (scripts/setup_deps.sh makes the torch 2.x environment)")
        return slurm.SKIP
    try:
        with slurm.SlurmCluster(nodes=max(2, nodes), keep_dir=a.keep) as c:
            t0 = time.monotonic()
            try:
                fn(c, a)
            except Failure as e:
                print(f"FAIL {a.scenario}: {e}\n(cluster directory {c.dir})")
                return 1
            print(f"OK {a.scenario} ({time.monotonic() - t0:.1f}s)")
        left = c.processes()
        if left:
            print(f"FAIL {a.scenario}: the cluster left processes: {c.describe(left)}")
            return 1
        return 0
    except slurm.Skip as e:
        print(f"SKIP: {e}")
        return slurm.SKIP


if __name__ == "__main__":
    sys.exit(main())
