#!/usr/bin/env bash
# cmake/DdprunVersion.cmake over a scratch git repository that holds it and cmake/version-base:
# the version at the base's commit, N commits after it, at a tag vX.Y.Z and after it, with the
# base moved on, without git, from an sdist's PKG-INFO and from DDPRUN_VERSION; and each
# version sorts above the one before for pip (packaging.version) and for dpkg.
#   version_test.sh SOURCE_DIR
set -uo pipefail
src=$1
work=$(mktemp -d /tmp/ddprun-version-test.XXXXXX)
trap 'rm -rf "$work"' EXIT
fails=0
fail() { echo "FAIL: $*"; fails=$((fails + 1)); }
py=${DDPRUN_PKG_VENV:-$src/.venv-pkg}/bin/python  # scripts/setup_deps.sh makes it, with packaging
[[ -x $py ]] || py=python3
$py -c 'import packaging.version' 2>/dev/null || { echo "FAIL: $py has no packaging module (scripts/setup_deps.sh makes .venv-pkg with it)"; exit 1; }

repo=$work/repo
mkdir -p "$repo/cmake"
cp "$src/cmake/DdprunVersion.cmake" "$repo/cmake/"
echo 0.4.2 >"$repo/cmake/version-base"
g() { git -C "$repo" -c user.name=t -c user.email=t@example.org -c tag.gpgSign=false -c commit.gpgSign=false "$@" >/dev/null; }
g init -q
commit() { echo "$1" >>"$repo/file"; g add -A; g commit -q -m "$1"; }
version() {  # version [VAR=value...]: prints "pep440 deb" of the scratch tree
  local out
  out=$(env "$@" cmake -DDDPRUN_SOURCE_DIR="$repo" -P "$repo/cmake/DdprunVersion.cmake" 2>"$work/err") ||
    { echo "ERROR $(cat "$work/err")"; return; }
  echo "$(sed -n 's/^pep440=//p' <<<"$out") $(sed -n 's/^deb=//p' <<<"$out")"
}
hash() { git -C "$repo" rev-parse --short=10 HEAD; }
seen=()  # "pep440 deb" in the order they must sort
expect() {  # expect WHAT "pep440 deb" [env...]
  local what=$1 want=$2
  shift 2
  local got
  got=$(version "$@")
  echo "$what: $got"
  [[ $got == "$want" ]] || fail "$what: got '$got', expected '$want'"
}
ordered() { seen+=("$1"); }

commit one
expect "the commit that sets the base" "0.4.2 0.4.2"
ordered "0.4.2 0.4.2"
commit two
h=$(hash)
expect "1 commit after the base" "0.4.3.dev1+g$h 0.4.3~dev1+g$h"
ordered "0.4.3.dev1+g$h 0.4.3~dev1+g$h"
for i in 2 3 4 5 6 7 8 9 10; do commit "c$i"; done
h=$(hash)
expect "10 commits after the base" "0.4.3.dev10+g$h 0.4.3~dev10+g$h"
ordered "0.4.3.dev10+g$h 0.4.3~dev10+g$h"
g tag v0.4.3
expect "a tag v0.4.3 on it" "0.4.3 0.4.3"
ordered "0.4.3 0.4.3"
commit after-tag
h=$(hash)
expect "1 commit after the tag" "0.4.4.dev1+g$h 0.4.4~dev1+g$h"
ordered "0.4.4.dev1+g$h 0.4.4~dev1+g$h"
echo 1.0.0 >"$repo/cmake/version-base"
g commit -q -am "base 1.0.0"
expect "the base moved to 1.0.0 (nearer than the tag)" "1.0.0 1.0.0"
ordered "1.0.0 1.0.0"
commit after-base
h=$(hash)
expect "1 commit after the new base" "1.0.1.dev1+g$h 1.0.1~dev1+g$h"
ordered "1.0.1.dev1+g$h 1.0.1~dev1+g$h"
echo "uncommitted" >>"$repo/file"
expect "uncommitted changes do not change it" "1.0.1.dev1+g$h 1.0.1~dev1+g$h"
expect "DDPRUN_VERSION overrides it" "2.0.0.dev3+gabc 2.0.0~dev3+gabc" DDPRUN_VERSION=2.0.0.dev3+gabc
out=$(version DDPRUN_VERSION=2.0)
[[ $out == ERROR* ]] && grep -q "is not X.Y.Z" "$work/err" || fail "DDPRUN_VERSION=2.0 was not refused with a clear error: $out"

# No git: a source archive, inside another repository or not.
mkdir -p "$work/outer" && git -C "$work/outer" init -q
tar -C "$repo" --exclude=.git -cf - . | (mkdir -p "$work/outer/tree" && tar -C "$work/outer/tree" -xf -)
repo=$work/outer/tree
expect "no git of its own (inside another repository)" "0.0.0+unknown 0.0.0+unknown"
grep -q "no git clone" "$work/err" || fail "no warning that the version is unknown: $(cat "$work/err")"
printf 'Metadata-Version: 2.1\nName: ddprun\nVersion: 1.0.1.dev1+g%s\n' "$h" >"$repo/PKG-INFO"
expect "an sdist's PKG-INFO" "1.0.1.dev1+g$h 1.0.1~dev1+g$h"

# The order, for pip and for dpkg.
for ((i = 1; i < ${#seen[@]}; i++)); do
  read -r p0 d0 <<<"${seen[i - 1]}"
  read -r p1 d1 <<<"${seen[i]}"
  $py -c 'import sys; from packaging.version import Version as V; sys.exit(0 if V(sys.argv[1]) < V(sys.argv[2]) else 1)' "$p0" "$p1" ||
    fail "pip: $p1 does not sort above $p0"
  dpkg --compare-versions "$d1" gt "$d0" || fail "dpkg: $d1 does not sort above $d0"
done
echo "${#seen[@]} versions in order for pip and dpkg: ${seen[*]%% *}"
if ((fails)); then
  echo "$fails failure(s)"
  exit 1
fi
echo "versions: ok"
