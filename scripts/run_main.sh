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

# The build says which file it compiles, as "k of N" (N from a dry run of the Makefiles; other
# generators print their own progress).
total="$( { for t in ddprun train; do cmake --build "$build" --target "$t" -- -n; done; } 2>/dev/null |
  grep -oE 'Building (C|CXX|CUDA) object [^"]*' | sort -u | wc -l || true)"
step 3 "building ddprun and train: ${total:-?} files to compile ($(nproc) jobs)"
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
