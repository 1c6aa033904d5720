#!/usr/bin/env python3
"""The end-of-run GPU usage (--gpu_util_warn, on by default) keeps NVML off the launch and exit
path: a job shorter than one sampling interval never loads it; a longer one loads it once, on
the recorder's thread. NVML is the stand-in tests/launcher/fake_nvml, which counts its inits.

Run: test_gpu_usage.py <path to ddprun> [unittest names] (harness.py says more).
"""
import os
import tempfile
import unittest

import harness
from harness import run, worker


class NvmlOffLaunchPath(unittest.TestCase):
    def inits(self, args):
        fake = os.environ.get("DDPRUN_TEST_FAKE_NVML_DIR") or os.path.join(
            os.path.dirname(os.path.dirname(harness.DDPRUN)), "tests", "launcher", "fake_nvml")
        self.assertTrue(os.path.exists(os.path.join(fake, "libnvidia-ml.so.1")), f"build fake_nvml first: {fake}")
        with tempfile.TemporaryDirectory() as d:
            log = os.path.join(d, "inits")
            p = run(args, env={"LD_LIBRARY_PATH": fake, "DDPRUN_FAKE_NVML_INITS": log})
            self.assertEqual(p.returncode, 0, p.stderr)
            return open(log).read().count("init") if os.path.exists(log) else 0

    def test_a_short_cpu_job_never_loads_nvml(self):
        self.assertEqual(self.inits(["--nproc_per_node=2", "--no_python", "true"]), 0)

    def test_a_job_past_one_sample_loads_it_once(self):
        # The control: the stand-in is found and counted (a sample every 2 s).
        self.assertEqual(self.inits(["--nproc_per_node=2"] + worker("import time; time.sleep(3)")), 1)


if __name__ == "__main__":
    harness.main()
