#!/usr/bin/env bash
# Runs a command with a fresh, empty tmpfs on /dev/shm in a private mount namespace, so a test
# can see every byte and every entry the processes it starts leave there, whatever their names
# (and nothing else on the host adds to or takes from it). Sets DDPRUN_TEST_PRIVATE_DEVSHM=1
# for the command. Needs root (unshare -m); exits 77 (skipped) otherwise.
#   usage: with_private_devshm.sh <command> [args...]
set -euo pipefail
if [[ "$(id -u)" != 0 ]] || ! unshare -m true 2>/dev/null; then echo "SKIP: needs root and unshare -m"; exit 77; fi
export DDPRUN_TEST_PRIVATE_DEVSHM=1
exec unshare -m bash -c 'mount --make-rprivate / && mount -t tmpfs -o size=256m,mode=1777 tmpfs /dev/shm && exec "$@"' _ "$@"
