"""The package's version for scikit-build-core (pyproject.toml), from the same place as CMake's:
``cmake -P cmake/DdprunVersion.cmake`` (git, else an sdist's PKG-INFO, else 0.0.0+unknown;
the environment's DDPRUN_VERSION overrides it). A CPU-only wheel (CMAKE_ARGS holds
-DDDPRUN_WITH_CUDA=OFF) gets the local version label ``cpu`` (X.Y.Z+cpu, X.Y.Z.devN+g<hash>.cpu),
so its name differs from the CUDA wheel's (docs/INSTALL.md says why a local label)."""

import os
import re
import shutil
import subprocess

__all__ = ["dynamic_metadata"]


def dynamic_metadata(field, settings=None):
    if field != "version":
        raise RuntimeError("ddprun_version_provider only gives the version")
    if settings:
        raise RuntimeError("ddprun_version_provider takes no settings")
    cmake = shutil.which("cmake")
    if cmake is None:
        raise RuntimeError("cmake is not on PATH; it is needed to build ddprun (apt-get install cmake)")
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    out = subprocess.run([cmake, "-DDDPRUN_SOURCE_DIR=" + root, "-P", os.path.join(root, "cmake", "DdprunVersion.cmake")],
                         check=True, stdout=subprocess.PIPE, universal_newlines=True).stdout
    for line in out.splitlines():
        if line.startswith("pep440="):
            return with_variant(line[len("pep440="):], os.environ.get("CMAKE_ARGS", ""))
    raise RuntimeError("cmake/DdprunVersion.cmake printed no version: " + out)


def with_variant(version, cmake_args):
    """``version`` with the local label ``cpu`` when ``cmake_args`` turns CUDA off."""
    off = re.findall(r"-DDDPRUN_WITH_CUDA(?::BOOL)?=(\S+)", cmake_args)
    if not off or off[-1].upper() not in ("OFF", "0", "FALSE", "NO", "N"):
        return version
    if re.search(r"[+.]cpu$", version):
        return version
    return version + (".cpu" if "+" in version else "+cpu")
