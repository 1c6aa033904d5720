#!/usr/bin/env python3
"""A worker's whole environment under ddprun and under a torchrun 2.x (2.11, 2.15), same flags, diffed.

Usage: test_env_diff.py <ddprun> <torch 2.x venv python> {static|static2|c10d|standalone|empty}
  static      one node, --nproc_per_node=2 --master_port=P
  static2     two static nodes on loopback (--nnodes=2 --node_rank=0|1, one worker each)
  c10d        one node, --rdzv_backend=c10d --rdzv_endpoint=127.0.0.1:P
  standalone  --standalone --nproc_per_node=2
  empty       static, with every flag torchrun runs with empty given as `--flag=`

Every worker dumps os.environ to a file; the environments of the same rank must be equal but
for the differences listed in ALLOWED / ALLOWED_IN (each with its reason; launcher/README.md
documents them). The workers run under the venv's Python under both launchers (PYTHON_EXEC,
which torchrun honours too). Exit 77 (ctest: skipped) when the venv is missing and CI is not
set, as tests/interop does; with CI=true a missing venv fails.
"""
import json
import os
import re
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "pylib"))
from ddprun_testlib import free_port  # noqa: E402

HANG_GUARD = 240
WORKER = ("import json, os\n"
          "with open(os.path.join(os.environ['ENV_OUT'], os.environ['RANK'] + '.json'), 'w') as f:\n"
          "    json.dump(dict(os.environ), f)\n")

ERROR_FILE = re.compile(r"^/.+/[^/]+_[A-Za-z0-9_]{6,}/attempt_0/(\d+)/error\.json$")
UUID = re.compile(r"^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$")


def same_shape_error_file(d, t, rank_env):
    """Each launcher's own log directory; the layout <dir>/<run_id>_<unique>/attempt_<n>/<local
    rank>/error.json is the same."""
    md, mt = ERROR_FILE.match(d or ""), ERROR_FILE.match(t or "")
    return bool(md and mt and md.group(1) == mt.group(1) == rank_env["LOCAL_RANK"])


def ddprun_only_preempt_file(d, t, rank_env):
    """ddprun's own addition: where a worker announces that it stopped for a preemption (beside
    its error file); torchrun has no such contract."""
    return t is None and d is not None and d.endswith(f"/{rank_env['LOCAL_RANK']}/preempted")


def ddprun_only_progress_file(d, t, rank_env):
    """ddprun's own addition: the rank's progress file beside its error file, where
    libddprun_worker leaves its step statistics for the end-of-run table and where
    --hang_timeout reads the ticks; torchrun has no such file."""
    return t is None and d is not None and d.endswith(f"/{rank_env['LOCAL_RANK']}/progress")


def torchrun_only_locale(d, t, rank_env):
    """torchrun's own Python coerces a C locale (PEP 538) and its workers inherit LC_CTYPE;
    ddprun is not Python. A Python worker coerces its own locale the same way."""
    return d is None


def a_port_each(d, t, rank_env):
    """torchrun 2.11 serves the workers' store on a new free port; ddprun on the rendezvous
    port (one node) or the round's store port. Both are ports, the same for every rank."""
    return bool(d and t and d.isdigit() and t.isdigit() and int(d) > 0 and int(t) > 0)


def host_of_store(d, t, rank_env):
    """torchrun gives the rank-0 node's socket.getfqdn() ('localhost' on a machine without a
    domain); ddprun the address its store is bound to (127.0.0.1 on one node): the same host."""
    return d == "127.0.0.1" and bool(t)


def random_run_id(d, t, rank_env):
    """--standalone draws a random run id (uuid4) under both."""
    return bool(UUID.match(d or "") and UUID.match(t or ""))


def random_run_id_each(d, t, rank_env):
    """--rdzv_id= (empty) draws a random run id under both: uuid4 as text under ddprun, its
    integer under torchrun."""
    return bool(UUID.match(d or "") and (t or "").isdigit())


def torchrun_only_inductor_cache(d, t, rank_env):
    """With --signals_to_handle= (empty), torchrun 2.11's agent sets TORCHINDUCTOR_CACHE_DIR in
    its own environment (a side effect of its failed lookup of the signal named ''), and its
    workers inherit it; ddprun sets nothing of the kind."""
    return d is None and bool(t) and os.path.basename(t).startswith("torchinductor_")


ALLOWED = {
    "TORCHELASTIC_ERROR_FILE": same_shape_error_file,
    "LC_CTYPE": torchrun_only_locale,
    "DDPRUN_PREEMPT_FILE": ddprun_only_preempt_file,
    "DDPRUN_PROGRESS_FILE": ddprun_only_progress_file,
}
ALLOWED_IN = {
    "c10d": {"MASTER_PORT": a_port_each, "MASTER_ADDR": host_of_store},
    "standalone": {"MASTER_PORT": a_port_each, "MASTER_ADDR": host_of_store, "TORCHELASTIC_RUN_ID": random_run_id},
    "empty": {"TORCHELASTIC_RUN_ID": random_run_id_each, "TORCHINDUCTOR_CACHE_DIR": torchrun_only_inductor_cache},
}
# torchrun 2.11 runs with these flags empty (the others it refuses or fails on).
EMPTY_FLAGS = ["--rdzv_endpoint=", "--rdzv_id=", "--rdzv_conf=", "--role=", "--log_dir=", "--local_ranks_filter=",
               "--local_addr=", "--signals_to_handle=", "--duplicate_stdout_filters=", "--duplicate_stderr_filters="]


def launch(cmds, env):
    """Runs the agents of one launch at once (one per node); returns their outcomes."""
    procs = [subprocess.Popen(c, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True) for c in cmds]
    outs = []
    for c, p in zip(cmds, procs):
        try:
            out, _ = p.communicate(timeout=HANG_GUARD)
        except subprocess.TimeoutExpired:
            for q in procs:
                q.kill()
            raise
        outs.append((c, p.returncode, out))
    return outs


def flags_for(mode, port):
    if mode == "static":
        return [["--nproc_per_node=2", f"--master_port={port}"]]
    if mode == "static2":
        return [["--nnodes=2", f"--node_rank={n}", "--nproc_per_node=1", "--master_addr=127.0.0.1",
                 f"--master_port={port}"] for n in range(2)]
    if mode == "c10d":
        return [["--nproc_per_node=2", "--rdzv_backend=c10d", f"--rdzv_endpoint=127.0.0.1:{port}"]]
    if mode == "standalone":
        return [["--standalone", "--nproc_per_node=2"]]
    if mode == "empty":
        return [["--nproc_per_node=2", f"--master_port={port}"] + EMPTY_FLAGS]
    raise SystemExit(f"unknown mode {mode}")


def environments(name, launcher, python, mode, tmp, port):
    # The same ENV_OUT for both launchers (one after the other), so it is no difference.
    out_dir = os.path.join(tmp, "out")
    os.makedirs(out_dir)
    script = os.path.join(tmp, "printenv.py")
    # The same small, fixed parent environment for both: what differs is the launchers' doing.
    env = {"PATH": os.path.dirname(python) + ":/usr/bin:/bin", "HOME": tmp, "LANG": "C.UTF-8",
           "ENV_OUT": out_dir, "PYTHON_EXEC": python, "TMPDIR": tmp}
    cmds = [launcher + f + [script] for f in flags_for(mode, port)]
    for c, rc, out in launch(cmds, env):
        print("$", " ".join(c), f"-> {rc}\n{out}", flush=True)
        if rc != 0:
            raise SystemExit(f"FAIL: {name} exited {rc}")
    envs = {}
    for f in sorted(os.listdir(out_dir)):
        with open(os.path.join(out_dir, f)) as fh:
            envs[int(f.split(".")[0])] = json.load(fh)
    os.rename(out_dir, os.path.join(tmp, name))
    return envs


def main():
    ddprun, python, mode = sys.argv[1], sys.argv[2], sys.argv[3]
    if not (os.path.isfile(python) and os.access(python, os.X_OK)):
        if os.environ.get("CI", "").lower() == "true":
            print(f"FAIL: the torch venv interpreter {python} is missing (CI=true: not skipping)")
            return 1
        print(f"SKIP: venv missing ({python}); run scripts/setup_deps.sh to create it")
        return 77
    torchrun = os.path.join(os.path.dirname(python), "torchrun")
    with tempfile.TemporaryDirectory() as tmp:
        with open(os.path.join(tmp, "printenv.py"), "w") as f:
            f.write(WORKER)
        # One port for both launches, one after the other: --master_port is the same flag.
        port = free_port()
        ours = environments("ddprun", [ddprun], python, mode, tmp, port)
        theirs = environments("torchrun", [torchrun], python, mode, tmp, port)
    if sorted(ours) != sorted(theirs) or not ours:
        print(f"FAIL: ranks differ: ddprun {sorted(ours)}, torchrun {sorted(theirs)}")
        return 1
    allowed = dict(ALLOWED, **ALLOWED_IN.get(mode, {}))
    problems, used = [], set()
    for rank in sorted(ours):
        d_env, t_env = ours[rank], theirs[rank]
        for key in sorted(set(d_env) | set(t_env)):
            d, t = d_env.get(key), t_env.get(key)
            if d == t:
                continue
            check = allowed.get(key)
            if check and check(d, t, t_env):
                used.add(key)
                continue
            problems.append(f"rank {rank} {key}: ddprun {d!r}, torchrun {t!r}"
                            + (f" (allowed only as: {check.__doc__.split('.')[0].strip()})" if check else ""))
    # Allowed values still agree across the ranks of one launch (one store, one run).
    for key in ("MASTER_PORT", "MASTER_ADDR", "TORCHELASTIC_RUN_ID"):
        for name, envs in (("ddprun", ours), ("torchrun", theirs)):
            values = {e.get(key) for e in envs.values()}
            if len(values) != 1:
                problems.append(f"{name}: {key} differs between ranks: {sorted(map(str, values))}")
    for key in sorted(used):
        print(f"allowed difference {key}: {' '.join(allowed[key].__doc__.split())}")
    if problems:
        print("FAIL: environments differ:\n  " + "\n  ".join(problems))
        return 1
    print(f"PASS: {mode}: {len(ours)} ranks, {len(ours[0])} variables each, only documented differences")
    return 0


if __name__ == "__main__":
    sys.exit(main())
