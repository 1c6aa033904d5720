#!/usr/bin/env bash
# Warm spares: how long the GPUs of a job sit idle after a worker dies, ddprun with and without
# spares beside torchrun, side by side in one run: see scripts/bench/bench_restart.py (mode
# "spares") for what it measures and its settings.
# On the GPU machine (binaries from scripts/bench/bundle_bin.sh):
#   . scripts/bench/device_env.sh out/bench-bin && DDPRUN=out/bench-bin/ddprun PYS="$(which python3)" \
#     scripts/bench/bench_spares.sh -n 3
# "gpu" first: the same on GPUs with NCCL, ddprun --spare_cuda=1 beside CPU-warm spares, cold
# starts and torchrun (mode "gpu" there; NPROC=<ranks>, one GPU each, default 1).
# "busy": on a host whose cores all spin (busy data loaders), --spare_priority=idle beside normal.
#   usage: scripts/bench/bench_spares.sh [gpu|busy] [-n N] [build-dir]     (N default 3)
mode=spares
if [[ "${1:-}" == gpu || "${1:-}" == busy ]]; then mode="$1"; shift; fi
exec python3 "$(dirname "${BASH_SOURCE[0]}")/bench_restart.py" "$mode" "$@"
