#!/usr/bin/env bash
# The test command: set-up when missing (packages, Fashion-MNIST), then pytest on CPU. Arguments go to pytest.
#   bash tests/run.sh              # everything CUDA-free (tests marked `gpu` skip without a GPU)
#   bash tests/run.sh -m gpu       # the GPU tests, on a machine with CUDA
set -euo pipefail
cd "$(dirname "$0")/.."
bash bench/setup.sh --test
# Two processes, one test file each at a time (--dist loadfile: a file's module fixtures run once): most tests wait on
# subprocesses that start Python and torch, so two at a time finish sooner on 2 cores.
exec "${PYTHON:-python3}" -m pytest tests -n "${PYTEST_WORKERS:-2}" --dist loadfile "$@"
