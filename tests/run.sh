#!/usr/bin/env bash
# The test command: set-up when missing (packages, Fashion-MNIST), then pytest on CPU. Arguments go to pytest.
#   bash tests/run.sh              # everything CUDA-free (tests marked `gpu` skip without a GPU)
#   bash tests/run.sh -m gpu       # the GPU tests, on a machine with CUDA
set -euo pipefail
cd "$(dirname "$0")/.."
bash bench/setup.sh --test
. bench/python.sh  # the Python set-up installed into: $PYTHON, the active environment, .venv/ or python3
# Two processes, one test file each at a time (--dist loadfile: a file's module fixtures run once): most tests wait on
# subprocesses that start Python and torch, so two at a time finish sooner on 2 cores.
workers=${PYTEST_WORKERS:-2}
# The cores shared out between the test processes: torch's default of one thread per core in each of two trainings at
# once oversubscribes them (two small trainings side by side on 2 cores: 14.7 s with the default, 11.1 s with one
# thread each). The tests check what is computed, not how fast; the scripts themselves keep torch's default.
case $workers in
  ''|*[!0-9]*|0) ;;  # auto, logical, 0 (no xdist): torch's default
  *) threads=$(( $(nproc 2>/dev/null || echo 2) / workers )); [ "$threads" -ge 1 ] || threads=1
     export OMP_NUM_THREADS=${OMP_NUM_THREADS:-$threads} ;;
esac
exec "$(project_python)" -m pytest tests -n "$workers" --dist loadfile "$@"
