#!/usr/bin/env bash
# Builds the libFuzzer targets of tests/fuzz with clang (ASan + UBSan) and runs each for a
# while; exits 1 when one finds a crash. The seeds (tests/fuzz/corpus/<target>) are copied to
# a scratch corpus, so the repository only changes when you copy a crasher in by hand.
#   scripts/fuzz.sh [seconds per target, default 60] [target...]   (targets: codec server options auth)
# Environment: DDPRUN_FUZZ_BUILD_DIR (default build-fuzz), DDPRUN_FUZZ_WORK (scratch corpora
# and crashers, default $DDPRUN_FUZZ_BUILD_DIR/fuzz-work), DDPRUN_FUZZ_JOBS (build jobs).
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
build="${DDPRUN_FUZZ_BUILD_DIR:-$here/build-fuzz}"
work="${DDPRUN_FUZZ_WORK:-$build/fuzz-work}"
seconds="${1:-60}"
shift || true
targets=("$@")
((${#targets[@]})) || targets=(codec server options auth)

if ! command -v clang++ >/dev/null; then
  echo "scripts/fuzz.sh: clang++ not found; install clang and libclang-rt-14-dev (scripts/setup_deps.sh does)" >&2
  exit 2
fi
CC=clang CXX=clang++ cmake -S "$here" -B "$build" -DCMAKE_BUILD_TYPE=RelWithDebInfo -DDDPRUN_FUZZ=ON \
  -DDDPRUN_BUILD_WORKER_RUNTIME=OFF >/dev/null
cmake --build "$build" -j "${DDPRUN_FUZZ_JOBS:-$(nproc)}" --target "${targets[@]/#/ddprun_fuzz_}"

failed=()
for t in "${targets[@]}"; do
  mkdir -p "$work/corpus/$t" "$work/crashes/$t"
  log="$work/$t.log"
  echo "[fuzz] $t: ${seconds}s (log: $log)"
  # -max_len: frames and command lines of a few KiB reach every path; -rss_limit_mb and
  # -timeout turn memory blow-ups and hangs into findings too.
  if "$build/tests/fuzz/ddprun_fuzz_$t" -max_total_time="$seconds" -max_len=8192 -timeout=10 \
      -rss_limit_mb=2048 -print_final_stats=1 -artifact_prefix="$work/crashes/$t/" \
      "$work/corpus/$t" "$here/tests/fuzz/corpus/$t" >"$log" 2>&1; then
    { grep -E '^#[0-9]+[[:space:]]+DONE' "$log" || true; } | tail -1 | sed "s/^/[fuzz] $t: /"
  else
    failed+=("$t")
    { grep -E 'ERROR|invariant|SUMMARY' "$log" || true; } | head -5 | sed "s/^/[fuzz] $t: /"
    echo "[fuzz] $t: crasher in $work/crashes/$t/ -- replay it with build/tests/fuzz/ddprun_fuzz_replay $t FILE," \
         "then keep it in tests/fuzz/regressions/$t/ once fixed" >&2
  fi
done
if ((${#failed[@]})); then
  echo "[fuzz] FAILED: ${failed[*]}" >&2
  exit 1
fi
echo "[fuzz] no crash in ${targets[*]} (${seconds}s each)"
