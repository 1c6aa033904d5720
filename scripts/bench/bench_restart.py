#!/usr/bin/env python3
"""How long a job stops computing after a worker dies, side by side in one run, the same worker
(scripts/bench/bench_restart_worker.py) under every launcher: --nproc_per_node=2
--max_restarts=1, gloo on loopback, rank 1 SIGKILLed by this driver (t_kill). Two modes:

restart  Restart latency (scripts/bench/bench_restart.sh). Rank 1 is killed once past
         init_process_group, while rank 0 sits in an all_reduce rank 1 never joins.
         Launchers, for /usr/bin/python3's torch and the venv's ($DDPRUN_VENV or .venv-torch2):
           ddprun            as is (--overlap_restart=1: the next attempt starts while the old
                             survivors are being stopped; --early_exit_watch=1: an exit is seen
                             as it begins); "-nowatch": --early_exit_watch=0 (seen when reaped);
                             with WAIT=1 also "-wait": --overlap_restart=0
           torchrun          python -m torch.distributed.run --monitor_interval 0.1 (torch 1.13
                             with --redirects 1 --tee 1 --log_dir, which Python 3.11 needs)
         Each worker runs behind scripts/bench/bench_exec_stamp.c when a C compiler is here.
         Columns, from t_kill: noticed (the launcher's first stderr line about the failure;
         for torchrun its first elastic log line about it, and separately the first saying
         "failed"), exec'd (every replacement process running), started (every replacement's
         first Python line), init (every replacement past init_process_group), launcher wall.
         Defaults: -n 5, RUN_TIMEOUT 45 s, BUDGET 270 s.
spares   Warm spares (scripts/bench/bench_spares.sh). Rank 1 is killed once past a first
         all_reduce; for ddprun with spares only after both spares said they are ready
         ("warm spare ... ready" in ddprun -v's log). Launchers, for each python in $PYS
         (default /usr/bin/python3 and the venv's): ddprun --warm_spares=1
         (--spare_priority=$SPARE_PRIORITY, default idle), ddprun --warm_spares=0, and torchrun
         (torch >= 2 only). Columns, from t_kill by the workers' clocks: started, init, ready
         (every replacement past its first all_reduce: the job computes again), ratios, the
         spares' RSS/PSS. Defaults: -n 3, RUN_TIMEOUT 90 s, BUDGET 540 s.
gpu      Warm spares on GPUs (scripts/bench/bench_spares.sh gpu): --nproc_per_node=$NPROC (default 1)
         --max_restarts=1, NCCL, one GPU per local rank; the last rank SIGKILLed once past a first
         all_reduce (after every spare said it is ready, for ddprun with spares). Launchers, for
         each python in $PYS (default the venv's): ddprun --warm_spares=1 --spare_cuda=1,
         ddprun --warm_spares=1, ddprun --warm_spares=0, torchrun. Columns as for spares, plus
         "cuda" (every replacement's device current and a tensor on it) and the GPU memory a
         GPU-warm spare holds (NVML, from ddprun's log). Defaults: -n 3, RUN_TIMEOUT 120 s, BUDGET 480 s.
busy     Warm spares on a host whose cores are all busy (scripts/bench/bench_spares.sh busy): as
         "spares", but each worker of attempt 0 starts BENCH_LOAD processes that spin at normal
         priority (default: cores / 2 each, so every core is busy), and rank 1 is killed KILL_AT
         seconds after the launch (default 30) whether or not the spares are ready. Launchers, for
         each python in $PYS (default /usr/bin/python3): ddprun --spare_priority=idle, =normal,
         --warm_spares=0. Columns: when the spares were ready (after the launch), how many
         workers the restart took from spares, kill → every replacement past a first all_reduce.
         Defaults: -n 2, RUN_TIMEOUT 120 s, BUDGET 600 s.
Runs are interleaved (round-robin, order rotated each round); whole rounds stop once the next
would pass BUDGET; each run is killed after RUN_TIMEOUT; workers a run leaves behind are
SIGKILLed by pid. KEEP=1 keeps the per-run logs. Tables: medians, ratios to ddprun.
restart: DDPRUN_BEFORE=<another ddprun> adds its rows ("ddprun-before", defaults), interleaved like
every launcher, to compare two builds in one run; NO_TORCHRUN=1 leaves torchrun's rows out.
  usage: bench_restart.py {restart,spares,gpu,busy} [-n N] [build-dir]     (env DDPRUN=... for a binary)
"""
import argparse
import os
import re
import signal
import subprocess
import sys
import shutil
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import benchlib  # noqa: E402

HERE = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
WORKER = os.path.join(HERE, "scripts", "bench", "bench_restart_worker.py")
DDPRUN_NOTICE = re.compile(r"^\[ddprun\] warning: worker r1 .*failed")
# torchrun's own log lines (1.13: "WARNING:torch.distributed...", 2.x: "W1129 ... torch/distributed/...")
TORCHRUN_NOTICE = re.compile(r"^(?:(?:INFO|WARNING|ERROR):torch\.distributed|[IWE]\d{4} .*torch/distributed/)"
                             r".*(?:failed|FAILED|closing signal|Stopping|[Rr]estart)")
SPARE_READY = re.compile(r"warm spare for local rank (\d+) ready: .*RSS (\d+) MiB \(PSS (\d+) MiB\)")
SPARE_GPU = re.compile(r"GPU \d+ warm: context (\d+) ms, (?:NCCL set-up (\d+) ms|NCCL not warmed[^,]*), "
                       r"(?:holds (\d+) MiB)?")
NPROC = int(os.environ.get("NPROC", "1"))  # gpu mode: ranks (one GPU each); the other modes: 2


class Launcher:
    def __init__(self, name, torch, python, cmd, label, wait_spares=False, kill_at=None):
        self.name, self.torch, self.python, self.cmd, self.label = name, torch, python, cmd, label
        self.wait_spares = wait_spares
        self.kill_at = kill_at  # seconds after the launch (busy mode), not when the pid file appears


def ms_after(t_kill, recs, event, key, nproc=2):
    """Milliseconds from t_kill to the last of attempt 1's `nproc` `event` records, or None."""
    r1 = [r for r in recs if r["attempt"] == 1 and r["event"] == event]
    return (max(r[key] for r in r1) - t_kill) * 1e3 if len(r1) == nproc else None


def trial(mode, la, run, workdir, timeout):
    """One launcher run: start it, kill rank 1 of attempt 0 when due, time what follows."""
    d = os.path.join(workdir, "%s.%d" % (la.name, run))
    os.makedirs(d)
    ts, pidfile = os.path.join(d, "ts.jsonl"), os.path.join(d, "rank1.pid")
    port = benchlib.free_port()
    cmd = [a.replace("{PORT}", str(port)).replace("{LOGDIR}", os.path.join(d, "logs")) for a in la.cmd]
    env = dict(os.environ, BENCH_RESTART_TS=ts, BENCH_RESTART_PIDFILE=pidfile, GLOO_SOCKET_IFNAME="lo",
               PYTHONUNBUFFERED="1", PYTHON_EXEC=la.python, BENCH_KILL_AFTER="init" if mode == "restart" else "ready")
    if mode == "gpu":
        env["BENCH_BACKEND"] = "nccl"
    if mode == "busy":
        env["BENCH_LOAD"] = os.environ.get("BENCH_LOAD", str(max(1, (os.cpu_count() or 2) // 2)))
    nproc = NPROC if mode == "gpu" else 2
    res = dict(name=la.name, torch=la.torch, run=run, error=None)
    p = benchlib.Launched(cmd, env)
    deadline = p.t0 + timeout

    def spares_ready(lines):
        return {m.group(1): (int(m.group(2)), int(m.group(3))) for m in (SPARE_READY.search(l) for _, l in lines) if m}

    pid = None
    if la.wait_spares:
        p.wait_for(lambda lines: len(spares_ready(lines)) == nproc, deadline)
        sr = spares_ready(p.lines)
        if sr:
            res["spare_rss_mib"] = max(v[0] for v in sr.values())
            res["spare_pss_mib"] = max(v[1] for v in sr.values())
        res["spares_ready_after_s"] = max((t for t, l in p.lines if SPARE_READY.search(l)), default=p.t0) - p.t0
        for _, l in p.lines:
            g = SPARE_GPU.search(l) if SPARE_READY.search(l) else None
            if g:
                res["spare_ctx_ms"] = int(g.group(1))
                if g.group(2):
                    res["spare_nccl_ms"] = int(g.group(2))
                if g.group(3):
                    res["spare_gpu_mib"] = int(g.group(3))
            elif "did not warm its GPU" in l:
                res["spare_gpu_skipped"] = l.strip()
    if la.kill_at is not None:
        pid = benchlib.wait_for_file_int(pidfile, deadline, alive=lambda: p.proc.poll() is None)
        while pid is not None and time.time() < p.t0 + la.kill_at and p.proc.poll() is None:
            time.sleep(0.05)
        ready_at = sorted(t for t, l in p.lines if SPARE_READY.search(l))
        res["spares_ready_s"] = [round(t - p.t0, 1) for t in ready_at]
    elif not la.wait_spares or len(spares_ready(p.lines)) == nproc:
        pid = benchlib.wait_for_file_int(pidfile, deadline, alive=lambda: p.proc.poll() is None)
    t_kill = None
    if pid is None:
        res["error"] = "no kill: rank 1 of attempt 0 never wrote its pid or the spares were not ready (launcher exit %s)" % p.proc.poll()
    else:
        t_kill = time.time()
        os.kill(pid, signal.SIGKILL)
    rc, timed_out = p.finish(deadline)
    t_end = time.time()
    if timed_out:
        res["error"] = res["error"] or "timed out after %.0f s" % timeout
    recs = benchlib.read_jsonl(ts)
    left = benchlib.kill_leftovers({r["pid"] for r in recs}, b"bench_restart_worker")
    if left:
        res["killed_leftover_workers"] = left
    p.save(os.path.join(d, "stderr.log"))
    res.update(rc=rc, wall_s=t_end - p.t0)
    if t_kill is not None:
        if mode == "restart":
            measure_restart(res, la, p, recs, t_kill)
        else:
            measure_spares(res, la, p, recs, t_kill, nproc)
    if rc != 0 and not res["error"]:
        res["error"] = "launcher exit %s" % rc
    if res["error"]:
        errl = [l for _, l in p.lines if re.search(r"Error|connectFullMesh", l)]
        res["stderr_tail"] = errl[:2] + ["..."] + [l for _, l in p.lines[-3:]]
    return res


def measure_restart(res, la, p, recs, t_kill):
    notice = DDPRUN_NOTICE if la.name.startswith("ddprun") else TORCHRUN_NOTICE
    note = p.first_line(notice, since=t_kill)
    if note:
        res.update(noticed_ms=(note[0] - t_kill) * 1e3, notice_line=note[1])
    # the first of those lines that literally says "failed" (torchrun logs it after stopping the group)
    fl = p.first_line(notice, since=t_kill, also=lambda l: "failed" in l.lower())
    if fl:
        res.update(failed_line_ms=(fl[0] - t_kill) * 1e3, failed_line=fl[1])
    for event, key, out in (("exec", "t_exec", "exec_ms"), ("start", "t_start", "started_ms"), ("init", "t_init", "init_ms")):
        v = ms_after(t_kill, recs, event, key)
        if v is not None:
            res[out] = v
    s1 = sum(r["attempt"] == 1 and r["event"] == "start" for r in recs)
    a1 = sum(r["attempt"] == 1 and r["event"] == "init" for r in recs)
    res.update(replacements_started=s1, replacements_init=a1)
    if a1 != 2:
        why = "%d of 2 replacement workers started, %d past init_process_group" % (s1, a1)
        res["error"] = "%s; %s" % (res["error"], why) if res["error"] else why
    err = [r for r in recs if r["event"] == "allreduce_error"]
    if err:
        res["rank0_allreduce_error_ms"] = (err[0]["t"] - t_kill) * 1e3
        res["rank0_error"] = err[0]["error"]
    if sum(r["event"] == "done" for r in recs) != 2 and not res["error"]:
        res["error"] = "attempt 1 did not finish its all_reduce on both ranks"


def measure_spares(res, la, p, recs, t_kill, nproc):
    for event, key, out in (("start", "t_start", "started_ms"), ("cuda", "t_cuda", "cuda_ms"), ("init", "t_init", "init_ms"),
                            ("ready", "t_ready", "ready_ms")):
        v = ms_after(t_kill, recs, event, key, nproc)
        if v is not None:
            res[out] = v
    if "ready_ms" not in res and not res["error"]:
        res["error"] = "attempt 1 did not get past its first all_reduce on both ranks"
    note = next((l for _, l in p.lines if "restarting the worker group" in l), "")
    m = re.search(r"(\d+) of (\d+) from warm spares", note)
    if m:
        res["from_spares"] = "%s/%s" % (m.group(1), m.group(2))


def print_run(res, columns):
    fmt = lambda k: ("%7.0f" % res[k]) if k in res else "      -"
    print("  %-26s run %d: %s  wall %5.2f s  rc %s%s%s" % (
        res["name"] + " (" + res["torch"] + ")", res["run"], "  ".join("%s %s ms" % (k[:-3], fmt(k)) for k in columns),
        res["wall_s"], res["rc"], ("  spares " + res["from_spares"]) if "from_spares" in res else "",
        ("  ERROR: " + res["error"]) if res["error"] else ""), flush=True)


def restart_launchers(ddprun, python_sys, venv_py, stamp):
    common = ["--nproc_per_node=2", "--max_restarts=1", "--master_addr=127.0.0.1", "--master_port={PORT}"]
    out = []
    for py, suffix in ((python_sys, ""), (venv_py, "-venv")):
        v = benchlib.torch_version(py) if os.access(py, os.X_OK) else None
        if not v:
            print("(no torch in %s: its launchers skipped)" % py)
            continue
        run = (["--no_python", stamp, py, "-u"] if stamp else []) + [WORKER]
        out.append(Launcher("ddprun" + suffix, v, py, [ddprun] + common + ["--overlap_restart=1"] + run, "ddprun (defaults)"))
        if os.environ.get("DDPRUN_BEFORE"):  # another build, to compare two in one run
            out.append(Launcher("ddprun%s-before" % suffix, v, py,
                                [os.environ["DDPRUN_BEFORE"]] + common + ["--overlap_restart=1"] + run,
                                "ddprun-before (defaults)"))
        out.append(Launcher("ddprun%s-nowatch" % suffix, v, py, [ddprun] + common + ["--early_exit_watch=0"] + run,
                            "ddprun --early_exit_watch=0"))
        if os.environ.get("WAIT"):
            out.append(Launcher("ddprun%s-wait" % suffix, v, py, [ddprun] + common + ["--overlap_restart=0"] + run,
                                "ddprun --overlap_restart=0"))
        if os.environ.get("NO_TORCHRUN"):
            continue
        tr = [py, "-m", "torch.distributed.run"]
        if not suffix:
            tr += ["--redirects", "1", "--tee", "1", "--log_dir", "{LOGDIR}"]
        out.append(Launcher("torchrun" + suffix, v, py, tr + ["--monitor_interval", "0.1"] + common + run,
                            "torchrun " + ".".join(v.split(".")[:2])))
    return out


def common_flags(nproc):
    return ["--nproc_per_node=%d" % nproc, "--max_restarts=1", "--master_addr=127.0.0.1", "--master_port={PORT}"]


def torch_pythons(pys):
    """(python, torch version, major.minor) for each python that imports torch."""
    for py in pys:
        v = benchlib.torch_version(py) if os.access(py, os.X_OK) else None
        if not v:
            print("(no torch in %s: skipped)" % py)
            continue
        yield py, v, v.rsplit(".", 1)[0]


def spares_launchers(ddprun, pys, priority):
    common = common_flags(2)
    out = []
    for py, v, tag in torch_pythons(pys):
        out.append(Launcher("ddprun-spares-" + tag, v, py, [ddprun, "-v"] + common + [
            "--warm_spares=1", "--spare_priority=" + priority, WORKER], "ddprun --warm_spares=1", wait_spares=True))
        out.append(Launcher("ddprun-cold-" + tag, v, py, [ddprun] + common + ["--warm_spares=0", WORKER],
                            "ddprun --warm_spares=0"))
        if int(v.split(".")[0]) >= 2:
            out.append(Launcher("torchrun-" + tag, v, py, [py, "-m", "torch.distributed.run", "--monitor_interval", "0.1"]
                                + common + [WORKER], "torchrun"))
    return out


def gpu_launchers(ddprun, pys):
    common = common_flags(NPROC)
    out = []
    for py, v, tag in torch_pythons(pys):
        out.append(Launcher("ddprun-cuda-" + tag, v, py, [ddprun, "-v"] + common + [
            "--warm_spares=1", "--spare_cuda=1", WORKER], "ddprun --warm_spares=1 --spare_cuda=1", wait_spares=True))
        out.append(Launcher("ddprun-spares-" + tag, v, py, [ddprun, "-v"] + common + [
            "--warm_spares=1", WORKER], "ddprun --warm_spares=1", wait_spares=True))
        out.append(Launcher("ddprun-cold-" + tag, v, py, [ddprun] + common + ["--warm_spares=0", WORKER],
                            "ddprun --warm_spares=0"))
        out.append(Launcher("torchrun-" + tag, v, py, [py, "-m", "torch.distributed.run", "--monitor_interval", "0.1"]
                            + common + [WORKER], "torchrun"))
    return out


def busy_launchers(ddprun, pys, kill_at):
    common = common_flags(2)
    out = []
    for py, v, tag in torch_pythons(pys):
        for prio in ("idle", "normal"):
            out.append(Launcher("ddprun-%s-%s" % (prio, tag), v, py, [ddprun, "-v"] + common + [
                "--warm_spares=1", "--spare_priority=" + prio, WORKER], "ddprun --spare_priority=" + prio, kill_at=kill_at))
        out.append(Launcher("ddprun-cold-" + tag, v, py, [ddprun] + common + ["--warm_spares=0", WORKER],
                            "ddprun --warm_spares=0", kill_at=kill_at))
    return out


def report_busy(rs, launchers, kill_at):
    rows = []
    for la in launchers:
        mine = [r for r in rs if r["name"] == la.name]
        if not mine:
            continue
        ok = [r for r in mine if not r["error"]]
        ready = [r["spares_ready_s"] for r in mine if r.get("spares_ready_s")]
        ready_cell = "-" if "cold" in la.name else "; ".join(
            ", ".join("%.1f" % t for t in x) for x in ready) or "none by the kill"
        from_sp = ", ".join(r.get("from_spares", "0/2") for r in ok) if "cold" not in la.name else "-"
        m, sp = benchlib.median(r["ready_ms"] for r in ok if "ready_ms" in r), \
            benchlib.spread([r["ready_ms"] for r in ok if "ready_ms" in r])
        rows.append([la.label, la.torch, "%d/%d" % (len(ok), len(mine)), ready_cell, from_sp,
                     "-" if m is None else "%.0f" % m + (" (%s)" % sp if sp else "")])
    print("\n" + benchlib.markdown_table(
        ["launcher", "worker torch", "ok runs", "spares ready (s after the launch, each run)",
         "restart's workers from spares", "kill → all past a first all_reduce (ms)"], rows))
    print("\nevery core kept busy by the workers' spinning loaders (normal priority) until the kill at %.0f s;"
          " kill → ready: median (min–max) over the runs without error" % kill_at)


def ready_rows(rs, launchers, keys, others, last_cell):
    """One table row per launcher: ok runs, median (min–max) of each key over the runs without
    error ("started" over every run that got that far), the ready-time ratio of each launcher
    named by a prefix in `others` (same torch) to this one, and last_cell(its runs)."""
    def vals(name, k):
        return [r[k] for r in rs if r["name"] == name and (k == "started_ms" or not r["error"]) and k in r]
    rows = []
    for la in launchers:
        mine = [r for r in rs if r["name"] == la.name]
        if not mine:
            continue
        tag = la.name.rsplit("-", 1)[1]
        cells = []
        for k in keys:
            m, sp = benchlib.median(vals(la.name, k)), benchlib.spread(vals(la.name, k))
            cells.append("-" if m is None else "%.0f" % m + (" (%s)" % sp if sp else ""))
        ready = benchlib.median(vals(la.name, "ready_ms"))
        ratios = []
        for prefix in others:
            mo = benchlib.median(vals(prefix + tag, "ready_ms"))
            ratios.append(("%.1f×" % (mo / ready)) if ready and mo and prefix + tag != la.name else "-")
        rows.append([la.label, la.torch, "%d/%d" % (sum(not r["error"] for r in mine), len(mine))] + cells + ratios +
                    [last_cell(mine)])
    return rows


def report_gpu(rs, launchers):
    def gpu_mib(mine):
        held = [r["spare_gpu_mib"] for r in mine if "spare_gpu_mib" in r]
        return "%d" % benchlib.median(held) if held else "-"
    rows = ready_rows(rs, launchers, ("started_ms", "cuda_ms", "init_ms", "ready_ms"),
                      ("ddprun-spares-", "ddprun-cold-", "torchrun-"), gpu_mib)
    print("\n" + benchlib.markdown_table(
        ["launcher", "worker torch", "ok runs", "kill → replacements started (ms)", "kill → CUDA ready (ms)",
         "kill → past init_process_group (ms)", "kill → past a first NCCL all_reduce (ms)", "vs CPU-warm spares",
         "vs cold", "vs torchrun", "GPU memory per spare (MiB)"], rows))
    print("\nmedians (min–max) over the runs without error; \"vs X\" = X's median ready time / this row's")
    for k, what in (("spare_ctx_ms", "the spare's CUDA context"), ("spare_nccl_ms", "the spare's NCCL set-up")):
        v = [r[k] for r in rs if k in r]
        if v:
            print("%s: %d ms (median, off the restart path: done before the kill)" % (what, benchlib.median(v)))
    sk = [r for r in rs if "spare_gpu_skipped" in r]
    if sk:
        print("GPU not warmed in %d run(s): %s" % (len(sk), sk[0]["spare_gpu_skipped"][:200]))
    for r in rs:
        if r["name"].startswith("ddprun-") and "-cold-" not in r["name"] and r.get("from_spares") not in (
                None, "%d/%d" % (NPROC, NPROC)):
            print("%s run %d: only %s workers from spares" % (r["name"], r["run"], r.get("from_spares")))


def ratio_cell(m, mb):
    return "%.1fx" % (m / mb) if m and mb else "-"


def report_restart(rs, launchers):
    early = ("noticed_ms", "failed_line_ms", "exec_ms", "started_ms")  # stages before the replacements' init

    def med(name, k):  # a run whose replacements failed later (torchrun's connectFullMesh) still timed these
        return benchlib.median(r[k] for r in rs if r["name"] == name and (k in early or not r["error"]) and k in r)
    base = {r["torch"]: r["name"] for r in rs if r["name"] in ("ddprun", "ddprun-venv")}
    keys = [("noticed_ms", "kill → failure noticed (ms)"), ("failed_line_ms", "kill → line saying 'failed' (ms)"),
            ("exec_ms", "kill → all replacements exec'd (ms)"), ("started_ms", "kill → all replacements' first Python line (ms)"),
            ("init_ms", "kill → all past init_process_group (ms)"), ("wall_s", "total wall (s)")]
    rows = []
    for la in launchers:
        mine = [r for r in rs if r["name"] == la.name]
        if not mine:
            continue
        b = base.get(la.torch)
        cells = []
        for k, _ in keys:
            m = med(la.name, k)
            if m is None:
                cells.append("-")
                continue
            mb = med(b, k) if b and b != la.name else None
            cells.append((("%.2f" if k == "wall_s" else "%.0f") % m) + (" (%.1fx)" % (m / mb) if mb else ""))
        codes = ",".join(sorted(set(str(r["rc"]) for r in mine)))
        rows.append([la.label, la.torch, "%d/%d" % (sum(not r["error"] for r in mine), len(mine))] + cells + [codes])
    print("\n" + benchlib.markdown_table(["launcher", "worker torch", "ok runs"] + [h for _, h in keys] + ["exit codes"], rows))
    print("\nmedians: up to the replacements' first Python line over every run that got that far, init and wall over the"
          " runs without error; (Nx) = this row / ddprun (defaults) with the same torch in its workers;"
          " wall = launcher start to exit, both attempts' `import torch` included")
    print("\nfailure-noticed line (first run of each):")
    for la in launchers:
        r = next((r for r in rs if r["name"] == la.name and "notice_line" in r), None)
        print("  %-16s %s" % (la.name, r["notice_line"][:160] if r else "(none seen)"))
        if r and r.get("failed_line") and r["failed_line"] != r["notice_line"]:
            print("  %-16s %s" % ("", r["failed_line"][:160]))
    lo = [r for r in rs if r.get("killed_leftover_workers")]
    if lo:
        print("\nworkers left running after the launcher exited (SIGKILLed by the driver): " +
              ", ".join("%s run %d: %d" % (r["name"], r["run"], len(r["killed_leftover_workers"])) for r in lo))
    errs = [r for r in rs if r.get("rank0_error")]
    if errs:
        print("\nrank 0's pending all_reduce raised in %d/%d runs, median %.0f ms after the kill (about when the killed"
              " process's sockets closed, i.e. when it was really gone): %s" % (
                  len(errs), len(rs), benchlib.median(r["rank0_allreduce_error_ms"] for r in errs), errs[0]["rank0_error"][:100]))


def report_spares(rs, launchers):
    def memory(mine):
        rss = [r["spare_rss_mib"] for r in mine if "spare_rss_mib" in r]
        pss = [r["spare_pss_mib"] for r in mine if "spare_pss_mib" in r]
        return "%d / %d" % (benchlib.median(rss), benchlib.median(pss)) if rss else "-"
    rows = ready_rows(rs, launchers, ("started_ms", "init_ms", "ready_ms"), ("ddprun-cold-", "torchrun-"), memory)
    print("\n" + benchlib.markdown_table(
        ["launcher", "worker torch", "ok runs", "kill → replacements started (ms)", "kill → all past init_process_group (ms)",
         "kill → all past a first all_reduce (ms)", "vs ddprun cold", "vs torchrun", "spare RSS / PSS (MiB)"], rows))
    print("\nmedians (min–max) over the runs without error (\"started\": every run that got that far); \"vs X\" = X's median"
          " ready time / this row's (how many times sooner this launcher's job computes again)")
    sr = [r["spares_ready_after_s"] for r in rs if "spares_ready_after_s" in r]
    if sr:
        print("spares ready %.1f s (median) after the launch (the kill waits for it)" % benchlib.median(sr))
    for r in rs:
        if r["name"].startswith("ddprun-spares") and r.get("from_spares") not in (None, "2/2"):
            print("%s run %d: only %s workers from spares" % (r["name"], r["run"], r.get("from_spares")))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter,
                                 epilog=__doc__)
    ap.add_argument("mode", choices=("restart", "spares", "gpu", "busy"))
    ap.add_argument("-n", type=int, default=None, help="rounds (restart: 5, spares: 3)")
    ap.add_argument("build", nargs="?", default=os.path.join(HERE, "build"))
    a = ap.parse_intermixed_args()
    restart = a.mode == "restart"
    busy = a.mode == "busy"
    rounds = a.n or (5 if restart else 2 if busy else 3)
    kill_at = float(os.environ.get("KILL_AT", 30))
    gpu = a.mode == "gpu"
    timeout = float(os.environ.get("RUN_TIMEOUT", 45 if restart else 120 if gpu or busy else 90))
    budget = float(os.environ.get("BUDGET", 270 if restart else 480 if gpu else 600 if busy else 540))
    ddprun = os.environ.get("DDPRUN", os.path.join(a.build, "launcher", "ddprun"))
    venv_py = os.path.join(os.environ.get("DDPRUN_VENV", os.path.join(HERE, ".venv-torch2")), "bin", "python")
    if not os.access(ddprun, os.X_OK):
        sys.exit("no ddprun at %s (build first: cmake --build %s --target ddprun)" % (ddprun, a.build))
    tmp = tempfile.mkdtemp()
    try:
        stamp = None
        if restart and subprocess.run(["cc", "-O2", "-o", os.path.join(tmp, "bench_exec_stamp"),
                                       os.path.join(HERE, "scripts", "bench", "bench_exec_stamp.c")],
                                      stderr=subprocess.DEVNULL).returncode == 0:
            stamp = os.path.join(tmp, "bench_exec_stamp")
        if restart:
            launchers = restart_launchers(ddprun, "/usr/bin/python3", venv_py, stamp)
        elif gpu:
            launchers = gpu_launchers(ddprun, os.environ.get("PYS", venv_py).split())
        elif busy:
            launchers = busy_launchers(ddprun, os.environ.get("PYS", "/usr/bin/python3").split(), kill_at)
        else:
            launchers = spares_launchers(ddprun, os.environ.get("PYS", "/usr/bin/python3 " + venv_py).split(),
                                         os.environ.get("SPARE_PRIORITY", "idle"))
        if not launchers:
            sys.exit("no python with torch found")
        columns = (("noticed_ms", "started_ms", "init_ms") if restart else
                   ("started_ms", "cuda_ms", "init_ms", "ready_ms") if gpu else ("started_ms", "init_ms", "ready_ms"))
        if restart:
            print(benchlib.report_header("restart latency: --nproc_per_node=2 --max_restarts=1, gloo on loopback, rank 1"
                                         " SIGKILLed after init", "%d runs each, interleaved; ddprun %s" % (rounds, ddprun)))
            print("# workers started through bench_exec_stamp (exec time stamped)" if stamp else
                  "# workers started as python scripts (no C compiler here: no exec'd column)")
        elif busy:
            print(benchlib.report_header("warm spares on a busy host: --nproc_per_node=2 --max_restarts=1, gloo on loopback,"
                                         " every core spinning, rank 1 SIGKILLed %.0f s after the launch" % kill_at,
                                         "%d runs each, interleaved; ddprun %s" % (rounds, ddprun)))
        elif gpu:
            print(benchlib.report_header("warm spares on GPUs: --nproc_per_node=%d --max_restarts=1, NCCL, rank %d"
                                         " SIGKILLed after its first all_reduce" % (NPROC, NPROC - 1),
                                         "%d runs each, interleaved; ddprun %s" % (rounds, ddprun)))
        else:
            print(benchlib.report_header("warm spares: --nproc_per_node=2 --max_restarts=1, gloo on loopback, rank 1"
                                         " SIGKILLed after its first all_reduce",
                                         "%d runs each, interleaved; ddprun %s; --spare_priority=%s" % (
                                             rounds, ddprun, os.environ.get("SPARE_PRIORITY", "idle"))))
        if os.environ.get("KEEP"):
            print("(KEEP: per-run logs stay in %s)" % tmp)
        by_name = {la.name: la for la in launchers}
        results = []

        def run_one(name, i):
            res = trial(a.mode, by_name[name], i, tmp, timeout)
            results.append(res)
            print_run(res, columns)
        benchlib.run_rounds([la.name for la in launchers], rounds, budget, run_one)
        if busy:
            report_busy(results, launchers, kill_at)
        else:
            (report_restart if restart else report_gpu if gpu else report_spares)(results, launchers)
        for r in results:
            if r["error"]:
                print("\n%s run %d: %s\n    %s" % (r["name"], r["run"], r["error"], "\n    ".join(r.get("stderr_tail", []))))
    finally:
        if not os.environ.get("KEEP"):
            shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
