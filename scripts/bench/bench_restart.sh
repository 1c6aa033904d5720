#!/usr/bin/env bash
# Restart latency on one node, side by side in one run, same worker (scripts/bench/bench_restart_worker.py)
# for every launcher: --nproc_per_node=2 --max_restarts=1, gloo, loopback only.
#   ddprun           with the worker on torch 1.13 (/usr/bin/python3) and, if the venv exists, on torch 2.11;
#                    as is (defaults: --overlap_restart=1, the next attempt starts while the old survivors
#                    are still being stopped; --early_exit_watch=1, a worker's exit is seen as it begins),
#                    with --early_exit_watch=0 ("-nowatch": the exit is seen when reaped), and with WAIT=1
#                    also --overlap_restart=0 ("-wait": wait for the old survivors, then start)
#   torchrun 1.13    /usr/bin/python3 -m torch.distributed.run --redirects 1 --tee 1 --log_dir (Python 3.11 needs them)
#   torchrun 2.11    the venv's python -m torch.distributed.run (when $DDPRUN_VENV or .venv-torch2 exists)
# torchrun gets --monitor_interval 0.1. All launchers get --master_addr=127.0.0.1 and a free port.
# Attempt 0: rank 0 sits in an all_reduce that rank 1 never joins; once rank 1 is past init_process_group
# the driver SIGKILLs it (t_kill). Measured from t_kill, per run:
#   noticed  the launcher's first stderr line announcing the failure (read line by line as it comes):
#            ddprun: "[ddprun] warning: worker r1 ... failed ..."; torchrun: its first elastic log line
#            mentioning failed/FAILED/closing signal/Stopping/restart (the line is printed below the table);
#            also the first such line saying "failed" (torchrun logs it only after it has stopped the group)
#   exec'd   every replacement worker process running (max t_exec of attempt 1, stamped by
#            scripts/bench/bench_exec_stamp.c, which every launcher runs in front of `python -u worker`)
#   started  every replacement worker's first Python line (max t_start of attempt 1: Python start-up included)
#   init     every replacement worker past init_process_group("gloo") (max t_init of attempt 1)
# plus the launcher's total wall time and exit code. Runs are interleaved across launchers (round-robin, the
# order rotated each round); workers a run leaves behind are SIGKILLed by pid (and counted in the notes);
# the table has medians and ratios X/ddprun (ddprun --overlap_restart=1 with the same torch in its workers).
# Bounded: each run is killed after RUN_TIMEOUT s (45); whole rounds stop once the next would pass BUDGET s
# (270) from the script's start, so the script ends in < 5 min (fewer than N runs on a slow host). KEEP=1
# keeps the per-run stderr logs (with read times) and timestamp files.
# DDPRUN_BEFORE=<another ddprun> adds its rows ("ddprun-before", defaults), interleaved like every
# launcher, to compare two builds in one run; NO_TORCHRUN=1 leaves torchrun's rows out.
#   usage: scripts/bench/bench_restart.sh [-n N] [build-dir]     (N default 5; env DDPRUN=..., DDPRUN_VENV=...)
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
N=5
while getopts "n:h" opt; do
  case $opt in
    n) N="$OPTARG" ;;
    *) sed -n '2,24p' "$0"; exit 2 ;;
  esac
done
shift $((OPTIND - 1))
build="${1:-$here/build}"
DDPRUN="${DDPRUN:-$build/launcher/ddprun}"
VENV_PY="${DDPRUN_VENV:-$here/.venv-torch2}/bin/python"
SYS_PY=/usr/bin/python3
WORKER="$here/scripts/bench/bench_restart_worker.py"
RUN_TIMEOUT="${RUN_TIMEOUT:-45}"    # seconds, one launcher run (the kill wait included)
BUDGET="${BUDGET:-270}"             # seconds, all runs: later runs are skipped past it
[[ -x "$DDPRUN" ]] || { echo "no ddprun at $DDPRUN (build first: cmake --build $build --target ddprun)"; exit 1; }
[[ -f "$WORKER" ]] || { echo "no worker at $WORKER"; exit 1; }
tmp="$(mktemp -d)"
if [[ -n "${KEEP:-}" ]]; then echo "(KEEP: per-run stderr logs and timestamps stay in $tmp)"; else trap 'rm -rf "$tmp"' EXIT; fi

# ---- one run: launch, wait for rank 1 of attempt 0 past init, SIGKILL it, time what follows ----
cat > "$tmp/trial.py" <<'PY'
import json, os, re, signal, socket, subprocess, sys, threading, time
name, run, torchver, results, workdir, timeout = sys.argv[1:7]
cmd = sys.argv[7:]
run, timeout = int(run), float(timeout)
d = os.path.join(workdir, "%s.%d" % (name, run)); os.makedirs(d)
ts, pidfile = os.path.join(d, "ts.jsonl"), os.path.join(d, "rank1.pid")
s = socket.socket(); s.bind(("127.0.0.1", 0)); port = s.getsockname()[1]; s.close()
cmd = [a.replace("{PORT}", str(port)).replace("{LOGDIR}", os.path.join(d, "logs")) for a in cmd]
env = dict(os.environ, BENCH_RESTART_TS=ts, BENCH_RESTART_PIDFILE=pidfile, GLOO_SOCKET_IFNAME="lo",
           PYTHONUNBUFFERED="1")
if name.startswith("ddprun"):
    notice_re = re.compile(r"^\[ddprun\] warning: worker r1 .*failed")
else:  # torchrun's own log lines (1.13: "WARNING:torch.distributed...", 2.x: "W1129 ... torch/distributed/...")
    notice_re = re.compile(r"^(?:(?:INFO|WARNING|ERROR):torch\.distributed|[IWE]\d{4} .*torch/distributed/)"
                           r".*(?:failed|FAILED|closing signal|Stopping|[Rr]estart)")
lines = []  # (time.time() when read, text)
t0 = time.time()
p = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=env, start_new_session=True)
def reader():
    for raw in iter(p.stderr.readline, b""):
        lines.append((time.time(), raw.decode(errors="replace").rstrip("\n")))
th = threading.Thread(target=reader, daemon=True); th.start()
deadline = t0 + timeout
res = dict(name=name, torch=torchver, run=run, error=None)
pid = None
while time.time() < deadline and p.poll() is None:
    try:
        with open(pidfile) as f: pid = int(f.read())
        break
    except (FileNotFoundError, ValueError):
        time.sleep(0.002)
if pid is None:
    res["error"] = "rank 1 of attempt 0 never wrote its pid (launcher exit %s)" % p.poll()
    t_kill = None
else:
    t_kill = time.time()
    os.kill(pid, signal.SIGKILL)
try:
    rc = p.wait(timeout=max(0.1, deadline - time.time()))
except subprocess.TimeoutExpired:
    os.killpg(p.pid, signal.SIGKILL); rc = p.wait()
    res["error"] = res["error"] or "timed out after %.0f s" % timeout
t_end = time.time()
th.join(5)
def sweep():  # workers left behind (torchrun 2.x starts each in its own session, so killpg misses them)
    left = []
    if not os.path.exists(ts): return left
    with open(ts) as f:
        for w in {json.loads(l)["pid"] for l in f if l.strip()}:
            try:
                with open("/proc/%d/cmdline" % w, "rb") as c:
                    if b"bench_restart_worker" not in c.read(): continue
                os.kill(w, signal.SIGKILL); left.append(w)
            except (FileNotFoundError, ProcessLookupError):
                pass
    return left
left = sweep()
if left: res["killed_leftover_workers"] = left
with open(os.path.join(d, "stderr.log"), "w") as f:
    f.writelines("%.6f %s\n" % l for l in lines)
res.update(rc=rc, wall_s=t_end - t0)
recs = []
if os.path.exists(ts):
    with open(ts) as f: recs = [json.loads(l) for l in f if l.strip()]
if t_kill is not None:
    note = next(((t, l) for t, l in lines if t >= t_kill and notice_re.search(l)), None)
    if note: res.update(noticed_ms=(note[0] - t_kill) * 1e3, notice_line=note[1])
    # the first of those lines that literally says "failed" (torchrun logs it after stopping the group)
    fl = next(((t, l) for t, l in lines if t >= t_kill and notice_re.search(l) and "failed" in l.lower()), None)
    if fl: res.update(failed_line_ms=(fl[0] - t_kill) * 1e3, failed_line=fl[1])
    e1 = [r for r in recs if r["attempt"] == 1 and r["event"] == "exec"]
    if len(e1) == 2: res["exec_ms"] = (max(r["t_exec"] for r in e1) - t_kill) * 1e3
    s1 = [r for r in recs if r["attempt"] == 1 and r["event"] == "start"]
    a1 = [r for r in recs if r["attempt"] == 1 and r["event"] == "init"]
    res.update(replacements_started=len(s1), replacements_init=len(a1))
    if len(s1) == 2: res["started_ms"] = (max(r["t_start"] for r in s1) - t_kill) * 1e3
    if len(a1) == 2: res["init_ms"] = (max(r["t_init"] for r in a1) - t_kill) * 1e3
    if len(a1) != 2:
        why = "%d of 2 replacement workers started, %d past init_process_group" % (len(s1), len(a1))
        res["error"] = "%s; %s" % (res["error"], why) if res["error"] else why
    err = [r for r in recs if r["event"] == "allreduce_error"]
    if err: res["rank0_allreduce_error_ms"] = (err[0]["t"] - t_kill) * 1e3; res["rank0_error"] = err[0]["error"]
    if sum(r["event"] == "done" for r in recs) != 2 and not res["error"]:
        res["error"] = "attempt 1 did not finish its all_reduce on both ranks"
if rc != 0 and not res["error"]:
    res["error"] = "launcher exit %s" % rc
if res["error"]:
    errl = [l for _, l in lines if re.search(r"Error|connectFullMesh", l)]
    res["stderr_tail"] = errl[:2] + ["..."] + [l for _, l in lines[-3:]]
with open(results, "a") as f: f.write(json.dumps(res) + "\n")
fmt = lambda k: ("%7.0f" % res[k]) if k in res else "      -"
print("  %-26s run %d: noticed %s ms  started %s ms  init %s ms  wall %5.2f s  rc %s%s" % (
    name + " (" + torchver + ")", run, fmt("noticed_ms"), fmt("started_ms"), fmt("init_ms"), res["wall_s"], rc,
    ("  ERROR: " + res["error"]) if res["error"] else ""), flush=True)
PY

# ---- launchers: NAME TORCH PYTHON-FOR-WORKERS  then the command (worker path appended) ----
names=() ; declare -A TORCHV CMD WPY
add() { names+=("$1"); TORCHV[$1]="$2"; WPY[$1]="$3"; shift 3; CMD[${names[-1]}]="$(printf '%q ' "$@")"; }
tv() { "$1" -c "import torch, torch.distributed; print(torch.__version__.split('+')[0])" 2>/dev/null; }
common=(--nproc_per_node=2 --max_restarts=1 --master_addr=127.0.0.1 "--master_port={PORT}")
# Every launcher starts the worker through bench_exec_stamp (when a C compiler is here), which
# stamps the moment the replacement process runs, before Python's own start-up.
STAMP=""
if cc -O2 -o "$tmp/bench_exec_stamp" "$here/scripts/bench/bench_exec_stamp.c" 2>/dev/null; then STAMP="$tmp/bench_exec_stamp"; fi
wrap() {  # PYTHON -> the launcher arguments that run the worker through the stamp, under that python
  if [[ -n "$STAMP" ]]; then echo --no_python "$STAMP" "$1" -u; fi
}
if v=$(tv "$SYS_PY"); then
  add ddprun "$v" "$SYS_PY" "$DDPRUN" "${common[@]}" --overlap_restart=1 $(wrap "$SYS_PY")
  if [[ -n "${DDPRUN_BEFORE:-}" ]]; then add ddprun-before "$v" "$SYS_PY" "$DDPRUN_BEFORE" "${common[@]}" --overlap_restart=1 $(wrap "$SYS_PY"); fi
  add ddprun-nowatch "$v" "$SYS_PY" "$DDPRUN" "${common[@]}" --early_exit_watch=0 $(wrap "$SYS_PY")
  if [[ -n "${WAIT:-}" ]]; then add ddprun-wait "$v" "$SYS_PY" "$DDPRUN" "${common[@]}" --overlap_restart=0 $(wrap "$SYS_PY"); fi
  [[ -n "${NO_TORCHRUN:-}" ]] || add torchrun "$v" "$SYS_PY" "$SYS_PY" -m torch.distributed.run --redirects 1 --tee 1 --log_dir "{LOGDIR}" \
    --monitor_interval 0.1 "${common[@]}" $(wrap "$SYS_PY")
else
  echo "(no torch on $SYS_PY: ddprun/torchrun with torch 1.13 skipped)"
fi
if [[ -x "$VENV_PY" ]] && v=$(tv "$VENV_PY"); then
  add ddprun-venv "$v" "$VENV_PY" "$DDPRUN" "${common[@]}" --overlap_restart=1 $(wrap "$VENV_PY")
  if [[ -n "${DDPRUN_BEFORE:-}" ]]; then add ddprun-venv-before "$v" "$VENV_PY" "$DDPRUN_BEFORE" "${common[@]}" --overlap_restart=1 $(wrap "$VENV_PY"); fi
  add ddprun-venv-nowatch "$v" "$VENV_PY" "$DDPRUN" "${common[@]}" --early_exit_watch=0 $(wrap "$VENV_PY")
  if [[ -n "${WAIT:-}" ]]; then add ddprun-venv-wait "$v" "$VENV_PY" "$DDPRUN" "${common[@]}" --overlap_restart=0 $(wrap "$VENV_PY"); fi
  [[ -n "${NO_TORCHRUN:-}" ]] || add torchrun-venv "$v" "$VENV_PY" "$VENV_PY" -m torch.distributed.run --monitor_interval 0.1 "${common[@]}" $(wrap "$VENV_PY")
else
  echo "(no torch in $VENV_PY: torchrun 2.x skipped)"
fi
((${#names[@]})) || { echo "no python with torch found"; exit 1; }

echo "# restart latency: --nproc_per_node=2 --max_restarts=1, gloo on loopback, rank 1 SIGKILLed after init"
echo "# $N runs each, interleaved; $(nproc) cores, $(date -u '+%F %T') UTC, ddprun $DDPRUN"
if [[ -n "$STAMP" ]]; then echo "# workers started through bench_exec_stamp (exec time stamped)"
else echo "# workers started as python scripts (no C compiler here: no exec'd column)"; fi
results="$tmp/results.jsonl"; : > "$results"
round_s=0
for ((i = 0; i < N; i++)); do
  # whole rounds only, so every launcher gets as many runs; stop when the next round would pass BUDGET
  if ((i > 0 && SECONDS + round_s > BUDGET)); then
    echo "  (time budget: ${SECONDS}s spent, a round takes ~${round_s}s; stopping after $i of $N rounds)"; break
  fi
  r0=$SECONDS
  k=${#names[@]}
  for ((j = 0; j < k; j++)); do
    n=${names[$(((i + j) % k))]}  # rotated each round: no launcher always runs right after the same one
    eval "cmd=(${CMD[$n]})"
    PYTHON_EXEC="${WPY[$n]}" timeout -k 5 $((RUN_TIMEOUT + 15)) \
      python3 "$tmp/trial.py" "$n" "$i" "${TORCHV[$n]}" "$results" "$tmp" "$RUN_TIMEOUT" "${cmd[@]}" "$WORKER" ||
      echo "  $n run $i: driver failed (exit $?)"
  done
  round_s=$((SECONDS - r0))
done

# ---- medians, ratios ----
python3 - "$results" <<'PY'
import json, statistics, sys
rs = [json.loads(l) for l in open(sys.argv[1])]
names = list(dict.fromkeys(r["name"] for r in rs))
EARLY = ("noticed_ms", "failed_line_ms", "exec_ms", "started_ms")  # stages before the replacements' init
def med(name, k):
    # A run whose replacements failed later (torchrun's connectFullMesh) still timed these stages.
    v = [r[k] for r in rs if r["name"] == name and (k in EARLY or not r["error"]) and k in r]
    return statistics.median(v) if v else None
base = {r["torch"]: r["name"] for r in rs if r["name"] in ("ddprun", "ddprun-venv")}  # overlap on
keys = [("noticed_ms", "kill → failure noticed (ms)"), ("failed_line_ms", "kill → line saying 'failed' (ms)"), ("exec_ms", "kill → all replacements exec'd (ms)"), ("started_ms", "kill → all replacements' first Python line (ms)"),
        ("init_ms", "kill → all past init_process_group (ms)"), ("wall_s", "total wall (s)")]
print("\n| launcher | worker torch | ok runs | " + " | ".join(h for _, h in keys) + " | exit codes |")
print("|---|---|---|" + "---|" * (len(keys) + 1))
for n in names:
    mine = [r for r in rs if r["name"] == n]
    tv = mine[0]["torch"]; b = base.get(tv)
    cells = []
    for k, _ in keys:
        m = med(n, k)
        if m is None: cells.append("-"); continue
        c = ("%.2f" if k == "wall_s" else "%.0f") % m
        mb = med(b, k) if b and b != n else None
        if mb: c += " (%.1fx)" % (m / mb)
        cells.append(c)
    codes = sorted(set(str(r["rc"]) for r in mine))
    if n.startswith("ddprun"):
        label = ("ddprun-before (defaults)" if n.endswith("-before") else
                 "ddprun --overlap_restart=0" if n.endswith("-wait") else
                 "ddprun --early_exit_watch=0" if n.endswith("-nowatch") else "ddprun (defaults)")
    else:
        label = "torchrun " + ".".join(tv.split(".")[:2])
    print("| %s | %s | %d/%d | %s | %s |" % (label, tv, sum(not r["error"] for r in mine), len(mine),
                                           " | ".join(cells), ",".join(codes)))
print("\nmedians: up to the replacements' first Python line over every run that got that far, init and wall over the"
      " runs without error; (Nx) = this row / ddprun (defaults) with the same torch in its workers;"
      " wall = launcher start to exit, both attempts' `import torch` included")
print("\nfailure-noticed line (first run of each):")
for n in names:
    r = next((r for r in rs if r["name"] == n and "notice_line" in r), None)
    print("  %-16s %s" % (n, r["notice_line"][:160] if r else "(none seen)"))
    if r and r.get("failed_line") and r["failed_line"] != r["notice_line"]:
        print("  %-16s %s" % ("", r["failed_line"][:160]))
lo = [r for r in rs if r.get("killed_leftover_workers")]
if lo:
    print("\nworkers left running after the launcher exited (SIGKILLed by the driver): " +
          ", ".join("%s run %d: %d" % (r["name"], r["run"], len(r["killed_leftover_workers"])) for r in lo))
errs = [r for r in rs if r.get("rank0_error")]
if errs:
    ms = statistics.median(r["rank0_allreduce_error_ms"] for r in errs)
    print("\nrank 0's pending all_reduce raised in %d/%d runs, median %.0f ms after the kill (about when the killed"
          " process's sockets closed, i.e. when it was really gone): %s" % (len(errs), len(rs), ms, errs[0]["rank0_error"][:100]))
for r in rs:
    if r["error"]:
        print("\n%s run %d: %s\n    %s" % (r["name"], r["run"], r["error"], "\n    ".join(r.get("stderr_tail", []))))
PY
