#!/usr/bin/env bash
# `train`'s settings precedence and the worker's 0/1 knobs, one rank (no launcher needed):
#  - an explicit --timeout beats DDPRUN_COLLECTIVE_TIMEOUT_S (a bad value in the environment is
#    then never read), while without the flag the environment is read (and a bad value refused);
#  - DDPRUN_SHM and DDPRUN_DEBUG_COLLECTIVES accept only 0 or 1: anything else fails start-up
#    with a message naming the variable, even at world size 1 where neither is used.
#   usage: train_knobs.sh <train>
set -uo pipefail
train="$1"
small=(--width 16 --depth 1 --samples 40 --batch 10 --epochs 1 --device cpu)
fail=0
expect() {  # expect <ok|fail> <text that must be in the output or ""> <env...> -- <train args...>
  local want="$1" text="$2"; shift 2
  local envs=(); while [[ "$1" != -- ]]; do envs+=("$1"); shift; done; shift
  local out rc
  out="$(env -u RANK -u WORLD_SIZE DDPRUN_DEVICE= "${envs[@]}" "$train" "${small[@]}" "$@" 2>&1)"; rc=$?
  local what="${envs[*]} train $*"
  if [[ "$want" == ok && "$rc" != 0 ]]; then echo "FAIL ($what): exit $rc, expected success"; echo "$out"; fail=1; return; fi
  if [[ "$want" == fail && "$rc" == 0 ]]; then echo "FAIL ($what): succeeded, expected an error"; echo "$out"; fail=1; return; fi
  if [[ -n "$text" && "$out" != *"$text"* ]]; then echo "FAIL ($what): no '$text' in:"; echo "$out"; fail=1; return; fi
  echo "ok: $what -> exit $rc${text:+, '$text'}"
}
expect ok   "final_param_checksum=" DDPRUN_COLLECTIVE_TIMEOUT_S=abc -- --timeout 30
expect fail "DDPRUN_COLLECTIVE_TIMEOUT_S='abc' is not a positive number" DDPRUN_COLLECTIVE_TIMEOUT_S=abc --
expect ok   "final_param_checksum=" DDPRUN_COLLECTIVE_TIMEOUT_S=30 --
for bad in yes true 2 " 1"; do
  expect fail "DDPRUN_SHM='$bad': expected 0 or 1" "DDPRUN_SHM=$bad" --
  expect fail "DDPRUN_DEBUG_COLLECTIVES='$bad': expected 0 or 1" "DDPRUN_DEBUG_COLLECTIVES=$bad" --
done
expect ok "final_param_checksum=" DDPRUN_SHM=0 DDPRUN_DEBUG_COLLECTIVES=1 --
expect ok "final_param_checksum=" DDPRUN_SHM=1 DDPRUN_DEBUG_COLLECTIVES=0 --
exit "$fail"
