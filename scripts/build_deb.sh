#!/usr/bin/env bash
# Builds ddprun (scripts/build.sh, into ${DDPRUN_BUILD_DIR:-build}) and its Debian package:
#   scripts/build_deb.sh [cmake configure args...]   ->  <build>/packages/{ddprun,libddprun-worker0,libddprun-worker-dev}_<version>_<arch>.deb
# Install them with: sudo apt install ./build/packages/*.deb   (docs/ADMIN.md)
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
build="${DDPRUN_BUILD_DIR:-$here/build}"
command -v help2man >/dev/null || {
  echo "build_deb.sh: help2man is missing (the man pages are made with it): apt-get install help2man, or scripts/setup_deps.sh" >&2
  exit 1
}
"$here/scripts/build.sh" "$@"
cpack --config "$build/CPackConfig.cmake" -B "$build/packages"
ls -l "$build"/packages/*.deb
