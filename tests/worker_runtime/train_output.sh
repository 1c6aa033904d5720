#!/usr/bin/env bash
# What `train` prints by default, as a PyTorch training script would: loss and throughput, no
# profiling lines or internals; --profile adds the per-phase timings and the run's internals.
#   usage: train_output.sh <train>
set -uo pipefail
train="$1"
small=(--width 16 --depth 1 --samples 80 --batch 10 --epochs 2 --device cpu)
fail=0
run() { env -u RANK -u WORLD_SIZE DDPRUN_DEVICE= "$train" "${small[@]}" "$@" 2>&1; }
out="$(run)" || { echo "FAIL: train exited $?"; echo "$out"; exit 1; }
for want in "loss " "samples/s"; do
  [[ "$out" == *"$want"* ]] || { echo "FAIL: no '$want' by default"; fail=1; }
done
for internal in phase_ms preempted_per_step blocked_per_step "state=" blas_core avg_comm_wait_ms; do
  [[ "$out" != *"$internal"* ]] || { echo "FAIL: '$internal' printed without --profile"; fail=1; }
done
prof="$(run --profile)" || { echo "FAIL: train --profile exited $?"; echo "$prof"; exit 1; }
for want in phase_ms "state=" blas_core avg_comm_wait_ms; do
  [[ "$prof" == *"$want"* ]] || { echo "FAIL: no '$want' with --profile"; fail=1; }
done
[[ "$fail" == 0 ]] || { echo "--- default:"; echo "$out"; echo "--- --profile:"; echo "$prof"; }
exit "$fail"
