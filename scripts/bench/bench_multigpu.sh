#!/usr/bin/env bash
# Multi-GPU benchmark: ddprun + libddprun_worker vs torchrun + PyTorch DDP on every GPU
# of one machine (any count >= 1), one command per machine kind. Steps, each bounded and each
# failure reported (the script goes on to the next step):
#   info       nproc, nvidia-smi -L / topo -m, NCCL version (ddprun_allreduce_bench --info and
#              torch.cuda.nccl.version()), torch version
#   correct    DDP invariant: `train` (1024x4, fp32 and bf16) on N GPUs x batch 64 vs 1 GPU x batch
#              64N over the same samples, final parameters and loss compared to a tolerance (read
#              from the checkpoints) and to a control run (1 GPU x batch 64); kill and resume: rank N-1 SIGKILLed twice
#              under `ddprun --max_restarts=2` with checkpoints, final checksum vs the clean run
#   allreduce  8 B .. 1 GiB (powers of 2), fp32 and bf16: our NcclCommunicator and a raw
#              ncclAllReduce loop (ddprun_allreduce_bench under ddprun), torch.distributed.all_reduce
#              (scripts/bench/bench_multigpu_allreduce.py under torchrun)
#   ddp        4096x6 (b1024) and 8192x5 (b512) bf16: `train` vs scripts/bench/bench_worker_ddp.py, 1 GPU
#              and N GPUs, and both without overlap (train --no-overlap; bench_multigpu_torch_ddp.py)
#   launch     ddprun vs torchrun, PyTorch NCCL worker and `train`: exec -> first collective, and
#              SIGKILL of rank N-1 -> every rank past its first collective again (--max_restarts=1)
# Tables go to stdout and to $OUT_DIR/multigpu.md; raw logs to $OUT_DIR/multigpu-raw/.
#   usage: scripts/bench/bench_multigpu.sh [bin-dir with train, ddprun, ddprund, ddprun_allreduce_bench]
#   env:   OUT_DIR=./out PY=python3 NGPU=<all> STEPS=30 WARMUP=10 LAUNCH_RUNS=2 STEP_TIMEOUT=120 BUDGET_S=540
#          ONLY=info,correct,allreduce,ddp,launch   DRY_RUN=1 (print the commands, run nothing)
#          TRAIN_DEVICE=cpu (correct and launch on CPU/Gloo: a test of the script on a machine without GPU)
# The bin dir may also be a build tree (build/worker_runtime/train ...). Shared libraries next to
# the binaries (the carried bundle) and the venv's NVIDIA libraries (NCCL, CUDA runtime, cuBLAS)
# go on LD_LIBRARY_PATH.
set -uo pipefail
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
here="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
bin="${1:-$here/build}"
bin="$(cd "$bin" 2>/dev/null && pwd || echo "$bin")"
. "$here/scripts/bench/benchlib.sh"  # first, port
train="$(first "$bin/train" "$bin/worker_runtime/train")"
ddprun="$(first "$bin/ddprun" "$bin/launcher/ddprun")"
arbench="$(first "$bin/ddprun_allreduce_bench" "$bin/worker_runtime/ddprun_allreduce_bench")"
PY="${PY:-python3}"
OUT_DIR="${OUT_DIR:-./out}"
STEPS="${STEPS:-30}"; WARMUP="${WARMUP:-10}"; LAUNCH_RUNS="${LAUNCH_RUNS:-2}"; STEP_TIMEOUT="${STEP_TIMEOUT:-120}"
BUDGET_S="${BUDGET_S:-540}"   # no program starts after this many seconds; each is cut at what is left
ONLY="${ONLY:-info,correct,allreduce,ddp,launch}"
DRY_RUN="${DRY_RUN:-0}"
TRAIN_DEVICE="${TRAIN_DEVICE:-cuda}"   # cpu: the correct and launch steps on CPU/Gloo (tests the script without a GPU)
mkdir -p "$OUT_DIR"
OUT_DIR="$(cd "$OUT_DIR" && pwd)"
raw="$OUT_DIR/multigpu-raw"
rm -rf "$raw"; mkdir -p "$raw"/{info,correct,allreduce,ddp,launch}
t_script=$(date +%s)
export PYTHON_EXEC="$PY"   # ddprun runs x.py with $PYTHON_EXEC

# ---- libraries: the venv's NVIDIA wheels (NCCL, CUDA runtime, cuBLAS) and the bundle next to the binaries
nvlibs="$("$PY" - <<'PY' 2>/dev/null
import glob, os
dirs = []
try:
    import nvidia.nccl
    dirs.append(os.path.join(list(nvidia.nccl.__path__)[0], "lib"))
except Exception:
    pass
try:  # the CUDA runtime and cuBLAS: nvidia/cu13/lib (CUDA 13 wheels) or nvidia/{cuda_runtime,cublas}/lib
    import nvidia
    for d in nvidia.__path__:
        for pat in ("libcudart.so*", "libcublas.so*", "libcublasLt.so*"):
            for so in glob.glob(os.path.join(d, "*", "lib", pat)) + glob.glob(os.path.join(d, "*", "*", "lib", pat)):
                if os.path.dirname(so) not in dirs:
                    dirs.append(os.path.dirname(so))
except Exception:
    pass
print(":".join(dirs))
PY
)"
libdirs=""
for d in "$bin" "$bin/lib" "$bin/worker_runtime"; do [[ -d "$d" ]] && libdirs="$libdirs:$d"; done
# $bin/fallback: libraries most machines have (libibverbs, libnl): used only when the system lacks
# one of them, so that PyTorch's NCCL never sees another distribution's libibverbs.
if [[ -d "$bin/fallback" ]]; then
  for so in "$bin"/fallback/*.so*; do
    [[ -e "$so" ]] || continue
    ldconfig -p 2>/dev/null | grep -qE "^[[:space:]]+$(basename "$so") " || { libdirs="$libdirs:$bin/fallback"; break; }
  done
fi
export LD_LIBRARY_PATH="${nvlibs}${libdirs}${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
LD_LIBRARY_PATH="${LD_LIBRARY_PATH#:}"

NGPU="${NGPU:-$(nvidia-smi -L 2>/dev/null | grep -c '^GPU ' || true)}"
[[ "$NGPU" =~ ^[0-9]+$ && "$NGPU" -gt 0 ]] || NGPU="$("$PY" -c 'import torch; print(torch.cuda.device_count())' 2>/dev/null || echo 0)"
n="$NGPU"
enabled() { [[ ",$ONLY," == *",$1,"* ]]; }
# x LOG CMD...: run one program, bounded by STEP_TIMEOUT and by what is left of BUDGET_S, output to
# LOG (appended), the command line to commands.txt. CMD may start with the words ddp_run or torchrun:
# ddprun / python -m torch.distributed.run on 127.0.0.1 and a fresh port.
x() {
  local log="$1"; shift
  local -a cmd
  case "$1" in
    ddp_run) shift; cmd=("$ddprun" --master_addr=127.0.0.1 --master_port="$(port)" "$@") ;;
    torchrun) shift; cmd=("$PY" -m torch.distributed.run --master_addr=127.0.0.1 --master_port="$(port)" "$@") ;;
    *) cmd=("$@") ;;
  esac
  echo "${cmd[*]}" >> "$raw/commands.txt"
  if [[ "$DRY_RUN" == 1 ]]; then echo "  + ${cmd[*]}"; return 0; fi
  local left=$(( BUDGET_S - ($(date +%s) - t_script) )) lim="$STEP_TIMEOUT"
  if (( left < 5 )); then echo "  !! skipped (over the ${BUDGET_S}s budget): ${cmd[*]}" | tee -a "$log"; return 124; fi
  (( left < lim )) && lim=$left
  timeout -k 10 "$lim" "${cmd[@]}" >>"$log" 2>&1
  local rc=$?
  [[ $rc == 0 ]] || { echo "  !! rc=$rc$( ((rc == 124)) && echo " (timed out after ${lim}s)"): ${cmd[*]}"; echo "     (log: $log)"; tail -5 "$log" | sed 's/^/     | /'; }
  return $rc
}
# step NAME FUNCTION: run a step, record rc and seconds; a failure never stops the script
step() {
  local name="$1"; shift
  local t0; t0=$(date +%s.%N)
  echo "== $name"
  "$@"
  local rc=$?
  local secs; secs=$(awk "BEGIN{printf \"%.1f\", $(date +%s.%N) - $t0}")
  echo "STEP $name rc=$rc secs=$secs" >> "$raw/steps.txt"
  [[ $rc == 0 ]] || echo "!! step $name failed (rc=$rc) after ${secs}s; going on"
  return 0
}

echo "bench_multigpu: $n GPU(s), bin $bin, out $OUT_DIR/multigpu.md"
[[ "$n" -gt 0 ]] || echo "!! no GPU found (nvidia-smi and torch); every GPU step will fail"
for f in "$train" "$ddprun" "$arbench"; do [[ -x "$f" ]] || echo "!! missing binary: $f"; done

# ---------------------------------------------------------------- info
do_info() {
  local v="$raw/info/versions.txt" m="$raw/info/machine.txt" rc=0
  {
    echo "date=$(date -u +%Y-%m-%dT%H:%M:%SZ)"; echo "host=$(hostname)"; echo "nproc=$(nproc)"; echo "ngpu=$n"
    echo "gpus=$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | sort | uniq -c | awk '{c=$1; $1=""; printf "%s%dx%s", s, c, $0; s=", "}')"
    echo "driver=$(nvidia-smi --query-gpu=driver_version --format=csv,noheader 2>/dev/null | head -1)"
    echo "bin=$bin"
    echo "env=NCCL_NVLS_ENABLE=$NCCL_NVLS_ENABLE TORCH_SYMM_MEM_DISABLE_MULTICAST=$TORCH_SYMM_MEM_DISABLE_MULTICAST NVSHMEM_DISABLE_NVLS=$NVSHMEM_DISABLE_NVLS"
  } > "$v"
  {
    echo "\$ nproc: $(nproc)"; echo "\$ nvidia-smi -L"; nvidia-smi -L 2>&1
    echo "\$ nvidia-smi topo -m"; nvidia-smi topo -m 2>&1
    echo "\$ ddprun_allreduce_bench --info"
  } > "$m"
  x "$m" "$arbench" --info || rc=1
  local nv; nv="$(grep -o 'nccl=[0-9.]*' "$m" | head -1 | cut -d= -f2)"; echo "nccl_lib=${nv:-?} (ncclGetVersion in ddprun_allreduce_bench)" >> "$v"
  grep -o 'cuda_runtime=[0-9]*' "$m" | head -1 >> "$v"
  echo "\$ python: torch, torch.cuda.nccl.version()" >> "$m"
  x "$m" "$PY" -c 'import torch; v=torch.cuda.nccl.version(); print("torch=%s torch_nccl=%s cuda=%s" % (torch.__version__, ".".join(map(str, v)) if isinstance(v, tuple) else v, torch.version.cuda))' || rc=1
  local tl; tl="$(grep -o 'torch=.*' "$m" | tail -1)"
  echo "torch=$(echo "$tl" | sed -n 's/^torch=\([^ ]*\).*/\1/p')" >> "$v"
  echo "torch_nccl=$(echo "$tl" | sed -n 's/.*torch_nccl=\([^ ]*\).*/\1/p')" >> "$v"
  echo "LD_LIBRARY_PATH=$LD_LIBRARY_PATH" >> "$m"
  cat "$m"
  return $rc
}

# ---------------------------------------------------------------- correctness
do_correct() {
  local c="$raw/correct" B=64 S=24 W=1024 D=4 rc=0
  local samples=$(( B * n * S )) victim=$(( n - 1 ))
  printf "width=%s\ndepth=%s\nbatch=%s\nsteps=%s\nngpu=%s\nseed=0\nsamples=%s\nckpt_every=6\nfail_steps=13,19\n" \
    "$W" "$D" "$B" "$S" "$n" "$samples" > "$c/params.txt"
  local common=(--device "$TRAIN_DEVICE" --width "$W" --depth "$D" --samples "$samples" --epochs 1 --momentum 0.9 --keep-checkpoints 0)
  run_train() {  # name nproc batch precision extra...
    local name="$1" np="$2" b="$3" prec="$4"; shift 4
    mkdir -p "$c/$name"
    x "$c/$name/run.log" ddp_run --nproc_per_node="$np" "$train" "${common[@]}" --batch "$b" --precision "$prec" \
      --checkpoint-dir "$c/$name/ck" "$@"
  }
  run_train init 1 "$B" fp32 --lr 0 --max-steps 1 --checkpoint-every 1 || rc=1
  for prec in fp32 bf16; do
    run_train "ref1_$prec" 1 $(( B * n )) "$prec" --checkpoint-every "$S" || rc=1
    run_train "ngpu_$prec" "$n" "$B" "$prec" --checkpoint-every "$S" || rc=1
    # control: 1 GPU at the per-rank batch, same steps (the update without the other ranks' gradients)
    if [[ "$n" -gt 1 ]]; then run_train "control_$prec" 1 "$B" "$prec" --max-steps "$S" --checkpoint-every "$S" || rc=1; fi
  done
  mkdir -p "$c/killed_bf16"
  x "$c/killed_bf16/run.log" ddp_run --nproc_per_node="$n" --max_restarts=2 "$train" "${common[@]}" --batch "$B" \
    --precision bf16 --checkpoint-dir "$c/killed_bf16/ck" --checkpoint-every 6 --fail-at-step 13,19 \
    --fail-rank "$victim" --fail-mode kill || rc=1
  grep -hE "injected|resumed|final_param_checksum" "$c"/ngpu_bf16/run.log "$c"/killed_bf16/run.log 2>/dev/null | sed 's/^/  /'
  return $rc
}

# ---------------------------------------------------------------- all-reduce sweep
do_allreduce_ours() {
  x "$raw/allreduce/ours_raw.log" ddp_run --nproc_per_node="$n" "$arbench" --impl ours,raw --dtype fp32,bf16 \
    --min-bytes 8 --max-bytes $((1 << 30)) --out "$raw/allreduce/ours_raw.txt"
}
do_allreduce_torch() {
  x "$raw/allreduce/torch.log" torchrun --nproc_per_node="$n" "$here/scripts/bench/bench_multigpu_allreduce.py" \
    --dtype fp32,bf16 --min-bytes 8 --max-bytes $((1 << 30)) --out "$raw/allreduce/torch.txt"
}

# ---------------------------------------------------------------- DDP step
do_ddp() {
  local d="$raw/ddp" rc=0
  printf "models=w4096d6,w8192d5\nlabel.w4096d6=4096x6 (100.7 M params), batch 1024/rank\nlabel.w8192d5=8192x5 (335.6 M params), batch 512/rank\nsteps=%s\nwarmup=%s\n" \
    "$STEPS" "$WARMUP" > "$d/params.txt"
  local cfg m w dep b np
  for cfg in "w4096d6 4096 6 1024" "w8192d5 8192 5 512"; do
    set -- $cfg; m=$1 w=$2 dep=$3 b=$4
    for np in 1 "$n"; do
      x "$d/$m.ours.$np.overlap.log" ddp_run --nproc_per_node="$np" "$train" --device cuda --precision bf16 --width "$w" \
        --depth "$dep" --batch "$b" --samples $(( b * (STEPS + WARMUP) * np )) --epochs 1 --warmup-steps "$WARMUP" || rc=1
      x "$d/$m.torch.$np.overlap.log" torchrun --nproc_per_node="$np" "$here/scripts/bench/bench_worker_ddp.py" --device cuda \
        --precision bf16 --width "$w" --depth "$dep" --batch "$b" --steps "$STEPS" --warmup "$WARMUP" || rc=1
      [[ "$n" == 1 ]] && break
    done
    if [[ "$n" -gt 1 ]]; then
      x "$d/$m.ours.$n.nooverlap.log" ddp_run --nproc_per_node="$n" "$train" --device cuda --precision bf16 --width "$w" \
        --depth "$dep" --batch "$b" --samples $(( b * (STEPS + WARMUP) * n )) --epochs 1 --warmup-steps "$WARMUP" --no-overlap || rc=1
      x "$d/$m.torch.$n.nooverlap.log" torchrun --nproc_per_node="$n" "$here/scripts/bench/bench_multigpu_torch_ddp.py" \
        --precision bf16 --width "$w" --depth "$dep" --batch "$b" --steps "$STEPS" --warmup "$WARMUP" || rc=1
    fi
    grep -H -o 'avg_step_ms=[0-9.]*' "$d/$m".*.log 2>/dev/null | sed "s|$d/||; s/^/  /"
  done
  return $rc
}

# ---------------------------------------------------------------- launch and restart
do_launch() {
  local left=$(( BUDGET_S - ($(date +%s) - t_script) ))
  if (( left < 30 )); then echo "  !! skipped (over the ${BUDGET_S}s budget)"; return 124; fi
  local lim=$(( STEP_TIMEOUT < 60 ? STEP_TIMEOUT : 60 )); (( left < lim )) && lim=$left  # a healthy run takes < 30 s
  # The driver bounds every run (--timeout) and starts none after --budget; the outer timeout is for the driver.
  local args=(--nproc "$n" --ddprun "$ddprun" --train "$train" --py "$PY" --runs "$LAUNCH_RUNS" --timeout "$lim"
              --budget $(( left > lim ? left - lim : 1 )) --backend "$([[ $TRAIN_DEVICE == cpu ]] && echo gloo || echo nccl)" --workdir "$raw/launch/runs" --out "$raw/launch/runs.jsonl")
  echo "$PY $here/scripts/bench/bench_multigpu_launch.py ${args[*]}" >> "$raw/commands.txt"
  if [[ "$DRY_RUN" == 1 ]]; then "$PY" "$here/scripts/bench/bench_multigpu_launch.py" "${args[@]}" --dry-run | sed 's/^/  + /'; return 0; fi
  timeout -k 10 $(( left + 30 )) "$PY" "$here/scripts/bench/bench_multigpu_launch.py" "${args[@]}"
}

enabled info && step info do_info
enabled correct && step correct do_correct
enabled allreduce && { step allreduce_ours do_allreduce_ours; grep -h 'CHECK impl=' "$raw/allreduce/ours_raw.log" 2>/dev/null | sed 's/^/  /'; }
enabled allreduce && { step allreduce_torch do_allreduce_torch; grep -h 'CHECK impl=' "$raw/allreduce/torch.log" 2>/dev/null | sed 's/^/  /'; }
enabled ddp && step ddp do_ddp
enabled launch && step launch do_launch

echo "== report ($(( $(date +%s) - t_script )) s so far)"
"$PY" "$here/scripts/bench/bench_multigpu_report.py" --raw "$raw" --out "$OUT_DIR/multigpu.md" ||
  python3 "$here/scripts/bench/bench_multigpu_report.py" --raw "$raw" --out "$OUT_DIR/multigpu.md" ||
  echo "!! report failed; raw logs in $raw"
echo "total $(( $(date +%s) - t_script )) s; tables in $OUT_DIR/multigpu.md, logs in $raw"
