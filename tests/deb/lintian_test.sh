#!/usr/bin/env bash
# The .debs pass lintian with no error and no warning: cpack over this build tree, then lintian.
#   lintian_test.sh BUILD_DIR [SANITIZERS]
set -uo pipefail
build=$1 sanitize=${2:-}
if [[ -n $sanitize ]]; then
  echo "SKIP: a build with sanitizers ($sanitize): the packages are made from a plain build"
  exit 77
fi
command -v lintian >/dev/null || { echo "SKIP: lintian is not installed (apt-get install lintian; scripts/setup_deps.sh installs it)"; exit 77; }
work=$(mktemp -d /tmp/ddprun-lintian.XXXXXX)
trap 'rm -rf "$work"' EXIT
cpack --config "$build/CPackConfig.cmake" -B "$work" >"$work/cpack.log" 2>&1 || { echo "FAIL: cpack: $(tail -30 "$work/cpack.log")"; exit 1; }
ls "$work"/*.deb
# (lintian warns that it runs as root; that line is no finding)
lintian --fail-on error,warning "$work"/*.deb 2>&1 | grep -v 'running with root privileges' | tee "$work/lintian.txt"
rc=${PIPESTATUS[0]}
if ((rc != 0)) || grep -E '^[EW]: ' "$work/lintian.txt" >/dev/null; then
  echo "FAIL: lintian reports errors or warnings (above)"
  exit 1
fi
echo "lintian: no errors, no warnings in $(ls "$work"/*.deb | wc -l) packages"
