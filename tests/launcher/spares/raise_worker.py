# Run by test_spares.py (traceback): on attempt 0 waits to be SIGKILLed (pid file, as
# probe_worker.py); on later attempts rank 0 fails with a traceback through a function of this
# script and rank 1 exits 0 (so that no failure of rank 1 stops rank 0 before it printed).
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
if os.environ["LOCAL_RANK"] == "0":
    fail(7)
