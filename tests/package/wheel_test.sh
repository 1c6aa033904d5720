#!/usr/bin/env bash
# The package.wheel.* tests: the pip wheel, built from the main build folder, installed into a
# fresh virtual environment and used from a shell that holds nothing of the source or build
# tree (PATH, LD_LIBRARY_PATH, PYTHONPATH, the working directory).
#   wheel_test.sh STEP SOURCE_DIR BUILD_DIR WORK_DIR
# STEPs, in the order the ctest fixtures run them: build install torch_ddp python_choice train
# ddprund cmake_consumer libs uninstall.
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
  uninstall)
    "$venv/bin/pip" uninstall -y --disable-pip-version-check ddprun
    venv_listing >"$work/venv-after.txt"
    diff "$work/venv-before.txt" "$work/venv-after.txt" || fail "pip uninstall left the files above (> lines) behind"
    echo "the venv holds the same $(wc -l <"$work/venv-after.txt") files and folders as before the install"
    ;;
  *) fail "unknown step '$step'" ;;
esac
