#!/usr/bin/env bash
# On a GPU machine: --nccl_flight_recorder with a real NCCL collective timeout on one GPU. A
# PyTorch 2.x job (world size 1, NCCL, 8 s process-group timeout) completes one all_reduce, then
# queues a second one behind a kernel that spins for minutes (torch.cuda._sleep): PyTorch's
# watchdog times the collective out after 8 s, its flight recorder dumps into
# <run dir>/nccl_trace/ a few seconds later, and ddprun's summary lists the dump. The worker
# ends (SIGABRT from the watchdog) only once the spinning kernel has ended: about 3.5 minutes on
# an H200. The dump is read back (pickle) and must hold both all_reduce
# entries, the second one not completed.
#   scripts/bench/check_nccl_flight_recorder_gpu.sh BIN_DIR   (after . scripts/bench/device_env.sh BIN_DIR)
set -uo pipefail
. "$(dirname "${BASH_SOURCE[0]}")/gpu_check_env.sh"
PY="${PY:-python3}"
work="$(mktemp -d)"
cat > "$work/hang.py" <<'PYEOF'
import datetime, os, torch, torch.distributed as dist
torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
dist.init_process_group("nccl", timeout=datetime.timedelta(seconds=8))
x = torch.ones(1 << 20, device="cuda")
dist.all_reduce(x)
torch.cuda.synchronize()
print("first all_reduce done", x[0].item(), flush=True)
torch.cuda._sleep(int(4e11))  # minutes of spinning on the compute stream
dist.all_reduce(x)            # waits behind it on the GPU: the watchdog's timeout fires
torch.cuda.synchronize()
print("not reached", flush=True)
PYEOF
start=$(date +%s)
PYTHON_EXEC="$(command -v "$PY")" timeout 300 "$ddprun" --nproc_per_node=1 --max_restarts=0 --master_port="$(port)" \
  --nccl_flight_recorder --log_dir "$work/logs" "$work/hang.py" > "$work/out" 2> "$work/err"
rc=$?
echo "== ddprun exit $rc after $(( $(date +%s) - start )) s; its lines:"
grep -E '^\[ddprun\]|^    ' "$work/err" | grep -v '^    at ' | head -30
echo "== the worker's last lines"
grep -E 'first all_reduce|not reached|Watchdog|timeout|Timeout' "$work/out" "$work/err" | cut -c1-300 | head -8
fail=0
dump="$(grep -oE '^    /[^ ]*/nccl_trace/rank_0$' "$work/err" | head -1 | tr -d ' ')"
if [[ $rc == 0 ]]; then echo "FAIL: the job should have failed"; fail=1; fi
if [[ -z "$dump" || ! -s "$dump" ]]; then
  echo "FAIL: the summary lists no non-empty <run dir>/nccl_trace/rank_0"; ls -la "$work"/logs/*/nccl_trace 2>&1; fail=1
else
  echo "== the dump ($dump, $(stat -c %s "$dump") bytes), read back"
  "$PY" - "$dump" <<'PYEOF' || fail=1
import pickle, sys
d = pickle.load(open(sys.argv[1], "rb"))
entries = d.get("entries", [])
print("version", d.get("version"), "entries", len(entries))
for e in entries:
    print(" ", e.get("profiling_name"), "state", e.get("state"), "seq", e.get("collective_seq_id"),
          "timeout_ms", e.get("timeout_ms"))
ar = [e for e in entries if "allreduce" in str(e.get("profiling_name", "")).replace("_", "")]
if len(ar) < 2 or ar[-1].get("state") == "completed":
    print("FAIL: expected two all_reduce entries, the last one not completed"); sys.exit(1)
PYEOF
fi
rm -rf "$work"
[[ $fail == 0 ]] && echo "PASS: a real NCCL timeout's flight-recorder dump lands in the run directory and the summary lists it"
exit $fail
