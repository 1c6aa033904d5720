#!/usr/bin/env bash
# The test command: installs what is missing, builds, and runs every test with ctest
# (unit, integration, end-to-end, interop with PyTorch 1.13 and 2.11, multi-host in network
# namespaces). Needs root for apt-get and network namespaces, as CI has.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
build="${DDPRUN_BUILD_DIR:-$here/build}"
"$here/scripts/setup_deps.sh"
"$here/scripts/build.sh"
cd "$build"
ctest --output-on-failure --timeout 900 -j "${DDPRUN_TEST_JOBS:-2}" "$@"
