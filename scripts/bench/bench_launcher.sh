#!/usr/bin/env bash
# Launcher overhead, side by side in one run on this machine:
#   ddprun --nproc_per_node=2 --no_python true
#   torchrun 1.13 (Debian: /usr/bin/python3 -m torch.distributed.run; it needs --redirects 1
#     --tee 1 --log_dir on Python 3.11) with --monitor_interval 0.1
#   torchrun 2.11 (the venv's python, when present) with --monitor_interval 0.1
# Reports the median wall time of N runs, the launcher's peak RSS (/usr/bin/time %M: the
# largest of the launcher and its reaped children) and ratios; then restart latency: a worker
# SIGKILLs itself on attempt 0 -> the time until every replacement worker has started.
# With DDPRUN_BEFORE=<another ddprun> it also measures that binary ("ddprun-before"), its runs
# interleaved one by one with ddprun's (launch and restart), to compare two builds in one run;
# NO_TORCHRUN=1 skips the torchrun rows.
#   usage: scripts/bench/bench_launcher.sh [build-dir]      (env N=10 N_TORCH=5 RESTART_N=5)
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
build="${1:-$here/build}"
DDPRUN="${DDPRUN:-$build/launcher/ddprun}"
VENV_PY="${DDPRUN_VENV:-$here/.venv-torch2}/bin/python"
N="${N:-10}"
N_TORCH="${N_TORCH:-5}"
RESTART_N="${RESTART_N:-5}"
TIME=/usr/bin/time
[[ -x "$DDPRUN" ]] || { echo "no ddprun at $DDPRUN (build first: cmake --build $build --target ddprun)"; exit 1; }
[[ -x "$TIME" ]] || { echo "needs GNU time at $TIME (apt-get install time)"; exit 1; }
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT

median() { sort -n | awk '{a[NR]=$1} END {if (NR%2) print a[(NR+1)/2]; else print (a[NR/2]+a[NR/2+1])/2}'; }

# bench NAME RUNS CMD...: fills WALL_MS[NAME], RSS_KB[NAME]
declare -A WALL_MS RSS_KB
bench() {
  local name="$1" runs="$2"; shift 2
  local walls=() rsss=() i t0 t1 rc
  for ((i = 0; i < runs; i++)); do
    before_run "$name" "$@"
    t0=$(date +%s%N)
    rc=0
    "$TIME" -f %M -o "$tmp/rss" "$@" >/dev/null 2>"$tmp/err" || rc=$?
    t1=$(date +%s%N)
    if ((rc != 0)); then echo "$name failed (exit $rc):"; tail -5 "$tmp/err"; return 1; fi
    walls+=($(( (t1 - t0) / 1000 )))
    rsss+=($(tail -1 "$tmp/rss"))
  done
  WALL_MS[$name]=$(printf '%s\n' "${walls[@]}" | median | awk '{printf "%.1f", $1/1000}')
  RSS_KB[$name]=$(printf '%s\n' "${rsss[@]}" | sort -n | tail -1)
}

# Interleaving with DDPRUN_BEFORE: before each run of ddprun, one run of the other binary with
# the same arguments (its walls, RSS and restart latencies go to BEFORE_*).
BEFORE_WALLS=() BEFORE_RSS=() BEFORE_LAT=()
before_run() {
  [[ -n "${DDPRUN_BEFORE:-}" && "$1" == ddprun && "$2" == "$DDPRUN" ]] || return 0
  shift 2
  local t0 t1
  t0=$(date +%s%N)
  "$TIME" -f %M -o "$tmp/rss.before" "$DDPRUN_BEFORE" "$@" >/dev/null 2>"$tmp/err.before" ||
    { echo "ddprun-before failed:"; tail -5 "$tmp/err.before"; exit 1; }
  t1=$(date +%s%N)
  BEFORE_WALLS+=($(( (t1 - t0) / 1000 )))
  BEFORE_RSS+=($(tail -1 "$tmp/rss.before"))
}

echo "# launcher overhead: --nproc_per_node=2 --no_python true ($(nproc) cores, $(date -u +%F))"
names=(ddprun)
bench ddprun "$N" "$DDPRUN" --nproc_per_node=2 --no_python true
if [[ -n "${DDPRUN_BEFORE:-}" ]]; then
  WALL_MS[ddprun-before]=$(printf '%s\n' "${BEFORE_WALLS[@]}" | median | awk '{printf "%.1f", $1/1000}')
  RSS_KB[ddprun-before]=$(printf '%s\n' "${BEFORE_RSS[@]}" | sort -n | tail -1)
  names+=(ddprun-before)
fi
if [[ -n "${NO_TORCHRUN:-}" ]]; then
  echo "(NO_TORCHRUN: torchrun skipped)"
elif /usr/bin/python3 -c "import torch" 2>/dev/null; then
  bench "torchrun-1.13" "$N_TORCH" /usr/bin/python3 -m torch.distributed.run --redirects 1 --tee 1 \
    --log_dir "$tmp/logs113" --monitor_interval 0.1 --nproc_per_node=2 --no_python true && names+=("torchrun-1.13")
else
  echo "(no torch on /usr/bin/python3: torchrun 1.13 skipped)"
fi
if [[ -n "${NO_TORCHRUN:-}" ]]; then
  :
elif [[ -x "$VENV_PY" ]]; then
  bench "torchrun-2.11" "$N_TORCH" "$VENV_PY" -m torch.distributed.run --monitor_interval 0.1 \
    --nproc_per_node=2 --no_python true && names+=("torchrun-2.11")
else
  echo "(no $VENV_PY: torchrun 2.11 skipped)"
fi

printf '\n| launcher | median wall (ms) | peak RSS (MB) | wall vs ddprun | RSS vs ddprun |\n|---|---|---|---|---|\n'
for n in "${names[@]}"; do
  awk -v n="$n" -v w="${WALL_MS[$n]}" -v r="${RSS_KB[$n]}" -v w0="${WALL_MS[ddprun]}" -v r0="${RSS_KB[ddprun]}" \
    'BEGIN {printf "| %s | %.1f | %.1f | %.1fx | %.1fx |\n", n, w, r/1024, w/w0, r/r0}'
done

# ---- restart latency ----
cat > "$tmp/worker.sh" <<'SH'
#!/bin/sh
# $1: file for timestamps. Attempt 0: rank 1 SIGKILLs itself, the others wait to be stopped.
now=$(date +%s%N)
if [ "$TORCHELASTIC_RESTART_COUNT" = 0 ]; then
  if [ "$RANK" = 1 ]; then echo "kill $now" >> "$1"; kill -KILL $$; fi
  exec sleep 60
fi
echo "start $now" >> "$1"
SH
chmod +x "$tmp/worker.sh"
# restart_latency NAME CMD...: the command gets the timestamp file as its last argument
declare -A RESTART_MS
restart_latency() {
  local name="$1"; shift
  local lat=() i f
  for ((i = 0; i < RESTART_N; i++)); do
    if [[ -n "${DDPRUN_BEFORE:-}" && "$name" == ddprun ]]; then
      f="$tmp/ts.before.$i"; : > "$f"
      "$DDPRUN_BEFORE" "${@:2}" "$tmp/worker.sh" "$f" >/dev/null 2>"$tmp/err" || { echo "ddprun-before restart run failed:"; tail -5 "$tmp/err"; return 1; }
      BEFORE_LAT+=($(awk '$1=="kill"{k=$2} $1=="start"{if ($2>s) s=$2} END {printf "%d", (s-k)/1000}' "$f"))
    fi
    f="$tmp/ts.$name.$i"; : > "$f"
    "$@" "$tmp/worker.sh" "$f" >/dev/null 2>"$tmp/err" || { echo "$name restart run failed:"; tail -5 "$tmp/err"; return 1; }
    lat+=($(awk '$1=="kill"{k=$2} $1=="start"{if ($2>s) s=$2} END {printf "%d", (s-k)/1000}' "$f"))
  done
  RESTART_MS[$name]=$(printf '%s\n' "${lat[@]}" | median | awk '{printf "%.1f", $1/1000}')
}
echo
echo "# restart latency: worker SIGKILLed on attempt 0 -> all 2 replacement workers started (median of $RESTART_N)"
rnames=(ddprun)
restart_latency ddprun "$DDPRUN" --nproc_per_node=2 --max_restarts=1 --no_python
if [[ -n "${DDPRUN_BEFORE:-}" ]]; then
  RESTART_MS[ddprun-before]=$(printf '%s\n' "${BEFORE_LAT[@]}" | median | awk '{printf "%.1f", $1/1000}')
  rnames+=(ddprun-before)
fi
if [[ " ${names[*]} " == *" torchrun-1.13 "* ]]; then
  restart_latency "torchrun-1.13" /usr/bin/python3 -m torch.distributed.run --redirects 1 --tee 1 \
    --log_dir "$tmp/rlogs113" --monitor_interval 0.1 --nproc_per_node=2 --max_restarts=1 --no_python && rnames+=("torchrun-1.13")
fi
if [[ " ${names[*]} " == *" torchrun-2.11 "* ]]; then
  restart_latency "torchrun-2.11" "$VENV_PY" -m torch.distributed.run --monitor_interval 0.1 \
    --nproc_per_node=2 --max_restarts=1 --no_python && rnames+=("torchrun-2.11")
fi
printf '\n| launcher | restart latency (ms) | vs ddprun |\n|---|---|---|\n'
for n in "${rnames[@]}"; do
  awk -v n="$n" -v w="${RESTART_MS[$n]}" -v w0="${RESTART_MS[ddprun]}" \
    'BEGIN {printf "| %s | %.1f | %.1fx |\n", n, w, w/w0}'
done
