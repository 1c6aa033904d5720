#!/usr/bin/env bash
# Configures and builds ddprun into ${DDPRUN_BUILD_DIR:-build}. Extra arguments go to CMake's
# configure step, e.g.  scripts/build.sh -DDDPRUN_SANITIZE=address,undefined
# A build folder configured before packages were installed (scripts/run_main.sh, then
# scripts/setup_deps.sh) looks for them again: LibTorch (.venv-torch2) and munge.h.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
build="${DDPRUN_BUILD_DIR:-$here/build}"
again=()
if [[ -f "$build/CMakeCache.txt" ]]; then
  # An empty LibTorch root is what the first configure found then: forget it, look again.
  grep -q '^DDPRUN_LIBTORCH_ROOT:PATH=$' "$build/CMakeCache.txt" && again+=(-UDDPRUN_LIBTORCH_ROOT)
  # munge.h is compiled in where present (__has_include), which no dependency records: the
  # object is built again when the header came or went since the last build.
  have=0
  [[ -e /usr/include/munge.h ]] && have=1
  if [[ "$(cat "$build/.ddprun-munge-h" 2>/dev/null)" != "$have" ]]; then
    find "$build" -name 'munge_auth.cpp.o' -delete
  fi
fi
cmake -S "$here" -B "$build" -DCMAKE_BUILD_TYPE="${DDPRUN_BUILD_TYPE:-RelWithDebInfo}" "${again[@]}" "$@"
cmake --build "$build" -j "$(nproc)"
[[ -e /usr/include/munge.h ]] && echo 1 >"$build/.ddprun-munge-h" || echo 0 >"$build/.ddprun-munge-h"
