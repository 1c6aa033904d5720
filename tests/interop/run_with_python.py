#!/usr/bin/env python3
"""Runs an interop script under a given interpreter (a torch 2.x venv), or says why not.

usage: run_with_python.py PYTHON SCRIPT [ARGS...]
When PYTHON is missing: with CI=true this fails loudly (exit 1); otherwise it prints
"SKIP: venv missing" and exits 77, the SKIP_RETURN_CODE of the ctest tests.
"""
import os
import sys

SKIP = 77

if len(sys.argv) < 3:
    sys.exit("usage: run_with_python.py PYTHON SCRIPT [ARGS...]")
python, script = sys.argv[1], sys.argv[2]
if not (os.path.isfile(python) and os.access(python, os.X_OK)):
    if os.environ.get("CI", "").lower() == "true":
        print(f"FAIL: the torch venv interpreter {python} is missing (CI=true: not skipping). "
              "Run scripts/setup_deps.sh to create it.", flush=True)
        sys.exit(1)
    print(f"SKIP: venv missing ({python}); run scripts/setup_deps.sh to create it", flush=True)
    sys.exit(SKIP)
os.execv(python, [python, script, *sys.argv[3:]])
