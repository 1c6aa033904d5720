#!/usr/bin/env bash
# CPU benchmark, one run: ddprun's `train` vs a PyTorch gloo DDP script of the same model under
# torchrun (torch 2.11 from the repository's .venv-torch2), 1024-wide x 4 hidden layers (4.2 M
# params), batch 64 per rank, fp32, one thread per rank, at 1 and 2 ranks.
# Each configuration runs REPEAT times, interleaved, and the fastest run counts (the host is
# shared; the minimum is the least disturbed measurement).
#   usage: scripts/bench/bench_train_cpu.sh [build-dir]   (env STEPS=40 REPEAT=3 WIDTH=1024 DEPTH=4 BATCH=64)
# TORCH_ARGS adds flags to every PyTorch run, e.g. TORCH_ARGS=--tuned (gradient_as_bucket_view,
# static_graph, gradients zeroed in place) instead of DDP's defaults.
# TRAIN_ARGS adds flags to every `train` run, e.g. TRAIN_ARGS=--fused-step=0 for the unfused step,
# TRAIN_ARGS="--progress thread" for the communication thread instead of auto's pick. The report ends
# with train's per-phase lines of every run (phase_ms: wall/CPU time per phase and rank).
# PY=python (default .venv-torch2/bin/python: torch 2.11 with its own optimised BLAS, the speed
# anchor; Debian's /usr/bin/python3 has torch 1.13 on netlib BLAS, for wire compatibility only
# and never an anchor) runs the PyTorch side; CPUS=0,1
# pins every process of the run to those cores (taskset), e.g. two idle cores of a big host.
# SAMETIME=1 with CPUS=a,b,c (three cores): the 1-rank and the 2-rank run of each implementation
# run AT THE SAME MOMENT, the 1-rank one on one core, the 2-rank one on the other two (roles
# rotate over the three cores from run to run), so both see the same host speed: on a shared machine
# whose speed drifts by more than the target's margin between runs a few seconds apart, this is the
# weak-scaling figure that drift does not decide. The 1-rank run gets more steps, scaled by the
# previous run's step-time ratio, so that the two runs cover about the same wall-clock window.
# ours first (both runs), then PyTorch's (both runs), each round.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
build="${1:-$here/build}"
train="$build/worker_runtime/train"; ddprun="$build/launcher/ddprun"
STEPS="${STEPS:-40}"; REPEAT="${REPEAT:-3}"; WIDTH="${WIDTH:-1024}"; DEPTH="${DEPTH:-4}"; BATCH="${BATCH:-64}"; WARMUP=5
[[ -x "$train" ]] || { echo "build train first: cmake --build $build --target train"; exit 1; }
tmp="$(mktemp -d /tmp/ddprun-bench-XXXXXX)"; trap 'kill $(jobs -p) 2>/dev/null; rm -rf "$tmp"' EXIT  # a failed run's same-moment partner too
export OMP_NUM_THREADS=1 MKL_NUM_THREADS=1
PY="${PY:-$here/.venv-torch2/bin/python}"
PY="$(command -v "$PY" || echo "$PY")"  # PY=python3 (a name on PATH) works too, as the docs' commands use it
[[ -x "$PY" ]] || { echo "no $PY: run scripts/setup_deps.sh (or set PY=a python with torch 2.x)"; exit 1; }
# The anchor, named in the output: which torch, from where, with which BLAS.
anchor="$("$PY" - <<'PY' 2>/dev/null || echo "torch ? ($PY)"
import re, sys, torch
blas = re.findall(r"BLAS_INFO=([^,\s]+)", torch.__config__.show())
print("torch %s (%s, BLAS %s)" % (torch.__version__, sys.executable, blas[0] if blas else "?"))
PY
)"
pin=(); if [[ -n "${CPUS:-}" ]]; then pin=(taskset -c "$CPUS"); fi
if [[ "${SAMETIME:-0}" == 1 ]]; then
  IFS=, read -ra cores <<<"${CPUS:-}"
  if (( ${#cores[@]} != 3 )); then
    echo "SAMETIME=1 needs CPUS with exactly three cores (one for the 1-rank run, two for the 2-rank run), e.g. CPUS=2,3,4; got '${CPUS:-}'" >&2
    exit 2
  fi
fi
free_port() { PYTHONPATH="$here/scripts/bench" python3 -c 'import benchlib; print(benchlib.free_port())'; }

# The run's avg_step_ms, or a failure that shows the end of the run's log (a run that failed
# must not turn into an empty figure).
step_of() {  # log what
  local v; v="$(grep -o 'avg_step_ms=[0-9.]*' "$1" | tail -1 | cut -d= -f2 || true)"
  if [[ -z "$v" ]]; then echo "bench_train_cpu: $2 printed no avg_step_ms; the end of its log:" >&2; tail -20 "$1" >&2; return 1; fi
  echo "$v"
}
ours() {  # nproc [steps [cores]] -> avg ms/step
  local n="$1" steps="${2:-$STEPS}"; local samples=$(( BATCH * n * (steps + WARMUP) )); local log="$tmp/ours$1.log"
  local pin=("${pin[@]}"); if [[ -n "${3:-}" ]]; then pin=(taskset -c "$3"); fi
  local args=(--profile --device cpu --width "$WIDTH" --depth "$DEPTH" --batch "$BATCH" --samples "$samples" --epochs 1
              --warmup-steps "$WARMUP" --threads 1 ${TRAIN_ARGS:-})
  if [[ -x "$ddprun" ]]; then
    "${pin[@]}" "$ddprun" --nproc_per_node="$n" --master_port="$(free_port)" "$train" "${args[@]}" >"$log" 2>&1 || true
  else  # no launcher built: set the worker environment by hand
    local port; port="$(free_port)"; local pids=()
    for ((r = 0; r < n; r++)); do
      RANK=$r WORLD_SIZE=$n LOCAL_RANK=$r LOCAL_WORLD_SIZE=$n MASTER_ADDR=127.0.0.1 MASTER_PORT=$port \
        "${pin[@]}" "$train" "${args[@]}" >>"$log" 2>&1 & pids+=($!)
    done
    wait "${pids[@]}" || true
  fi
  # train's per-phase lines (wall/CPU per rank) and overlap line, kept for the end of the report
  { echo "$n rank(s)${3:+ on cores $3}:"; grep -E 'phase_ms|overlap_' "$log" | sed 's/^\[r[0-9]*\]: //; s/ (wall\/cpu.*//' || true; } >>"$tmp/phases$n.txt"
  # the model's own CPU time per step (forward + backward outside the reducer), mean over ranks
  { grep -o 'model_cpu=[0-9.]*' "$log" | cut -d= -f2 | awk '{s += $1} END {if (NR) printf "%.3f\n", s / NR; else print "nan"}' || true; } >>"$tmp/model_cpu$n"
  { grep -o 'gemm=[a-z]* blas_core=[A-Za-z0-9]*' "$log" | head -1 || true; } >>"$tmp/gemm$n"  # which GEMM `auto` took
  step_of "$log" "ddprun train, $n rank(s)"
}
theirs() {  # nproc [steps [cores]] -> avg ms/step
  local n="$1" steps="${2:-$STEPS}"; local log="$tmp/torch$1.log"
  local pin=("${pin[@]}"); if [[ -n "${3:-}" ]]; then pin=(taskset -c "$3"); fi
  "${pin[@]}" "$PY" -m torch.distributed.run --redirects 1 --tee 1 --log_dir "$tmp/tlogs$n" --nproc_per_node="$n" \
    --master_port="$(free_port)" "$here/scripts/bench/bench_worker_ddp.py" --width "$WIDTH" --depth "$DEPTH" \
    --batch "$BATCH" --steps "$steps" --warmup "$WARMUP" --threads 1 ${TORCH_ARGS:-} >"$log" 2>&1 || true
  step_of "$log" "PyTorch DDP, $n rank(s)"
}

echo "model: ${WIDTH}x${DEPTH} hidden${TRAIN_ARGS:+, train $TRAIN_ARGS}, batch $BATCH/rank, fp32, 1 thread/rank, $STEPS timed steps; $(getconf _NPROCESSORS_ONLN) cores${CPUS:+, pinned to cores $CPUS}${SAMETIME:+ (1 and 2 ranks at the same moment)}"
echo "anchor: PyTorch DDP (gloo) on $anchor"
o1=(); o2=(); t1=(); t2=()
flush_phases() { for n in 1 2; do [[ -f "$tmp/phases$n.txt" ]] && cat "$tmp/phases$n.txt" >>"$tmp/phases.txt"; rm -f "$tmp/phases$n.txt"; done; }
if [[ "${SAMETIME:-0}" == 1 ]]; then
  # Steps of the 1-rank run per step of the 2-rank run, from the previous round (start: typical).
  so=1.3; st=2.2
  scale() { awk -v s="$STEPS" -v r="$1" 'BEGIN { r = (r < 1) ? 1 : (r > 4 ? 4 : r); printf "%d", s * r + 0.5 }'; }
  for ((i = 0; i < REPEAT; i++)); do
    a="${cores[i % 3]}"; b="${cores[(i + 1) % 3]},${cores[(i + 2) % 3]}"
    ours 1 "$(scale "$so")" "$a" >"$tmp/r1" & p1=$!; ours 2 "$STEPS" "$b" >"$tmp/r2" & p2=$!
    wait "$p1" || exit 1; wait "$p2" || exit 1; o1+=("$(cat "$tmp/r1")"); o2+=("$(cat "$tmp/r2")")
    theirs 1 "$(scale "$st")" "$a" >"$tmp/r1" & p1=$!; theirs 2 "$STEPS" "$b" >"$tmp/r2" & p2=$!
    wait "$p1" || exit 1; wait "$p2" || exit 1; t1+=("$(cat "$tmp/r1")"); t2+=("$(cat "$tmp/r2")")
    so="$(awk -v a="${o1[-1]}" -v b="${o2[-1]}" 'BEGIN { print (a > 0) ? b / a : 1.3 }')"
    st="$(awk -v a="${t1[-1]}" -v b="${t2[-1]}" 'BEGIN { print (a > 0) ? b / a : 2.2 }')"
    echo "run $((i + 1)) (1 rank on core $a, 2 ranks on cores $b, at the same moment): ours ${o1[-1]} / ${o2[-1]} ms, torch ${t1[-1]} / ${t2[-1]} ms (1 / 2 ranks)"
    echo "-- run $((i + 1)) --" >>"$tmp/phases.txt"; flush_phases
  done
else
  for ((i = 0; i < REPEAT; i++)); do
    o1+=("$(ours 1)"); o2+=("$(ours 2)"); t1+=("$(theirs 1)"); t2+=("$(theirs 2)")
    echo "run $((i + 1)): ours ${o1[-1]} / ${o2[-1]} ms, torch ${t1[-1]} / ${t2[-1]} ms (1 / 2 ranks)"
    echo "-- run $((i + 1)) --" >>"$tmp/phases.txt"; flush_phases
  done
fi
"$PY" - "${o1[*]}" "${o2[*]}" "${t1[*]}" "${t2[*]}" "$(cat "$tmp/model_cpu1")" "$(cat "$tmp/model_cpu2")" <<'PY'
import math, statistics, sys
runs = [list(map(float, a.split())) for a in sys.argv[1:5]]
mc1, mc2 = (list(map(float, a.split())) for a in sys.argv[5:7])
o1, o2, t1, t2 = (min(r) for r in runs)
print(f"{'best of runs':15}{'1 rank ms':>11}{'2 ranks ms':>12}{'weak-scaling eff':>18}")
print(f"{'ddprun train':15}{o1:11.2f}{o2:12.2f}{o1 / o2:17.1%}")
print(f"{'torch DDP':15}{t1:11.2f}{t2:12.2f}{t1 / t2:17.1%}")
print(f"ratio ours/torch: 1 rank {o1 / t1:.3f}, 2 ranks {o2 / t2:.3f}  (target <= 0.9; 2-rank efficiency target >= 90%)")
# The same runs paired as they were interleaved (1 rank, then 2 ranks, back to back): less
# sensitive to the host drifting between runs than two separate minima.
pair = lambda a, b: statistics.median(x / y for x, y in zip(a, b))
print(f"median of the runs' own 1-rank/2-rank ratios: ddprun {pair(runs[0], runs[1]):.1%}, torch {pair(runs[2], runs[3]):.1%}")
rng = lambda a, b: f"{min(x / y for x, y in zip(a, b)):.1%}-{max(x / y for x, y in zip(a, b)):.1%}"
print(f"  range of the runs' own ratios: ddprun {rng(runs[0], runs[1])}, torch {rng(runs[2], runs[3])}")
# The host's speed drifts between runs (on the H200 machine the model's own forward+backward CPU
# time, no communication in it, moved 25-42 ms within one command): each run's step divided by
# its model CPU time (model_cpu: forward + backward outside the reducer, mean over ranks)
# leaves what DDP adds per unit of compute. Also removes a real cost (2 busy cores computing
# slower than 1, e.g. a shared L3): a diagnostic beside the wall figures, not a replacement.
norm = [(a / c) / (b / d) for a, b, c, d in zip(runs[0], runs[1], mc1, mc2) if c > 0 and d > 0]
if norm and not any(math.isnan(x) for x in norm):
    print(f"ddprun, step per model-CPU ms, 1 rank / 2 ranks (compute-normalised efficiency): median {statistics.median(norm):.1%}, "
          f"runs {' '.join(f'{x:.1%}' for x in norm)}")
PY
# Where each run's time went, per rank: forward/backward/after_backward as wall/CPU of the
# training thread (CPU < wall: the thread waited or was preempted), comm = the collectives'
# wall/CPU, the share of the reduction done during backward, context switches per step.
echo "ddprun train's GEMM: $(cat "$tmp"/gemm1 "$tmp"/gemm2 2>/dev/null | sort | uniq -c | tr -s ' ' | paste -sd, -)"
echo "per-phase breakdown of ddprun train (ms/step; a/b = wall/CPU time of the training thread):"
cat "$tmp/phases.txt"
