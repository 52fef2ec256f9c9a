"""Fault injection: each case runs a real entry point as a subprocess against a damaged input or an output it cannot
write, and asserts one line on stderr (`<script>: error: ...`), no traceback, the documented exit status (README,
"Errors and reproducibility"), and that nothing the user had is lost or overwritten.

Inputs: checkpoints (unreadable, truncated, a pickle with code in it, an older format, from another script, model or
batch; another world size: test_variants.py, another optimizer or extra state: test_common.py), the bench matrix.
Damaged Fashion-MNIST files: test_errors.py. Outputs: a file path that is a folder, a folder path that is a file, a
parent that is a file, a folder that cannot be written, a checkpoint folder that already holds a run's last.pt, for
every script, the bench and prepare_data.py. A finished run whose metrics cannot be written at the end, and a
checkpoint writer killed mid-write.
"""

import argparse
import io
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from conftest import REPO, run, stopped_after_first_checkpoint, vouch_for

import common

SCRIPTS = [
    "src/train.py", "src/train_DP.py", "src/train_DDP.py", "src/train_DDP_elastic.py", "src/train_accum.py",
    "src/train_amp.py", "src/train_channels_last.py", "src/train_compile.py", "src/train_fast.py",
    "src/train_model_parallel.py", "src/loader.py", "src/loader_DALI.py",
]  # fmt: skip
CPU = ["--device", "cpu", "--workers", "0"]
QUICK = [*CPU, "--model", "cnn", "--subset", "512", "--batch-size", "128", "--warmup-steps", "1", "--log-every", "100"]


def assert_fault(proc: subprocess.CompletedProcess, code: int, *fragments: str) -> str:
    """Exit status `code`, exactly one line on stderr, `<script>: error: ` and every fragment in it; returns it."""
    assert "Traceback" not in proc.stderr, proc.stderr
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, proc.stderr
    assert proc.returncode == code, (proc.returncode, proc.stderr)
    assert ": error: " in lines[0], lines[0]
    for fragment in fragments:
        assert fragment in lines[0], lines[0]
    return lines[0]


def snapshot(folder: Path) -> dict[str, bytes | None]:
    """Every file and folder under `folder` with its bytes (None for a folder): what a failed run must not change."""
    return {str(p.relative_to(folder)): None if p.is_dir() else p.read_bytes() for p in sorted(folder.rglob("*"))}


@pytest.fixture
def unwritable(tmp_path) -> Path:
    """A folder this process cannot write into: a read-only one for a normal user; for root (who may write into
    any folder of a normal filesystem) sysfs, which refuses new files even to root."""
    if os.geteuid() != 0:
        folder = tmp_path / "read-only"
        folder.mkdir()
        folder.chmod(0o555)
        yield folder
        folder.chmod(0o755)
        return
    try:
        (Path("/sys") / "probe").write_bytes(b"")
    except OSError:
        yield Path("/sys")
    else:
        pytest.skip("running as root and /sys accepts files: no folder here refuses a write")


# -- outputs, checked before any work ------------------------------------------------------------------------------


def output_cases(tmp: Path, unwritable: Path) -> list[tuple[list, str]]:
    """(flags, fragment of the one-line error) for each way an output can be unusable, with what each needs in `tmp`:
    a results folder with a file in it, a file, and a checkpoint folder that holds an earlier run's last.pt."""
    (tmp / "results").mkdir()
    (tmp / "results" / "earlier.json").write_text('{"images_per_s": 1234.5}')
    (tmp / "a-file").write_text("the user's notes")
    (tmp / "ckpt").mkdir()
    (tmp / "ckpt" / "last.pt").write_bytes(b"an earlier run's checkpoint")
    return [
        (["--metrics-out", tmp / "results"], f"--metrics-out {tmp / 'results'} is a folder; give a file name"),
        (["--metrics-out", tmp / "a-file" / "m.json"], f"cannot be created: {tmp / 'a-file'} is a file"),
        (["--checkpoint-dir", tmp / "a-file"], f"--checkpoint-dir {tmp / 'a-file'} is a file, not a folder"),
        (["--checkpoint-dir", tmp / "ckpt"], "already holds last.pt from an earlier run: add --resume"),
        (["--metrics-out", unwritable / "m.json"], "cannot be written"),
        (["--checkpoint-dir", unwritable / "ckpt"], f"--checkpoint-dir {unwritable / 'ckpt'} cannot be"),
    ]


@pytest.mark.parametrize("script", SCRIPTS)
def test_an_output_that_cannot_be_written_stops_the_script_before_any_work(script, tmp_path, unwritable):
    """Each script meets one of the six cases (they share common.parse_args, so each case is met by two scripts)."""
    flags, fragment = output_cases(tmp_path, unwritable)[SCRIPTS.index(script) % 6]
    before = snapshot(tmp_path)
    proc = run(script, *CPU, *flags, timeout=120)
    assert_fault(proc, 2, f"{Path(script).name}: error: ", fragment)
    assert "training" not in proc.stdout  # refused before the data was even read
    assert snapshot(tmp_path) == before  # the user's folder, file and checkpoint are untouched


@pytest.mark.parametrize(
    "argv, damage",
    [
        (["bench/bench.py", "--profile", "smoke"], "a file"),
        (["bench/prepare/prepare_data.py", "--only", "synthetic"], "parent"),
    ],
)
def test_the_bench_and_prepare_data_refuse_an_unusable_out_before_any_work(argv, damage, tmp_path):
    (tmp_path / "a-file").write_text("the user's notes")
    out, fragment = (tmp_path / "a-file", "is a file, not a folder")
    if damage == "parent":
        out, fragment = (tmp_path / "a-file" / "sub", f"cannot be created: {tmp_path / 'a-file'} is a file")
    proc = run(*argv, "--out", out, timeout=120)
    assert_fault(proc, 2, f"--out {out} ", fragment)
    assert (tmp_path / "a-file").read_text() == "the user's notes"


MATRIX = """
[t]
repeats = 1
[[t.runs]]
name = "quick"
script = "src/train.py"
args = ["--epochs", "1"]
baseline = "quick"
"""


@pytest.mark.parametrize(
    "damage, fragment",
    [
        (("args = [", "arg = ["), "run 'quick' of profile 't' in "),  # a typo in a key
        (("src/train.py", "src/train_nope.py"), "script 'src/train_nope.py' is not a file of the repository"),
        (('baseline = "quick"', 'baseline = "quik"'), "baseline 'quik' is not the name of a run of the profile"),
    ],
)
def test_a_bad_matrix_is_one_line_before_any_run(damage, fragment, tmp_path):
    (tmp_path / "m.toml").write_text(MATRIX.replace(*damage))
    proc = run("bench/bench.py", "--matrix", tmp_path / "m.toml", "--profile", "t", "--out", tmp_path / "o")
    assert_fault(proc, 2, fragment)
    assert not (tmp_path / "o" / "runs.csv").exists()


# -- a finished run is never lost ----------------------------------------------------------------------------------


def test_metrics_that_cannot_be_written_at_the_end_go_to_a_fallback_file_and_stdout(tmp_path):
    """The --metrics-out folder is replaced by a file while the run trains: its metrics land in the working
    directory and on stdout, the one line says where, and the exit status is 1."""
    results = tmp_path / "results"
    argv = [sys.executable, REPO / "src/train.py", *QUICK, "--subset", "4096", "--epochs", "1"]
    argv += ["--metrics-out", results / "m.json"]
    job = subprocess.Popen(
        list(map(str, argv)), cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )  # fmt: skip
    first = job.stdout.readline()
    assert first.startswith("training cnn"), first + job.stderr.read()
    shutil.rmtree(results)
    results.write_text("now a file: the folder is gone")  # so even mkdir cannot bring it back
    stdout, stderr = job.communicate(timeout=300)
    fallback = tmp_path / f"metrics-{job.pid}.json"
    line = assert_fault(
        subprocess.CompletedProcess(argv, job.returncode, stdout, stderr), 1, f"cannot write --metrics-out {results}"
    )
    assert str(fallback) in line
    metrics = json.loads(fallback.read_text())
    assert metrics["status"] == "ok" and metrics["steps"] == 32 and metrics["test_acc"] > 0.5
    assert json.loads(stdout[stdout.index("{\n") :]) == metrics  # and on stdout, whole
    assert results.read_text() == "now a file: the folder is gone"


# -- checkpoints ---------------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def saved(tmp_path_factory) -> Path:
    """A real train.py checkpoint: cnn, 4 steps of 128 Fashion-MNIST images."""
    folder = tmp_path_factory.mktemp("saved")
    proc = run("src/train.py", *QUICK, "--epochs", "1", "--checkpoint-dir", folder, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return folder / "last.pt"


def _saved_bytes(state: dict) -> bytes:
    buffer = io.BytesIO()
    torch.save(state, buffer)
    return buffer.getvalue()


def _old_format(raw: bytes) -> bytes:
    """The checkpoint as the code before format 2 wrote it: no `format`, no `made_by`."""
    state = torch.load(io.BytesIO(raw), weights_only=True)
    return _saved_bytes({key: value for key, value in state.items() if key not in ("format", "made_by")})


CODE = argparse.Namespace(hook="not a tensor: torch.load(weights_only=True) refuses to build it")
CHECKPOINTS = {  # name: (how the checkpoint is damaged, script, extra flags, fragment of the one-line error)
    "not a checkpoint": (lambda raw: b"not a checkpoint at all", "src/train.py", [], "is not a readable checkpoint"),
    "truncated": (lambda raw: raw[: len(raw) // 2], "src/train.py", [], "is not a readable checkpoint"),
    "a pickle with code": (
        lambda raw: _saved_bytes({"format": common.checkpoint.CHECKPOINT_FORMAT, "made_by": {}, "hook": CODE}),
        "src/train.py", [], "is not a readable checkpoint (Weights only load failed",
    ),
    "an older format": (_old_format, "src/train.py", [], "has checkpoint format none, this code reads formats 4, 5"),
    "another script": (lambda raw: raw, "src/train_amp.py", [], "script train.py there, train_amp.py here"),
    "another model, seed and batch": (  # another seed: a mid-epoch resume would skip other samples than it trained on
        lambda raw: raw, "src/train.py", ["--model", "mlp", "--batch-size", "64", "--seed", "1"],
        "model cnn there, mlp here; seed 0 there, 1 here; batch per process 128 there, 64 here",
    ),
    "another schedule": (  # more epochs or another peak would reshape the one-cycle schedule mid-run
        lambda raw: raw, "src/train.py", ["--epochs", "3", "--lr", "0.001"],
        "epochs 1 there, 3 here; peak learning rate 0.005 there, 0.001 here",
    ),
    "another length": (lambda raw: raw, "src/train.py", ["--max-steps", "2"], "max steps none there, 2 here"),
}  # fmt: skip


@pytest.mark.parametrize("case", CHECKPOINTS)
def test_resume_refuses_a_checkpoint_it_cannot_continue_in_one_line(case, saved, tmp_path):
    damage, script, flags, fragment = CHECKPOINTS[case]
    (tmp_path / "last.pt").write_bytes(damage(saved.read_bytes()))
    vouch_for(tmp_path / "last.pt")  # its digest: the checks under test come after the digest's (test_fuzz.py)
    before = snapshot(tmp_path)
    proc = run(script, *QUICK, "--epochs", "1", *flags, "--checkpoint-dir", tmp_path, "--resume", timeout=120)
    line = assert_fault(proc, 2, f"--resume: {tmp_path / 'last.pt'} ", fragment, "use a new --checkpoint-dir")
    assert "training" not in proc.stdout  # nothing trained from a partial state
    assert snapshot(tmp_path) == before, line  # and the checkpoint is kept as it was


def test_a_writer_killed_mid_write_leaves_the_previous_checkpoint_whole(tmp_path):
    """SIGKILL while torch.save writes the epoch-2 checkpoint (ResNet-18 + AdamW, 140 MB: about 0.2 s of writing):
    last.pt still holds epoch 1, whole, and --resume can continue from it (the next save removes the dead writer's
    temporary file: test_common.py)."""
    flags = [*CPU, "--model", "resnet18", "--dataset", "synthetic", "--image-size", "32", "--subset", "128",
             "--batch-size", "128", "--warmup-steps", "1", "--checkpoint-dir", tmp_path]  # fmt: skip
    stopped_after_first_checkpoint("src/train.py", *flags, "--epochs", "2")  # last.pt: epoch 1 of 2
    epoch_1 = (tmp_path / "last.pt").read_bytes()

    argv = [sys.executable, "src/train.py", *map(str, flags), "--epochs", "2", "--resume"]
    job = subprocess.Popen(argv, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline, partial = time.monotonic() + 300, None
    while partial is None and job.poll() is None and time.monotonic() < deadline:
        partial = next(tmp_path.glob(".last.pt.*.tmp"), None)  # the temporary file of the write in progress
        time.sleep(0.001)
    job.send_signal(signal.SIGKILL)
    stdout, stderr = job.communicate(timeout=60)
    assert partial is not None, f"the writer ended before it could be killed mid-write: {stdout}{stderr}"
    assert "resumed from" in stdout and job.returncode == -signal.SIGKILL
    assert partial.exists()  # the dead writer's file, as far as it got
    assert (tmp_path / "last.pt").read_bytes() == epoch_1  # the previous checkpoint, whole
    state = torch.load(tmp_path / "last.pt", weights_only=True)
    assert state["epoch"] == 1 and state["step"] == 1 and state["made_by"]["script"] == "train.py"
    model = common.build_model("resnet18", 3, 32)
    model.load_state_dict(state["model"])  # strict: every tensor is there
    torch.optim.AdamW(model.parameters()).load_state_dict(state["optimizer"])
