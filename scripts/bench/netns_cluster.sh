#!/usr/bin/env bash
# A cluster of N network-namespace nodes on this machine, each running a real launcher agent
# (ddprun against a standing ddprund with a token, or torchrun's c10d rendezvous), timed at
# launch and after one node is killed. One command:
#   sudo scripts/bench/netns_cluster.sh N [--nproc P] [--launcher ddprun|torchrun]
#        [--worker trivial|train] [--netem-delay 100us] [--phases launch,kill] [--check]
# `scripts/bench/netns_cluster.sh --help` lists every option. Every namespace is created and
# deleted by the script (also on failure or Ctrl-C); the host's own network is not touched.
# Exit 77 with a one-line reason when this machine cannot run it (no root, no `ip`, no netem).
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
command -v python3 >/dev/null || { echo "netns_cluster: python3 is needed" >&2; exit 2; }
ulimit -n "$(ulimit -Hn)"
exec python3 "$here/netns_cluster.py" "$@"
