#!/usr/bin/env bash
# On a GPU machine: what ddprun shows of a GPU job while it runs and after. Runs
#   1. `ddprun doctor` for a one-GPU launch (text and --json);
#   2. `train` on the GPU under `ddprun --metrics_port=0`: `ddprun status` (table and --json)
#      and a scrape of the metrics while it trains, then the end-of-run table;
#   3. a PyTorch script (matmuls on the GPU) the same way;
#   4. a PyTorch script that leaves the GPU mostly idle (sleeps between small kernels): the
#      end-of-run table's low-utilisation warning.
# From a bundle made here with scripts/bench/bundle_bin.sh BUILD OUT/bin:
#   PY=python3 scripts/bench/gpu_observe.sh OUT/bin RESULTS_DIR
set -uo pipefail
bin="$(cd "${1:?bundle dir}" && pwd)"; out="${2:?results dir}"
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
mkdir -p "$out"; out="$(cd "$out" && pwd)"
PY="${PY:-python3}"
. "$here/device_env.sh" "$bin"
export PATH="$bin:$PATH" PYTHON_EXEC="$(command -v "$PY")"
export XDG_RUNTIME_DIR="$(mktemp -d)"; chmod 700 "$XDG_RUNTIME_DIR"
work="$(mktemp -d)"

section() { echo; echo "===== $*"; }

section "machine"
nvidia-smi --query-gpu=index,name,driver_version,memory.total,compute_mode --format=csv 2>&1
"$PY" -c 'import torch; print("torch", torch.__version__, "cuda", torch.version.cuda, "nccl", torch.cuda.nccl.version())'

section "ddprun doctor --nproc_per_node=1 (a PyTorch script)"
cat > "$work/noop.py" <<'PYEOF'
import torch
print(torch.cuda.is_available())
PYEOF
ddprun doctor --nproc_per_node=1 "$work/noop.py"; echo "exit $?"
section "ddprun doctor --json --nproc_per_node=2 (more workers than GPUs)"
ddprun doctor --json --nproc_per_node=2 "$work/noop.py"; echo "exit $?"

# Runs a job in the background, looks at it with `ddprun status` and a metrics scrape while it
# runs, then shows its end.
observe() {
  local name="$1" look_after="$2"; shift 2
  section "$name: ddprun --metrics_port=0 $*"
  ddprun --metrics_port=0 --rdzv_id="$name" "$@" > "$work/$name.out" 2> "$work/$name.err" &
  local pid=$!
  sleep "$look_after"
  echo "--- ddprun status (while it runs)"
  ddprun status --rdzv_id="$name"
  echo "--- ddprun status --json"
  ddprun status --json --rdzv_id="$name"
  local url; url="$(grep -o 'http://[^ ]*/metrics' "$work/$name.err" | head -1)"
  echo "--- metrics ($url), worker series"
  [[ -n "$url" ]] && "$PY" -c 'import sys, urllib.request; print(urllib.request.urlopen(sys.argv[1]).read().decode())' "$url" | grep -E '^ddprun_(worker_|workers|attempt)' | grep -v '^#'
  wait "$pid"; echo "--- exit $?"
  echo "--- ddprun's lines (stderr)"; grep -E '^\[ddprun\]|^    ' "$work/$name.err"
  echo "--- last lines of the workers' stdout"; tail -3 "$work/$name.out"
}

observe train_gpu 12 --nproc_per_node=1 "$bin/train" --device cuda --width 4096 --depth 4 --batch 512 \
  --samples 200000 --epochs 20 --max-steps 3000 --log-every 500

cat > "$work/matmul.py" <<'PYEOF'
import time, torch
x = torch.randn(8192, 8192, device="cuda")
end = time.time() + 25
n = 0
while time.time() < end:
    for _ in range(20):
        x = torch.tanh(x @ x) * 0.5
    torch.cuda.synchronize()
    n += 20
print("matmuls", n, flush=True)
PYEOF
observe torch_busy 12 --nproc_per_node=1 "$work/matmul.py"

cat > "$work/idle.py" <<'PYEOF'
import time, torch
x = torch.randn(1024, 1024, device="cuda")
end = time.time() + 15
while time.time() < end:
    x = torch.tanh(x @ x)
    torch.cuda.synchronize()
    time.sleep(0.05)
print("done", flush=True)
PYEOF
observe torch_idle 8 --nproc_per_node=1 "$work/idle.py"
rm -rf "$work" "$XDG_RUNTIME_DIR"
