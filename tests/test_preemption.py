"""A preemption signal and a full disk lose nothing.

SIGTERM (what Slurm, Kubernetes, `timeout` and torchrun send before they kill a job) at a step chosen at random:
train.py, and train_DDP_elastic.py on 2 ranks under torchrun, stop at a step boundary, save it, write the metrics of
what finished, say so in one line and exit 143; `--resume` then ends with the uninterrupted run's weights, bit for bit
(`--deterministic`: each epoch's order depends on the seed and the epoch only, the done steps are skipped, the
schedule continues at its step). Each test waits for a progress line, never for a time: the step the run stops at is
whatever step the signal found, and every assertion is about that step. SIGTERM to the bench: test_bench.py
(`test_a_signal_at_any_moment_of_a_run_kills_its_child_and_leaves_an_interrupted_row`, SIGINT and SIGTERM).

A full disk: a checkpoint, the metrics JSON and the bench's tables are written to a filesystem with no room left, a
real tmpfs where the test may mount one (root), else under a file size limit (RLIMIT_FSIZE: the write fails with
EFBIG instead of ENOSPC, through the same code). Each ends in one line naming the file and the OS error, no
temporary file, and the previous file byte-identical; a run's numbers are still written (or printed).
"""

import contextlib
import json
import os
import random
import resource
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import torch
from conftest import REPO, stopped_after_first_checkpoint, torchrun_command

FLAGS = ["--device", "cpu", "--subset", "1024", "--test-subset", "500", "--batch-size", "128", "--epochs", "2",
         "--deterministic", "--seed", "0", "--warmup-steps", "0", "--log-every", "1"]  # fmt: skip  # 8 steps an epoch
UNBUFFERED = {**os.environ, "PYTHONUNBUFFERED": "1"}


def launch(argv, **kwargs) -> subprocess.Popen:
    """Start `argv` (a script's path first: run with this Python) in the repository, unbuffered, output captured."""
    argv = argv if argv[0] == sys.executable else [sys.executable, *argv]
    kwargs.setdefault("cwd", REPO)
    kwargs.setdefault("env", UNBUFFERED)
    return subprocess.Popen(list(map(str, argv)), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, **kwargs)


def finish(argv, **kwargs) -> subprocess.CompletedProcess:
    job = launch(argv, **kwargs)
    stdout, stderr = job.communicate(timeout=600)
    return subprocess.CompletedProcess(argv, job.returncode, stdout, stderr)


def terminate_after(argv, step: int, send, **kwargs) -> subprocess.CompletedProcess:
    """Start `argv`, wait for its progress line of `step` ("step K/"), then `send(job)` SIGTERM; return the result."""
    job = launch(argv, start_new_session=True, **kwargs)
    lines = []
    try:
        for line in job.stdout:
            lines.append(line)
            if f" step {step}/" in line:
                send(job)
                break
        stdout, stderr = job.communicate(timeout=600)
    finally:  # whatever happened, nothing of it outlives the test
        with contextlib.suppress(ProcessLookupError):
            os.killpg(job.pid, signal.SIGKILL)
    return subprocess.CompletedProcess(argv, job.returncode, "".join(lines) + stdout, stderr)


def rank_pid(launcher: int, rank: int) -> int:
    """The pid of torchrun's worker of `rank`: a child of `launcher` whose environment says RANK=<rank>."""
    for proc in Path("/proc").iterdir():
        if proc.name.isdigit():
            with contextlib.suppress(OSError):
                if int((proc / "stat").read_text().rsplit(")", 1)[1].split()[1]) == launcher:
                    if f"RANK={rank}".encode() in (proc / "environ").read_bytes().split(b"\0"):
                        return int(proc.name)
    raise AssertionError(f"no worker of rank {rank} under torchrun {launcher}")


def state(path: Path) -> dict:
    return torch.load(path, weights_only=True)


def assert_same_weights(a: dict, b: dict) -> None:
    assert a["step"] == b["step"] and a["model"].keys() == b["model"].keys()
    for key in a["model"]:
        assert torch.equal(a["model"][key], b["model"][key]), key


def stopped_line(proc: subprocess.CompletedProcess, script: str, checkpoint: Path) -> int:
    """The step of the one line "SCRIPT: terminated by SIGTERM at step N; CHECKPOINT holds it: ..." on stderr."""
    ours = [line for line in proc.stderr.splitlines() if line.startswith(f"{script}: ")]
    assert len(ours) == 1, proc.stderr
    prefix = f"{script}: terminated by SIGTERM at step "
    assert ours[0].startswith(prefix), proc.stderr
    step, rest = ours[0].removeprefix(prefix).split(";", 1)
    assert rest == f" {checkpoint} holds it: resume with --resume", ours[0]
    return int(step)


def test_sigterm_at_a_random_step_saves_that_step_and_the_resume_ends_with_the_uninterrupted_weights(tmp_path):
    """train.py with 2 DataLoader workers, SIGTERM to its whole process group (as `timeout` and Slurm send it: the
    workers get it too and must not die of it) after the progress line of a random step K of 16: the run stops at a
    step N >= K, before step N + 1 starts; last.pt holds step N; the metrics say "terminated" at N; stderr holds the
    one line; exit 143. `--resume` trains steps N + 1 to 16 and ends with the uninterrupted run's weights, BatchNorm
    statistics and optimizer step, bit for bit (tolerance none: the same samples in the same order through the same
    kernels, --deterministic), and the uninterrupted run's epoch records: both epochs, each with its test loss and
    accuracy (epoch 1's from last.pt when N >= 8)."""
    full = finish(["src/train.py", *FLAGS, "--checkpoint-dir", tmp_path / "full", "--metrics-out", tmp_path / "f.json"])
    assert full.returncode == 0, full.stderr
    k = random.randint(1, 10)  # the signal's step; more may run before it is seen, on a busy machine
    ck = tmp_path / "cut"
    argv = ["src/train.py", *FLAGS, "--checkpoint-dir", ck, "--metrics-out", tmp_path / "cut.json"]
    cut = terminate_after(argv, k, lambda job: os.killpg(job.pid, signal.SIGTERM))
    assert cut.returncode == 143, f"K={k}\n{cut.stdout[-2000:]}\n{cut.stderr}"
    n = stopped_line(cut, "train.py", ck / "last.pt")
    assert k <= n < 16 and f" step {n + 1}/" not in cut.stdout, f"K={k}, N={n}"
    assert state(ck / "last.pt")["step"] == n and state(ck / "last.pt")["epoch"] == n // 8
    metrics = json.loads((tmp_path / "cut.json").read_text())
    assert (metrics["status"], metrics["stopped_at_step"], metrics["steps"]) == ("terminated", n, n)
    assert not list(ck.glob(".*.tmp"))

    resumed = finish([*argv[:-1], tmp_path / "resumed.json", "--resume"])
    assert resumed.returncode == 0, resumed.stderr
    assert f"resumed from {ck / 'last.pt'}: {n // 8} epochs and {n} steps done" in resumed.stdout
    assert_same_weights(state(ck / "last.pt"), state(tmp_path / "full" / "last.pt"))
    resumed, expected = [json.loads((tmp_path / name).read_text())["epochs"] for name in ("resumed.json", "f.json")]
    assert [e["epoch"] for e in resumed] == [e["epoch"] for e in expected] == [1, 2], f"N={n}"
    assert [(e["step"], e["val_loss"], e["val_acc"]) for e in resumed] == [
        (e["step"], e["val_loss"], e["val_acc"]) for e in expected
    ], f"N={n}"


def test_sigterm_to_torchrun_stops_both_ranks_at_one_step_and_the_resume_ends_with_the_uninterrupted_weights(
    tmp_path,
):
    """train_DDP_elastic.py on 2 gloo ranks under torchrun: SIGTERM to rank 1 alone, after rank 0's progress line of
    a random step K of 16 (--subset 1024: 512 images a rank, 8 steps of 64 an epoch). Rank 0 never gets the
    signal: both stop at one step because they agree on it (an all-reduce of the flag at every step boundary);
    without that, rank 1 would leave and rank 0 wait in its next collective. Rank 0 saves that step and prints the
    one line; both exit 143, which torchrun (no restarts) reports as a failure, exit 1. `torchrun ... --resume` ends
    with the uninterrupted run's weights, bit for bit, as after a crash (test_equivalence.py), and with its epoch
    records (both epochs: epoch 1's from last.pt when N >= 8). SIGTERM to torchrun itself, which passes it on to every
    worker: the bench's test (test_bench.py) and train.py's above."""
    def ranks(*flags):  # the tests' torchrun (conftest.py): its workers, forked, pass a signal on to the script
        command, env = torchrun_command("--standalone", "--nproc-per-node", 2, *flags, env=UNBUFFERED)
        return {"argv": command, "env": env}

    flags = ["src/train_DDP_elastic.py", *FLAGS, "--batch-size", "64", "--workers", "0"]
    full = finish(**ranks(*flags, "--checkpoint-dir", tmp_path / "full", "--metrics-out", tmp_path / "f.json"))
    assert full.returncode == 0, full.stderr
    k = random.randint(1, 10)
    ck = tmp_path / "cut"
    cut = terminate_after(
        step=k, send=lambda job: os.kill(rank_pid(job.pid, 1), signal.SIGTERM), **ranks(*flags, "--checkpoint-dir", ck)
    )
    assert cut.returncode == 1 and "exitcode  : 143" in cut.stderr, cut.stderr
    n = stopped_line(cut, "train_DDP_elastic.py", ck / "last.pt")
    assert k <= n < 16 and state(ck / "last.pt")["step"] == n, f"K={k}, N={n}\n{cut.stderr}"
    resumed = finish(**ranks(*flags, "--checkpoint-dir", ck, "--resume", "--metrics-out", tmp_path / "resumed.json"))
    assert resumed.returncode == 0, resumed.stderr
    assert_same_weights(state(ck / "last.pt"), state(tmp_path / "full" / "last.pt"))
    records = [json.loads((tmp_path / name).read_text())["epochs"] for name in ("resumed.json", "f.json")]
    fields = ["epoch", "step", "train_loss", "val_loss", "val_acc"]  # its epoch's loss sums are in last.pt too
    assert [[e[f] for f in fields] for e in records[0]] == [[e[f] for f in fields] for e in records[1]], f"N={n}"
    assert [e["epoch"] for e in records[0]] == [1, 2]


# -- a full disk ---------------------------------------------------------------------------------------------------


@contextlib.contextmanager
def full_disk(folder: Path, room: int):
    """`folder` on a filesystem with `room` bytes left after what the caller copies into it: a tmpfs of that size
    plus the copied bytes when this process may mount one; else an ordinary folder, and a `preexec_fn` that limits
    every file the run writes to `room` bytes (RLIMIT_FSIZE). Yields (folder, fill, preexec_fn): `fill(nbytes)` sizes
    the tmpfs for `nbytes` of content (call it before copying); preexec_fn is None on a tmpfs."""
    folder.mkdir(parents=True)
    mounted = []

    def fill(content: int) -> None:
        size = content + room + 64 * 1024  # tmpfs counts whole pages and directory entries: a margin, then filled
        ok = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(folder)], capture_output=True)
        if ok.returncode == 0:
            mounted.append(folder)

    def limit() -> None:
        resource.setrlimit(resource.RLIMIT_FSIZE, (room, room))

    try:
        yield folder, fill, (lambda: None if mounted else limit())
    finally:
        if mounted:
            subprocess.run(["umount", "-l", str(folder)], check=False)


def top_up(folder: Path, leave: int) -> None:
    """Fill the tmpfs `folder` up to `leave` free bytes with a filler file (nothing to do when it is not a tmpfs)."""
    if os.path.ismount(folder):
        free = shutil.disk_usage(folder).free - leave
        if free > 0:
            with open(folder / "filler", "wb") as f:
                with contextlib.suppress(OSError):
                    f.write(b"\0" * free)


def snapshot(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def one_error_line(proc: subprocess.CompletedProcess, script: str, path: Path) -> str:
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in proc.stderr, proc.stderr
    assert lines[0].startswith(f"{script}: error: cannot write {path} ("), lines[0]
    reason = lines[0].split(f"cannot write {path} (", 1)[1].split(")", 1)[0]
    assert reason in ("No space left on device", "File too large"), lines[0]
    return lines[0]


def test_a_checkpoint_that_does_not_fit_leaves_the_previous_one_and_the_run_s_numbers(tmp_path):
    """The issue's case: a checkpoint folder with room for one last.pt, not two. A run saves epoch 1 there; its
    --resume for epoch 2 trains, evaluates, then cannot write the new last.pt: one line naming it and the OS error,
    the previous last.pt byte-identical, no temporary file left; the run's metrics are written (status "checkpoint
    not written", epoch 2's test accuracy in them) and the exit status is 1."""
    quick = ["src/train.py", "--device", "cpu", "--workers", "0", "--subset", "1024", "--log-every", "1000"]
    first = tmp_path / "first"
    stopped_after_first_checkpoint(*quick, "--epochs", "2", "--checkpoint-dir", first)  # last.pt: epoch 1 of 2
    size = (first / "last.pt").stat().st_size
    with full_disk(tmp_path / "disk", room=size // 2) as (disk, fill, preexec):
        fill(size)
        (disk / "ck").mkdir()
        shutil.copy(first / "last.pt", disk / "ck" / "last.pt")
        shutil.copy(first / "last.pt.sha256", disk / "ck" / "last.pt.sha256")
        top_up(disk, leave=size // 2)
        before = (disk / "ck" / "last.pt").read_bytes()
        metrics = tmp_path / "m.json"
        argv = [*quick, "--epochs", "2", "--checkpoint-dir", disk / "ck", "--resume", "--metrics-out", metrics]
        proc = finish(argv, preexec_fn=preexec)
        assert proc.returncode == 1, proc.stderr
        line = one_error_line(proc, "train.py", disk / "ck" / "last.pt")
        assert "the previous checkpoint is left as it was" in line
        assert (disk / "ck" / "last.pt").read_bytes() == before
        assert sorted(p.name for p in (disk / "ck").iterdir()) == ["last.pt", "last.pt.sha256"]
    record = json.loads(metrics.read_text())
    assert record["status"] == "checkpoint not written" and record["epochs"][-1]["epoch"] == 2
    assert record["failed_writes"] == [line.removeprefix("train.py: error: ").split("; ")[0]]


def test_metrics_that_do_not_fit_leave_the_previous_file_and_go_to_stdout(tmp_path):
    """--metrics-out on a full filesystem that already holds an earlier m.json: one line naming it and the OS error,
    exit 1, the earlier file byte-identical and no temporary file beside it; the metrics are on stdout (and in
    ./metrics-PID.json where that can be written)."""
    with full_disk(tmp_path / "disk", room=512) as (disk, fill, preexec):
        fill(4096)
        (disk / "m.json").write_text('{"an": "earlier run"}\n')
        top_up(disk, leave=512)
        argv = [REPO / "src/train.py", "--device", "cpu", "--workers", "0", "--subset", "512", "--epochs", "1",
                "--metrics-out", disk / "m.json"]  # fmt: skip
        proc = finish(argv, preexec_fn=preexec, cwd=tmp_path)  # the fallback file goes to the working directory
        assert proc.returncode == 1
        lines = proc.stderr.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith(
            f"train.py: error: cannot write --metrics-out {disk / 'm.json'} ("
        )
        assert (disk / "m.json").read_text() == '{"an": "earlier run"}\n'
        assert sorted(p.name for p in disk.iterdir() if p.name != "filler") == ["m.json"]
    printed = json.loads(proc.stdout[proc.stdout.index("{\n") :])
    assert printed["status"] == "ok" and printed["steps"] == 4
    written = list(tmp_path.glob("metrics-*.json"))
    assert not written or json.loads(written[0].read_text()) == printed  # on a tmpfs; under a size limit, stdout only


def test_bench_tables_that_do_not_fit_leave_the_previous_ones(tmp_path):
    """`bench.py --tables-only` rewrites a committed result folder's tables, plots and pages from its runs.csv, on a
    filesystem with no room left: one line naming the first file it could not write and the OS error, exit 1, every
    file of the folder byte-identical and no temporary file."""
    source = REPO / "results" / "vit-defaults-2026-11-25"  # a small folder
    content = sum((p.stat().st_size // 4096 + 1) * 4096 for p in source.rglob("*") if p.is_file())  # whole blocks
    with full_disk(tmp_path / "disk", room=0) as (disk, fill, preexec):
        fill(content)
        shutil.copytree(source, disk / "r")
        top_up(disk, leave=0)
        before = snapshot(disk / "r")
        proc = finish([sys.executable, "bench/bench.py", "--tables-only", "--out", disk / "r"], preexec_fn=preexec)
        assert proc.returncode == 1, proc.stderr
        one_error_line(proc, "bench.py", disk / "r" / "summary.csv")
        assert snapshot(disk / "r") == before


SECOND_SIGTERM = """
import os, signal, sys, time
sys.path.insert(0, "src")
import common
preemption = common.Preemption(common.runstate.RunState())
os.kill(os.getpid(), signal.SIGTERM)
time.sleep(0.01)
if sys.argv[1] == "stopped":
    assert preemption.requested(5)  # the run stops at this step boundary, then saves and leaves
time.sleep(1.1)  # later than the first signal passed on
os.kill(os.getpid(), signal.SIGTERM)  # as torchrun sends one to every worker once another exited 143
time.sleep(0.1)
print("still here", flush=True)
preemption.exit()
"""


def test_a_second_sigterm_kills_while_training_and_is_ignored_once_stopped():
    """While the run trains, a second SIGTERM (more than a second after the first) ends the process at once, as
    without the handler. Once the run has stopped at a step boundary, it is ignored: the rank finishes its save, its
    metrics and its closing line (torchrun signals the rest of a job as soon as one worker exits 143)."""
    training = subprocess.run([sys.executable, "-c", SECOND_SIGTERM, "training"], cwd=REPO, capture_output=True,
                              text=True, timeout=60)  # fmt: skip
    assert training.returncode == -signal.SIGTERM and "still here" not in training.stdout
    stopped = subprocess.run([sys.executable, "-c", SECOND_SIGTERM, "stopped"], cwd=REPO, capture_output=True,
                             text=True, timeout=60)  # fmt: skip
    assert stopped.returncode == 143 and "still here" in stopped.stdout, stopped.stderr
    assert "terminated by SIGTERM at step 5" in stopped.stderr
