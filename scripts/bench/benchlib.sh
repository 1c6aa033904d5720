# What the bash benchmark and check scripts of scripts/bench share (benchlib.py is the Python
# side). Source it: . "$(dirname "${BASH_SOURCE[0]}")/benchlib.sh"
#   first PATH...   the first executable among PATHs (else the first PATH): a bundle's flat
#                   layout (scripts/bench/bundle_bin.sh) or a build tree's
#   port            a random port for --master_port
first() { for f in "$@"; do [[ -x "$f" ]] && { echo "$f"; return; }; done; echo "$1"; }
port() { echo $((20000 + RANDOM % 20000)); }
