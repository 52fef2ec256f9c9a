#!/usr/bin/env bash
# The main job: set-up when missing (packages, data; into .venv/ where the system's Python refuses packages), then the
# bench on this machine's hardware: tables, plots, logs in --out, and a summary that fits a terminal at the end.
#   bash run_all.sh                               # profile auto: gpu when CUDA is present, else cpu
#   bash run_all.sh --profile cpu --out results/my-laptop
# Flags go to bench/bench.py (--profile, --out, --repeats, --matrix). Results land in --out (default results/local/PROFILE).
set -euo pipefail
cd "$(dirname "$0")"
bash bench/setup.sh
. bench/python.sh  # the Python set-up installed into: $PYTHON, the active environment, .venv/ or python3
exec "$(project_python)" bench/bench.py "$@"
