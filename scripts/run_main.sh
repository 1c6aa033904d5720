#!/usr/bin/env bash
# The main job, quick on a fresh machine: installs only what it needs (setup_deps.sh --main:
# the build's Debian packages; no PyTorch, no Slurm, no clang), builds only ddprun and the C++
# `train` example (and the libraries they link), and runs a 2-process data-parallel training
# run under ddprun: Gloo on CPU, NCCL on GPUs. Extra arguments go to `train`.
# When Debian's PyTorch is already installed (scripts/setup_deps.sh installs it for the tests),
# a PyTorch DDP script (gloo) runs under ddprun as well.
# Every step says what it does and which step of how many it is; the build prints its percent.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
build="${DDPRUN_BUILD_DIR:-$here/build}"
start=$SECONDS
n=4
step() { echo "[main] step $1 of $n ($((SECONDS - start)) s): $2"; }

step 1 "packages the build needs (scripts/setup_deps.sh --main)"
"$here/scripts/setup_deps.sh" --main

step 2 "configuring into $build (cmake)"
cmake -S "$here" -B "$build" -DCMAKE_BUILD_TYPE="${DDPRUN_BUILD_TYPE:-RelWithDebInfo}"

# The build says which file it compiles, as "k of N": N counts the object files of ddprun,
# train and every target they link (from the Makefiles CMake wrote; 0 with another generator,
# which prints its own progress). A rebuild compiles fewer than N.
count_objects() {
  local m2="$build/CMakeFiles/Makefile2" seen=" " n=0 d c
  local todo=(launcher/CMakeFiles/ddprun.dir worker_runtime/CMakeFiles/train.dir)
  [[ -f "$m2" ]] || { echo 0; return; }
  while ((${#todo[@]})); do
    d="${todo[0]}"
    todo=("${todo[@]:1}")
    [[ "$seen" == *" $d "* ]] && continue
    seen+="$d "
    c="$(grep -cE '^[^ ]+\.o: [^ ]+/flags\.make$' "$build/$d/build.make" 2>/dev/null || true)"
    n=$((n + ${c:-0}))
    mapfile -t -O "${#todo[@]}" todo < <(sed -nE "s#^$d/all: ([^ ]+)/all\$#\1#p" "$m2")
  done
  echo "$n"
}
total="$(count_objects)"
step 3 "building ddprun and train ($total source files in them and what they link; $(nproc) jobs)"
k=0
cmake --build "$build" -j "$(nproc)" --target ddprun train 2>&1 | while IFS= read -r line; do
  if [[ "$line" =~ Building\ (C|CXX|CUDA)\ object\ (.*)$ ]] && ((total > 0)); then
    ((k < total)) && k=$((k + 1))
    echo "[main] build: $k of $total: ${BASH_REMATCH[2]}"
  else
    echo "$line"
  fi
done

ddprun="$build/launcher/ddprun"
train="$build/worker_runtime/train"
step 4 "ddprun --nproc_per_node=2 train $*"
"$ddprun" --nproc_per_node=2 --master_port=0 "$train" "$@"

if /usr/bin/python3 -c 'import torch' 2>/dev/null; then
  echo "[main] also: ddprun --nproc_per_node=2 tests/launcher/train_ddp.py" \
       "(PyTorch $(/usr/bin/python3 -c 'import torch; print(torch.__version__)'), gloo)"
  PYTHON_EXEC=/usr/bin/python3 "$ddprun" --nproc_per_node=2 --master_port=0 "$here/tests/launcher/train_ddp.py"
else
  echo "[main] no PyTorch for /usr/bin/python3: the PyTorch DDP example is skipped" \
       "(scripts/setup_deps.sh installs Debian's python3-torch)"
fi
echo "[main] done in $((SECONDS - start)) s"
