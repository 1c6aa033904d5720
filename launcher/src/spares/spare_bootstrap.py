# ddprun warm spare (launcher/src/spares/spares.cpp runs this as `python -u -c <this> ...`)
# argv: -c CTL_FD PRIORITY PRELOAD GPU -- COLD_ARGV...   PRIORITY: idle | normal; PRELOAD: m1,m2;
# GPU: cuda | -. COLD_ARGV is what a cold start execs: PYTHON -u (SCRIPT | -m MODULE | -c CODE) ARGS...
# 1. Imports the preload modules (at SCHED_IDLE in a helper thread unless PRIORITY is normal);
#    with GPU=cuda warms the GPU of its local rank (_warm_gpu below), on the main thread; then
#    tells the agent "R <import seconds> <threads> <gpu report>" on CTL_FD and parks on it.
# 2. The launch: "G" + 8-byte length with the worker's stdout and stderr attached (SCM_RIGHTS),
#    then cwd, argv, environment (NUL-separated). It takes them, answers "A" (or "E why"),
#    closes CTL_FD and runs the entry point in __main__ as the interpreter itself would.
# No at-sign in this file: CMake's configure_file embeds it.


def _warm_gpu():
    # The CUDA context of device LOCAL_RANK (the device a worker of this local rank selects, under
    # the same CUDA_VISIBLE_DEVICES) and NCCL's one-time set-up: a one-rank communicator, one
    # all_reduce, then destroyed. Done through the driver API and the NCCL library that torch
    # loaded, never through torch, so torch's state is as a cold start has it: CUDA not
    # initialised, current device 0, an empty caching allocator, no process group, no store.
    # The context is made current on this thread only while in use, and kept (retained) after.
    # Returns the report for the ready line: "gpu DEV CTX_MS NCCL_MS" (NCCL_MS "-" and a reason
    # when there is no NCCL to warm) or "nogpu WHY".
    import ctypes
    import os
    import sys
    import time

    torch = sys.modules.get("torch")
    if torch is not None and getattr(getattr(torch, "version", None), "cuda", "") is None:
        return "nogpu this torch is built without CUDA (torch %s)" % getattr(torch, "__version__", "?")
    try:
        cu = ctypes.CDLL("libcuda.so.1")
    except OSError as e:
        return "nogpu no NVIDIA driver (%s)" % str(e).split(":")[-1].strip()
    rc = cu.cuInit(0)
    if rc != 0:
        return "nogpu the CUDA driver did not initialise (cuInit: error %d)" % rc
    count = ctypes.c_int(0)
    cu.cuDeviceGetCount(ctypes.byref(count))
    try:
        ordinal = int(os.environ.get("LOCAL_RANK", "0"))
    except ValueError:
        return "nogpu LOCAL_RANK is not an integer"
    if ordinal >= count.value:
        return "nogpu LOCAL_RANK=%d but %d GPU(s) visible" % (ordinal, count.value)
    dev = ctypes.c_int(0)
    mode = ctypes.c_int(0)
    cu.cuDeviceGet(ctypes.byref(dev), ordinal)
    cu.cuDeviceGetAttribute(ctypes.byref(mode), 20, dev)  # CU_DEVICE_ATTRIBUTE_COMPUTE_MODE
    if mode.value != 0:
        name = {1: "EXCLUSIVE_THREAD", 2: "PROHIBITED", 3: "EXCLUSIVE_PROCESS"}.get(mode.value, str(mode.value))
        return ("nogpu device %d is in %s compute mode: a context held by the spare would keep the worker "
                "from the GPU" % (ordinal, name))
    t0 = time.monotonic()
    fds_before = set(os.listdir("/proc/self/fd"))
    ctx = ctypes.c_void_p()
    rc = cu.cuDevicePrimaryCtxRetain(ctypes.byref(ctx), dev)
    if rc != 0:
        return "nogpu device %d: no context (cuDevicePrimaryCtxRetain: error %d)" % (ordinal, rc)
    cu.cuCtxPushCurrent_v2(ctx)
    buf = ctypes.c_uint64(0)
    nccl_ms = "-"
    try:
        rc = cu.cuMemAlloc_v2(ctypes.byref(buf), ctypes.c_size_t(4096))
        if rc != 0:
            return "nogpu device %d: cuMemAlloc: error %d" % (ordinal, rc)
        cu.cuCtxSynchronize()
        ctx_ms = (time.monotonic() - t0) * 1000
        path = None
        with open("/proc/self/maps") as f:
            for line in f:
                if "/libnccl" in line and ".so" in line:
                    path = line.split(None, 5)[-1].strip()
                    break
        if path is None:
            return "gpu %d %.1f - no NCCL library loaded by the preloads" % (ordinal, ctx_ms)
        nccl = ctypes.CDLL(path)  # already loaded: the same library the worker's torch uses

        class UniqueId(ctypes.Structure):
            _fields_ = [("internal", ctypes.c_char * 128)]

        t1 = time.monotonic()
        uid = UniqueId()
        comm = ctypes.c_void_p()
        nccl.ncclCommInitRank.argtypes = [ctypes.POINTER(ctypes.c_void_p), ctypes.c_int, UniqueId, ctypes.c_int]
        nccl.ncclAllReduce.argtypes = [ctypes.c_uint64, ctypes.c_uint64, ctypes.c_size_t, ctypes.c_int,
                                       ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p]
        steps = (("ncclGetUniqueId", lambda: nccl.ncclGetUniqueId(ctypes.byref(uid))),
                 ("ncclCommInitRank", lambda: nccl.ncclCommInitRank(ctypes.byref(comm), 1, uid, 0)),
                 ("ncclAllReduce", lambda: nccl.ncclAllReduce(buf, buf, 1024, 7, 0, comm, None)),  # float32, sum
                 ("cuCtxSynchronize", lambda: cu.cuCtxSynchronize()),
                 ("ncclCommDestroy", lambda: nccl.ncclCommDestroy(comm)))
        for what, call in steps:
            rc = call()
            if rc != 0:
                if comm.value and what != "ncclCommDestroy":
                    nccl.ncclCommDestroy(comm)
                return "gpu %d %.1f - NCCL's set-up failed (%s: error %d)" % (ordinal, ctx_ms, what, rc)
        nccl_ms = "%.1f" % ((time.monotonic() - t1) * 1000)
        return "gpu %d %.1f %s" % (ordinal, ctx_ms, nccl_ms)
    finally:
        if buf.value:
            cu.cuMemFree_v2(ctypes.c_uint64(buf.value))
        cu.cuCtxPopCurrent_v2(ctypes.byref(ctypes.c_void_p()))
        # NCCL leaves sockets and pipes open without close-on-exec: the script's subprocesses
        # must not inherit them (a cold worker has none of them when its script starts).
        for fd in set(os.listdir("/proc/self/fd")) - fds_before:
            try:
                os.set_inheritable(int(fd), False)
            except OSError:
                pass  # the listdir's own descriptor, closed since


def _ddprun_spare_main():
    import os
    import sys
    import time

    if sys.version_info < (3, 9):  # socket.recv_fds; exiting with an error before "R" turns spares off
        print("warm spares need Python 3.9 or later (this is %d.%d)" % sys.version_info[:2], file=sys.stderr)
        sys.exit(3)
    ctl = int(sys.argv[1])
    priority = sys.argv[2]
    preload = [m for m in sys.argv[3].split(",") if m]
    gpu = sys.argv[4] == "cuda"
    cold = sys.argv[6:]

    def path0(rest):
        # What the interpreter puts first on sys.path for this command line (nothing with -P).
        if getattr(sys.flags, "safe_path", False):
            return None
        if rest[0] == "-c":
            return ""
        if rest[0] == "-m":
            return os.getcwd()
        if os.path.isdir(rest[0]) or _is_zip(rest[0]):
            return os.path.abspath(rest[0])
        return os.path.dirname(os.path.realpath(rest[0]))

    def _is_zip(p):
        try:
            with open(p, "rb") as f:
                f.seek(-22, 2)
                return f.read(4) == b"PK\x05\x06"
        except OSError:
            return False

    def set_path0(rest):
        # The bootstrap's own `-c` put "" there; the cold start would have put path0(rest).
        p = path0(rest)
        if p is not None and sys.path:
            sys.path[0] = p

    def tasks():
        return set(int(t) for t in os.listdir("/proc/self/task"))

    set_path0(cold[2:])  # preloads resolve as they would in the cold worker
    t0 = time.monotonic()
    main_tid = os.getpid()
    if priority == "idle":
        import threading  # on the main thread: threading.main_thread() must be this one

        failed = []

        def run():
            try:
                os.sched_setscheduler(0, os.SCHED_IDLE, os.sched_param(0))  # this thread only
            except (OSError, AttributeError):
                os.setpriority(os.PRIO_PROCESS, 0, 19)
            try:
                for m in preload:
                    __import__(m)
            except BaseException as e:  # noqa: B036 - reported by the main thread
                failed.append(e)

        before = tasks()
        th = threading.Thread(target=run, name="ddprun-preload", daemon=True)
        th.start()
        helper = th.native_id
        th.join()
        for _ in range(2000):  # join() returns a moment before the kernel thread is gone
            if helper not in tasks():
                break
            time.sleep(0.001)
        born = tasks() - before - {helper}
        # Threads the imports started inherited the idle priority, and an unprivileged process
        # cannot raise it again; a module that must be imported on the main thread (one that
        # calls signal.signal) failed. Either way: import once more, on the main thread, at
        # normal priority.
        why = None
        if failed and isinstance(failed[0], ValueError) and "main thread" in str(failed[0]):
            why = "the import needs the main thread (%s)" % failed[0]
        elif failed:
            raise failed[0]
        elif born:
            why = "%d thread(s) started by the import run at idle priority" % len(born)
        if why and hasattr(sys, "orig_argv"):
            print("ddprun warm spare: %s: importing again at normal priority" % why, file=sys.stderr)
            os.set_inheritable(ctl, True)
            argv = list(sys.orig_argv)
            argv[argv.index("idle", 4)] = "normal"
            os.execv(sys.executable, argv)
        elif why and failed:
            raise failed[0]
    else:
        for m in preload:
            __import__(m)
    # Everything the launch needs, imported now: nothing is imported between the launch and the
    # entry point.
    import runpy
    import socket
    import struct
    from importlib.machinery import SourceFileLoader

    try:
        import ctypes

        clearenv = ctypes.CDLL(None).clearenv
    except Exception:  # noqa: BLE001 - os.environ below still unsets what Python knows of
        clearenv = None

    import_s = time.monotonic() - t0
    report = "-"
    if gpu:
        try:
            report = _warm_gpu()
        except Exception as e:  # noqa: BLE001 - the spare still serves, CPU-warm
            report = "nogpu %s: %s" % (type(e).__name__, e)
    sock = socket.socket(fileno=ctl)
    threads = len(tasks())
    sock.sendall(("R %.3f %d %s\n" % (import_s, threads, " ".join(report.split()))).encode())

    def recv_exact(n, got=b""):
        while len(got) < n:
            b = sock.recv(n - len(got))
            if not b:
                os._exit(0)  # the agent closed it: not needed any more
            got += b
        return got

    try:
        head, fds, _flags, _addr = socket.recv_fds(sock, 9, 2)
    except OSError:
        os._exit(0)
    if not head:
        os._exit(0)
    head = recv_exact(9, head)
    (size,) = struct.unpack("<Q", head[1:9])
    fields = recv_exact(size).split(b"\0")
    cwd = fields[0]
    argc = int(fields[1])
    argv = [a.decode("utf-8", "surrogateescape") for a in fields[2 : 2 + argc]]
    env = [kv for kv in fields[2 + argc :] if kv]
    try:
        if len(fds) != 2:
            raise OSError("expected 2 descriptors, got %d" % len(fds))
        os.chdir(cwd)
    except OSError as e:
        sock.sendall(("E %s\n" % e).encode())
        os._exit(3)

    # The environment, all of it, in os.environ and in the C library's environ (what
    # subprocesses and native code see): both cleared, then filled from the launch.
    if clearenv is not None:
        clearenv()
    os.environ.clear()
    for kv in env:
        k, _, v = kv.partition(b"=")
        os.environb[k] = v

    sys.stdout.flush()
    sys.stderr.flush()
    os.dup2(fds[0], 1)
    os.dup2(fds[1], 2)
    for fd in fds:
        if fd > 2:
            os.close(fd)
    sock.sendall(b"A")
    sock.close()

    rest = argv[2:]
    sys.orig_argv = argv
    set_path0(rest)
    main = sys.modules["__main__"]
    g = main.__dict__
    keep = {k: g[k] for k in ("__builtins__", "__loader__") if k in g}
    g.clear()
    g.update(__name__="__main__", __doc__=None, __package__=None, __spec__=None, __annotations__={})
    g.update(keep)
    if rest[0] == "-c":
        sys.argv = ["-c"] + rest[2:]
        return compile(rest[1], "<string>", "exec", dont_inherit=True), g
    if rest[0] == "-m":
        sys.argv = ["-m"] + rest[2:]
        stub = compile("_r(_m, True)", "<ddprun-spare>", "exec", dont_inherit=True)
        return stub, {"_r": runpy._run_module_as_main, "_m": rest[1]}
    sys.argv = rest
    path = rest[0]
    if os.path.isdir(path) or _is_zip(path):
        stub = compile("_r('__main__', False)", "<ddprun-spare>", "exec", dont_inherit=True)
        return stub, {"_r": runpy._run_module_as_main}
    g["__file__"] = os.path.abspath(path)
    g["__cached__"] = None
    g["__loader__"] = SourceFileLoader("__main__", g["__file__"])
    with open(path, "rb") as f:
        source = f.read()
    return compile(source, g["__file__"], "exec", dont_inherit=True), g


# At module level, so that an exception leaves through the interpreter's own top level (exit
# status 1, SIGINT for KeyboardInterrupt, SystemExit) with this frame and the stub's taken
# off its traceback: what a cold start prints.
try:
    exec(*_ddprun_spare_main())
except BaseException as _ddprun_e:  # noqa: B036
    _ddprun_e.__traceback__ = _ddprun_e.__traceback__.tb_next
    while _ddprun_e.__traceback__ is not None and _ddprun_e.__traceback__.tb_frame.f_code.co_filename == "<ddprun-spare>":
        _ddprun_e.__traceback__ = _ddprun_e.__traceback__.tb_next
    raise
