# Run by test_spares.py (traceback): on attempt 0 waits to be SIGKILLed (pid file, as
# probe_worker.py); later attempts fail with a traceback through a function of this script.
import os
import sys
import time


def fail(n):
    raise ValueError("attempt %s fails on purpose (%d)" % (os.environ["TORCHELASTIC_RESTART_COUNT"], n))


if os.environ["TORCHELASTIC_RESTART_COUNT"] == "0":
    pidfile = os.environ["PROBE_PIDFILE_DIR"] + "/" + os.environ["LOCAL_RANK"]
    with open(pidfile + ".tmp", "w") as f:
        f.write(str(os.getpid()))
    os.rename(pidfile + ".tmp", pidfile)
    time.sleep(600)
    sys.exit(3)
fail(7)
