"""Progress ticks for ddprun's hang detection.

Call ``progress()`` once per training step::

    import ddprun

    for batch in loader:
        loss = step(batch)
        ddprun.progress()

Started by ``ddprun --hang_timeout=S``, every worker finds the path of its own progress file in
the environment variable ``DDPRUN_PROGRESS_FILE``; ``progress()`` adds one to the counter in it.
When a rank's counter has not moved for S seconds, ddprun names the rank, saves the stacks of
every local rank in the run's log directory and restarts the group (``--max_restarts``).

Without the variable (the script runs without ddprun) or with a file that is not a progress
file, ``progress()`` does nothing; without ``--hang_timeout`` nobody watches the counter. The first call maps the file; each
later one is a single store into that page: no system call, well under a microsecond.

With ``--hang_timeout``, ddprun makes this module importable in every worker: it appends a
directory holding it to ``PYTHONPATH`` unless the workers' interpreter is the one ddprun was
installed into with pip (there ``import ddprun`` finds the installed package). The module uses
nothing but the standard library.

File layout (one 4096-byte file per rank, little-endian 64-bit words): word 0 is the magic
``DDPRPRG1`` (written by ddprun), word 1 the counter (written only by the worker); words 2-6
hold the step statistics of the C++ worker library (see ddprun's hang.h), untouched here.
"""

import mmap as _mmap
import os as _os

_MAGIC = 0x3147525052504444  # the bytes "DDPRPRG1"
_counter = None  # None: not looked up yet; False: no progress file; else the words of the page


def _open():
    global _counter
    _counter = False
    path = _os.environ.get("DDPRUN_PROGRESS_FILE")
    if not path:
        return
    try:
        fd = _os.open(path, _os.O_RDWR)
        try:
            page = _mmap.mmap(fd, 4096, _mmap.MAP_SHARED, _mmap.PROT_READ | _mmap.PROT_WRITE)
        finally:
            _os.close(fd)
        words = memoryview(page).cast("Q")
        if words[0] == _MAGIC:
            _counter = words
    except (OSError, ValueError):
        pass


def progress():
    """Tells ddprun that this worker made progress (one step). Never raises."""
    words = _counter
    if words is None:
        _open()
        words = _counter
    if words is not False:
        words[1] += 1
