#!/usr/bin/env bash
# Preemption on a GPU: `ddprun --nproc_per_node=1 train --device cuda` (bf16, momentum) held after
# step 25 until SIGUSR1 reaches ddprun (as Slurm's --signal=USR1 or scancel --signal=USR1 does):
# the ranks agree on a step (every 10 on the GPU: step 30), rank 0 writes that step's checkpoint,
# ddprun exits 99 (preempted); the rerun resumes from step 30 and must end with the same
# final_param_checksum as an uninterrupted run. Also: --stop-check-every 0 keeps the signal's
# default action (the process dies), and the uninterrupted run's speed with and without the
# agreement (avg_step_ms), to see what the every-10-steps host wait costs.
#   usage: scripts/bench/check_preempt_gpu.sh [bin-dir with train and ddprun]
set -euo pipefail
. "$(dirname "${BASH_SOURCE[0]}")/gpu_check_env.sh"
tmp="$(mktemp -d /tmp/ddprun-gpupreempt-XXXXXX)"
common=("${GPU_MODEL[@]}")
"$ddprun" --nproc_per_node=1 --master_port="$(port)" "$train" "${common[@]}" >"$tmp/clean.log" 2>&1
"$ddprun" --nproc_per_node=1 --master_port="$(port)" "$train" "${common[@]}" --stop-check-every 0 >"$tmp/nocheck.log" 2>&1
"$ddprun" --nproc_per_node=1 --max_restarts=3 --master_port="$(port)" "$train" "${common[@]}" \
  --checkpoint-dir "$tmp/ck" --checkpoint-every 1000 --wait-for-signal-at-step 25 >"$tmp/pre.log" 2>&1 &
pid=$!
for _ in $(seq 600); do grep -q "waiting for a stop signal" "$tmp/pre.log" && break; sleep 0.1; done
kill -USR1 "$pid"
rc=0; wait "$pid" || rc=$?
"$ddprun" --nproc_per_node=1 --max_restarts=3 --master_port="$(port)" "$train" "${common[@]}" \
  --checkpoint-dir "$tmp/ck" --checkpoint-every 1000 >"$tmp/resume.log" 2>&1
want="$(checksum "$tmp/clean.log")"
got="$(checksum "$tmp/resume.log")"
grep -hE "stopping after|checkpoint of step|PREEMPTED|resumed from" "$tmp/pre.log" "$tmp/resume.log" | head -8
echo "preempted run: exit $rc (want 99)"
echo "avg_step_ms, agreement every 10 steps: $(grep -o 'avg_step_ms=[0-9.]*' "$tmp/clean.log")  none: $(grep -o 'avg_step_ms=[0-9.]*' "$tmp/nocheck.log")"
echo "uninterrupted: $want"
echo "resumed:       $got"
ok=1
[[ "$rc" == 99 ]] || ok=0
grep -q "stopping after step 30 for a preemption" "$tmp/pre.log" || ok=0
grep -q "resumed from step 30" "$tmp/resume.log" || ok=0
[[ -n "$want" && "$got" == "$want" ]] || ok=0
if [[ $ok == 1 ]]; then echo "OK: preempted at step 30 on the GPU, resumed bit-identically"; else echo "FAILED"; tail -20 "$tmp/pre.log"; exit 1; fi
