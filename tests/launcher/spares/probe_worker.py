# Run by tests/launcher/spares/test_spares.py under ddprun: prints, as one JSON line on stdout, what a
# worker can observe of its start (argv, environment in os.environ and in libc's environ, cwd,
# __main__, sys.path, sys.flags, signal dispositions, descriptors, scheduling), then on attempt 0
# waits for the test to SIGKILL it; later attempts exit 0.
import ctypes
import json
import os
import re
import signal
import subprocess
import sys
import time


def c_environ():
    libc = ctypes.CDLL(None)
    envp = ctypes.POINTER(ctypes.c_char_p).in_dll(libc, "environ")
    out, i = [], 0
    while envp[i]:
        out.append(envp[i].decode("utf-8", "surrogateescape"))
        i += 1
    return sorted(out)


def proc_status(keys):
    out = {}
    with open("/proc/self/status") as f:
        for line in f:
            k, _, v = line.partition(":")
            if k in keys:
                out[k] = v.strip()
    return out


def fds():
    out = {}
    for fd in sorted(os.listdir("/proc/self/fd"), key=int):
        try:
            target = os.readlink("/proc/self/fd/%s" % fd)
        except OSError:
            continue
        kind = target.split(":")[0] if ":[" in target else ("file" if target.startswith("/") else target)
        if target.startswith("/proc/") and target.endswith("/fd"):
            continue  # the listdir itself
        flags = ""
        try:
            with open("/proc/self/fdinfo/%s" % fd) as f:
                for line in f:
                    if line.startswith("flags:"):
                        flags = "cloexec" if int(line.split()[1], 8) & 0o2000000 else "inherit"
        except OSError:
            pass
        out[fd] = "%s %s" % (kind if kind in ("pipe", "socket", "anon_inode") else target, flags)
    return out


torch_state = None
if os.environ.get("PROBE_TORCH") == "1":
    # What a script sees of torch before and after its own first CUDA use: a GPU-warm spare's
    # context and NCCL set-up must leave none of it (CUDA not initialised for torch, device 0
    # current, an empty allocator, no process group).
    import torch
    import torch.distributed as dist
    from torch.distributed import distributed_c10d as c10d

    torch_state = {
        "dist_initialized": dist.is_available() and dist.is_initialized(),
        "process_groups": len(getattr(getattr(c10d, "_world", None), "pg_map", {}) or {}),
        "cuda_initialized_at_start": torch.cuda.is_initialized(),
    }
    if torch.cuda.is_available():
        torch_state["current_device"] = torch.cuda.current_device()
        x = torch.ones(1, device="cuda")
        torch_state["cuda_value"] = float(x.sum().item())
        torch_state["memory_allocated"] = torch.cuda.memory_allocated()
        torch_state["memory_reserved"] = torch.cuda.memory_reserved()
        del x

main = sys.modules["__main__"]
info = {
    "torch_state": torch_state,
    "argv": sys.argv,
    "orig_argv": getattr(sys, "orig_argv", None),
    "executable": sys.executable,
    "environ": dict(os.environ),
    "c_environ": c_environ(),
    "child_env": sorted(subprocess.run(["env", "-0"], capture_output=True).stdout.decode().split("\0")[:-1]),
    "cwd": os.getcwd(),
    "name": __name__,
    "file": globals().get("__file__"),
    "cached": globals().get("__cached__"),
    "loader": type(globals().get("__loader__")).__name__,
    "spec": re.sub(r" at 0x[0-9a-f]+", "", repr(globals().get("__spec__"))),  # no object addresses
    "main_globals": sorted(k for k in vars(main) if k not in ("info",)),
    "path0": sys.path[0],
    "path": sys.path,
    "flags": repr(sys.flags),
    "signals": {signal.Signals(s).name: repr(signal.getsignal(s)) for s in sorted(signal.valid_signals())
                if s not in (signal.SIGKILL, signal.SIGSTOP) and s in signal.Signals._value2member_map_},
    "status": proc_status(("SigBlk", "SigIgn", "SigCgt", "NoNewPrivs", "Seccomp", "Cpus_allowed_list")),
    "fds": fds(),
    "sched": [os.sched_getscheduler(0), os.getpriority(os.PRIO_PROCESS, 0)],
    "threads_sched": sorted(os.sched_getscheduler(int(t)) for t in os.listdir("/proc/self/task")),
    "pgrp_is_pid": os.getpgrp() == os.getpid(),
    "stdout": [sys.stdout.encoding, sys.stdout.line_buffering, sys.stdout.write_through],
    "excepthook_default": sys.excepthook is sys.__excepthook__,
}
print(json.dumps(info, sort_keys=True), flush=True)
if os.environ.get("TORCHELASTIC_RESTART_COUNT") == "0":
    pidfile = os.environ["PROBE_PIDFILE_DIR"] + "/" + os.environ["LOCAL_RANK"]
    with open(pidfile + ".tmp", "w") as f:
        f.write(str(os.getpid()))
    os.rename(pidfile + ".tmp", pidfile)
    time.sleep(600)
    sys.exit(3)
