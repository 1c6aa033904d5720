#!/usr/bin/env bash
# DDP for LibTorch on one GPU: smoke tests of the CUDA path, then the benchmark against Python
# DDP (bench_torch_ddp.py --device cuda). Runs on the GPU machine, from a bundle made here:
#
#   scripts/bench/bench_torch_ddp_gpu.sh --bundle BUILD_DIR BUNDLE_DIR   # on the build machine
#   BUNDLE_DIR/scripts/bench/bench_torch_ddp_gpu.sh OUT_DIR [bench args]  # on the GPU machine
#
# The bundle: bin/ (ddprun, ddprun-torch-example, train) + bin/lib (their libraries other than
# the C/C++ runtime, CUDA, NCCL and LibTorch, which the GPU machine has in PyTorch's venv), and
# copies of this script, bench_torch_ddp.py, ddp_reference.py and libtorch_ddp_test.py in the
# repository's layout. LibTorch comes from the GPU machine's python3 (PY=...): it must be the
# torch version the example was built against.
#
# Smoke tests (1 rank, --device cuda, collective forced), each printing PASS or FAIL:
#   python_ddp   20 steps with `aux` unused on some steps (find_unused_parameters), several
#                buckets: every parameter and buffer equals PyTorch's DDP on the same GPU
#                (same initial state, same batches, deterministic cuDNN) within 1e-5 relative.
#   repeat       two identical runs give the same checksum (the GPU run is deterministic).
#   kill_resume  the rank SIGKILLed at step 10 under `ddprun --max_restarts=1`, resumed from the
#                step-8 checkpoint: the checksum of the uninterrupted run.
#   comm_hook_fp16, comm_hook_bf16  12 steps with register_comm_hook's built-in compression hook
#                against PyTorch's DDP with default_hooks' same hook, on the same GPU: every
#                parameter and buffer bit-identical. (One rank: the all-reduce moves no data;
#                the casts, the division and the hook's place in the step are what is compared.)
set -uo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
root="$(cd "$here/../.." && pwd)"

if [[ "${1:-}" == "--bundle" ]]; then
  build="${2:?build dir}"; dst="${3:?bundle dir}"
  set -e
  mkdir -p "$dst/bin/lib" "$dst/bin/fallback" "$dst/scripts/bench" "$dst/tests/worker_runtime/torch"
  for p in launcher/ddprun worker_runtime/torch/ddprun-torch-example worker_runtime/train; do
    [[ -x "$build/$p" ]] || { echo "missing $build/$p: build it first"; exit 2; }
    cp "$build/$p" "$dst/bin/"
    ldd "$build/$p" | awk '/=> \// {print $3}' | while read -r lib; do
      case "$(basename "$lib")" in
        libc.so*|libm.so*|libgcc_s*|libstdc++*|libpthread*|libdl.so*|librt.so*|libutil.so*|ld-linux*) ;;
        libcuda*|libcudart*|libcublas*|libcudnn*|libnccl*|libnvidia*|libnv*|libcusparse*|libcufft*|libcurand*|libcufile*) ;;
        libtorch*|libc10*|libshm*|libgomp*|libcupti*) ;;   # LibTorch: the GPU machine's wheel
        # Only where the GPU machine lacks them: NCCL must see that machine's own libibverbs.
        libibverbs*|libnl-*) cp -L "$lib" "$dst/bin/fallback/" ;;
        *) cp -L "$lib" "$dst/bin/lib/" ;;
      esac
    done
  done
  cp "$here/bench_torch_ddp_gpu.sh" "$here/bench_torch_ddp.py" "$here/device_env.sh" "$dst/scripts/bench/"
  cp "$root/tests/worker_runtime/torch/ddp_reference.py" "$root/tests/worker_runtime/torch/libtorch_ddp_test.py" \
     "$dst/tests/worker_runtime/torch/"
  strip "$dst"/bin/* "$dst"/bin/lib/* "$dst"/bin/fallback/* 2>/dev/null || true
  du -sh "$dst"
  exit 0
fi

out="${1:?output dir}"; shift
mkdir -p "$out"; out="$(cd "$out" && pwd)"
PY="${PY:-python3}"
bin="$root/bin"
. "$here/device_env.sh" "$bin"   # library path (bundle, LibTorch, NVIDIA wheels), multicast off
export PATH="$bin:$PATH"
ex="$bin/ddprun-torch-example"

{
  echo "date=$(date -u +%FT%TZ)"
  nvidia-smi -L 2>&1
  nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader 2>&1
  "$PY" -c 'import torch; print("torch", torch.__version__, "cuda", torch.version.cuda, "nccl", torch.cuda.nccl.version(), "cudnn", torch.backends.cudnn.version())'
  echo "LD_LIBRARY_PATH=$LD_LIBRARY_PATH"
  echo "env NCCL_NVLS_ENABLE=$NCCL_NVLS_ENABLE TORCH_SYMM_MEM_DISABLE_MULTICAST=$TORCH_SYMM_MEM_DISABLE_MULTICAST NVSHMEM_DISABLE_NVLS=$NVSHMEM_DISABLE_NVLS"
  echo "ldd ddprun-torch-example:"; ldd "$ex" | grep -E "torch|c10|nccl|cudart|ddprun|gloo|not found"
} > "$out/info.txt" 2>&1
cat "$out/info.txt"

fails=0
verdict() { if [[ "$2" == 0 ]]; then echo "PASS $1"; else echo "FAIL $1"; fails=$((fails + 1)); fi; }
checksum() { grep -o 'final_param_checksum=[0-9a-f]*' "$1" | tail -1 | cut -d= -f2; }
tmp="$(mktemp -d)"
dev="${SMOKE_DEVICE:-cuda}"   # SMOKE_DEVICE=cpu: the same checks on the CPU (to test this script without a GPU)
small=(--device "$dev" --force-collective --deterministic --batch 16 --channels 16 --hidden 64 --depth 2
       --image 16 --bucket-cap-kb 16 --first-bucket-kb 4)

# python_ddp: ours against PyTorch's DDP on the same GPU.
timeout 300 ddprun --nproc_per_node=1 --master_port=0 "$ex" "${small[@]}" --steps 20 --unused-mode rank --find-unused 1 \
  --dump-init "$tmp/init.%r" --dump-final "$tmp/cpp.%r" --dump-batches "$tmp/batches.%r" > "$out/smoke_ours.log" 2>&1
rc=$?
cat "$out/smoke_ours.log"
if [[ $rc == 0 ]]; then
  timeout 300 "$PY" -m torch.distributed.run --standalone --nproc_per_node=1 "$root/tests/worker_runtime/torch/ddp_reference.py" \
    --device "$dev" --deterministic --steps 20 --batch 16 --channels 16 --hidden 64 --depth 2 --image 16 --unused-mode rank \
    --find-unused 1 --load-init "$tmp/init.0" --batches "$tmp/batches.%r" --dump-final "$tmp/py.%r" > "$out/smoke_torch.log" 2>&1
  rc=$?
  tail -5 "$out/smoke_torch.log"
  [[ $rc == 0 ]] && (cd "$root/tests/worker_runtime/torch" && "$PY" -c "
import sys; sys.argv = ['x']
from libtorch_ddp_test import compare, read_dump
w = compare('$tmp/cpp.0', '$tmp/py.0')
moved = (read_dump('$tmp/cpp.0')['param/conv1.weight'] - read_dump('$tmp/init.0')['param/conv1.weight']).norm().item()
print(f'worst relative difference {w:.3e}, conv1.weight moved by {moved:.3e}')
assert moved > 1e-4
")
  rc=$?
fi
verdict python_ddp $rc

# repeat + kill_resume (SGD with momentum, checkpoint every 8 steps, kill at step 10).
kr=(--steps 24 --checkpoint-every 8)
timeout 300 ddprun --nproc_per_node=1 --master_port=0 "$ex" "${small[@]}" "${kr[@]}" --checkpoint-dir "$tmp/ck1" > "$out/smoke_ref1.log" 2>&1
timeout 300 ddprun --nproc_per_node=1 --master_port=0 "$ex" "${small[@]}" "${kr[@]}" --checkpoint-dir "$tmp/ck2" > "$out/smoke_ref2.log" 2>&1
a="$(checksum "$out/smoke_ref1.log")"; b="$(checksum "$out/smoke_ref2.log")"
echo "uninterrupted: $a / $b"
[[ -n "$a" && "$a" == "$b" ]]; verdict repeat $?
timeout 300 ddprun --nproc_per_node=1 --master_port=0 --max_restarts=1 "$ex" "${small[@]}" "${kr[@]}" --checkpoint-dir "$tmp/ck3" \
  --fail-at-step 10 --fail-rank 0 > "$out/smoke_kill.log" 2>&1
c="$(checksum "$out/smoke_kill.log")"
grep -E "injected|resumed|restart" "$out/smoke_kill.log" | head -5
echo "killed and resumed: $c"
[[ -n "$c" && "$c" == "$a" ]] && grep -q "resumed from step 8" "$out/smoke_kill.log"; verdict kill_resume $?

# comm_hook_*: register_comm_hook with a built-in hook against PyTorch's default_hooks.
for hook in fp16 bf16; do
  hk=(--steps 12 --unused-mode none --find-unused 0 --comm-hook "$hook")
  timeout 300 ddprun --nproc_per_node=1 --master_port=0 "$ex" "${small[@]}" "${hk[@]}" \
    --dump-init "$tmp/hinit.%r" --dump-final "$tmp/hcpp.%r" --dump-batches "$tmp/hbatches.%r" > "$out/smoke_hook_$hook.log" 2>&1
  rc=$?
  if [[ $rc == 0 ]]; then
    timeout 300 "$PY" -m torch.distributed.run --standalone --nproc_per_node=1 "$root/tests/worker_runtime/torch/ddp_reference.py" \
      --device "$dev" --deterministic --batch 16 --channels 16 --hidden 64 --depth 2 --image 16 "${hk[@]}" \
      --load-init "$tmp/hinit.0" --batches "$tmp/hbatches.%r" --dump-final "$tmp/hpy.%r" > "$out/smoke_hook_torch_$hook.log" 2>&1
    rc=$?
    tail -3 "$out/smoke_hook_torch_$hook.log"
    [[ $rc == 0 ]] && (cd "$root/tests/worker_runtime/torch" && "$PY" -c "
import sys; sys.argv = ['x']
from libtorch_ddp_test import compare
w = compare('$tmp/hcpp.0', '$tmp/hpy.0', rtol=0, atol=0)
print(f'$hook hook: worst relative difference {w:.3e}')
")
    rc=$?
  else
    tail -5 "$out/smoke_hook_$hook.log"
  fi
  verdict "comm_hook_$hook" $rc
done
rm -rf "$tmp"

# The benchmark.
[[ "${SKIP_BENCH:-0}" == 1 ]] && { echo "smoke failures: $fails"; exit "$fails"; }
echo "== benchmark"
"$PY" "$root/scripts/bench/bench_torch_ddp.py" --device cuda --example "$ex" --ddprun "$bin/ddprun" --python "$PY" "$@" \
  2>&1 | tee "$out/bench.txt"
echo "smoke failures: $fails"
