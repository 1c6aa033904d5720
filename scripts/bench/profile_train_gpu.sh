#!/usr/bin/env bash
# Per-phase GPU profile of `train` on one GPU (DDPRUN_TRAIN_PROFILE=1: cudaEvents between the
# phases of each step, see PhaseProfile in worker_runtime/tools/train_gpu.cu), collective
# forced as PyTorch's DDP does at world size 1; with fp32 and bf16 gradients for bf16 models.
#   usage: scripts/bench/profile_train_gpu.sh BIN_DIR [STEPS]    (on the GPU machine, after
#          . scripts/bench/device_env.sh BIN_DIR)
set -uo pipefail
: "${1:?bin dir with train and ddprun}"
. "$(dirname "${BASH_SOURCE[0]}")/gpu_check_env.sh"
steps="${2:-40}"; warm=10
cfgs=("8192 5 512 bf16 fp32" "8192 5 512 bf16 bf16" "4096 6 1024 bf16 fp32" "4096 6 1024 bf16 bf16"
      "8192 5 512 fp16 fp32" "4096 6 1024 fp32 fp32")
[[ -n "${CONFIGS:-}" ]] && IFS=, read -ra cfgs <<<"$CONFIGS"   # e.g. CONFIGS="8192 5 512 bf16 fp32,..."
for cfg in "${cfgs[@]}"; do
  set -- $cfg
  for prof in ${PROFILE:-1}; do   # PROFILE="0 1": also the unprofiled step
    echo "== ${1}x${2} b${3} ${4}, grads $5, forced, profile=$prof"
    DDPRUN_TRAIN_PROFILE=$prof "$ddprun" --nproc_per_node=1 --master_port="$(port)" "$train" --device cuda \
      --width "$1" --depth "$2" --batch "$3" --precision "$4" --grad-dtype "$5" --force-collective \
      --samples $(( $3 * (steps + warm) )) --epochs 1 --warmup-steps $warm 2>&1 | grep -E 'profile|avg_step_ms|rror'
  done
done
