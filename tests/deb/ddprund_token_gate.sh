#!/usr/bin/env bash
# ddprund --allow-open-rendezvous (ddprund.service passes it from /etc/default/ddprund):
# "no" refuses to start without a token, with a message that says what to do; a token file or
# DDPRUN_RDZV_TOKEN lets it start; "yes", the default, starts open as before. And --version.
#   ddprund_token_gate.sh DDPRUND EXPECTED_VERSION
set -uo pipefail
ddprund=$1 version=$2
tmp=$(mktemp -d)
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill -KILL "$p" 2>/dev/null; done
  rm -rf "$tmp"
}
trap cleanup EXIT
fails=0
fail() { echo "FAIL: $*"; fails=$((fails + 1)); }
unset DDPRUN_RDZV_TOKEN

# Starts ddprund with the given arguments, waits for its "listening" line, stops it with SIGTERM;
# fails unless it listened and then exited 0.
starts() {
  local what=$1 log pid i
  shift
  log=$tmp/log.$RANDOM
  "$@" >"$log" 2>&1 &
  pid=$!
  pids+=("$pid")
  for ((i = 0; i < 200; i++)); do
    grep -q "ddprund listening on" "$log" && break
    kill -0 "$pid" 2>/dev/null || break
    sleep 0.1
  done
  if ! grep -q "ddprund listening on" "$log"; then
    fail "$what: ddprund did not start: $(cat "$log")"
    kill -KILL "$pid" 2>/dev/null
    return
  fi
  kill -TERM "$pid"
  wait "$pid" || fail "$what: ddprund exited $? on SIGTERM"
  echo "ok: $what"
}

# Refuses: exit 2 and one message naming the ways out.
refuses() {
  local what=$1 out rc
  shift
  out=$(timeout 30 "$@" 2>&1)
  rc=$?
  [[ $rc == 2 ]] || fail "$what: exit $rc, expected 2 (output: $out)"
  [[ $out == *"--rdzv-token-file"* && $out == *"DDPRUN_RDZV_TOKEN"* && $out == *"--allow-open-rendezvous=yes"* ]] ||
    fail "$what: the message does not say what to do: $out"
  [[ $out != *"listening"* ]] || fail "$what: it listened: $out"
  echo "ok: $what"
}

refuses "no token, --allow-open-rendezvous=no" "$ddprund" --port=0 --allow-open-rendezvous=no
refuses "an empty DDPRUN_RDZV_TOKEN, --allow-open-rendezvous=no" env DDPRUN_RDZV_TOKEN= "$ddprund" --port=0 --allow-open-rendezvous=no

(umask 077 && head -c 32 /dev/urandom | base64 >"$tmp/token")
starts "a token file, --allow-open-rendezvous=no" "$ddprund" --port=0 --rdzv-token-file="$tmp/token" --allow-open-rendezvous=no
starts "DDPRUN_RDZV_TOKEN, --allow-open-rendezvous=no" env DDPRUN_RDZV_TOKEN=0123456789abcdef0123 "$ddprund" --port=0 --allow-open-rendezvous=no
starts "no token, --allow-open-rendezvous=yes" "$ddprund" --port=0 --allow-open-rendezvous=yes
starts "no token, the default (open, as before)" "$ddprund" --port=0

# A bad token file is still refused by its own check, whatever --allow-open-rendezvous says.
out=$(timeout 30 "$ddprund" --port=0 --rdzv-token-file="$tmp/absent" --allow-open-rendezvous=yes 2>&1)
rc=$?
[[ $rc == 2 && $out == *"cannot open it"* ]] || fail "a missing token file: exit $rc: $out"
out=$(timeout 30 "$ddprund" --port=0 --allow-open-rendezvous=maybe 2>&1)
rc=$?
[[ $rc != 0 && $out == *"allow-open-rendezvous"* ]] || fail "--allow-open-rendezvous=maybe: exit $rc: $out"

out=$("$ddprund" --version)
[[ $out == "ddprund $version" ]] || fail "--version printed '$out', expected 'ddprund $version'"

if ((fails)); then
  echo "$fails failure(s)"
  exit 1
fi
echo "ddprund token gate: ok"
