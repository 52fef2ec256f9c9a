"""Slow steps injected into chosen training runs, for the bench's busy-machine test (tests/test_pairs.py): a
synthetic hog that is deterministic. Python imports this file at start-up when tests/slow_steps is on PYTHONPATH
(tests/slow_steps/python puts it there). SLOW_STEPS is JSON: {"a metrics file name's part": [first step, last
step, factor]}; a run whose --metrics-out names that part makes each of those steps (counted from 0, warm-up
included) take `factor` times as long, by sleeping before `Meter.step` records it: as if another program had taken
the cores then. A factor, not seconds: the slow-down stands out whatever else loads the machine."""

import importlib.abc
import importlib.machinery
import json
import os
import sys
import time

_PLAN = json.loads(os.environ.get("SLOW_STEPS", "{}"))
_TARGET = next((sys.argv[i + 1] for i, a in enumerate(sys.argv[:-1]) if a == "--metrics-out"), "")
_SLOW = next((v for part, v in _PLAN.items() if part in os.path.basename(_TARGET)), None)


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
            first, last, factor = _SLOW
            last_end = [time.perf_counter()]

            def slow_step(self, *args, **kwargs):
                now = time.perf_counter()
                if first <= self.steps <= last:
                    time.sleep((factor - 1) * (now - last_end[0]))  # this step, `factor` times as long
                result = step(self, *args, **kwargs)
                last_end[0] = time.perf_counter()
                return result

            module.Meter.step = slow_step

        loader.exec_module = exec_module
        return spec


if _SLOW:
    sys.meta_path.insert(0, _Finder())
