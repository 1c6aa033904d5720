"""Tensor collectives of ddprun::worker::libtorch (collectives.h) against PyTorch's
torch.distributed (gloo) from the same torch build, 2 ranks under ddprun each:

  tensor_collectives_test.py --ddprun <ddprun> --tool <ddprun-torch-collectives> --python <venv python>

Every case's result must be equal bit for bit on every rank (inputs from the same seeds through
the same generator); misuse cases must be refused with a message that names the problem."""
import argparse
import re
import subprocess
import sys
import os

HERE = os.path.dirname(os.path.abspath(__file__))
TIMEOUT = 180


def run(cmd, shm):
    env = dict(os.environ, DDPRUN_SHM="1" if shm else "0")
    print("$", " ".join(cmd), f"(DDPRUN_SHM={env['DDPRUN_SHM']})", flush=True)
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=TIMEOUT, env=env)
    if p.returncode != 0:
        print(p.stdout, p.stderr, sep="\n")
        sys.exit(f"FAILED: exit code {p.returncode}")
    return p.stdout


def cases(out):
    got = {}
    for line in out.splitlines():
        m = re.match(r"\[r(\d+)\]: case (\S+) (\S+) ([0-9a-f]+)$", line)
        if m:
            got[(int(m.group(1)), m.group(2))] = (m.group(3), m.group(4))
    return got


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--ddprun", required=True)
    ap.add_argument("--tool", required=True)
    ap.add_argument("--python", required=True)
    a = ap.parse_args()
    base = [a.ddprun, "--standalone", "--nproc_per_node=2"]
    ref_out = run(base + ["--no_python", a.python, os.path.join(HERE, "tensor_collectives_ref.py")], shm=False)
    ref = cases(ref_out)
    if len(ref) != 22:
        print(ref_out)
        sys.exit(f"FAILED: expected 11 cases x 2 ranks from the reference, got {len(ref)}")
    failures = []
    for shm in (True, False):
        out = run(base + ["--no_python", a.tool], shm=shm)
        ours = cases(out)
        for key, (dtype, hexval) in sorted(ref.items()):
            mine = ours.get(key)
            if mine != (dtype, hexval):
                failures.append(f"shm={shm} rank {key[0]} {key[1]}: ours {mine} vs torch.distributed {(dtype, hexval)}")
        expect = {
            "dtype": "dtype Bool is not supported",
            "list_length": "tensor_list has 1 tensors, expected one per rank (2)",
            "output_size": "the output has 3 elements, expected world size x input = 2 x 2",
            "src": "src 2 is not a rank (world size 2)",
        }
        for name, text in expect.items():
            for r in range(2):
                line = next((l for l in out.splitlines() if l.startswith(f"[r{r}]: misuse {name} ")), "")
                if text not in line:
                    failures.append(f"shm={shm} rank {r} misuse {name}: expected {text!r} in {line!r}")
    if failures:
        print("\n".join(failures))
        sys.exit(f"FAILED: {len(failures)} differences")
    print(f"ok: {len(ref) // 2} cases bit-identical to torch.distributed on both ranks, with and without "
          "the shared-memory path; 4 misuse cases refused with their reason")


if __name__ == "__main__":
    main()
