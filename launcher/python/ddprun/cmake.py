"""``python -m ddprun.cmake`` prints the prefix to put on CMAKE_PREFIX_PATH for
``find_package(ddprun_worker)``, e.g.
``cmake -S . -B build -DCMAKE_PREFIX_PATH="$(python -m ddprun.cmake)"``."""

from ._paths import cmake_prefix_path

if __name__ == "__main__":
    print(cmake_prefix_path())
