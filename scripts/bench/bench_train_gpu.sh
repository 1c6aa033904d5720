#!/usr/bin/env bash
# GPU benchmark on one GPU: ddprun's `train` (cuBLAS + NCCL) vs PyTorch DDP (torch 2.x, NCCL,
# bf16 autocast, SGD) on the same MLP, batch and precision:
#   8192-wide x 5 hidden (335.6 M params) at batch 512, and 4096-wide x 6 (100.7 M) at 1024.
# Also a 1-rank NCCL run of the default model (train without --width/--depth) under ddprun and an fp16 (loss scaling) run.
#   usage: scripts/bench/bench_train_gpu.sh [bin-dir with train and ddprun]   (env STEPS=50 PY=python3)
set -uo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
bin="${1:-$here/build}"
. "$here/scripts/bench/benchlib.sh"  # first, port
train="$(first "$bin/train" "$bin/worker_runtime/train")"
ddprun="$(first "$bin/ddprun" "$bin/launcher/ddprun")"
PY="${PY:-python3}"; STEPS="${STEPS:-50}"; WARMUP=10
tmp="$(mktemp -d /tmp/ddprun-gpubench-XXXXXX)"

echo "== 1-rank NCCL run of the default model under ddprun"
"$ddprun" --nproc_per_node=1 --master_port="$(port)" "$train" --device cuda 2>&1 | tail -8
echo "== fp16 with dynamic loss scaling (1024x4, batch 256)"
"$train" --device cuda --precision fp16 --width 1024 --depth 4 --batch 256 --samples 25600 --epochs 2 2>&1 | tail -5
echo "== bf16 vs fp32 loss sanity (1024x4, batch 256)"
for p in fp32 bf16; do "$train" --device cuda --precision $p --width 1024 --depth 4 --batch 256 --samples 25600 --epochs 2 2>&1 | grep "epoch 1 done"; done

ours() {  # width depth batch precision
  "$ddprun" --nproc_per_node=1 --master_port="$(port)" "$train" --device cuda --width "$1" --depth "$2" --batch "$3" \
    --precision "$4" --samples $(( $3 * (STEPS + WARMUP) )) --epochs 1 --warmup-steps $WARMUP >"$tmp/o.log" 2>&1
  grep -q avg_step_ms "$tmp/o.log" || cat "$tmp/o.log" >&2
  grep -o 'avg_step_ms=[0-9.]*' "$tmp/o.log" | tail -1 | cut -d= -f2
}
theirs() {
  "$PY" -m torch.distributed.run --nproc_per_node=1 --master_port="$(port)" "$here/scripts/bench/bench_worker_ddp.py" \
    --device cuda --width "$1" --depth "$2" --batch "$3" --precision "$4" --steps "$STEPS" --warmup $WARMUP >"$tmp/t.log" 2>&1
  grep -q avg_step_ms "$tmp/t.log" || tail -20 "$tmp/t.log" >&2
  grep -o 'avg_step_ms=[0-9.]*' "$tmp/t.log" | tail -1 | cut -d= -f2
}
echo "== benchmark (ms/step, $STEPS timed steps after $WARMUP warm-up)"
printf "%-22s %10s %10s %8s\n" "model" "ddprun" "torch DDP" "ratio"
for cfg in "8192 5 512 bf16" "4096 6 1024 bf16" "8192 5 512 fp16" "4096 6 1024 fp32"; do
  set -- $cfg
  o="$(ours "$@")"; t="$(theirs "$@")"
  r="$("$PY" -c "print(f'{float(\"$o\")/float(\"$t\"):.3f}')" 2>/dev/null || echo "?")"
  printf "%-22s %10s %10s %8s\n" "${1}x${2} b${3} ${4}" "$o" "$t" "$r"
done
"$PY" -c "import torch; print('torch', torch.__version__, torch.cuda.get_device_name())" 2>/dev/null
