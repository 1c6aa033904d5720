#!/usr/bin/env bash
# Upgrades, as an administrator and a pip user do them: the .debs and the wheel of this build
# (the older), and the same re-stamped as the next commit's version (the newer: its version in
# the packages' metadata, the .debs' changelog and ddprun.__version__; the programs are the same
# build). `apt-get install ./*.deb` of the older, then of the newer (docs/ADMIN.md); `pip install`
# of the older wheel into a fresh venv, then of the newer. Each must really upgrade: the
# installed version and a file change. Root, alone; everything installed is removed at the end.
#   upgrade_test.sh BUILD_DIR SOURCE_DIR [SANITIZERS]
set -uo pipefail
build=$1 src=$2 sanitize=${3:-}
if [[ -n $sanitize ]]; then
  echo "SKIP: a build with sanitizers ($sanitize): packages are made from a plain build"
  exit 77
fi
[[ $EUID == 0 ]] || { echo "SKIP: installing .debs needs root"; exit 77; }
pkg_venv=${DDPRUN_PKG_VENV:-$src/.venv-pkg}
[[ -x $pkg_venv/bin/wheel ]] || { echo "FAIL: $pkg_venv/bin/wheel is missing (scripts/setup_deps.sh)"; exit 1; }
packages=(ddprun libddprun-worker0 libddprun-worker-dev)
for p in "${packages[@]}"; do
  if s=$(dpkg-query -W -f='${Status}' "$p" 2>/dev/null) && [[ $s != *not-installed* ]]; then
    echo "FAIL: the package $p is installed ($s); this test installs and purges its own: dpkg --purge ${packages[*]}"
    exit 1
  fi
done
getent passwd ddprund >/dev/null && { echo "FAIL: a user ddprund exists; purging the package deletes it: remove it first"; exit 1; }
fails=0
fail() { echo "FAIL: $*"; fails=$((fails + 1)); }
work=$(mktemp -d /tmp/ddprun-upgrade-test.XXXXXX)
cleanup() {
  local rc=$?
  for p in "${packages[@]}"; do
    if s=$(dpkg-query -W -f='${Status}' "$p" 2>/dev/null) && [[ $s != *not-installed* ]]; then
      dpkg --purge "$p" >/dev/null 2>&1 || echo "cleanup: dpkg --purge $p failed"
    fi
  done
  rm -rf /etc/ddprund
  getent passwd ddprund >/dev/null && deluser --system --quiet ddprund >/dev/null 2>&1
  getent group ddprund >/dev/null && delgroup --system --quiet ddprund >/dev/null 2>&1
  rm -rf "$work"
  exit "$rc"
}
trap cleanup EXIT
trap 'exit 1' INT TERM HUP
t0=$SECONDS
step() { echo "== [$((SECONDS - t0)) s] $*"; }

# ---- the versions ---------------------------------------------------------------------------
old=$(cat "$build/ddprun-version.txt")
if [[ $old =~ ^([0-9]+\.[0-9]+\.[0-9]+)\.dev([0-9]+)\+ ]]; then
  new="${BASH_REMATCH[1]}.dev$((BASH_REMATCH[2] + 1))+gnext"
else
  IFS=. read -r x y z _ <<<"${old%%+*}"
  new="$x.$y.$((z + 1)).dev1+gnext"
fi
debver() { DDPRUN_VERSION=$1 cmake -P "$src/cmake/DdprunVersion.cmake" | sed -n 's/^deb=//p'; }
old_deb=$(debver "$old") new_deb=$(debver "$new")
echo "older: $old (Debian $old_deb); newer, the next commit's: $new (Debian $new_deb)"
dpkg --compare-versions "$new_deb" gt "$old_deb" || fail "dpkg: $new_deb does not sort above $old_deb"

# ---- the older packages: this build's ----------------------------------------------------------
step "cpack and the wheel of this build"
cpack --config "$build/CPackConfig.cmake" -B "$work/old" >"$work/cpack.log" 2>&1 || { fail "cpack: $(tail -20 "$work/cpack.log")"; exit 1; }
DDPRUN_PKG_VENV=$pkg_venv DDPRUN_WHEEL_DIR=$work/old "$src/scripts/build_wheel.sh" --from-build "$build" >"$work/wheel.log" 2>&1 ||
  { fail "build_wheel.sh: $(tail -20 "$work/wheel.log")"; exit 1; }
ls "$work/old"

# ---- the newer: the same, re-stamped ---------------------------------------------------------
step "re-stamp them as $new"
mkdir -p "$work/new"
for deb in "$work"/old/*.deb; do
  t=$work/tree.$(basename "$deb")
  dpkg-deb -R "$deb" "$t"
  name=$(dpkg-deb -f "$deb" Package)
  for f in "$t/DEBIAN/control" "$t/DEBIAN/shlibs"; do  # (a literal replacement: + and ~ are no pattern)
    [[ -f $f ]] && OLD=$old_deb NEW=$new_deb perl -pi -e 's/\Q$ENV{OLD}\E/$ENV{NEW}/g' "$f"
  done
  cl=$t/usr/share/doc/$name/changelog.gz
  { printf 'ddprun (%s) unstable; urgency=medium\n\n  * The next commit.\n\n -- %s  %s\n\n' "$new_deb" \
      "$(dpkg-deb -f "$deb" Maintainer)" "$(date -R -u)"; zcat "$cl"; } | gzip -9n >"$cl.new"
  mv "$cl.new" "$cl"
  (cd "$t" && find usr etc -type f 2>/dev/null | grep -v '^etc/' | LC_ALL=C sort | xargs md5sum >DEBIAN/md5sums)
  dpkg-deb --root-owner-group --build "$t" "$work/new/${name}_${new_deb}_$(dpkg-deb -f "$deb" Architecture).deb" >/dev/null ||
    fail "dpkg-deb --build $name"
done
"$pkg_venv/bin/wheel" unpack -d "$work/whl" "$work"/old/*.whl >/dev/null
wt=$(ls -d "$work"/whl/*/)
mv "$wt"/ddprun-*.dist-info "$wt/ddprun-$new.dist-info"
sed -i "s/^Version: .*/Version: $new/" "$wt/ddprun-$new.dist-info/METADATA"
printf '__version__ = "%s"\n' "$new" >"$wt/ddprun/_version.py"
mv "$wt" "$work/whl/ddprun-$new"
"$pkg_venv/bin/wheel" pack -d "$work/new" "$work/whl/ddprun-$new" >/dev/null || fail "wheel pack"
ls "$work/new"

# ---- apt: install the older, upgrade to the newer ------------------------------------------
installed() { dpkg-query -W -f='${Version}' "$1" 2>/dev/null; }
step "apt-get install the older .debs"
DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends "$work"/old/*.deb >"$work/apt1.log" 2>&1 ||
  { fail "apt-get install (older): $(tail -20 "$work/apt1.log")"; exit 1; }
for p in "${packages[@]}"; do [[ $(installed "$p") == "$old_deb" ]] || fail "$p: installed $(installed "$p"), expected $old_deb"; done
zcat /usr/share/doc/ddprun/changelog.gz | head -1
before=$(md5sum </usr/share/doc/ddprun/changelog.gz)
[[ $(/usr/bin/ddprun --version) == "ddprun $old" ]] || fail "ddprun --version: $(/usr/bin/ddprun --version)"
step "apt-get install the newer .debs (docs/ADMIN.md's upgrade)"
DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends "$work"/new/*.deb >"$work/apt2.log" 2>&1 ||
  fail "apt-get install (newer): $(tail -20 "$work/apt2.log")"
grep -E "^(Unpacking|Setting up|Preparing)" "$work/apt2.log" | head -6
grep -q "already the newest version" "$work/apt2.log" && fail "apt: $(grep "already the newest" "$work/apt2.log")"
for p in "${packages[@]}"; do [[ $(installed "$p") == "$new_deb" ]] || fail "$p: after the upgrade $(installed "$p"), expected $new_deb"; done
zcat /usr/share/doc/ddprun/changelog.gz | head -1
[[ $(md5sum </usr/share/doc/ddprun/changelog.gz) != "$before" ]] || fail "the upgrade did not replace /usr/share/doc/ddprun/changelog.gz"
[[ -x /usr/bin/ddprun && -f /usr/lib/libddprun_worker.so.0 ]] || fail "the upgrade lost files"
getent passwd ddprund >/dev/null || fail "the upgrade lost the ddprund user"
dpkg --purge "${packages[@]}" >/dev/null || fail "dpkg --purge"

# ---- pip: install the older, upgrade to the newer ------------------------------------------
step "pip install the older wheel into a fresh venv, then the newer"
/usr/bin/python3 -m venv "$work/venv" || { fail "python3 -m venv"; exit 1; }
pip=("$work/venv/bin/python" -m pip --disable-pip-version-check -q)
ver() { (cd / && "$work/venv/bin/python" -c 'import ddprun; print(ddprun.__version__)'); }
"${pip[@]}" install --no-index "$work"/old/*.whl || fail "pip install (older)"
[[ $(ver) == "$old" ]] || fail "ddprun.__version__ after installing the older: $(ver), expected $old"
"${pip[@]}" install --no-index "$work"/new/*.whl >"$work/pip2.log" 2>&1 || fail "pip install (newer): $(cat "$work/pip2.log")"
grep -qi "already installed\|already satisfied" "$work/pip2.log" && fail "pip: $(cat "$work/pip2.log")"
shown=$("$work/venv/bin/python" -m pip --disable-pip-version-check show ddprun | sed -n 's/^Version: //p')
echo "pip show ddprun: $shown; ddprun.__version__: $(ver)"
[[ $shown == "$new" ]] || fail "pip show: $shown, expected $new"
[[ $(ver) == "$new" ]] || fail "ddprun.__version__ after the upgrade: $(ver), expected $new"
[[ $("$work/venv/bin/ddprun" --version) == "ddprun $old" ]] || fail "the upgraded wheel's ddprun does not run: $("$work/venv/bin/ddprun" --version)"

if ((fails)); then
  echo "$fails failure(s)"
  exit 1
fi
step "upgrades: ok"
