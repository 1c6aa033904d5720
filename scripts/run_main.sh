#!/usr/bin/env bash
# The main job: installs what is missing, builds, and runs a 2-process data-parallel training
# run on this machine under ddprun: the C++ `train` example (Gloo on CPU, NCCL on GPUs) when
# it is built, and the seed's PyTorch DDP script (gloo, Debian's PyTorch) as well.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
build="${DDPRUN_BUILD_DIR:-$here/build}"
"$here/scripts/setup_deps.sh"
"$here/scripts/build.sh"
ddprun="$build/launcher/ddprun"
train="$(find "$build/worker_runtime" -maxdepth 3 -type f -name train -perm -u+x 2>/dev/null | head -n1 || true)"
if [[ -n "$train" ]]; then
  echo "== ddprun --nproc_per_node=2 train"
  "$ddprun" --nproc_per_node=2 --master_port=0 "$train" "$@"
fi
echo "== ddprun --nproc_per_node=2 tests/launcher/train_ddp.py (PyTorch $(/usr/bin/python3 -c 'import torch; print(torch.__version__)'), gloo)"
PYTHON_EXEC=/usr/bin/python3 "$ddprun" --nproc_per_node=2 --master_port=0 "$here/tests/launcher/train_ddp.py"
