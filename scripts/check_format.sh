#!/usr/bin/env bash
# clang-format check: the files listed in .clang-format-files (one path a line from the repository
# root; # starts a comment), or with --base REF the C++ files changed since REF, must be formatted
# as .clang-format says. Exits 1 naming each file that is not (fix: clang-format -i FILE), 77 when
# clang-format is missing (ctest skips), 2 on bad usage.
#   usage: scripts/check_format.sh [--base REF] [repo-root]
set -euo pipefail
base=""
if [[ "${1:-}" == "--base" ]]; then
  [[ -n "${2:-}" ]] || { echo "check_format.sh: --base needs a git revision (e.g. --base origin/main)" >&2; exit 2; }
  base="$2"
  shift 2
fi
root="${1:-$(cd "$(dirname "$0")/.." && pwd)}"
cd "$root"
fmt="${CLANG_FORMAT:-}"
if [[ -z "$fmt" ]]; then
  for c in clang-format-14 clang-format; do
    if command -v "$c" >/dev/null 2>&1; then fmt="$c"; break; fi
  done
fi
if [[ -z "$fmt" ]]; then
  echo "SKIP: clang-format not found; install it (apt-get install clang-format, or scripts/setup_deps.sh)"
  exit 77
fi
if [[ -n "$base" ]]; then
  mapfile -t files < <(git diff --name-only --diff-filter=d "$base" -- '*.cpp' '*.h' '*.cu' '*.cuh')
else
  [[ -f .clang-format-files ]] || { echo "check_format.sh: no .clang-format-files in $root" >&2; exit 2; }
  mapfile -t files < <(sed -e 's/#.*//' -e 's/[[:space:]]*$//' .clang-format-files | grep -v '^$')
fi
bad=0
for f in "${files[@]}"; do
  if [[ ! -f "$f" ]]; then
    echo "error: $f is listed in .clang-format-files but does not exist; remove it from the list"
    bad=1
  elif ! "$fmt" --style=file --dry-run -Werror "$f" >/dev/null 2>&1; then
    echo "error: $f is not formatted as .clang-format says; run: $fmt -i $f"
    bad=1
  fi
done
echo "${#files[@]} files checked with $("$fmt" --version | head -1)"
exit "$bad"
