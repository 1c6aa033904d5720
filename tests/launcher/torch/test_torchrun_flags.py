#!/usr/bin/env python3
"""Every flag of a torchrun version is a flag of ddprun: read from that torchrun's own argument
parser (torch.distributed.run.get_args_parser), not from a list kept here.

Usage: test_torchrun_flags.py <ddprun> <python of a torch 2.x venv>

For each of torchrun's options: ddprun's --help names every spelling of it; ddprun runs with each
spelling (and with PET_<FLAG> for a flag that takes a value) given a valid value, and does not
answer with a usage error (exit 2). A flag new in torchrun that has no sample value below fails
here, naming it: give it a meaning in ddprun (launcher/src/options/flags.cpp) and a sample.
Exit 77 (ctest: skipped) when the venv is missing and CI is not set; with CI=true it fails.
"""
import json
import os
import re
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "pylib"))
from ddprun_testlib import free_port  # noqa: E402

USAGE_EXIT = 2
READ_PARSER = """
import json
from torch.distributed.run import get_args_parser
import torch
out = []
for a in get_args_parser()._actions:
    if not a.option_strings or a.dest == "help":
        continue
    out.append({"options": a.option_strings, "dest": a.dest, "takes_value": a.nargs != 0,
                "choices": list(a.choices) if a.choices else None})
print(json.dumps({"version": torch.__version__, "flags": out}))
"""


def samples(tmp, port):
    """A valid value for each flag that takes one (keys: torchrun's dest)."""
    return {
        "nnodes": "1", "nproc_per_node": "1", "rdzv_backend": "static", "rdzv_endpoint": f"127.0.0.1:{port}",
        "rdzv_id": "flags", "rdzv_conf": "join_timeout=60", "max_restarts": "0", "monitor_interval": "0.1",
        "start_method": "spawn", "event_log_handler": "null", "role": "trainer", "log_dir": tmp,
        "redirects": "3", "tee": "3", "log_line_prefix_template": "${hostname}:${rank}: ",
        "local_ranks_filter": "0", "duplicate_stdout_filters": "x", "duplicate_stderr_filters": "x",
        "node_rank": "0", "master_addr": "127.0.0.1", "master_port": str(port), "local_addr": "127.0.0.1",
        "logs_specs": "default", "numa_binding": "node", "signals_to_handle": "SIGTERM,SIGINT",
        "shutdown_timeout": "5", "print_completion": "bash",
    }


def command(flag, dest, value, tmp):
    """ddprun's arguments for one flag: an entry point that suits it."""
    given = [flag] + ([value] if value is not None else [])
    if dest == "print_completion":
        return given  # prints a script and exits: no entry point
    if dest == "module":
        return given + ["platform"]
    if dest == "run_path":
        script = os.path.join(tmp, "noop.py")
        with open(script, "w") as f:
            f.write("pass\n")
        return given + [script]
    if dest == "no_python":
        return given + ["true"]
    return given + ["--no_python", "true"]


def help_names(text):
    return set(re.findall(r"(?<![\w-])(-{1,2}[A-Za-z][\w-]*)", text))


def run(ddprun, args, env):
    return subprocess.run([ddprun] + args, capture_output=True, text=True, env=env, timeout=120)


def main():
    ddprun, python = sys.argv[1], sys.argv[2]
    if not (os.path.isfile(python) and os.access(python, os.X_OK)):
        if os.environ.get("CI", "").lower() == "true":
            print(f"FAIL: the torch venv interpreter {python} is missing (CI=true: not skipping); "
                  "run scripts/setup_deps.sh")
            return 1
        print(f"SKIP: venv missing ({python}); run scripts/setup_deps.sh to create it")
        return 77
    parser = json.loads(subprocess.run([python, "-c", READ_PARSER], check=True, capture_output=True,
                                       text=True, timeout=240).stdout)
    print(f"torchrun {parser['version']}: {len(parser['flags'])} flags")
    helptext = run(ddprun, ["--help"], dict(os.environ)).stdout
    listed = help_names(helptext)
    problems = []
    with tempfile.TemporaryDirectory() as tmp:
        # The workers' Python: the system one (the flags are the matter here, not torch).
        env = {"PATH": "/usr/bin:/bin", "HOME": tmp, "LANG": "C.UTF-8", "TMPDIR": tmp, "PYTHON_EXEC": sys.executable}
        values = samples(tmp, free_port())
        for f in parser["flags"]:
            dest = f["dest"]
            missing = [o for o in f["options"] if o not in listed]
            if missing:
                problems.append(f"{dest}: ddprun --help does not list {', '.join(missing)}")
            value = None
            if f["takes_value"]:
                value = values.get(dest)
                if value is None:
                    problems.append(f"--{dest}: new in torchrun {parser['version']}, no sample value here: "
                                    "give it a meaning in ddprun and a sample in this test")
                    continue
                if f["choices"] and value not in f["choices"]:
                    problems.append(f"--{dest}: the sample {value!r} is not one of torchrun's {f['choices']}")
            runs = [(o, command(o, dest, value, tmp), env) for o in f["options"]]
            if value is not None and dest != "print_completion":
                pet = "PET_" + dest.upper()
                runs.append((pet, ["--no_python", "true"], dict(env, **{pet: value})))
            for name, args, run_env in runs:
                p = run(ddprun, args, run_env)
                ok = p.returncode != USAGE_EXIT and "unrecognized flag" not in p.stderr
                if dest == "print_completion":
                    ok = p.returncode == 0 and "complete" in p.stdout
                print(f"{'ok  ' if ok else 'FAIL'} {name} -> {p.returncode}", flush=True)
                if not ok:
                    problems.append(f"{' '.join(args)} -> exit {p.returncode}: {p.stderr.strip()[-300:]}")
    if problems:
        print("FAIL: torchrun flags ddprun does not take:\n  " + "\n  ".join(problems))
        return 1
    print(f"PASS: every flag of torchrun {parser['version']} accepted by ddprun")
    return 0


if __name__ == "__main__":
    sys.exit(main())
