#!/usr/bin/env bash
# Elastic resume on a GPU: `ddprun --nproc_per_node=1 --max_restarts=3 train --device cuda`
# (bf16, momentum) with the worker SIGKILLed before steps 45 and 130 must end with the same
# final_param_checksum as an uninterrupted run (cuBLAS GEMMs and our kernels are deterministic).
#   usage: scripts/bench/check_worker_resume_gpu.sh [bin-dir with train and ddprun]
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
bin="${1:-$here/build}"
first() { for f in "$@"; do [[ -x "$f" ]] && { echo "$f"; return; }; done; echo "$1"; }
train="$(first "$bin/train" "$bin/worker_runtime/train")"
ddprun="$(first "$bin/ddprun" "$bin/launcher/ddprun")"
tmp="$(mktemp -d /tmp/ddprun-gpuresume-XXXXXX)"
common=(--device cuda --precision bf16 --width 1024 --depth 4 --batch 256 --samples 25600 --epochs 2 --momentum 0.9)
"$ddprun" --nproc_per_node=1 --master_port=$((20000 + RANDOM % 20000)) "$train" "${common[@]}" >"$tmp/clean.log" 2>&1
"$ddprun" --nproc_per_node=1 --max_restarts=3 --master_port=$((20000 + RANDOM % 20000)) "$train" "${common[@]}" \
  --checkpoint-dir "$tmp/ck" --checkpoint-every 30 --fail-at-step 45,130 --fail-rank 0 >"$tmp/elastic.log" 2>&1 || true
want="$(grep -o 'final_param_checksum=[0-9a-f]*' "$tmp/clean.log" | tail -1)"
got="$(grep -o 'final_param_checksum=[0-9a-f]*' "$tmp/elastic.log" | tail -1)"
grep -E "injected|resumed|restart" "$tmp/elastic.log" | head -8
echo "uninterrupted: $want"
echo "elastic:       $got"
[[ -n "$want" && "$got" == "$want" ]] && echo "OK: bit-identical on GPU after two SIGKILLs" || { echo "MISMATCH"; tail -20 "$tmp/elastic.log"; exit 1; }
