#!/usr/bin/env python3
"""No line of a C++ source or header of the project runs over 120 columns (.clang-format's
ColumnLimit; characters, not bytes). Exits 1 with one line per long line.
    usage: scripts/check_columns.py [repo-root]
"""
import os
import subprocess
import sys

LIMIT = 120
EXTS = (".cpp", ".h", ".hpp", ".cc", ".cu", ".cuh", ".h.in")


def tracked(repo):
    """The repository's files (git ls-files), or a walk of it where it is no git checkout."""
    try:
        out = subprocess.run(["git", "-C", repo, "ls-files"], capture_output=True, text=True, check=True).stdout
        return out.splitlines()
    except (OSError, subprocess.CalledProcessError):
        skip = {".git", "build"}
        files = []
        for d, dirs, names in os.walk(repo):
            dirs[:] = [x for x in dirs if x not in skip and not x.startswith((".venv", "build"))]
            files += [os.path.relpath(os.path.join(d, n), repo) for n in names]
        return files


def main():
    repo = sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(__file__), "..")
    files = [f for f in tracked(repo) if f.endswith(EXTS) and os.path.isfile(os.path.join(repo, f))]
    long_lines = 0
    for f in sorted(files):
        with open(os.path.join(repo, f), encoding="utf-8", errors="replace") as fh:
            for n, line in enumerate(fh, 1):
                width = len(line.rstrip("\n"))
                if width > LIMIT:
                    long_lines += 1
                    print(f"error: {f}:{n}: {width} columns, over {LIMIT}; break the line")
    print(f"{len(files)} C++ files, {long_lines} lines over {LIMIT} columns")
    return 1 if long_lines else 0


if __name__ == "__main__":
    sys.exit(main())
