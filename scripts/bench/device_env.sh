#!/usr/bin/env bash
# Source on the GPU machine before running carried binaries:  . scripts/bench/device_env.sh BIN_DIR
# Puts the bundle's libraries (scripts/bench/bundle_bin.sh), LibTorch's (torch/lib) and the
# NVIDIA wheels' (CUDA runtime, cuBLAS, NCCL) of $PY (default python3, the one with torch) on
# LD_LIBRARY_PATH, and keeps NVLink multicast off (NCCL, PyTorch, NVSHMEM) as that machine asks.
_bin="${1:?bin dir}"
_py="${PY:-python3}"
_libs="$("$_py" - <<'PY'
import glob, os
dirs = []
try:
    import torch
    dirs.append(os.path.join(os.path.dirname(torch.__file__), "lib"))
except Exception:
    pass
try:
    import nvidia
    for d in nvidia.__path__:
        for so in glob.glob(os.path.join(d, "*", "lib", "*.so*")) + glob.glob(os.path.join(d, "*", "*", "lib", "*.so*")):
            if os.path.dirname(so) not in dirs:
                dirs.append(os.path.dirname(so))
except Exception:
    pass
print(":".join(dirs))
PY
)"
_bin="$(cd "$_bin" && pwd)"
export LD_LIBRARY_PATH="$_bin/lib:${_libs}${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
# $_bin/fallback: libraries most machines have (libibverbs, libnl), used only where this one
# lacks them, so that NCCL never sees another distribution's libibverbs.
for _so in "$_bin"/fallback/*.so*; do
  [[ -e "$_so" ]] || continue
  ldconfig -p 2>/dev/null | grep -qE "^[[:space:]]+$(basename "$_so") " || { LD_LIBRARY_PATH="$LD_LIBRARY_PATH:$_bin/fallback"; break; }
done
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
unset _bin _py _libs _so
