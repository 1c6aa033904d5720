#!/usr/bin/env bash
# Copies the built programs and the shared libraries they need that a GPU machine lacks
# (Debian's spdlog/fmt/gloo/..., libddprun_worker) into one folder, to carry there with the
# device tool. CUDA's own libraries (cudart, cublas, nccl) are left out: the GPU machine has
# them in PyTorch's venv: put its nvidia/*/lib folders on LD_LIBRARY_PATH there. So do LibTorch's
# (torch/lib), which the LibTorch example links.
#   usage: scripts/bench/bundle_bin.sh BUILD_DIR OUT_DIR
set -euo pipefail
build="${1:?build dir}"; out="${2:?out dir}"
mkdir -p "$out/lib"
progs=(launcher/ddprun rendezvous/ddprund rendezvous/tools/bench/ddprun_store_bench rendezvous/ddprun_rdzv_bench
       rendezvous/ddprun_scale_sim rendezvous/ddprun_store_relay
       worker_runtime/train worker_runtime/ddprun_allreduce_bench worker_runtime/torch/ddprun-torch-example)
for p in "${progs[@]}"; do
  [[ -x "$build/$p" ]] || continue
  cp "$build/$p" "$out/"
  ldd "$build/$p" | awk '/=> \// {print $3}' | while read -r lib; do
    case "$(basename "$lib")" in
      libc.so*|libm.so*|libgcc_s*|libstdc++*|libpthread*|libdl.so*|librt.so*|ld-linux*) ;;
      libcuda*|libcudart*|libcublas*|libnccl*|libnvidia*) ;;
      *) case "$lib" in
           */site-packages/*) ;;  # LibTorch and its CUDA libraries: the GPU machine's torch wheel has them
           *) cp -L "$lib" "$out/lib/" ;;
         esac ;;
    esac
  done
done
strip "$out"/* "$out"/lib/* 2>/dev/null || true
du -sh "$out"
