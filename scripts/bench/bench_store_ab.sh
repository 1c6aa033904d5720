#!/usr/bin/env bash
# ddprund builds side by side, interleaved, against the same PyTorch 2.11 server: the store
# benchmark's phases (1: PyTorch clients, 2: the C++ generator) for the chosen operations,
# ROUNDS rounds of every build in turn. Each run also measures PyTorch's own server, so every
# ratio is taken within its own run.
#   scripts/bench/bench_store_ab.sh OUT ROUNDS OPS CLIENTS PHASES NAME=BIN [NAME=BIN ...]
#   e.g. scripts/bench/bench_store_ab.sh /tmp/ab 3 add,wait 64 1,2 new=out/new old=out/old
# Each BIN folder holds ddprund; the first one also ddprun_store_bench (used for every build),
# e.g. bundles of scripts/bench/bundle_bin.sh. PY (default python3) is the Python with torch
# 2.11. With PERF=<perf binary>, each build is then profiled (perf record, flat, by symbol)
# under the C++ generator at the largest client count for each op: OUT/perf-NAME-OP.txt, and
# one line per profile with its samples per 1000 ops (server CPU per op, comparable across
# builds in one run).
set -uo pipefail
out="${1:?out dir}"; rounds="${2:?rounds}"; ops="${3:?ops}"; clients="${4:?clients}"; phases="${5:?phases}"
shift 5
(( $# >= 1 )) || { echo "usage: $0 OUT ROUNDS OPS CLIENTS PHASES NAME=BIN..." >&2; exit 2; }
names=(); bins=()
for nb in "$@"; do
  [[ "$nb" == *=* && -x "${nb#*=}/ddprund" ]] || { echo "$0: '$nb' is not NAME=BIN with BIN/ddprund" >&2; exit 2; }
  names+=("${nb%%=*}"); bins+=("$(cd "${nb#*=}" && pwd)")
done
bench="${bins[0]}/ddprun_store_bench"
[[ -x "$bench" ]] || { echo "$0: $bench missing" >&2; exit 2; }
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
PY="${PY:-python3}"
mkdir -p "$out"
for r in $(seq 1 "$rounds"); do
  for i in "${!names[@]}"; do
    side="${names[$i]}"
    "$PY" "$here/bench_store_main.py" --ddprund "${bins[$i]}/ddprund" --bench "$bench" --py211 "$PY" \
      --skip-pt113 --clients "$clients" --phases "$phases" --ops "$ops" --out "$out/$side-$r" > "$out/$side-$r.log" 2>&1
    echo "round $r $side: rc $?"
  done
done
# One line per (build, round, op, clients, phase): the table row (ddprund, PyTorch, ratio).
for side in "${names[@]}"; do
  for r in $(seq 1 "$rounds"); do
    grep -hE '^\|\s*(get|add|compare_set|wait) ' "$out/$side-$r"/*.md 2>/dev/null | grep -v '| n/a | n/a' | sed "s/^/$side $r /"
  done
done
[[ -n "${PERF:-}" ]] || exit 0
n="${clients##*,}"
for i in "${!names[@]}"; do
  side="${names[$i]}"
  for op in ${ops//,/ }; do
    "${bins[$i]}/ddprund" --host 127.0.0.1 --port 0 --log-level warn > "$out/d-$side.out" 2>&1 &
    dp=$!
    port=""
    for _ in $(seq 50); do port=$(grep -oE ':[0-9]+' "$out/d-$side.out" | head -1 | tr -d :); [[ -n "$port" ]] && break; sleep 0.1; done
    "$PERF" record -F 4999 -p "$dp" -o "$out/perf.data" -- sleep 4 > /dev/null 2>&1 &
    pp=$!
    res=$("$bench" ops --port "$port" --op "$op" --clients "$n" --seconds 5 --dialect D2 --tag p --threads 8 | grep RESULT)
    wait "$pp"; kill "$dp"; wait "$dp" 2>/dev/null
    "$PERF" report -i "$out/perf.data" --stdio --no-children --sort sym 2>/dev/null | grep -vE '^#|^$' | head -150 \
      | cut -c1-160 > "$out/perf-$side-$op.txt"
    samples=$("$PERF" report -i "$out/perf.data" --stdio 2>/dev/null | grep -m1 -oE '^# Samples: [0-9.]+[KM]?' | awk '{print $3}')
    rm -f "$out/perf.data"
    ops_s=$(grep -oE 'ops_per_s=[0-9.]+' <<< "$res" | cut -d= -f2)
    "$PY" - "$side" "$op" "$n" "$samples" "$ops_s" <<'PY'
import sys
side, op, n, samples, ops = sys.argv[1:]
mult = {"K": 1e3, "M": 1e6}.get(samples[-1], 1)
s = float(samples.rstrip("KM")) * mult
# perf samples the server for 4 s of the 5 s run
print(f"perf {side} {op} x{n}: {float(ops):,.0f} ops/s, {s * 1000 / (4 * float(ops)):.1f} samples per 1000 ops")
PY
  done
done
