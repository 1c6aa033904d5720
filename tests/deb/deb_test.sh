#!/usr/bin/env bash
# The .debs, end to end, on this machine (root): build them with cpack over this build tree
# (ddprun, libddprun-worker0, libddprun-worker-dev), install them with dpkg -i, use what it installed (man pages, --version, bash completion, a 2-process job
# of a C++ program built against the installed library, the ddprund service's unit and start-up
# settings), then dpkg -r and dpkg --purge, and check that nothing is left behind. Whatever
# happens, the package, its user and its files are removed at the end.
#   deb_test.sh BUILD_DIR SOURCE_DIR DEB_VERSION PROGRAM_VERSION [SANITIZERS]
set -uo pipefail
build=$1 src=$2 version=$3 prog_version=$4 sanitize=${5:-}
packages=(ddprun libddprun-worker0 libddprun-worker-dev)
t0=$SECONDS
step() { echo "== [$((SECONDS - t0)) s] $*"; }
die() {
  echo "FAIL: $*"
  exit 1
}
fails=0
fail() {
  echo "FAIL: $*"
  fails=$((fails + 1))
}

if [[ -n $sanitize ]]; then
  echo "SKIP: a build with sanitizers ($sanitize): a package is made from a plain build, and a program built"
  echo "against its library would lack the sanitizer runtime"
  exit 77
fi
if [[ $EUID != 0 ]]; then
  echo "SKIP: installing a .deb needs root (this test installs, uses and purges one)"
  exit 77
fi
for tool in dpkg dpkg-deb cpack man; do
  command -v "$tool" >/dev/null || { echo "SKIP: $tool is not installed"; exit 77; }
done

# ---- preconditions: nothing of ours is here already (we delete all of it at the end) --------
for p in "${packages[@]}"; do
  if status=$(dpkg-query -W -f='${Status}' "$p" 2>/dev/null) && [[ $status != *not-installed* ]]; then
    die "the package $p is on this machine ($status); this test installs and purges its own: remove it first with: dpkg --purge ${packages[*]}"
  fi
done
for p in /usr/bin/ddprun /usr/bin/ddprund /etc/ddprund /etc/default/ddprund; do
  [[ -e $p ]] && die "$p exists but belongs to no ddprun package; this test would replace and then delete it: move it away first"
done
getent passwd ddprund >/dev/null && die "a user ddprund exists; purging the package deletes it: remove it first (deluser --system ddprund)"
getent group ddprund >/dev/null && die "a group ddprund exists; purging the package deletes it: remove it first (delgroup ddprund)"

work=$(mktemp -d /tmp/ddprun-deb-test.XXXXXX)
pids=()
cleanup() {
  local rc=$?
  for p in "${pids[@]}"; do kill -KILL "$p" 2>/dev/null; done
  for p in "${packages[@]}"; do
    if s=$(dpkg-query -W -f='${Status}' "$p" 2>/dev/null) && [[ $s != *not-installed* ]]; then
      echo "cleanup: dpkg --purge $p"
      dpkg --purge "$p" >/dev/null 2>&1 || echo "cleanup: dpkg --purge $p failed"
    fi
  done
  # What the package's scripts should have removed, in case they did not (all checked absent above).
  rm -rf /etc/ddprund
  getent passwd ddprund >/dev/null && deluser --system --quiet ddprund >/dev/null 2>&1
  getent group ddprund >/dev/null && delgroup --system --quiet ddprund >/dev/null 2>&1
  rm -rf "$work"
  exit "$rc"
}
trap cleanup EXIT
trap 'exit 1' INT TERM HUP

# Paths under /etc and /usr, for the before/after comparison. Python byte-code caches that
# other programs write meanwhile are not ours: left out.
snapshot() {
  find /etc /usr -xdev 2>/dev/null | grep -v '/__pycache__' | LC_ALL=C sort
}

# ---- build ----------------------------------------------------------------------------------
step "cpack over $build"
cpack --config "$build/CPackConfig.cmake" -B "$work/pkg" >"$work/cpack.log" 2>&1 ||
  die "cpack failed: $(tail -30 "$work/cpack.log")"
debs=()
for p in "${packages[@]}"; do
  f=("$work"/pkg/"${p}"_*.deb)
  [[ ${#f[@]} == 1 && -f ${f[0]} ]] || die "expected one ${p}_*.deb in $work/pkg: $(ls "$work/pkg")"
  debs+=("${f[0]}")
  echo "$(basename "${f[0]}"): $(du -k "${f[0]}" | cut -f1) KiB"
  dpkg-deb -f "${f[0]}" Package Version Depends
  [[ $(dpkg-deb -f "${f[0]}" Version) == "$version" ]] || fail "$p: version $(dpkg-deb -f "${f[0]}" Version), expected $version"
  dpkg-deb -c "${f[0]}" | grep "/usr/share/doc/$p/copyright\$" >/dev/null || fail "$p has no /usr/share/doc/$p/copyright"
done
deb=${debs[0]}
dpkg-deb -c "${debs[1]}" | grep '/usr/lib/libddprun_worker\.so\.0 ' >/dev/null || fail "libddprun-worker0 has no libddprun_worker.so.0"
dpkg-deb -I "${debs[1]}" shlibs | grep '^libddprun_worker 0 libddprun-worker0 ' >/dev/null || fail "libddprun-worker0 has no shlibs file"
dpkg-deb -f "${debs[2]}" Depends | grep -F "libddprun-worker0 (= $version)" >/dev/null || fail "libddprun-worker-dev does not depend on libddprun-worker0 (= $version)"
# --metrics_port links prometheus-cpp's exposer: dpkg-shlibdeps must have named its runtime package.
dpkg-deb -f "$deb" Depends | grep -q 'libprometheus-cpp-pull' ||
  fail "Depends lacks libprometheus-cpp-pull (ddprun and ddprund link it for --metrics_port)"
for d in "${debs[@]}"; do dpkg-deb --fsys-tarfile "$d" | tar -t; done | sed 's|^\./|/|; s|/$||' | grep . | LC_ALL=C sort -u >"$work/contents"
for f in /usr/bin/ddprun /usr/bin/ddprund /usr/lib/libddprun_worker.so /usr/include/ddprun/worker/runtime.h \
  /usr/lib/cmake/ddprun_worker/ddprun_workerConfig.cmake /usr/share/man/man1/ddprun.1.gz \
  /usr/share/man/man8/ddprund.8.gz /usr/share/bash-completion/completions/ddprun \
  /usr/share/bash-completion/completions/ddprund /usr/lib/systemd/system/ddprund.service \
  /usr/lib/ddprun/ddprund-service /etc/default/ddprund /usr/share/doc/ddprun/ADMIN.md; do
  grep -qxF "$f" "$work/contents" || fail "the package lacks $f"
done
grep -q '^/usr/share/man/' "$work/contents" ||
  fail "no man pages: help2man was not found when the build was configured (scripts/setup_deps.sh installs it; then reconfigure)"

# ---- install --------------------------------------------------------------------------------
step "snapshot of /etc and /usr"
snapshot >"$work/before"
cp /etc/passwd /etc/group /etc/shadow /etc/gshadow "$work/"
step "dpkg -i"
DEBIAN_FRONTEND=noninteractive dpkg -i "${debs[@]}" || die "dpkg -i failed"
dpkg-query -L "${packages[@]}" | grep -vx "/\." | LC_ALL=C sort -u >"$work/package_files"
while read -r f; do
  [[ -e $f ]] || die "dpkg -i did not install $f"
done <"$work/contents"
echo "the package installed $(wc -l <"$work/package_files") paths"

# A shell with nothing of the build tree: the system's PATH, no LD_LIBRARY_PATH.
clean() { env -i PATH=/usr/sbin:/usr/bin:/sbin:/bin HOME="$work" LANG=C.UTF-8 "$@"; }

step "the installed programs: --version, libraries, no path into the build tree"
out=$(clean ddprun --version) || fail "ddprun --version failed"
[[ $out == "ddprun $prog_version" ]] || fail "ddprun --version printed '$out', expected 'ddprun $prog_version'"
echo "$out"
out=$(clean ddprund --version) || fail "ddprund --version failed"
[[ $out == "ddprund $prog_version" ]] || fail "ddprund --version printed '$out', expected 'ddprund $prog_version'"
for f in /usr/bin/ddprun /usr/bin/ddprund /usr/lib/libddprun_worker.so; do
  # (no grep -q after a pipe: with pipefail, the writer's SIGPIPE would hide the match)
  ldd "$f" | grep "not found" >/dev/null && fail "$f: $(ldd "$f" | grep "not found")"
  readelf -d "$f" | grep -E 'RPATH|RUNPATH' | grep -F "$build" >/dev/null && fail "$f has a run path into the build tree"
done

step "man pages"
for page in "1 ddprun" "8 ddprund"; do
  read -r sec prog <<<"$page"
  path=$(clean man -w "$sec" "$prog") || fail "man -w $sec $prog found nothing"
  echo "man -w $sec $prog: $path"
  # Every flag of --help is in the page (help2man writes '-' as '\-').
  zcat "$path" | sed 's/\\-/-/g' >"$work/$prog.man"
  n=0
  for f in $(clean "$prog" --help | sed -n 's/^  \(-[^ ]*\).*/\1/p' | tr ',' ' '); do
    n=$((n + 1))
    grep -qF -- "$f" "$work/$prog.man" || fail "$prog($sec) lacks $f"
  done
  echo "$prog($sec): all $n flag spellings of --help"
  clean man "$sec" "$prog" >/dev/null 2>&1 || fail "man $sec $prog does not render"
done

step "bash completion (the installed file, the installed programs)"
clean bash "$src/tests/deb/completion_test.sh" /usr/share/bash-completion/completions/ddprun /usr/bin/ddprun /usr/bin/ddprund ||
  fail "the installed bash completion"

step "a 2-process job from /usr/bin/ddprun: a shell script"
cat >"$work/job.sh" <<'EOS'
#!/bin/sh
echo "$RANK $LOCAL_RANK $WORLD_SIZE $MASTER_PORT" >"$OUT_DIR/rank.$RANK"
EOS
chmod +x "$work/job.sh"
clean OUT_DIR="$work" timeout 120 /usr/bin/ddprun --standalone --nproc_per_node=2 --no_python "$work/job.sh" ||
  fail "ddprun --nproc_per_node=2 job.sh failed"
for r in 0 1; do
  read -r rank local_rank world port <"$work/rank.$r" 2>/dev/null || { fail "rank $r did not run"; continue; }
  [[ $rank == "$r" && $local_rank == "$r" && $world == 2 && -n $port ]] || fail "rank $r saw '$rank $local_rank $world $port'"
done

step "a 2-process job from /usr/bin/ddprun: a C++ program built against the installed library"
clean cmake -S "$src/tests/deb/consumer" -B "$work/consumer" -DCMAKE_BUILD_TYPE=Release \
  -DCMAKE_FIND_PACKAGE_NO_PACKAGE_REGISTRY=ON >"$work/consumer.log" 2>&1 ||
  fail "configuring the consumer against /usr failed: $(tail -20 "$work/consumer.log")"
grep "ddprun_worker from" "$work/consumer.log"
grep -q "ddprun_worker from /usr/lib/cmake/ddprun_worker" "$work/consumer.log" || fail "ddprun_worker was not found in /usr"
clean cmake --build "$work/consumer" -j2 >>"$work/consumer.log" 2>&1 ||
  fail "building the consumer failed: $(tail -20 "$work/consumer.log")"
if [[ -x $work/consumer/deb_consumer ]]; then
  clean timeout 120 /usr/bin/ddprun --standalone --nproc_per_node=2 --no_python "$work/consumer/deb_consumer" \
    >"$work/consumer_run.log" 2>&1 || fail "the consumer's 2-process job failed: $(tail -20 "$work/consumer_run.log")"
  grep "deb_consumer:" "$work/consumer_run.log"
  [[ $(grep -c "sum 3 (want 3)" "$work/consumer_run.log") == 2 ]] || fail "the consumer's ranks did not both sum to 3"
fi

step "the ddprund service: unit, user, /etc/ddprund"
unit=/usr/lib/systemd/system/ddprund.service
if command -v systemd-analyze >/dev/null; then
  systemd-analyze verify "$unit" || fail "systemd-analyze verify $unit"
  if sec=$(systemd-analyze security --offline=yes "$unit" 2>/dev/null); then
    level=$(sed -n 's/.*Overall exposure level for ddprund.service: \([0-9.]*\).*/\1/p' <<<"$sec")
    echo "systemd-analyze security: exposure $level (0 = fully confined, 10 = not at all)"
    [[ -n $level ]] && awk -v l="$level" 'BEGIN { exit !(l <= 2.0) }' || fail "exposure '$level' is above 2.0: $sec"
  else
    echo "systemd-analyze security --offline is not supported here (systemd < 250): exposure not measured"
  fi
else
  echo "SKIPPED systemd-analyze verify: systemd-analyze is not installed (apt-get install systemd)"
fi
for k in NoNewPrivileges=yes ProtectSystem=strict PrivateTmp=yes "User=ddprund" "MemoryMax="; do
  grep -q "^$k" "$unit" || fail "the unit lacks $k"
done
pw=$(getent passwd ddprund) || fail "postinst created no user ddprund"
IFS=: read -r _ _ uid gid _ home shell <<<"$pw"
echo "user ddprund: uid $uid gid $gid home $home shell $shell"
((uid < 1000)) || fail "ddprund is not a system user (uid $uid)"
[[ $shell == */nologin || $shell == */false ]] || fail "ddprund can log in (shell $shell)"
[[ $(stat -c '%U:%G %a' /etc/ddprund) == "root:ddprund 750" ]] || fail "/etc/ddprund is $(stat -c '%U:%G %a' /etc/ddprund), expected root:ddprund 750"

# The service's start as systemd does it: as ddprund, with /etc/default/ddprund in the
# environment (DDPRUND_PORT=0 here, so that no fixed port is needed), ExecStart, which execs
# ddprund.
exec_start=$(sed -n 's/^ExecStart=//p' "$unit")
[[ -x $exec_start ]] || fail "ExecStart $exec_start is not executable"
service() {  # service [VAR=value...]: runs ExecStart as the unit does, in the background
  svc_log=$work/service.$RANDOM
  (
    set -a
    # shellcheck disable=SC1091
    . /etc/default/ddprund
    set +a
    exec setpriv --reuid=ddprund --regid=ddprund --init-groups env "$@" DDPRUND_PORT=0 "$exec_start"
  ) >"$svc_log" 2>&1 &
  svc_pid=$!
  pids+=("$svc_pid")
}
svc_wait() {  # waits until the service listens or exits: r=listening, "exit N" or timeout
  local i
  r=timeout
  for ((i = 0; i < 200; i++)); do
    if grep -q "ddprund listening on" "$svc_log"; then
      r=listening
      return
    fi
    if ! kill -0 "$svc_pid" 2>/dev/null; then
      wait "$svc_pid"
      r="exit $?"
      return
    fi
    sleep 0.1
  done
}
svc_stop() {
  kill -TERM "$svc_pid" 2>/dev/null
  wait "$svc_pid" 2>/dev/null
}

service
svc_wait
[[ $r == "exit 2" ]] || fail "as installed, with no token file yet, the service did not refuse to start ($r): $(cat "$svc_log")"
echo "as installed (no token file yet): $r: $(head -c 300 "$svc_log")"
service DDPRUND_TOKEN_FILE=
svc_wait
[[ $r == "exit 2" ]] && grep -q "allow-open-rendezvous" "$svc_log" ||
  fail "with no token file set, the service did not refuse to start ($r): $(cat "$svc_log")"
echo "no token file set: $r: $(head -c 300 "$svc_log")"
# The token as /etc/default/ddprund says to make it.
(umask 077 && head -c 32 /dev/urandom | base64 >/etc/ddprund/rdzv-token)
chown ddprund:ddprund /etc/ddprund/rdzv-token
service
svc_wait
[[ $r == listening ]] || fail "with a token file, the service did not start ($r): $(cat "$svc_log")"
grep -q "must prove the rendezvous token" "$svc_log" || fail "with a token file, the service did not ask for the token: $(cat "$svc_log")"
echo "with /etc/ddprund/rdzv-token: $r"
svc_stop
service DDPRUND_TOKEN_FILE= DDPRUND_ALLOW_OPEN_RENDEZVOUS=yes
svc_wait
[[ $r == listening ]] || fail "with DDPRUND_ALLOW_OPEN_RENDEZVOUS=yes, the service did not start ($r): $(cat "$svc_log")"
grep -q "open to anyone" "$svc_log" || fail "the open service did not say it is open: $(cat "$svc_log")"
echo "DDPRUND_ALLOW_OPEN_RENDEZVOUS=yes: $r"
svc_stop

# ---- remove, purge --------------------------------------------------------------------------
step "dpkg -r"
dpkg -r "${packages[@]}" || fail "dpkg -r failed"
for f in /usr/bin/ddprun /usr/bin/ddprund /usr/lib/libddprun_worker.so /usr/lib/systemd/system/ddprund.service; do
  [[ -e $f ]] && fail "dpkg -r left $f"
done
[[ -f /etc/default/ddprund ]] || fail "dpkg -r removed the conffile /etc/default/ddprund (only --purge should)"
step "dpkg --purge"
dpkg --purge "${packages[@]}" || fail "dpkg --purge failed"
while read -r f; do
  [[ -e $f ]] && ! grep -qxF "$f" "$work/before" && fail "after --purge, $f is still there"
done <"$work/package_files"
getent passwd ddprund >/dev/null && fail "after --purge, the user ddprund is still there"
getent group ddprund >/dev/null && fail "after --purge, the group ddprund is still there"
for f in passwd group shadow gshadow; do
  cmp -s "$work/$f" "/etc/$f" || fail "after --purge, /etc/$f differs from before: $(diff "$work/$f" "/etc/$f")"
done
snapshot >"$work/after"
if ! diff "$work/before" "$work/after" >"$work/diff"; then
  fail "after --purge, /etc and /usr differ from before (< only before, > only after):"
  head -50 "$work/diff"
fi
echo "after --purge: /etc and /usr hold the same $(wc -l <"$work/after") paths as before"

if ((fails)); then
  echo "$fails failure(s)"
  exit 1
fi
step "the .deb: ok"
