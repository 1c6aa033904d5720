#!/usr/bin/env bash
# Chaos soak (scripts/chaos/soak.py says what it does and checks): `train` on CPU across three
# ddprun agents in network namespaces with a standing ddprund, while workers and agents are
# SIGKILLed, links cut and /dev/shm and the log disks filled; then bit-identical parameters,
# nothing left behind, and a report per fault. Needs root.
#   scripts/chaos/soak.sh [BUILD_DIR (default build)] [soak.py options, e.g. --duration 600 --seed 7]
# Builds what it needs (ddprun, ddprund, train) first.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
build="${1:-$here/build}"
shift || true
[[ -f "$build/CMakeCache.txt" ]] || cmake -S "$here" -B "$build" -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null
cmake --build "$build" -j "$(nproc)" --target ddprun ddprund train
exec python3 "$here/scripts/chaos/soak.py" --build "$build" "$@"
