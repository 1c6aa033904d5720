#!/usr/bin/env bash
# Elastic resume under the real launcher: `ddprun --nproc_per_node=N --max_restarts=3 train`
# with the last rank SIGKILLed before step 7 (attempt 0) and step 23 (attempt 1) must print the
# same final_param_checksum as an uninterrupted run. N = 1 also proves that a one-rank job's
# failures count as failures after progress (they are retried).
#   usage: elastic_resume_ddprun.sh <ddprun> <train> [N (default 2)]
set -euo pipefail
ddprun="$1"; train="$2"; n="${3:-2}"
tmp="$(mktemp -d /tmp/ddprun-elastic-XXXXXX)"
trap 'rm -rf "$tmp"' EXIT
common=(--width 64 --depth 2 --samples 400 --batch 20 --epochs 3 --momentum 0.9 --device cpu)

"$ddprun" --nproc_per_node="$n" --master_port=0 "$train" "${common[@]}" >"$tmp/clean.log" 2>&1 || {
  echo "uninterrupted run failed:"; cat "$tmp/clean.log"; exit 1; }
want="$(grep -o 'final_param_checksum=[0-9a-f]*' "$tmp/clean.log" | tail -1)"
[[ -n "$want" ]] || { echo "no checksum in the uninterrupted run:"; cat "$tmp/clean.log"; exit 1; }

"$ddprun" --nproc_per_node="$n" --max_restarts=3 --master_port=0 "$train" "${common[@]}" \
  --checkpoint-dir "$tmp/ck" --checkpoint-every 4 --fail-at-step 7,23 --fail-rank $((n - 1)) >"$tmp/elastic.log" 2>&1 || {
  echo "elastic run failed:"; cat "$tmp/elastic.log"; exit 1; }
got="$(grep -o 'final_param_checksum=[0-9a-f]*' "$tmp/elastic.log" | tail -1)"
restarts="$(grep -c 'injected fault' "$tmp/elastic.log" || true)"
echo "uninterrupted: $want"
echo "elastic:       $got (injected faults seen: $restarts)"
[[ "$restarts" -ge 2 ]] || { echo "expected two injected faults"; cat "$tmp/elastic.log"; exit 1; }
[[ "$got" == "$want" ]] || { echo "MISMATCH"; cat "$tmp/elastic.log"; exit 1; }
echo "OK: bit-identical after two SIGKILLs"
