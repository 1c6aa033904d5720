#!/usr/bin/env python3
"""What a worker is given: its environment, its entry point and interpreter, and the
torchrun 2.11 behaviours ddprun matches.

Run: test_environment.py <path to ddprun> [unittest names] (harness.py says more).
"""
import glob
import json
import os
import shutil
import subprocess
import sys
import tempfile
import unittest

import harness
from harness import PY, run, run_dir, worker, read_text


def unfrozen_runpy_python():
    """A Python whose `import runpy` searches sys.path (not frozen), or None."""
    pyenv = os.environ.get("PYENV_ROOT", os.path.expanduser("~/.pyenv"))
    older = sorted(glob.glob(os.path.join(glob.escape(pyenv), "versions", "3.*", "bin", "python3")), reverse=True)
    for candidate in [PY] + [shutil.which(f"python3.{minor}") for minor in (10, 9, 8)] + older:
        if not candidate:
            continue
        try:
            p = subprocess.run([candidate, "-I", "-c", "import runpy, sys; sys.stdout.write(str(runpy.__spec__.origin))"],
                               capture_output=True, text=True, timeout=60)
        except (OSError, subprocess.TimeoutExpired):
            continue
        if p.returncode == 0 and p.stdout.endswith(".py"):
            return candidate
    return None


class Environment(unittest.TestCase):
    def test_worker_environment(self):
        code = ("import json, os\n"
                "keys = ['RANK','LOCAL_RANK','GROUP_RANK','ROLE_RANK','ROLE_NAME','LOCAL_WORLD_SIZE',"
                "'WORLD_SIZE','GROUP_WORLD_SIZE','ROLE_WORLD_SIZE','MASTER_ADDR','MASTER_PORT',"
                "'TORCHELASTIC_RESTART_COUNT','TORCHELASTIC_MAX_RESTARTS','TORCHELASTIC_RUN_ID',"
                "'TORCHELASTIC_USE_AGENT_STORE','TORCHELASTIC_ERROR_FILE','TORCH_NCCL_ASYNC_ERROR_HANDLING',"
                "'NCCL_ASYNC_ERROR_HANDLING','OMP_NUM_THREADS','TORCHELASTIC_SIGNALS_TO_HANDLE',"
                "'NCCL_NVLS_ENABLE','FROM_PARENT']\n"
                "print('ENV', json.dumps({k: os.environ.get(k) for k in keys}), flush=True)\n")
        with tempfile.TemporaryDirectory() as d:
            p = run(["--nproc_per_node=3", "--max_restarts=2", "--rdzv_id=job7", "--role=trainer",
                     "--master_port=0", "--log_dir", d] + worker(code), env={"FROM_PARENT": "yes"})
            self.assertEqual(p.returncode, 0, p.stderr)
            envs = {}
            for line in p.stdout.splitlines():
                prefix, _, rest = line.partition(": ENV ")
                if rest:
                    envs[prefix] = json.loads(rest)
            self.assertEqual(sorted(envs), ["[r0]", "[r1]", "[r2]"])
            ports = set()
            for r in range(3):
                e = envs[f"[r{r}]"]
                expect = {"RANK": str(r), "LOCAL_RANK": str(r), "GROUP_RANK": "0", "ROLE_RANK": str(r),
                          "ROLE_NAME": "trainer", "LOCAL_WORLD_SIZE": "3", "WORLD_SIZE": "3",
                          "GROUP_WORLD_SIZE": "1", "ROLE_WORLD_SIZE": "3", "MASTER_ADDR": "127.0.0.1",
                          "TORCHELASTIC_RESTART_COUNT": "0", "TORCHELASTIC_MAX_RESTARTS": "2",
                          "TORCHELASTIC_RUN_ID": "job7", "TORCHELASTIC_USE_AGENT_STORE": "True",
                          "TORCH_NCCL_ASYNC_ERROR_HANDLING": "1", "NCCL_ASYNC_ERROR_HANDLING": None,
                          "OMP_NUM_THREADS": "1", "NCCL_NVLS_ENABLE": None,  # NCCL's default stays
                          "TORCHELASTIC_SIGNALS_TO_HANDLE": "SIGTERM,SIGINT,SIGHUP,SIGQUIT",
                          "FROM_PARENT": "yes"}
                for k, v in expect.items():
                    self.assertEqual(e[k], v, f"rank {r} {k}")
                self.assertEqual(e["TORCHELASTIC_ERROR_FILE"],
                                 os.path.join(run_dir(d, "job7"), "attempt_0", str(r), "error.json"))
                ports.add(e["MASTER_PORT"])
            self.assertEqual(len(ports), 1)
            self.assertNotEqual(ports.pop(), "0")

    def test_unless_set_variables_are_kept(self):
        p = run(["--nproc_per_node=2"] +
                worker("import os; print(os.environ['OMP_NUM_THREADS'], os.environ['NCCL_NVLS_ENABLE'])"),
                env={"OMP_NUM_THREADS": "7", "NCCL_NVLS_ENABLE": "1"})
        self.assertIn("[r0]: 7 1", p.stdout)

    def test_pet_environment_variables(self):
        p = run(worker("import os; print('ws', os.environ['WORLD_SIZE'], os.environ['TORCHELASTIC_RUN_ID'])"),
                env={"PET_NPROC_PER_NODE": "3", "PET_RDZV_ID": "pet"})
        self.assertEqual(p.returncode, 0, p.stderr)
        self.assertIn("[r2]: ws 3 pet", p.stdout)

    def test_py_entry_point_runs_under_python_exec(self):
        with tempfile.TemporaryDirectory() as d:
            script = os.path.join(d, "hello.py")
            with open(script, "w") as f:
                f.write("import sys; print('argv', sys.argv[1:], 'unbuffered', '-u' in sys.orig_argv)\n")
            p = run(["--nproc_per_node=1", script, "--x", "1"], env={"PYTHON_EXEC": PY})
            self.assertEqual(p.returncode, 0, p.stderr)
            self.assertIn("[r0]: argv ['--x', '1'] unbuffered True", p.stdout)

    def test_a_python_shim_on_path_is_resolved_once(self):
        # pyenv puts a shell-script shim first on PATH; every start through it costs a shell and
        # pyenv's lookup. ddprun asks the shim once which interpreter it runs and execs that.
        with tempfile.TemporaryDirectory() as d:
            shims = os.path.join(d, "shims")
            os.mkdir(shims)
            calls = os.path.join(d, "calls")
            with open(os.path.join(shims, "python3"), "w") as f:
                f.write(f"#!/bin/sh\necho called >> {calls}\nexec {os.path.realpath(PY)} \"$@\"\n")
            os.chmod(os.path.join(shims, "python3"), 0o755)
            script = os.path.join(d, "where.py")
            with open(script, "w") as f:
                f.write("import sys; print('exe', sys.executable)\n")
            env = {k: v for k, v in os.environ.items() if k not in ("PYTHON_EXEC", "DDPRUN_DEFAULT_PYTHON")}
            env["PATH"] = shims + os.pathsep + env.get("PATH", "")
            p = subprocess.run([harness.DDPRUN, "--nproc_per_node=3", script], capture_output=True, text=True,
                               env=env, timeout=harness.HANG_GUARD)
            self.assertEqual(p.returncode, 0, p.stderr)
            with open(calls) as f:
                self.assertEqual(f.read().count("called"), 1, "the shim runs once, to say where Python is")
            self.assertIn(f"Python workers: {os.path.realpath(PY)}", p.stderr)
            self.assertIn(f"through the shim {os.path.join(shims, 'python3')}", p.stderr)
            self.assertEqual(p.stdout.count(f"exe {os.path.realpath(PY)}"), 3, p.stdout)

    def test_run_path_entry_point(self):
        with tempfile.TemporaryDirectory() as d:
            script = os.path.join(d, "job")  # no .py: --run_path still runs it as Python
            with open(script, "w") as f:
                f.write("import sys; print('run_path', __name__, sys.argv)\n")
            p = run(["--run_path", script, "b"], env={"PYTHON_EXEC": PY})
            self.assertEqual(p.returncode, 0, p.stderr)
            self.assertIn(f"[r0]: run_path __main__ ['{script}', 'b']", p.stdout)

    def test_run_path_takes_runpy_from_python_not_the_working_directory(self):
        # Python 3.11+ imports its frozen runpy before looking at sys.path: an older Python (or
        # one with frozen modules off) finds a runpy.py in the working directory first.
        python = unfrozen_runpy_python()
        if python is None:
            self.skipTest("no Python here whose runpy is imported from sys.path (3.10 or older)")
        with tempfile.TemporaryDirectory() as d:
            script = os.path.join(d, "job")
            with open(script, "w") as f:
                f.write("import sys; print('run_path ran', sys.path[0] == '')\n")
            shared = os.path.join(d, "shared")
            os.mkdir(shared)
            marker = os.path.join(d, "runpy-ran")
            with open(os.path.join(shared, "runpy.py"), "w") as f:
                f.write(f"open({marker!r}, 'w').close()\n")
            p = run(["--run_path", script], env={"PYTHON_EXEC": python}, cwd=shared)
            self.assertEqual(p.returncode, 0, p.stderr)
            self.assertFalse(os.path.exists(marker), f"the runpy.py of the working directory ran ({python})")
            # The script itself sees the path as before (the working directory first).
            self.assertIn("[r0]: run_path ran True", p.stdout)

    def test_module_entry_point(self):
        with tempfile.TemporaryDirectory() as d:
            os.makedirs(os.path.join(d, "pkg"))
            open(os.path.join(d, "pkg", "__init__.py"), "w").close()
            with open(os.path.join(d, "pkg", "job.py"), "w") as f:
                f.write("import sys; print('module', __name__, sys.argv[1:])\n")
            p = run(["-m", "pkg.job", "a"], env={"PYTHON_EXEC": PY, "PYTHONPATH": d})
            self.assertEqual(p.returncode, 0, p.stderr)
            self.assertIn("[r0]: module __main__ ['a']", p.stdout)


def fake_gpu_machine(root, gpus):
    """A fake /proc + /sys under `root` for --numa-binding (DDPRUN_SYSFS_ROOT): `gpus` is a list of
    (pci address, numa node); node N's cpulist is nodes[N]."""
    def write(rel, text):
        os.makedirs(os.path.dirname(os.path.join(root, rel)), exist_ok=True)
        with open(os.path.join(root, rel), "w") as f:
            f.write(text)
    for pci, node, cpus in gpus:
        write(f"proc/driver/nvidia/gpus/{pci}/information", f"Model: \t\t NVIDIA H200\nGPU UUID: \t GPU-{pci}\n")
        write(f"sys/bus/pci/devices/{pci}/numa_node", f"{node}\n")
        write(f"sys/devices/system/node/node{node}/cpulist", ",".join(map(str, cpus)) + "\n")


class Parity(unittest.TestCase):
    """torchrun 2.11's behaviour, matched."""

    def test_non_executable_script_without_py_runs_with_python(self):
        with tempfile.TemporaryDirectory() as d:
            script = os.path.join(d, "job")
            with open(script, "w") as f:
                f.write("import sys; print('python ran', sys.argv[1:])\n")
            os.chmod(script, 0o644)
            p = run(["--nproc_per_node=1", script, "a"], env={"PYTHON_EXEC": PY})
            self.assertEqual(p.returncode, 0, p.stderr)
            self.assertIn("[r0]: python ran ['a']", p.stdout)
            # The start line says which interpreter (path and version).
            version = "%d.%d" % sys.version_info[:2]
            self.assertIn(f"Python workers: {PY} (Python {version}", p.stderr)

    def test_programs_say_no_interpreter(self):
        p = run(["--no_python", "true"])
        self.assertEqual(p.returncode, 0, p.stderr)
        self.assertNotIn("Python workers", p.stderr)

    def test_directory_and_non_executable_with_no_python_say_what_they_are(self):
        with tempfile.TemporaryDirectory() as d:
            script = os.path.join(d, "job")
            open(script, "w").close()
            os.chmod(script, 0o644)
            for args, words in (([d], ["is a directory without __main__.py"]),
                                (["--no_python", d], ["is a directory"]),
                                (["--no_python", script], ["exists but is not executable", "chmod +x"])):
                p = run(args)
                self.assertEqual(p.returncode, 2, p.stderr)
                self.assertNotIn("cannot find", p.stderr)
                for w in words:
                    self.assertIn(w, p.stderr)

    def test_missing_module_says_how_to_pick_another_python(self):
        p = run(worker("import ddprun_no_such_module_xyz"))
        self.assertNotEqual(p.returncode, 0)
        self.assertNotIn("PYTHON_EXEC", p.stderr)  # --no_python: ddprun did not pick the interpreter
        with tempfile.TemporaryDirectory() as d:
            script = os.path.join(d, "imp.py")
            with open(script, "w") as f:
                f.write("import ddprun_no_such_module_xyz\n")
            p = run([script], env={"PYTHON_EXEC": PY})
            self.assertEqual(p.returncode, 1, p.stderr)
            summary = p.stderr[p.stderr.index("FAILED"):]
            self.assertIn("No module named", summary)
            self.assertIn("PYTHON_EXEC", summary)
            self.assertIn(PY, summary)

    def test_second_run_with_the_same_log_dir_keeps_the_first(self):
        import glob
        with tempfile.TemporaryDirectory() as d:
            for n in range(2):
                p = run(["--log_dir", d, "--tee=1"] + worker(f"print('run {n}')"))
                self.assertEqual(p.returncode, 0, p.stderr)
            runs = sorted(glob.glob(os.path.join(d, "none_*")))
            self.assertEqual(len(runs), 2, runs)
            texts = sorted(read_text(os.path.join(r, "attempt_0", "0", "stdout.log")) for r in runs)
            self.assertEqual(texts, ["run 0\n", "run 1\n"])

    def test_duplicate_filters_copy_matching_teed_lines(self):
        code = ("import os, sys\n"
                "r = os.environ['RANK']\n"
                "print('apple', r); print('pear', r); print('or,ange', r)\n"
                "print('apple err', r, file=sys.stderr)\n")
        with tempfile.TemporaryDirectory() as d:
            # Rank 2 is tee'd but hidden by --local_ranks_filter: not copied, as in torchrun.
            p = run(["--nproc_per_node=3", "--log_dir", d, "--rdzv_id=f", "--tee=1", "--local_ranks_filter=0,1",
                     "--duplicate-stdout-filters", "apple,or,,ange", "--duplicate_stderr_filters=apple"] + worker(code))
            self.assertEqual(p.returncode, 0, p.stderr)
            attempt = os.path.join(run_dir(d, "f"), "attempt_0")
            got = sorted(read_text(os.path.join(attempt, "filtered_stdout.log")).splitlines())
            self.assertEqual(got, ["[r0]: apple 0", "[r0]: or,ange 0", "[r1]: apple 1", "[r1]: or,ange 1"])
            # stderr was not tee'd: nothing copied; the file exists (empty), as torchrun makes it.
            self.assertEqual(read_text(os.path.join(attempt, "filtered_stderr.log")), "")

    def test_logs_specs_and_event_log_handler_are_accepted(self):
        p = run(["--logs-specs=custom", "--event_log_handler=console"] + worker("print('ran')"))
        self.assertEqual(p.returncode, 0, p.stderr)
        self.assertIn("[r0]: ran", p.stdout)
        self.assertIn("--logs_specs=custom", p.stderr)
        self.assertIn("--event_log_handler=console", p.stderr)

    def test_numa_binding_binds_each_rank_to_its_gpus_node(self):
        allowed = sorted(os.sched_getaffinity(0))
        a, b = allowed[0], allowed[-1]
        code = "import os; print('cpus', sorted(os.sched_getaffinity(0)))"
        with tempfile.TemporaryDirectory() as root:
            # Listed out of PCI order: local rank 0 is the lower address (node 1 here).
            fake_gpu_machine(root, [("0000:c1:00.0", 0, [a]), ("0000:18:00.0", 1, [b])])
            p = run(["--nproc_per_node=2", "--numa-binding=node"] + worker(code), env={"DDPRUN_SYSFS_ROOT": root})
            self.assertEqual(p.returncode, 0, p.stderr)
            self.assertIn(f"[r0]: cpus [{b}]", p.stdout)
            self.assertIn(f"[r1]: cpus [{a}]", p.stdout)
            # CUDA_VISIBLE_DEVICES picks and orders the GPUs.
            p = run(["--nproc_per_node=1", "--numa_binding=node"] + worker(code),
                    env={"DDPRUN_SYSFS_ROOT": root, "CUDA_VISIBLE_DEVICES": "1"})
            self.assertEqual(p.returncode, 0, p.stderr)
            self.assertIn(f"[r0]: cpus [{a}]", p.stdout)

    def test_numa_binding_without_gpus_fails_before_any_worker(self):
        with tempfile.TemporaryDirectory() as root:
            marker = os.path.join(root, "started")
            p = run(["--numa-binding=node", "--no_python", "touch", marker], env={"DDPRUN_SYSFS_ROOT": root})
            self.assertEqual(p.returncode, 1, p.stderr)
            self.assertIn("no NVIDIA GPU visible", p.stderr)
            self.assertIn("drop --numa-binding", p.stderr)
            self.assertFalse(os.path.exists(marker))


if __name__ == "__main__":
    harness.main()
