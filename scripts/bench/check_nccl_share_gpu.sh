#!/usr/bin/env bash
# On a GPU machine: the end-of-run table of an NCCL job shows the all-reduce share of the step
# and how much of it was hidden behind backward (device time of the gradient collectives, from
# timing events on the communication stream), as numbers, not "-". `train` on one GPU with the
# collective forced (as PyTorch's DDP runs it at world size 1), a small and a large model; then
# train's own per-phase GPU profile of the large one (DDPRUN_TRAIN_PROFILE=1) for comparison.
#   scripts/bench/check_nccl_share_gpu.sh BIN_DIR   (after . scripts/bench/device_env.sh BIN_DIR)
set -euo pipefail
. "$(dirname "${BASH_SOURCE[0]}")/gpu_check_env.sh"
work="$(mktemp -d)"
fail=0
share_row() {  # LOG -> the r0 row of the end-of-run table, after its header
  awk '/resource use of attempt/ {t=1} t && /all-reduce\/step/ {print; next} t && $1 == "r0" {print; exit}' "$1"
}
for cfg in "1024 4 256" "8192 5 512"; do
  set -- $cfg
  log="$work/train-$1.log"
  "$ddprun" --nproc_per_node=1 --master_port="$(port)" "$train" --device cuda --precision bf16 --width "$1" \
    --depth "$2" --batch "$3" --samples $(( $3 * 300 )) --epochs 1 --force-collective > "$log" 2>&1 || {
    echo "FAIL: train ${1}x$2 exited $?"; tail -20 "$log"; fail=1; continue; }
  echo "== train ${1}x$2 batch $3 (bf16, NCCL, 1 rank, collective forced), ddprun's table:"
  share_row "$log"
  row="$(share_row "$log" | tail -1)"
  # The last two columns: all-reduce/step and hidden, both percentages.
  if ! awk '{exit !($(NF-1) ~ /^<?[0-9.]+%$/ && $NF ~ /^<?[0-9.]+%$/)}' <<<"$row"; then
    echo "FAIL: no all-reduce share or hidden figure in: $row"; fail=1
  fi
done
echo "== train's own GPU profile of the 8192x5 model (ms per step by phase)"
DDPRUN_TRAIN_PROFILE=1 "$ddprun" --nproc_per_node=1 --master_port="$(port)" "$train" --device cuda --precision bf16 \
  --width 8192 --depth 5 --batch 512 --samples $(( 512 * 50 )) --epochs 1 --warmup-steps 10 --force-collective 2>&1 |
  grep -E 'profile|avg_step_ms' || true
rm -rf "$work"
[[ $fail == 0 ]] && echo "PASS: the NCCL job's table shows the all-reduce share and the hidden part"
exit $fail
