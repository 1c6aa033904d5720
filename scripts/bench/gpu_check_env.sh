# Sourced by the GPU check scripts (check_preempt_gpu.sh, check_worker_resume_gpu.sh,
# profile_train_gpu.sh) after `set -euo pipefail`, with the bin dir as $1 (default: the build
# folder). Sets here (the repository), bin, train and ddprun (a bundle's flat layout from
# scripts/bench/bundle_bin.sh, or a build tree's), GPU_MODEL (the bf16 model the checks train)
# and defines port (a random port for --master_port, from benchlib.sh) and checksum (LOG -> its
# last final_param_checksum=...).
here="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
bin="${1:-$here/build}"
. "$here/scripts/bench/benchlib.sh"  # first, port
train="$(first "$bin/train" "$bin/worker_runtime/train")"
ddprun="$(first "$bin/ddprun" "$bin/launcher/ddprun")"
GPU_MODEL=(--device cuda --precision bf16 --width 1024 --depth 4 --batch 256 --samples 25600 --epochs 2 --momentum 0.9)
checksum() { grep -o 'final_param_checksum=[0-9a-f]*' "$1" | tail -1; }
