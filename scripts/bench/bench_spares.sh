#!/usr/bin/env bash
# Warm spares (issue 14): how long the GPUs of a job sit idle after a worker dies, side by side in one run.
# Same worker for every launcher (scripts/bench/bench_spares_worker.py): --nproc_per_node=2 --max_restarts=1,
# gloo on loopback. Attempt 0: both ranks pass init_process_group and a first all_reduce; then the driver
# SIGKILLs rank 1 (t_kill). For ddprun with spares the kill waits until both spares said they are ready
# ("warm spare ... ready" in ddprun -v's log): the state of a job that has run for longer than one
# `import torch`. Measured from t_kill, by the workers' own clocks (time.time(), one host):
#   started  every replacement's first line of its own code (max over ranks of attempt 1)
#   init     every replacement past init_process_group("gloo")
#   ready    every replacement past its first all_reduce: the job computes again
# Launchers (each with every worker python that has torch: /usr/bin/python3 = torch 1.13, $DDPRUN_VENV or
# .venv-torch2 = torch 2.x, or the pythons listed in $PYS):
#   ddprun --warm_spares=1  (--spare_priority=$SPARE_PRIORITY, default idle: the default)
#   ddprun --warm_spares=0  (cold restart: exec python, import torch)
#   torchrun                (python -m torch.distributed.run --monitor_interval 0.1, with torch >= 2 only)
# Runs are interleaved (round-robin, order rotated each round); medians and ratios to torchrun and to ddprun
# cold of the same torch. Bounded: RUN_TIMEOUT (default 90 s) per run; whole rounds stop past BUDGET
# (default 540 s). KEEP=1 keeps the per-run logs.
# On the GPU machine (binaries from scripts/bench/bundle_bin.sh):
#   . scripts/bench/device_env.sh out/bench-bin && DDPRUN=out/bench-bin/ddprun PYS="$(which python3)" \
#     scripts/bench/bench_spares.sh -n 3
#   usage: scripts/bench/bench_spares.sh [-n N] [build-dir]     (N default 3)
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
N=3
while getopts "n:h" opt; do
  case $opt in
    n) N="$OPTARG" ;;
    *) sed -n '2,23p' "$0"; exit 2 ;;
  esac
done
shift $((OPTIND - 1))
build="${1:-$here/build}"
DDPRUN="${DDPRUN:-$build/launcher/ddprun}"
PYS="${PYS:-/usr/bin/python3 ${DDPRUN_VENV:-$here/.venv-torch2}/bin/python}"
SPARE_PRIORITY="${SPARE_PRIORITY:-idle}"
WORKER="$here/scripts/bench/bench_spares_worker.py"
RUN_TIMEOUT="${RUN_TIMEOUT:-90}"
BUDGET="${BUDGET:-540}"
[[ -x "$DDPRUN" ]] || { echo "no ddprun at $DDPRUN (build first: cmake --build $build --target ddprun)"; exit 1; }
tmp="$(mktemp -d)"
if [[ -n "${KEEP:-}" ]]; then echo "(KEEP: per-run logs stay in $tmp)"; else trap 'rm -rf "$tmp"' EXIT; fi

cat > "$tmp/trial.py" <<'PY'
import json, os, re, signal, socket, subprocess, sys, threading, time
name, run, torchver, results, workdir, timeout, wait_spares = sys.argv[1:8]
cmd = sys.argv[8:]
run, timeout, wait_spares = int(run), float(timeout), wait_spares == "1"
d = os.path.join(workdir, "%s.%d" % (name, run)); os.makedirs(d)
ts, pidfile = os.path.join(d, "ts.jsonl"), os.path.join(d, "rank1.pid")
s = socket.socket(); s.bind(("127.0.0.1", 0)); port = s.getsockname()[1]; s.close()
cmd = [a.replace("{PORT}", str(port)) for a in cmd]
env = dict(os.environ, BENCH_SPARES_TS=ts, BENCH_SPARES_PIDFILE=pidfile, GLOO_SOCKET_IFNAME="lo", PYTHONUNBUFFERED="1")
lines, ready_re = [], re.compile(r"warm spare for local rank (\d+) ready: .*RSS (\d+) MiB \(PSS (\d+) MiB\)")
cv = threading.Condition()
t0 = time.time()
p = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=env, start_new_session=True)
def reader():
    for raw in iter(p.stderr.readline, b""):
        with cv:
            lines.append((time.time(), raw.decode(errors="replace").rstrip("\n"))); cv.notify_all()
    with cv: cv.notify_all()
th = threading.Thread(target=reader, daemon=True); th.start()
deadline = t0 + timeout
res = dict(name=name, torch=torchver, run=run, error=None)
def spares_ready():
    return {m.group(1): (int(m.group(2)), int(m.group(3))) for m in (ready_re.search(l) for _, l in lines) if m}
pid = None
while time.time() < deadline and p.poll() is None:
    with cv:
        ok = not wait_spares or len(spares_ready()) == 2
    try:
        with open(pidfile) as f: pid = int(f.read())
    except (FileNotFoundError, ValueError):
        pid = None
    if pid and ok: break
    with cv: cv.wait(0.05)
if wait_spares:
    sr = spares_ready()
    if sr: res["spare_rss_mib"] = max(v[0] for v in sr.values()); res["spare_pss_mib"] = max(v[1] for v in sr.values())
    res["spares_ready_after_s"] = (max((t for t, l in lines if ready_re.search(l)), default=t0) - t0)
t_kill = None
if pid is None or p.poll() is not None or (wait_spares and len(spares_ready()) < 2):
    res["error"] = "no kill: rank 1 pid %s, spares ready %d (launcher exit %s)" % (pid, len(spares_ready()), p.poll())
else:
    t_kill = time.time(); os.kill(pid, signal.SIGKILL)
try:
    rc = p.wait(timeout=max(0.1, deadline - time.time()))
except subprocess.TimeoutExpired:
    os.killpg(p.pid, signal.SIGKILL); rc = p.wait()
    res["error"] = res["error"] or "timed out after %.0f s" % timeout
th.join(5)
# workers a run left behind (torchrun 2.x starts each in its own session)
if os.path.exists(ts):
    with open(ts) as f:
        for w in {json.loads(l)["pid"] for l in f if l.strip()}:
            try:
                with open("/proc/%d/cmdline" % w, "rb") as c:
                    if b"bench_spares_worker" in c.read(): os.kill(w, signal.SIGKILL)
            except (FileNotFoundError, ProcessLookupError):
                pass
with open(os.path.join(d, "stderr.log"), "w") as f:
    f.writelines("%.6f %s\n" % l for l in lines)
res.update(rc=rc)
recs = []
if os.path.exists(ts):
    with open(ts) as f: recs = [json.loads(l) for l in f if l.strip()]
if t_kill is not None:
    for ev, key, out in (("start", "t_start", "started_ms"), ("init", "t_init", "init_ms"), ("ready", "t_ready", "ready_ms")):
        r1 = [r for r in recs if r["attempt"] == 1 and r["event"] == ev]
        if len(r1) == 2: res[out] = (max(r[key] for r in r1) - t_kill) * 1e3
    if "ready_ms" not in res and not res["error"]:
        res["error"] = "attempt 1 did not get past its first all_reduce on both ranks"
    note = next((l for _, l in lines if "restarting the worker group" in l), "")
    m = re.search(r"(\d+) of (\d+) from warm spares", note)
    if m: res["from_spares"] = "%s/%s" % (m.group(1), m.group(2))
if rc != 0 and not res["error"]:
    res["error"] = "launcher exit %s" % rc
if res["error"]:
    res["stderr_tail"] = [l for _, l in lines[-4:]]
with open(results, "a") as f: f.write(json.dumps(res) + "\n")
fmt = lambda k: ("%7.0f" % res[k]) if k in res else "      -"
print("  %-22s run %d: started %s ms  init %s ms  ready %s ms  rc %s%s%s" % (
    name + " (" + torchver + ")", run, fmt("started_ms"), fmt("init_ms"), fmt("ready_ms"), rc,
    ("  spares " + res["from_spares"]) if "from_spares" in res else "",
    ("  ERROR: " + res["error"]) if res["error"] else ""), flush=True)
PY

names=(); declare -A TORCHV CMD WPY WAIT
add() { names+=("$1"); TORCHV[$1]="$2"; WPY[$1]="$3"; WAIT[$1]="$4"; shift 4; CMD[${names[-1]}]="$(printf '%q ' "$@")"; }
tv() { "$1" -c "import torch, torch.distributed; print(torch.__version__.split('+')[0])" 2>/dev/null; }
common=(--nproc_per_node=2 --max_restarts=1 --master_addr=127.0.0.1 "--master_port={PORT}")
for py in $PYS; do
  [[ -x "$py" ]] || continue
  v=$(tv "$py") || { echo "(no torch in $py: skipped)"; continue; }
  tag="${v%.*}"
  add "ddprun-spares-$tag" "$v" "$py" 1 "$DDPRUN" -v "${common[@]}" --warm_spares=1 "--spare_priority=$SPARE_PRIORITY" "$WORKER"
  add "ddprun-cold-$tag" "$v" "$py" 0 "$DDPRUN" "${common[@]}" --warm_spares=0 "$WORKER"
  if [[ "${v%%.*}" -ge 2 ]]; then
    add "torchrun-$tag" "$v" "$py" 0 "$py" -m torch.distributed.run --monitor_interval 0.1 "${common[@]}" "$WORKER"
  fi
done
((${#names[@]})) || { echo "no python with torch found in: $PYS"; exit 1; }

echo "# warm spares: --nproc_per_node=2 --max_restarts=1, gloo on loopback, rank 1 SIGKILLed after its first all_reduce"
echo "# $N runs each, interleaved; $(nproc) cores, $(date -u '+%F %T') UTC; ddprun $DDPRUN; --spare_priority=$SPARE_PRIORITY"
results="$tmp/results.jsonl"; : > "$results"
round_s=0
for ((i = 0; i < N; i++)); do
  if ((i > 0 && SECONDS + round_s > BUDGET)); then
    echo "  (time budget: ${SECONDS}s spent, a round takes ~${round_s}s; stopping after $i of $N rounds)"; break
  fi
  r0=$SECONDS
  k=${#names[@]}
  for ((j = 0; j < k; j++)); do
    n=${names[$(((i + j) % k))]}
    eval "cmd=(${CMD[$n]})"
    PYTHON_EXEC="${WPY[$n]}" timeout -k 5 $((RUN_TIMEOUT + 15)) \
      python3 "$tmp/trial.py" "$n" "$i" "${TORCHV[$n]}" "$results" "$tmp" "$RUN_TIMEOUT" "${WAIT[$n]}" "${cmd[@]}" ||
      echo "  $n run $i: driver failed (exit $?)"
  done
  round_s=$((SECONDS - r0))
done

python3 - "$results" <<'PY'
import json, statistics, sys
rs = [json.loads(l) for l in open(sys.argv[1])]
names = list(dict.fromkeys(r["name"] for r in rs))
def vals(name, k):  # "started" counts every run that got that far (torchrun's replacements may fail later)
    return [r[k] for r in rs if r["name"] == name and (k == "started_ms" or not r["error"]) and k in r]
def med(name, k):
    v = vals(name, k)
    return statistics.median(v) if v else None
def rng(name, k):
    v = vals(name, k)
    return "%.0f–%.0f" % (min(v), max(v)) if len(v) > 1 else ""
print("\n| launcher | worker torch | ok runs | kill → replacements started (ms) | kill → all past init_process_group (ms) "
      "| kill → all past a first all_reduce (ms) | vs ddprun cold | vs torchrun | spare RSS / PSS (MiB) |")
print("|---|---|---|---|---|---|---|---|---|")
for n in names:
    mine = [r for r in rs if r["name"] == n]
    tv = mine[0]["torch"]; tag = n.rsplit("-", 1)[1]
    cells = []
    for k in ("started_ms", "init_ms", "ready_ms"):
        m = med(n, k)
        cells.append("-" if m is None else "%.0f" % m + (" (%s)" % rng(n, k) if rng(n, k) else ""))
    ready = med(n, "ready_ms")
    ratio = lambda other: ("%.1f×" % (med(other, "ready_ms") / ready)) if ready and med(other, "ready_ms") and other != n else "-"
    mem = "-"
    if n.startswith("ddprun-spares"):
        rss = [r["spare_rss_mib"] for r in mine if "spare_rss_mib" in r]; pss = [r["spare_pss_mib"] for r in mine if "spare_pss_mib" in r]
        if rss: mem = "%d / %d" % (statistics.median(rss), statistics.median(pss))
    label = {"ddprun-spares": "ddprun --warm_spares=1", "ddprun-cold": "ddprun --warm_spares=0", "torchrun": "torchrun"}[n.rsplit("-", 1)[0]]
    print("| %s | %s | %d/%d | %s | %s | %s |" % (label, tv, sum(not r["error"] for r in mine), len(mine), " | ".join(cells),
                                        ratio("ddprun-cold-" + tag), ratio("torchrun-" + tag) + " | " + mem))
print("\nmedians (min–max) over the runs without error (\"started\": every run that got that far); \"vs X\" = X's median ready time / this row's (how many times"
      " sooner this launcher's job computes again)")
sr = [r["spares_ready_after_s"] for r in rs if "spares_ready_after_s" in r]
if sr:
    print("spares ready %.1f s (median) after the launch (the kill waits for it)" % statistics.median(sr))
for r in rs:
    if r["name"].startswith("ddprun-spares") and r.get("from_spares") not in (None, "2/2"):
        print("%s run %d: only %s workers from spares" % (r["name"], r["run"], r.get("from_spares")))
    if r["error"]:
        print("\n%s run %d: %s\n    %s" % (r["name"], r["run"], r["error"], "\n    ".join(r.get("stderr_tail", []))))
PY
