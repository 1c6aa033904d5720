#!/usr/bin/env bash
# Store benchmark (not a timed test): ddprund vs PyTorch's own TCPStore server, side by side in
# one run on this machine, loopback only. See scripts/bench/bench_store_main.py for the phases.
#
#   scripts/bench/bench_store.sh [--quick] [--seconds S] [--skip-pt113]
# Env: BUILD_DIR (default build-bench), OUT_DIR (default ./out), DDPRUN_VENV (default
# .venv-torch2; its python is PyTorch 2.11), PY113 (default /usr/bin/python3, Debian's 1.13).
# Prints the tables and writes them to $OUT_DIR/store_bench.md. Takes about 4-5 minutes.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
BUILD_DIR="${BUILD_DIR:-$here/build-bench}"
OUT_DIR="${OUT_DIR:-./out}"
VENV="${DDPRUN_VENV:-$here/.venv-torch2}"
PY113="${PY113:-/usr/bin/python3}"

if [[ ! -x "$VENV/bin/python" ]]; then
  echo "bench_store.sh: $VENV/bin/python is missing; run scripts/setup_deps.sh first" >&2
  exit 1
fi
if [[ ! -f "$BUILD_DIR/CMakeCache.txt" ]]; then
  cmake -S "$here" -B "$BUILD_DIR" -DCMAKE_BUILD_TYPE=Release -DDDPRUN_BUILD_LAUNCHER=OFF \
        -DDDPRUN_BUILD_WORKER_RUNTIME=OFF -DDDPRUN_BUILD_TESTS=OFF >/dev/null
fi
cmake --build "$BUILD_DIR" -j"$(nproc)" --target ddprund ddprun_store_bench >/dev/null

# Thousands of connections: take the hard descriptor limit for us and our children.
ulimit -n "$(ulimit -Hn)"
exec "$VENV/bin/python" "$here/scripts/bench/bench_store_main.py" \
  --ddprund "$BUILD_DIR/rendezvous/ddprund" \
  --bench "$BUILD_DIR/rendezvous/tools/bench/ddprun_store_bench" \
  --py211 "$VENV/bin/python" --py113 "$PY113" --out "$OUT_DIR" "$@"
