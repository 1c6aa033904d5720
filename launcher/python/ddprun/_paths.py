"""Where the installed programs, library, headers and CMake package files are."""

import os

_ROOT = os.path.dirname(os.path.abspath(__file__))


def cmake_prefix_path() -> str:
    """The prefix to put on CMAKE_PREFIX_PATH for ``find_package(ddprun_worker)``."""
    return _ROOT


def bin_dir() -> str:
    """The folder of the bundled programs (ddprun, ddprund, train)."""
    return os.path.join(_ROOT, "bin")


def lib_dir() -> str:
    """The folder of libddprun_worker."""
    return os.path.join(_ROOT, "lib")


def include_dir() -> str:
    """The folder of libddprun_worker's headers."""
    return os.path.join(_ROOT, "include")
