"""The meter's probe step (common/meter.py): FLOPs and activations come from a step of the instrument's own, run
eagerly, never from a counter or hooks inside a compiled step. On torch 2.11 a frame first reached under a dispatch
mode runs eagerly for good (pytorch#190286): a meter inside the compiled step could change what it times. So, for
every rung that compiles and runs on a CPU: Dynamo's counters (frames, graphs, graph breaks) and the rung's own
compile figures are the same with the probe as without it (METER_PROBE=0), and the probe's FLOP count is the eager
train.py's for the same model and batch. (On torch 2.15 a counter inside the compiled step would leave these counters
equal too: the bug is 2.11's. What catches a probe that enters compiled frames on any version is
tests/test_meter.py's check that the probe step alone runs under the force_eager stance.)"""

import json
import os

import pytest
from conftest import run
from test_equivalence import SAME

# 6 steps of 32 images through the MLP in float32: every rung compiles it at step 1, the probe is step 2
MLP = ["--model", "mlp", "--subset", "256", "--batch-size", "32", "--epochs", "1", "--max-steps", "6",
       "--test-subset", "100"]  # fmt: skip
FLOAT32 = ["--amp-dtype", "float32"]  # the rungs that choose a precision: the base's float32
COMPILED = {  # the rungs that call torch.compile and run on a CPU (train_float8.py, train_cuda_graphs.py: a GPU's)
    "train_compile.py": FLOAT32,
    "train_compile_cache.py": [*FLOAT32, "--compile-cache", "{tmp}/cache"],
    "train_compiled_optimizer.py": [],
    "train_fast.py": FLOAT32,
}


def metrics(tmp_path, name: str, script: str, flags: list, probe: bool) -> dict:
    env = {**os.environ, "METER_PROBE": "1" if probe else "0"}
    out = tmp_path / f"{name}.json"
    flags = [flag.replace("{tmp}", str(tmp_path / name)) for flag in flags]
    proc = run(f"src/{script}", *SAME, *MLP, *flags, "--metrics-out", out, env=env)
    assert proc.returncode == 0, proc.stderr
    return json.loads(out.read_text())


@pytest.fixture(scope="module")
def eager_flops(tmp_path_factory):
    base = metrics(tmp_path_factory.mktemp("base"), "train", "train.py", [], probe=True)
    assert base["dynamo"] is None  # train.py compiles nothing
    return base["flops_per_image"]


@pytest.mark.parametrize("script", sorted(COMPILED))
def test_the_probe_leaves_the_compiled_frames_as_they_are(script, tmp_path, eager_flops):
    """`script` with and without the probe step: the same Dynamo counters (frames compiled, unique graphs, calls
    captured, graph breaks) and the same graphs_compiled / recompiled_steps where the rung reports them; with it,
    the FLOPs per image are the eager train.py's (818,176 for the MLP, the hand count of tests/test_train.py) and
    activations are measured; without it, neither."""
    flags = COMPILED[script]
    probed = metrics(tmp_path, "probed", script, flags, probe=True)
    bare = metrics(tmp_path, "bare", script, flags, probe=False)
    assert probed["dynamo"] and probed["dynamo"]["stats"].get("unique_graphs", 0) >= 1  # it compiled
    assert probed["dynamo"] == bare["dynamo"]
    for key in ("graphs_compiled", "recompiled_steps"):
        assert probed.get(key) == bare.get(key)
    assert probed["flops_per_image"] == eager_flops == 818_176
    assert probed["activation_mib"] > 0 and bare["flops_per_image"] is None and bare["activation_mib"] is None
    assert probed["excluded_steps"] == bare["excluded_steps"] + 1  # the probe step (--warmup-steps 0) left out
