#!/usr/bin/env bash
# Every flag spelling in `ddprun --help` and `ddprund --help` completes with the bash completion,
# values complete where they are known, and the words after the entry point are left to it.
#   completion_test.sh COMPLETION_FILE DDPRUN DDPRUND
set -uo pipefail
comp_file=$1 ddprun=$2 ddprund=$3
fails=0
fail() { echo "FAIL: $*"; fails=$((fails + 1)); }

# shellcheck disable=SC1090
source "$comp_file" || { echo "FAIL: cannot source $comp_file"; exit 1; }
[[ $(complete -p ddprun 2>/dev/null) == *_ddprun_complete* ]] || fail "no completion registered for ddprun"
[[ $(complete -p ddprund 2>/dev/null) == *_ddprun_complete* ]] || fail "no completion registered for ddprund"

# The candidates bash would offer for a command line typed up to its end.
candidates() {
  COMP_LINE=$1
  COMP_POINT=${#1}
  read -ra COMP_WORDS <<<"$1"
  [[ $1 == *' ' ]] && COMP_WORDS+=("")
  COMP_CWORD=$((${#COMP_WORDS[@]} - 1))
  COMPREPLY=()
  _ddprun_complete
  printf '%s\n' "${COMPREPLY[@]}"
}

# The flag spellings of a program, read from its --help here with sed (the completion reads
# them with bash's own matching): the first field of every line that starts with "  -".
flags_of() {
  "$1" --help | sed -n 's/^  \(-[^ ]*\).*/\1/p' | tr ',' '\n'
}

for prog in "$ddprun" "$ddprund"; do
  mapfile -t flags < <(flags_of "$prog")
  name=$(basename "$prog")
  echo "$name: ${#flags[@]} flag spellings in --help"
  ((${#flags[@]} >= 10)) || fail "$name: only ${#flags[@]} flags found in --help"
  for f in "${flags[@]}"; do
    # (grep reads all its input: with pipefail, grep -q could fail the pipe with SIGPIPE.)
    candidates "$prog $f" | grep -xF -- "$f" >/dev/null || fail "$name: '$f' does not complete"
  done
  # Everything offered for a bare dash is a flag of --help.
  while read -r c; do
    printf '%s\n' "${flags[@]}" | grep -xF -- "$c" >/dev/null || fail "$name: '$c' completes but is not in --help"
  done < <(candidates "$prog -")
done

expect() {  # expect 'command line' 'expected candidates, space-separated'
  local got
  got=$(candidates "$1" | sort | tr '\n' ' ')
  got=${got% }
  [[ $got == "$2" ]] || fail "'$1' completes to '$got', expected '$2'"
}
expect "$ddprun --rdzv_backend " "c10d static"
expect "$ddprun --rdzv-backend s" "static"
expect "$ddprun --nproc_per_node=" "auto cpu gpu"
expect "$ddprun --nproc_per_node=g" "gpu"
expect "$ddprun --numa_binding=core" "core-complex"
expect "$ddprun --standalone --nproc_per_node 2 --max_res" "--max_restarts"
# After the entry point the words are the script's: nothing from ddprun.
expect "$ddprun train.py --" ""
expect "$ddprun --nproc_per_node 2 train.py --max" ""
expect "$ddprun -- train.py -" ""
# ddprund: values from the sets its --help lists.
expect "$ddprund --legacy-dialect " "1.13 2.0 2.1"
expect "$ddprund --allow-open-rendezvous=" "no yes"
expect "$ddprund --log-level=w" "warn"

if ((fails)); then
  echo "$fails failure(s)"
  exit 1
fi
echo "completion: ok"
