#!/usr/bin/env bash
# A /dev/shm too small for the shared-memory all-reduce (a 1 MiB tmpfs in a private mount
# namespace, like a container's default) must not crash the job (SIGBUS) but fall back to Gloo
# over TCP with exactly one warning line, and train to the same parameters (bit for bit) as a
# normal run on the shared-memory path. Then a /dev/shm with room for the all-reduce segment and
# the gradients but not for the parameters: the one-copy region, then the per-rank one, fall
# back (one warning each), the parameters live in private memory, same bits again.
#   usage: shm_small_devshm.sh <ddprun> <train>      (needs root for unshare -m; else exit 77)
set -euo pipefail
ddprun="$1"; train="$2"
if [[ "$(id -u)" != 0 ]] || ! unshare -m true 2>/dev/null; then echo "SKIP: needs root and unshare -m"; exit 77; fi
tmp="$(mktemp -d /tmp/ddprun-smallshm-XXXXXX)"
trap 'rm -rf "$tmp"' EXIT
# Wide enough that the touched shared memory exceeds 1 MiB (a sparse segment would SIGBUS).
common=(--profile --width 512 --depth 2 --samples 120 --batch 20 --epochs 1 --device cpu)

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
grep -q 'backend=gloo ' "$tmp/small.log" || { echo "no train banner naming plain gloo"; cat "$tmp/small.log"; exit 1; }
grep -q 'backend=gloo+shm ' "$tmp/normal.log" || { echo "the normal run's banner does not say gloo+shm"; cat "$tmp/normal.log"; exit 1; }
[[ -n "$want" ]] || { echo "no checksum in the normal run"; cat "$tmp/normal.log"; exit 1; }
[[ -n "$got" ]] || { echo "no checksum"; cat "$tmp/small.log"; exit 1; }
echo "normal (shm): $want; 1 MiB /dev/shm (Gloo): $got"
# Bit for bit: with two ranks every element of the all-reduce is a sum of two addends, which
# commute exactly in IEEE arithmetic, so Gloo's ring and the shm path give the same bits (and
# the fused step equals all-reduce-then-step, see worker.process). With more ranks the
# summation order would differ and this would have to be a tolerance.
[[ "$got" == "$want" ]] || { echo "FAIL: the Gloo fallback trained to different parameters"; exit 1; }
echo "OK: fell back to Gloo with one warning, same parameters bit for bit"

# Room for the control segment (16 KiB + 3 x 8 MiB at 2 ranks) and the gradients (2 parts of
# 531457 floats, 520 pages each), plus 1 MiB: not for one copy of the parameters (520 pages).
pages=$(( (16384 + 3 * 8388608) / 4096 + 2 * 520 + 256 ))
unshare -m bash -c 'mount --make-rprivate / && mount -t tmpfs -o size='"$((pages * 4096))"' tmpfs /dev/shm && exec "$@"' _ \
  "$ddprun" --nproc_per_node=2 --master_port=0 "$train" "${common[@]}" >"$tmp/state.log" 2>&1 || {
  echo "run with room for the gradients only failed:"; cat "$tmp/state.log"; exit 1; }
grep 'shared-memory all-reduce' "$tmp/state.log" || true
grep -q 'params=531457 ' "$tmp/state.log" || { echo "the model size changed: fix the page counts above"; cat "$tmp/state.log"; exit 1; }
grep -q 'no room for a one-copy shared region.*falls back to a copy per rank' "$tmp/state.log" || {
  echo "expected the one-copy region's fallback warning"; cat "$tmp/state.log"; exit 1; }
grep -q 'no room for a shared region.*falls back to private memory' "$tmp/state.log" || {
  echo "expected the per-rank region's fallback warning"; cat "$tmp/state.log"; exit 1; }
grep -q 'step=fused(shm) state=private' "$tmp/state.log" || { echo "expected shm gradients, private state"; cat "$tmp/state.log"; exit 1; }
got_state="$(grep -o 'final_param_checksum=[0-9a-f]*' "$tmp/state.log" | tail -1)"
[[ "$got_state" == "$want" ]] || { echo "FAIL: private parameters trained to $got_state, not $want"; exit 1; }
echo "OK: no room for the parameters: one warning per fallback, private parameters, same bits"
