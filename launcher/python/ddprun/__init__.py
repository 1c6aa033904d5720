"""ddprun, as installed by pip: the torchrun-compatible launcher ``ddprun``, the rendezvous
store daemon ``ddprund`` and the C++ DDP worker runtime ``libddprun_worker``.

The programs and the library live in this package's ``bin/``, ``lib/`` and ``include/``;
``ddprun`` and ``ddprund`` on PATH, and ``python -m ddprun``, run them. A C++ project finds
the library with ``find_package(ddprun_worker)`` after
``-DCMAKE_PREFIX_PATH="$(python -m ddprun.cmake)"``.

A worker started by ``ddprun --hang_timeout=S`` reports its progress with
``ddprun.progress()`` once per step (see ``ddprun._progress``: ``DDPRUN_PROGRESS_FILE``).
"""

from ._paths import bin_dir, cmake_prefix_path, include_dir, lib_dir
from ._progress import progress

try:  # written by the build into the installed package (cmake/DdprunVersion.cmake)
    from ._version import __version__
except ImportError:  # the source tree itself
    __version__ = "0.0.0+unknown"

__all__ = ["__version__", "bin_dir", "cmake_prefix_path", "include_dir", "lib_dir", "progress"]
