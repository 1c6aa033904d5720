"""The console commands: each replaces this Python process with the bundled program (same
process id, so signals and the exit status are the program's own)."""

import os
import sys

from ._paths import bin_dir


def _exec(program: str) -> None:
    path = os.path.join(bin_dir(), program)
    if not os.access(path, os.X_OK):
        sys.stderr.write(
            f"ddprun: the bundled program {path} is missing or not executable; "
            "reinstall the package (pip install --force-reinstall ddprun)\n"
        )
        sys.exit(2)
    # Python entry points run with this interpreter (the environment ddprun was installed
    # in) unless PYTHON_EXEC says otherwise; the launcher reads DDPRUN_DEFAULT_PYTHON.
    os.environ["DDPRUN_DEFAULT_PYTHON"] = sys.executable
    sys.stdout.flush()
    sys.stderr.flush()
    os.execv(path, [program] + sys.argv[1:])


def ddprun() -> None:
    _exec("ddprun")


def ddprund() -> None:
    _exec("ddprund")


def train() -> None:
    _exec("train")
