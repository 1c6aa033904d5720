#!/usr/bin/env bash
# The test commands, in two tiers:
#   scripts/test.sh          every functional test: installs what is missing, builds, and runs
#                            every ctest test (unit, integration, end-to-end, interop with
#                            PyTorch 1.13, 2.11 and 2.15, multi-host in network namespaces, Slurm)
#   scripts/test.sh --full   the same, then a short fuzz run of each libFuzzer target and the
#                            suite again under ASan+UBSan and under TSan (what .ci/run runs)
# Needs root for apt-get, network namespaces and the Slurm cluster, as CI has. Other arguments
# go to the main ctest run (e.g. scripts/test.sh -R launcher).
#
# Stages, in this order (docs/FUZZING.md has what each costs on a 2-core box):
#   suite  the main build (build/) and every ctest test
#   fuzz   DDPRUN_TEST_FUZZ_SECONDS=N seconds per fuzz target (--full: default 30; 0 skips it)
#   asan   the suite again, built with ASan+UBSan (build-asan; what is left out and why: below)
#   tsan   the server, client, agent and worker-runtime tests built with TSan (build-tsan)
# Without --full, fuzz and the sanitizer stages run only when asked for by these variables.
# DDPRUN_TEST_SANITIZERS: 0 or none skips both sanitizer stages; asan or tsan runs one of them;
# 1 or asan,tsan both (the default with --full).
# DDPRUN_TEST_MAIN=0 skips the main suite (to run only the other stages).
# Every stage runs even when an earlier one failed (a stage's own steps are chained with &&:
# `set -e` does not apply inside `if`); the exit status is 1 if any failed.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
build="${DDPRUN_BUILD_DIR:-$here/build}"
jobs="${DDPRUN_TEST_JOBS:-2}"
full=0
if [[ "${1:-}" == --full ]]; then full=1; shift; fi
if ((full)); then
  fuzz_seconds="${DDPRUN_TEST_FUZZ_SECONDS:-30}"
  sanitizers="${DDPRUN_TEST_SANITIZERS:-asan,tsan}"
else
  fuzz_seconds="${DDPRUN_TEST_FUZZ_SECONDS:-0}"
  sanitizers="${DDPRUN_TEST_SANITIZERS:-none}"
fi
[[ "$sanitizers" == 1 || "$sanitizers" == all ]] && sanitizers="asan,tsan"
[[ "$sanitizers" == 0 || "$sanitizers" == none ]] && sanitizers=""
# Sanitizer builds at -O1 with line tables only (-g1): half the compile time of -O2 -g (the
# builds dominate these stages), and reports still name file:line.
san_flags=("-DCMAKE_CXX_FLAGS_RELWITHDEBINFO=-O1 -g1 -DNDEBUG")

failed=()
passed=0
stage() {  # stage NAME COMMAND...: runs it, times it, remembers a failure
  local name="$1" start=$SECONDS
  shift
  echo "[test] stage $name"
  if "$@"; then
    echo "[test] stage $name passed in $((SECONDS - start)) s"
    passed=$((passed + 1))
  else
    echo "[test] stage $name FAILED after $((SECONDS - start)) s" >&2
    failed+=("$name")
  fi
}

# One line for each tier of tests that this build leaves out, and why.
skipped_tiers() {
  local cache="$1/CMakeCache.txt"
  if grep -q '^DDPRUN_WITH_LIBTORCH:STRING=OFF' "$cache"; then
    echo "[test] skipped: the LibTorch DDP tests (libtorch.*): DDPRUN_WITH_LIBTORCH=OFF"
  elif ! (cd "$1" && ctest -N -R '^libtorch\.' | grep -q 'Total Tests: [1-9]'); then
    echo "[test] skipped: the LibTorch DDP tests (libtorch.*): no LibTorch found (scripts/setup_deps.sh makes .venv-torch2)"
  fi
  [[ -x "$here/.venv-torch215/bin/python" ]] ||
    echo "[test] skipped: the torch 2.15 tier (*.torch215.*): no .venv-torch215 (scripts/setup_deps.sh makes it)"
  [[ -e /usr/include/munge.h ]] ||
    echo "[test] skipped: munge authentication is built without munge.h (apt-get install libmunge-dev); slurm.cluster.munge fails"
  return 0
}

# The torch 2.15 venv (its test tier only) is made beside the build: about 70 s of download and
# unpacking on a machine that has none, hidden behind the compiler. Waited for before the tests.
torch215_pid=""
torch215_log="${TMPDIR:-/tmp}/ddprun-setup-torch215.$$.log"
start_torch215() {
  [[ "${DDPRUN_SKIP_TORCH2:-0}" == 1 ]] && return 0
  "$here/scripts/setup_deps.sh" --torch215 >"$torch215_log" 2>&1 &
  torch215_pid=$!
}
wait_torch215() {
  [[ -n "$torch215_pid" ]] || return 0
  local start=$SECONDS rc=0
  wait "$torch215_pid" || rc=$?
  torch215_pid=""
  sed 's/^/  /' "$torch215_log"
  rm -f "$torch215_log"
  echo "[test] torch 2.15 venv ready (waited $((SECONDS - start)) s, exit $rc)"
  return 0  # a missing venv: its tier skips, or fails with CI=true
}

main_suite() {
  "$here/scripts/build.sh" &&
  wait_torch215 &&
  skipped_tiers "$build" &&
  (cd "$build" && ctest --output-on-failure --timeout 900 -j "$jobs" "$@")
}

# ASan+UBSan over the suite: every C++ test and the ddprun/ddprund/train binaries that the
# Python (PyTorch) tests drive; the Python interpreters themselves are not instrumented. Left
# out, each for a reason:
#   - the GPU parts (-DDDPRUN_WITH_CUDA=OFF): nvcc does not instrument them, CI has no GPU;
#   - LibTorch DDP (-DDDPRUN_WITH_LIBTORCH=OFF, the libtorch.* tests): LibTorch is not
#     instrumented, and compiling against its headers would be most of this stage's build;
#   - rendezvous.resource_limits: it asserts RSS bounds (e.g. < 64 MB growth per request),
#     which ASan's shadow memory and quarantine make meaningless, and it exhausts the
#     daemon's descriptors, where UBSan's vptr check cannot probe memory (it needs a pipe) and
#     reports a false "invalid vptr"; the server's request handling runs under ASan in the
#     fuzz stage and in rendezvous.server_client (it runs under TSan, below);
#   - rendezvous.attack and rendezvous.attack_fairness: they assert other clients' p99 latency
#     (< 50 ms) and RSS under the memory budget, which the sanitizers' slowdown and shadow
#     memory decide instead of the code; the requests they send run under ASan in the fuzz
#     stage and rendezvous.server_client (its fairness case counts, it does not time);
#   - rendezvous.attack_memory: it runs ddprund in a memory cgroup sized for the plain build
#     and asserts the kernel never kills it, which ASan's shadow memory and quarantine would;
#   - worker.install: it builds an out-of-tree consumer of the installed library, which the
#     sanitizer runtime is not linked into (packaging, not memory).
#   - the torch 2.15 tier (*.torch215.*) and the launcher's 1.13 tier (launcher.torch113.*,
#     launcher.spares.torch113.*): the same launches as the 2.11 tier, which runs under ASan
#     (the 1.13 wire dialect does too, in interop.torch113.*); left out to keep the stage's
#     time (about 6 minutes of tests);
#   - slurm.cluster.elastic and slurm.cluster.requeue: they wait on Slurm's own timers (node
#     failure, requeue), 4-6x longer under the sanitizers (400 s); the agent's paths they take
#     (restart, re-rendezvous, preemption) run under ASan in launcher.e2e.* and multinode.*;
#   - launcher.torch211.flags: every torchrun option through ddprun's parser, which the
#     options fuzz target covers under ASan.
# DDPRUN_ASAN_EXCLUDE (a ctest -E regex) replaces the list.
asan_exclude='^(rendezvous\.(resource_limits|attack|attack_memory|attack_fairness)|worker\.install|[a-z.]+\.torch215\..+|launcher\.(spares\.)?torch113\..+|slurm\.cluster\.(elastic|requeue)|launcher\.torch211\.flags)$'
asan_suite() {
  local dir="${DDPRUN_ASAN_BUILD_DIR:-$here/build-asan}"
  DDPRUN_BUILD_DIR="$dir" "$here/scripts/build.sh" -DDDPRUN_SANITIZE=address,undefined -DDDPRUN_WITH_CUDA=OFF \
    -DDDPRUN_WITH_LIBTORCH=OFF "${san_flags[@]}" &&
  (cd "$dir" && ASAN_OPTIONS="detect_leaks=1:abort_on_error=0:strict_string_checks=1" \
     UBSAN_OPTIONS="print_stacktrace=1:halt_on_error=1" \
     ctest --output-on-failure --timeout 1800 -j "$jobs" -E "${DDPRUN_ASAN_EXCLUDE:-$asan_exclude}")
}

# TSan over what has threads: the Asio server, the blocking client, the launcher's agent
# (unit, end-to-end, process tests) and the worker runtime (its communication thread, the
# reducer's inline and threaded progress, the shared-memory collectives with ranks as threads,
# the background checkpoint writer; CPU only: the GPU and LibTorch parts are left out as in
# the ASan stage). tests/worker_runtime/tsan_catch.supp suppresses races inside Catch2's own
# assertion counters (tests that assert in rank threads), nothing of ours. What TSan cannot
# see: two processes writing one shared-memory segment (the barriers and disjoint slices keep
# that apart; tests compare bits). worker.install, rendezvous.attack, rendezvous.attack_memory and
# rendezvous.attack_fairness: as in the ASan stage.
tsan_suite() {
  local dir="${DDPRUN_TSAN_BUILD_DIR:-$here/build-tsan}"
  DDPRUN_BUILD_DIR="$dir" "$here/scripts/build.sh" -DDDPRUN_SANITIZE=thread -DDDPRUN_BUILD_WORKER_RUNTIME=ON \
    -DDDPRUN_WITH_CUDA=OFF -DDDPRUN_WITH_LIBTORCH=OFF "${san_flags[@]}" &&
  (cd "$dir" && TSAN_OPTIONS="halt_on_error=1:second_deadlock_stack=1:suppressions=$here/tests/worker_runtime/tsan_catch.supp" \
     ctest --output-on-failure --timeout 1800 -j "$jobs" -R '^(rendezvous\.|launcher\.(unit|e2e|process)|worker\.)' \
       -E '^(worker\.install|rendezvous\.attack(_memory|_fairness)?)$')
}

start=$SECONDS
DDPRUN_SKIP_TORCH215=1 "$here/scripts/setup_deps.sh"
start_torch215
echo "[test] packages ready after $((SECONDS - start)) s (the torch 2.15 venv: in the background)"
[[ "${DDPRUN_TEST_MAIN:-1}" != 0 ]] && stage suite main_suite "$@"
wait_torch215
if ((fuzz_seconds > 0)); then
  stage fuzz "$here/scripts/fuzz.sh" "$fuzz_seconds"
fi
[[ ",$sanitizers," == *,asan,* ]] && stage asan asan_suite
[[ ",$sanitizers," == *,tsan,* ]] && stage tsan tsan_suite
# The closing line counts stages (the main suite's own ctest summary is above).
if ((${#failed[@]})); then
  echo "[test] FAILED stages: ${failed[*]}" >&2
  echo "stages: $passed passed, ${#failed[@]} failed ($((SECONDS - start)) s)"
  exit 1
fi
echo "[test] all stages passed ($((SECONDS - start)) s)"
echo "stages: $passed passed, 0 failed"
