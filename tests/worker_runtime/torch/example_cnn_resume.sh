#!/usr/bin/env bash
# examples/libtorch_cnn_ddp under ddprun with 2 processes, twice: 30 steps in one go, and 20
# steps followed by a second run that resumes from the step-20 checkpoint to step 30. Both must
# end with the same state checksum (bit-identical resume).
#   usage: example_cnn_resume.sh DDPRUN EXAMPLE
set -euo pipefail
ddprun="$1" example="$2"
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
run() {  # DIR STEPS -> the run's output; fails the test when the run fails
  local out
  out="$(timeout 300 "$ddprun" --standalone --nproc_per_node=2 "$example" "$@" 2>&1)" || {
    echo "$out"; echo "FAIL: '$example $*' exited non-zero"; exit 1; }
  echo "$out"
}
checksum() { sed -n 's/.*finished step [0-9]*: state checksum \([0-9a-f]*\).*/\1/p' <<<"$1"; }
once="$(run "$tmp/once" 30)"; echo "$once"
first="$(run "$tmp/resumed" 20)"; echo "$first"
second="$(run "$tmp/resumed" 30)"; echo "$second"
grep -q "resumed from step 20" <<<"$second" || { echo "FAIL: the second run did not resume from step 20"; exit 1; }
a="$(checksum "$once")" b="$(checksum "$second")"
[[ -n "$a" && "$a" == "$b" ]] || { echo "FAIL: one go ends at '$a', the resumed run at '$b'"; exit 1; }
echo "PASS: one go and resumed both end at $a"
