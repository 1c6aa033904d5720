#!/usr/bin/env bash
# Elastic resume on a GPU: `ddprun --nproc_per_node=1 --max_restarts=3 train --device cuda`
# (bf16, momentum) with the worker SIGKILLed before steps 45 and 130 must end with the same
# final_param_checksum as an uninterrupted run (cuBLAS GEMMs and our kernels are deterministic).
#   usage: scripts/bench/check_worker_resume_gpu.sh [bin-dir with train and ddprun]
set -euo pipefail
. "$(dirname "${BASH_SOURCE[0]}")/gpu_check_env.sh"
tmp="$(mktemp -d /tmp/ddprun-gpuresume-XXXXXX)"
common=("${GPU_MODEL[@]}")
"$ddprun" --nproc_per_node=1 --master_port="$(port)" "$train" "${common[@]}" >"$tmp/clean.log" 2>&1
"$ddprun" --nproc_per_node=1 --max_restarts=3 --master_port="$(port)" "$train" "${common[@]}" \
  --checkpoint-dir "$tmp/ck" --checkpoint-every 30 --fail-at-step 45,130 --fail-rank 0 >"$tmp/elastic.log" 2>&1 || true
want="$(checksum "$tmp/clean.log")"
got="$(checksum "$tmp/elastic.log")"
grep -E "injected|resumed|restart" "$tmp/elastic.log" | head -8
echo "uninterrupted: $want"
echo "elastic:       $got"
[[ -n "$want" && "$got" == "$want" ]] && echo "OK: bit-identical on GPU after two SIGKILLs" || { echo "MISMATCH"; tail -20 "$tmp/elastic.log"; exit 1; }
