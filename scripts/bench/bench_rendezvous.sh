#!/usr/bin/env bash
# Rendezvous at scale: one process simulating N agents joining one round against ddprund.
# For each N, a fresh ddprund; reports connect time, round time (first JOIN sent -> last
# ROUND received) and the daemon's peak memory (VmHWM). Not a timed test: run and read.
#   scripts/bench/bench_rendezvous.sh [--token] [N ...]      (default: 64 1024 8192)
# --token: each N twice, side by side: an open rendezvous, and one with a token (the handshake
# in the connect time; every JOIN and ROUND carrying a MAC, checked at both ends).
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
build="${DDPRUN_BUILD_DIR:-$here/build}"
ddprund="$build/rendezvous/ddprund"
bench="$build/rendezvous/ddprun_rdzv_bench"
[[ -x "$ddprund" && -x "$bench" ]] || { echo "build first: scripts/build.sh" >&2; exit 2; }
modes=(open)
if [[ "${1:-}" == --token ]]; then modes=(open token); shift; fi
sizes=("$@")
((${#sizes[@]})) || sizes=(64 1024 8192)
ulimit -n "$(ulimit -Hn)"
out="$(mktemp)"
tokdir="$(mktemp -d)"
trap 'rm -rf "$out" "$tokdir"; [[ -n "${pid:-}" ]] && kill "$pid" 2>/dev/null || true' EXIT
token="bench-$(head -c 24 /dev/urandom | base64 | tr -d '/+=')"
(umask 077; printf '%s\n' "$token" >"$tokdir/token")
printf '| agents | rendezvous | connect (ms) | round (ms) | ddprund peak RSS (MB) |\n|---:|:---|---:|---:|---:|\n'
for n in "${sizes[@]}"; do
for mode in "${modes[@]}"; do
  daemon_args=() bench_args=()
  if [[ $mode == token ]]; then daemon_args=(--rdzv_token_file "$tokdir/token"); bench_args=(--token "$token"); fi
  "$ddprund" --host 127.0.0.1 --port 0 --log-level warn "${daemon_args[@]}" >"$out" 2>&1 &
  pid=$!
  for _ in $(seq 100); do grep -q listening "$out" && break; sleep 0.05; done
  port="$(grep -o '[0-9]*$' "$out" | head -n1)"
  line="$("$bench" --host 127.0.0.1 --port "$port" --agents "$n" "${bench_args[@]}")"
  hwm_kb="$(awk '/VmHWM/ {print $2}' "/proc/$pid/status")"
  kill "$pid"; wait "$pid" 2>/dev/null || true; pid=
  connect="$(sed -E 's/.*connect_ms=([0-9.]+).*/\1/' <<<"$line")"
  round="$(sed -E 's/.*round_ms=([0-9.]+).*/\1/' <<<"$line")"
  printf '| %d | %s | %s | %s | %.1f |\n' "$n" "$mode" "$connect" "$round" "$(awk -v k="$hwm_kb" 'BEGIN { print k / 1024 }')"
done
done
