#!/usr/bin/env bash
# Two ddprund builds side by side, interleaved, against the same PyTorch 2.11 server: the store
# benchmark's phases 1 and 2 (PyTorch clients, the C++ generator) for the chosen operations,
# ROUNDS rounds of (new, base). Each run also measures PyTorch's own server, so every ratio is
# taken within its own run.
#   scripts/bench/bench_store_ab.sh NEW_BIN BASE_BIN OUT [ROUNDS] [OPS] [CLIENTS]
# NEW_BIN and BASE_BIN hold ddprund (and NEW_BIN ddprun_store_bench, used for both), e.g. bundles
# of scripts/bench/bundle_bin.sh; PY (default python3) is the Python with torch 2.11.
set -uo pipefail
new="${1:?new bin}"; base="${2:?base bin}"; out="${3:?out dir}"
rounds="${4:-3}"; ops="${5:-get,add,compare_set,wait}"; clients="${6:-16,64}"
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
PY="${PY:-python3}"
mkdir -p "$out"
for r in $(seq 1 "$rounds"); do
  for side in new base; do
    bin="$new"; [[ "$side" == base ]] && bin="$base"
    "$PY" "$here/bench_store_main.py" --ddprund "$bin/ddprund" --bench "$new/ddprun_store_bench" --py211 "$PY" \
      --skip-pt113 --clients "$clients" --phases 1,2 --ops "$ops" --out "$out/$side-$r" > "$out/$side-$r.log" 2>&1
    echo "round $r $side: rc $?"
  done
done
# One line per (side, round, phase, op, clients): ddprund ops/s, PyTorch ops/s, ratio.
"$PY" - "$out" "$rounds" <<'PY'
import glob, os, re, sys
out, rounds = sys.argv[1], int(sys.argv[2])
for side in ("new", "base"):
    for r in range(1, rounds + 1):
        for md in sorted(glob.glob(os.path.join(out, f"{side}-{r}", "*.md"))):
            for line in open(md):
                if re.match(r"\|\s*(get|add|compare_set|wait)", line):
                    print(side, r, os.path.basename(md), line.strip())
PY
