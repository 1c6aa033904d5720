#!/usr/bin/env bash
# A /dev/shm too small for the shared-memory all-reduce (a 1 MiB tmpfs in a private mount
# namespace, like a container's default) must not crash the job (SIGBUS) but fall back to Gloo
# over TCP with exactly one warning line, and train to the same parameters (bit for bit) as a
# normal run on the shared-memory path.
#   usage: shm_small_devshm.sh <ddprun> <train>      (needs root for unshare -m; else exit 77)
set -euo pipefail
ddprun="$1"; train="$2"
if [[ "$(id -u)" != 0 ]] || ! unshare -m true 2>/dev/null; then echo "SKIP: needs root and unshare -m"; exit 77; fi
tmp="$(mktemp -d /tmp/ddprun-smallshm-XXXXXX)"
trap 'rm -rf "$tmp"' EXIT
# Wide enough that the touched shared memory exceeds 1 MiB (a sparse segment would SIGBUS).
common=(--width 512 --depth 2 --samples 120 --batch 20 --epochs 1 --device cpu)

"$ddprun" --nproc_per_node=2 --master_port=0 "$train" "${common[@]}" >"$tmp/normal.log" 2>&1 || {
  echo "normal run failed:"; cat "$tmp/normal.log"; exit 1; }
want="$(grep -o 'final_param_checksum=[0-9a-f]*' "$tmp/normal.log" | tail -1)"
grep -q 'step=fused(shm)' "$tmp/normal.log" || { echo "the normal run did not use shared memory"; cat "$tmp/normal.log"; exit 1; }

unshare -m bash -c 'mount --make-rprivate / && mount -t tmpfs -o size=1m tmpfs /dev/shm && exec "$@"' _ \
  "$ddprun" --nproc_per_node=2 --master_port=0 "$train" "${common[@]}" >"$tmp/small.log" 2>&1 || {
  echo "run with a 1 MiB /dev/shm failed:"; cat "$tmp/small.log"; exit 1; }
got="$(grep -o 'final_param_checksum=[0-9a-f]*' "$tmp/small.log" | tail -1)"
warnings="$(grep -c 'shared-memory all-reduce: no room' "$tmp/small.log" || true)"
grep 'shared-memory all-reduce' "$tmp/small.log" || true
[[ "$warnings" == 1 ]] || { echo "expected exactly one fallback warning, got $warnings"; cat "$tmp/small.log"; exit 1; }
grep -q 'backend=gloo' "$tmp/small.log" || { echo "no train banner"; cat "$tmp/small.log"; exit 1; }
[[ -n "$want" ]] || { echo "no checksum in the normal run"; cat "$tmp/normal.log"; exit 1; }
[[ -n "$got" ]] || { echo "no checksum"; cat "$tmp/small.log"; exit 1; }
echo "normal (shm): $want; 1 MiB /dev/shm (Gloo): $got"
# Bit for bit: with two ranks every element of the all-reduce is a sum of two addends, which
# commute exactly in IEEE arithmetic, so Gloo's ring and the shm path give the same bits (and
# the fused step equals all-reduce-then-step, see worker.process). With more ranks the
# summation order would differ and this would have to be a tolerance.
[[ "$got" == "$want" ]] || { echo "FAIL: the Gloo fallback trained to different parameters"; exit 1; }
echo "OK: fell back to Gloo with one warning, same parameters bit for bit"
