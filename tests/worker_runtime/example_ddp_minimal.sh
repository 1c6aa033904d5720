#!/usr/bin/env bash
# examples/ddp_minimal under ddprun with 2 processes: it exits 0 only when the ranks end with the
# same parameters and the loss went down; this also requires its closing line for 2 ranks.
#   usage: example_ddp_minimal.sh DDPRUN EXAMPLE
set -euo pipefail
ddprun="$1" example="$2"
out="$(timeout 120 "$ddprun" --standalone --nproc_per_node=2 "$example")" || { echo "$out"; echo "FAIL: exit $?"; exit 1; }
echo "$out"
grep -q "parameters identical on 2 ranks" <<<"$out" || { echo "FAIL: no closing line for 2 ranks"; exit 1; }
echo PASS
