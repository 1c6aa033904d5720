#!/usr/bin/env bash
# Restart latency on one node, ddprun beside torchrun, side by side in one run: see
# scripts/bench/bench_restart.py (mode "restart") for what it measures and its settings.
#   usage: scripts/bench/bench_restart.sh [-n N] [build-dir]     (N default 5; env DDPRUN=..., DDPRUN_VENV=...)
exec python3 "$(dirname "${BASH_SOURCE[0]}")/bench_restart.py" restart "$@"
