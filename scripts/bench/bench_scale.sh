#!/usr/bin/env bash
# A job of N nodes, simulated against a real ddprund with a rendezvous token (every agent
# handshakes, every message carries a MAC): N agents and N x P PyTorch-like workers from one
# process (ddprun_scale_sim). For each N a fresh ddprund; one table row per N:
#   connect   all N agents connected and handshaken (concurrently), from the start
#   round     first JOIN -> every agent has its ROUND
#   joined    first JOIN -> every worker connected to the round's store (VALIDATE, PING, ADD init/)
#   barrier   first JOIN -> every worker past the store-based barrier (ADD, ADD 0, WAIT last_worker)
#   done      first JOIN -> every worker has the NCCL unique id (rank 0 SET, the others WAIT + GET)
#   ddprund's CPU seconds from the first JOIN to the end, its peak RSS, its longest state-lock
#   hold, and another job's GET latency on ddprund's own port meanwhile (p50/p99).
# Where the descriptor limit cannot hold N agents + N x P workers in one process (and in
# ddprund), the workers are not simulated for that N (the row says so).
#   scripts/bench/bench_scale.sh [N ...]      (default: 256 1024 4096 16000)
# STORE=agent: every agent offers a workers' store, as the agents of a standing ddprund do, and
# node rank 0's is used (up to 8,192 nodes; past that ddprund keeps the store): a second
# ddprund, listening on every address, stands for node rank 0's agent; its CPU and RSS get
# their own columns. STORE=daemon (default): the agents offer none, ddprund hosts the store.
# STORE=torch (STORE=torch-nolibuv): the same workers use PyTorch's own TCPStore server (libuv,
# or the older one), a fresh one per N, from DDPRUN_VENV (default .venv-torch2) instead of the
# round's (ddprun_scale_sim --store-at); its CPU and RSS go into the store host columns.
# Then a second table: the same N, and one node dies once every worker is through (FAILURES=0:
# not run; STORE=daemon only: a fixed store would keep the last round's keys): from its death,
# every survivor told (RESTART), every survivor's new ROUND, and the surviving workers joined,
# past the barrier and done on the new round's store.
# With FAILURES=1 (STORE=daemon) two more tables. Churn (ddprun_scale_sim --churn, CHURN_PCT, default
# 1): once every worker is through, that % of the nodes leave (half with a LEAVE, half just
# close) and as many new nodes join at once (new node ids and addresses); min_nodes N/2, max N.
# Times from the first leave. Daemon restart (--expect-restart): the workers' store on node rank
# 0 (a second ddprund stands for it, as with STORE=agent; past 8,192 nodes the store stays on
# ddprund and is lost with it, so agents only); once every worker is through, ddprund is
# SIGKILLed and started again on its port with its token; the agents reconnect (50 ms doubling
# to 500 ms) and re-join their round with its resume fields. Times from the first lost connection.
# RELAY=1: each node's workers reach the store over one multiplexed connection, as through
# `ddprun --store_relay`'s relay on their node (the local hop, worker to relay, is not
# simulated); where one process cannot hold N agents and N relay connections, the agents are
# split over several simulator processes (--part/--parts; merged by scale_merge.py).
# Environment: NPROC (8), SIM_THREADS (sim event loops, default: cores/2, at least 1),
# DDPRUND_THREADS (0: ddprund's default), DDPRUN_BUILD_DIR. Not a timed test: run and read.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
build="${DDPRUN_BUILD_DIR:-$here/build}"
ddprund="$build/rendezvous/ddprund"
sim="$build/rendezvous/ddprun_scale_sim"
[[ -x "$ddprund" && -x "$sim" ]] || { echo "build first: cmake --build build --target ddprund ddprun_scale_sim" >&2; exit 2; }
sizes=("$@")
((${#sizes[@]})) || sizes=(256 1024 4096 16000)
nproc_per="${NPROC:-8}"
cores="$(nproc)"
sim_threads="${SIM_THREADS:-$(( cores / 2 > 0 ? cores / 2 : 1 ))}"
ulimit -n "$(ulimit -Hn)"
fd_limit="$(ulimit -n)"
log="$(mktemp)"
tokdir="$(mktemp -d)"
store_log="$(mktemp)"
pid= spid=
trap 'rm -rf "$log" "$store_log" "$tokdir"; [[ -n "$pid" ]] && kill "$pid" 2>/dev/null; [[ -n "$spid" ]] && kill "$spid" 2>/dev/null || true' EXIT
store_mode="${STORE:-daemon}"
relay="${RELAY:-0}"
# PyTorch's TCPStore server looks up a name for every connection it accepts: where the resolver
# does not answer (an offline host), each lookup waits for its timeout and that, not the store,
# decides the times. So with STORE=torch* the bench runs in a network namespace of its own
# (root), where the lookup fails at once, as it answers at once where DNS works.
if [[ $store_mode == torch* && -z "${BENCH_SCALE_NETNS:-}" && $(id -u) == 0 ]] && command -v unshare ip >/dev/null; then
  exec unshare -n env BENCH_SCALE_NETNS=1 bash -c 'ip link set lo up && exec "$@"' _ "$0" "$@"
fi
if [[ $relay == 1 && $store_mode == torch* ]]; then
  echo "RELAY=1 needs a store that serves relays (STORE=daemon or agent); PyTorch's does not" >&2; exit 2
fi
case "$store_mode" in
  daemon|agent) ;;
  torch|torch-nolibuv)
    torch_py="${DDPRUN_VENV:-$here/.venv-torch2}/bin/python"
    [[ -x "$torch_py" ]] || { echo "STORE=$store_mode needs PyTorch: set DDPRUN_VENV to a venv with torch (no $torch_py)" >&2; exit 2; } ;;
  *) echo "STORE=$store_mode: use daemon, agent, torch or torch-nolibuv" >&2; exit 2 ;;
esac
token="scale-$(head -c 24 /dev/urandom | base64 | tr -d '/+=')"
(umask 077; printf '%s\n' "$token" >"$tokdir/token")
echo "# $(date -u +%FT%TZ), $cores cores, descriptor limit $fd_limit, $nproc_per workers per node, sim threads $sim_threads, workers' store: $store_mode, relay: $relay"
printf '| agents | workers | connect (ms) | round (ms) | joined (ms) | barrier (ms) | done (ms) | ddprund CPU (s) | ddprund peak RSS (MiB) | longest lock hold (ms) | other job GET p50/p99 (µs) | store host CPU (s) | store host peak RSS (MiB) |\n'
printf '|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n'
get() { sed -nE "s/.* $1=([^ ]+).*/\\1/p" <<<" $2"; }
# The agents of one job over `parts` simulator processes (each within the descriptor limit);
# part 0 measures the servers and runs the probe. Prints the merged RESULT line.
run_parts() {
  local n="$1" parts="$2" k pids=() outs=() hold; shift 2
  hold="$tokdir/hold"; rm -f "$hold"
  local threads_each=$(( sim_threads / parts > 0 ? sim_threads / parts : 1 ))
  for ((k = 0; k < parts; k++)); do
    outs+=("$tokdir/part$k")
    local mine=(--part "$k" --parts "$parts" --hold-file "$hold")
    (( k == 0 )) && mine+=(--server-pid "$pid" --probe)
    "$sim" --port "$port" --agents "$n" --nproc "$nproc_per" --token "$token" --threads "$threads_each" \
      --timeout 300 "${mine[@]}" "$@" >"$tokdir/part$k" 2>&1 &
    pids+=($!)
  done
  for _ in $(seq 6000); do
    (( $(cat "${outs[@]}" | grep -c '^RESULT') == parts )) && break
    sleep 0.05
  done
  touch "$hold"
  wait "${pids[@]}" || true
  python3 "$here/scripts/bench/scale_merge.py" "${outs[@]}" || true
}
run_row() {
  local n="$1" kill="$2" line hold workers store_cpu store_rss
  extra=()
  workers=$((n * nproc_per))
  # Descriptors: each node's agent, and its P workers (one relay connection with RELAY=1), in
  # the simulator (split over processes with RELAY=1) and in the server that hosts the store.
  local per_node=$((relay == 1 ? 1 : nproc_per)) parts=1
  if (( relay == 1 )); then
    parts=$(( (2 * n + fd_limit - 513) / (fd_limit - 512) ))
    [[ $kill == 1 ]] && parts=1
  fi
  local store_conns=$((n * per_node))
  [[ $store_mode == daemon ]] && store_conns=$((n * (per_node + 1)))
  if (( n * (per_node + 1) / parts + 256 > fd_limit || store_conns + 256 > fd_limit )); then
    extra=(--no-workers); workers="not run (descriptors)"; parts=1
  fi
  "$ddprund" --host 127.0.0.1 --port 0 --threads "${DDPRUND_THREADS:-0}" --rdzv_token_file "$tokdir/token" \
    --max-connections $((n * (nproc_per + 1) + 1024)) >"$log" 2>&1 &
  pid=$!
  for _ in $(seq 200); do grep -q listening "$log" && break; sleep 0.05; done
  port="$(grep -oE 'listening on [0-9.]+:[0-9]+' "$log" | head -n1 | sed 's/.*://')"
  if [[ $store_mode == agent && -z "${extra[*]}" ]]; then
    "$ddprund" --port 0 --threads "${DDPRUND_THREADS:-0}" --max-connections $((n * nproc_per + 1024)) >"$store_log" 2>&1 &
    spid=$!
    for _ in $(seq 200); do grep -q listening "$store_log" && break; sleep 0.05; done
    extra=(--offer-store "$(grep -oE 'listening on .*:[0-9]+' "$store_log" | head -n1 | sed 's/.*://')" --store-pid "$spid")
  fi
  if [[ $store_mode == torch* && -z "${extra[*]}" ]]; then
    torch_args=(); [[ $store_mode == torch-nolibuv ]] && torch_args=(--no-libuv)
    "$torch_py" "$here/scripts/bench/torch_store_server.py" "${torch_args[@]}" >"$store_log" 2>&1 &
    spid=$!
    for _ in $(seq 600); do grep -q listening "$store_log" && break; sleep 0.05; done
    grep -q listening "$store_log" || { echo "PyTorch's TCPStore did not start: $(tail -n3 "$store_log")" >&2; exit 1; }
    extra=(--store-at "$(grep -oE 'listening on [0-9.]+:[0-9]+' "$store_log" | head -n1 | sed 's/listening on //')" --store-pid "$spid")
  fi
  [[ $kill == 1 ]] && extra+=(--kill-one --min-nodes $(( n / 2 > 0 ? n / 2 : 1 )))
  [[ $relay == 1 && " ${extra[*]} " != *" --no-workers "* ]] && extra+=(--relay)
  if (( parts == 1 )); then
    line="$("$sim" --port "$port" --agents "$n" --nproc "$nproc_per" --token "$token" --threads "$sim_threads" \
              --server-pid "$pid" --probe --timeout 300 "${extra[@]}" || true)"
  else
    line="$(run_parts "$n" "$parts" "${extra[@]}")"
  fi
  kill "$pid"; wait "$pid" 2>/dev/null || true; pid=
  if [[ -n "$spid" ]]; then kill "$spid"; wait "$spid" 2>/dev/null || true; spid=; fi
  store_cpu= store_rss=
  if [[ " ${extra[*]} " == *" --store-pid "* ]]; then
    store_cpu="$(get store_host_cpu_s "$line")" store_rss="$(get store_host_peak_rss_mib "$line")"
  fi
  hold="$(lock_hold)"
  if [[ "$(get ok "$line")" != 1 ]]; then
    printf '| %d | %s | failed: %s |\n' "$n" "$workers" "$(tr '\n' ' ' <<<"$line" | cut -c1-200)"
    return
  fi
  if [[ $kill == 1 ]]; then
    printf '| %d | %s | %s | %s | %s | %s | %s | %s | %s | %s |\n' "$n" "$workers" "$(get round_ms "$line")" \
      "$(get kill_restart_ms "$line")" "$(get kill_round_ms "$line")" "$(get kill_joined_ms "$line")" \
      "$(get kill_barrier_ms "$line")" "$(get kill_done_ms "$line")" "$(get server_cpu_s "$line")" "${hold:--}"
    return
  fi
  printf '| %d | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s/%s | %s | %s |\n' "$n" "$workers" "$(get connect_ms "$line")" \
    "$(get round_ms "$line")" "$(get workers_joined_ms "$line")" "$(get barrier_ms "$line")" "$(get done_ms "$line")" \
    "$(get server_cpu_s "$line")" "$(get server_peak_rss_mib "$line")" "${hold:--}" \
    "$(get probe_p50_us "$line")" "$(get probe_p99_us "$line")" "${store_cpu:--}" "${store_rss:--}"
}
# A fresh ddprund (sets pid and port; on `want_port` when given, else any free one).
start_ddprund() {
  local n="$1" want_port="${2:-0}"
  "$ddprund" --host 127.0.0.1 --port "$want_port" --threads "${DDPRUND_THREADS:-0}" --rdzv_token_file "$tokdir/token" \
    --max-connections $((n * (nproc_per + 1) + 1024)) >"$log" 2>&1 &
  pid=$!
  for _ in $(seq 200); do grep -q listening "$log" && break; kill -0 "$pid" 2>/dev/null || break; sleep 0.05; done
  port="$(grep -oE 'listening on [0-9.]+:[0-9]+' "$log" | head -n1 | sed 's/.*://' || true)"
}
# ddprund's longest state-lock hold and what held it: "12.9 (round completion)".
lock_hold() { sed -nE 's/.*longest lock hold ([0-9.]+) ms \(([^,;)]+).*/\1 (\2)/p; t; s/.*longest lock hold ([0-9.]+) ms.*/\1/p' "$log" | tail -n1; }
churn_row() {
  local n="$1" line extra=() workers=$((n * nproc_per))
  (( n * (nproc_per + 1) * 11 / 10 + 256 > fd_limit )) && { extra=(--no-workers); workers="not run (descriptors)"; }
  [[ $relay == 1 && -z "${extra[*]}" ]] && extra=(--relay)
  start_ddprund "$n"
  line="$("$sim" --port "$port" --agents "$n" --nproc "$nproc_per" --token "$token" --threads "$sim_threads" \
            --server-pid "$pid" --timeout 300 --churn "${CHURN_PCT:-1}" --min-nodes $(( n / 2 > 0 ? n / 2 : 1 )) \
            "${extra[@]}" || true)"
  kill "$pid"; wait "$pid" 2>/dev/null || true; pid=
  if [[ "$(get ok "$line")" != 1 ]]; then
    printf '| %d | %s | failed: %s |\n' "$n" "$workers" "$(tr '\n' ' ' <<<"$line" | cut -c1-200)"; return
  fi
  printf '| %d | %s | %s/%s | %s | %s | %s | %s | %s | %s | %s |\n' "$n" "$workers" "$(get churn_left "$line")" \
    "$(get churn_joined "$line")" "$(get churn_rounds "$line")" "$(get churn_restart_ms "$line")" \
    "$(get churn_round_ms "$line")" "$(get churn_done_ms "$line")" "$(get churn_restart_count "$line")" \
    "$(get server_cpu_s "$line")" "$(lock_hold)"
}
restart_row() {
  local n="$1" line extra=() workers=$((n * nproc_per)) ready="$tokdir/ready-for-kill" simpid out="$tokdir/restart.out"
  rm -f "$ready"
  if (( n > 8192 || n * (nproc_per + 1) + 256 > fd_limit )); then
    extra=(--no-workers); workers="not run (store on ddprund past 8,192 nodes, or descriptors)"
  else
    "$ddprund" --port 0 --threads "${DDPRUND_THREADS:-0}" --max-connections $((n * nproc_per + 1024)) >"$store_log" 2>&1 &
    spid=$!
    for _ in $(seq 200); do grep -q listening "$store_log" && break; sleep 0.05; done
    extra=(--offer-store "$(grep -oE 'listening on .*:[0-9]+' "$store_log" | head -n1 | sed 's/.*://')")
  fi
  [[ $relay == 1 && " ${extra[*]} " != *" --no-workers "* ]] && extra+=(--relay)
  start_ddprund "$n"
  "$sim" --port "$port" --agents "$n" --nproc "$nproc_per" --token "$token" --threads "$sim_threads" --timeout 300 \
    --expect-restart --ready-file "$ready" "${extra[@]}" >"$out" 2>&1 &
  simpid=$!
  while [[ ! -e $ready ]] && kill -0 "$simpid" 2>/dev/null; do sleep 0.02; done
  if [[ -e $ready ]]; then
    kill -9 "$pid"; wait "$pid" 2>/dev/null || true
    for _ in $(seq 100); do start_ddprund "$n" "$port"; [[ -n $port ]] && break; wait "$pid" 2>/dev/null || true; sleep 0.1; done
  fi
  wait "$simpid" || true
  line="$(grep '^RESULT' "$out" || tail -n3 "$out")"
  kill "$pid" 2>/dev/null; wait "$pid" 2>/dev/null || true; pid=
  if [[ -n "$spid" ]]; then kill "$spid"; wait "$spid" 2>/dev/null || true; spid=; fi
  if [[ "$(get ok "$line")" != 1 ]]; then
    printf '| %d | %s | failed: %s |\n' "$n" "$workers" "$(tr '\n' ' ' <<<"$line" | cut -c1-200)"; return
  fi
  printf '| %d | %s | %s | %s | %s | %s | %s |\n' "$n" "$workers" "$(get restart_attempts "$line")" \
    "$(get restart_rejoin_ms "$line")" "$(get restart_resumed_ms "$line")" "$(get restarts "$line")" \
    "$(grep -c 'rebuilt from its agents' "$log" || true)"
}
for n in "${sizes[@]}"; do run_row "$n" 0; done
# One node of N dies once every worker is through (ddprun_scale_sim --kill-one): its agent's
# and workers' connections close, no LEAVE; min_nodes is N/2, so the job goes on without it.
if [[ ${FAILURES:-1} == 1 && $store_mode == daemon ]]; then
  echo
  echo "# one node of N dies (no LEAVE); times from its death"
  printf '| agents | workers | first round (ms) | every survivor told (ms) | every survivor'"'"'s new ROUND (ms) | joined (ms) | barrier (ms) | done (ms) | ddprund CPU, both rounds (s) | longest lock hold (ms) |\n'
  printf '|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n'
  for n in "${sizes[@]}"; do run_row "$n" 1; done
fi
if [[ ${FAILURES:-1} == 1 && $store_mode == daemon ]]; then
  echo
  echo "# ${CHURN_PCT:-1} % of N nodes leave and as many new ones join; times from the first leave"
  printf '| agents | workers | left/joined | rounds formed | last RESTART (ms) | every node'"'"'s last ROUND (ms) | done (ms) | restarts spent | ddprund CPU, all rounds (s) | longest lock hold (ms) |\n'
  printf '|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n'
  for n in "${sizes[@]}"; do churn_row "$n"; done
  echo
  echo "# ddprund SIGKILLed and started again once every worker is through; times from the first lost connection"
  printf '| agents | workers | reconnect attempts | every agent re-joined (ms) | round whole again: every JOB_DONE (ms) | RESTARTs | rounds rebuilt (log) |\n'
  printf '|---:|---:|---:|---:|---:|---:|---:|\n'
  for n in "${sizes[@]}"; do restart_row "$n"; done
fi
