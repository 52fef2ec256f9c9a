"""Slow steps injected into chosen training runs, for the bench's busy-machine test (tests/test_bench.py): a
synthetic hog that is deterministic. Python imports this file at start-up when tests/slow_steps is on PYTHONPATH
(tests/slow_steps/python puts it there). SLOW_STEPS is JSON: {"a metrics file name's part": [first step, last
step, factor]}. Every run under it measures its steps on a simulated clock, not the machine's: common.meter's
`time.perf_counter` reads a clock that only Meter.step moves, by STEP_S a step, so every step of every run takes
exactly STEP_S and a loaded machine (CI, both cores busy) changes no rate. A run whose --metrics-out names a part
makes each of those steps (counted from 0, warm-up included) take `factor` times as long: as if another program had
taken the cores then. The training itself is real; only its clock is not."""

import importlib.abc
import importlib.machinery
import json
import os
import sys
import time
import types

_PLAN = json.loads(os.environ.get("SLOW_STEPS", "{}"))
_TARGET = next((sys.argv[i + 1] for i, a in enumerate(sys.argv[:-1]) if a == "--metrics-out"), "")
_SLOW = next((v for part, v in _PLAN.items() if part in os.path.basename(_TARGET)), None)
STEP_S = 0.01  # every step's simulated duration (s)


class _Finder(importlib.abc.MetaPathFinder):
    """Wraps common.meter's Meter.step once that module is loaded."""

    def find_spec(self, name, path, target=None):
        if name != "common.meter":
            return None
        spec = importlib.machinery.PathFinder.find_spec(name, path)
        loader = spec.loader
        original = loader.exec_module

        def exec_module(module):
            original(module)
            step = module.Meter.step
            first, last, factor = _SLOW or (0, -1, 1)
            clock = [0.0]
            module.time = types.SimpleNamespace(**{**vars(time), "perf_counter": lambda: clock[0]})

            def slow_step(self, *args, **kwargs):
                clock[0] += STEP_S * (factor if first <= self.steps <= last else 1)  # this step's simulated time
                return step(self, *args, **kwargs)

            module.Meter.step = slow_step

        loader.exec_module = exec_module
        return spec


if "SLOW_STEPS" in os.environ:
    sys.meta_path.insert(0, _Finder())
