#!/usr/bin/env bash
# Configures and builds ddprun into ${DDPRUN_BUILD_DIR:-build}. Extra arguments go to CMake's
# configure step, e.g.  scripts/build.sh -DDDPRUN_SANITIZE=address,undefined
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
build="${DDPRUN_BUILD_DIR:-$here/build}"
cmake -S "$here" -B "$build" -DCMAKE_BUILD_TYPE="${DDPRUN_BUILD_TYPE:-RelWithDebInfo}" "$@"
cmake --build "$build" -j "$(nproc)"
