# ddprun warm spare (launcher/src/spares/spares.cpp runs this as `python -u -c <this> ...`)
# argv: -c CTL_FD PRIORITY PRELOAD -- COLD_ARGV...   PRIORITY: idle | normal; PRELOAD: m1,m2
# COLD_ARGV is what a cold start execs: PYTHON -u (SCRIPT | -m MODULE | -c CODE) ARGS...
# 1. Imports the preload modules (at SCHED_IDLE in a helper thread unless PRIORITY is normal),
#    then tells the agent "R <import seconds> <threads>" on CTL_FD and parks on it.
# 2. The launch: "G" + 8-byte length with the worker's stdout and stderr attached (SCM_RIGHTS),
#    then cwd, argv, environment (NUL-separated). It takes them, answers "A" (or "E why"),
#    closes CTL_FD and runs the entry point in __main__ as the interpreter itself would.
# No at-sign in this file: CMake's configure_file embeds it.


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
    cold = sys.argv[5:]

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

    sock = socket.socket(fileno=ctl)
    threads = len(tasks())
    sock.sendall(("R %.3f %d\n" % (time.monotonic() - t0, threads)).encode())

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
