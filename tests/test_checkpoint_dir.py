"""One run owns its --checkpoint-dir, and no failure loses what it saved: a second run on the folder is refused in one
line naming the first (a killed run's lock is taken over, and said); --resume with nothing to resume from is refused
and deletes nothing; a checkpoint of today's format without its digest is refused like a changed file (only a file of
format 4, which may predate the digests, loads, with a line saying so); a sharded save that a full disk stops is one
line, its half-written folder removed, the last good checkpoint kept and resumable; and FSDP resumes a BatchNorm
model bit for bit after a SIGTERM in mid-epoch. Real scripts on real Fashion-MNIST, torchrun for the sharded ones.
"""

import io
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from conftest import REPO, run, torchrun
from test_equivalence import RESTARTABLE, assert_identical, train, weights
from test_faults import CPU, QUICK, assert_fault, snapshot

import common

# A run still training when the test has done what it needs, and saving nothing before its end: every Fashion-MNIST
# image once in steps of 16 (3,750 steps, 30 s or more on 2 cores)
LONG = [*CPU, "--model", "cnn", "--batch-size", "16", "--epochs", "1", "--warmup-steps", "1", "--log-every", "1000"]


def start(*argv) -> subprocess.Popen:
    """`python argv...` from the repository root, in a session of its own (killed whole at the end)."""
    return subprocess.Popen([sys.executable, *map(str, argv)], cwd=REPO, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True)  # fmt: skip


def wait_for_lock(folder: Path, job: subprocess.Popen, timeout: float = 120) -> str:
    """The text of `folder`'s lock file once `job` has written its name there (it holds the lock then)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        text = (folder / ".lock").read_text() if (folder / ".lock").exists() else ""
        if f"PID {job.pid} " in text:
            return text
        assert job.poll() is None, job.communicate()
        time.sleep(0.05)
    raise AssertionError(f"{job.args} did not take the lock of {folder} in {timeout} s")


def test_a_second_run_on_the_folder_is_refused_naming_the_first_and_a_killed_run_s_lock_is_taken_over(tmp_path):
    """Run A holds the folder (train.py, still training); B, the same command (a shell's history repeated), is refused
    in one line naming A's PID and host, before any work, and A's files are as they were; so is a torchrun FSDP run on
    it (rank 0 takes the lock, the other ranks stand behind it). A is then killed (SIGKILL: no cleanup, its name
    stays in the lock file): C on the folder takes the lock over, says so in one line naming A, trains and ends;
    a run that ends cleanly removes the lock file."""
    folder = tmp_path / "ck"
    a = start("src/train.py", *LONG, "--checkpoint-dir", folder)
    try:
        held = wait_for_lock(folder, a)
        before = snapshot(folder)
        b = run("src/train.py", *LONG, "--checkpoint-dir", folder)
        assert_fault(b, 2, f"--checkpoint-dir {folder} is in use by another run (PID {a.pid} on ", "pick another")
        assert snapshot(folder) == before and (folder / ".lock").read_text() == held
        fsdp = torchrun("--standalone", "--nproc-per-node", "2", "src/train_FSDP.py", *CPU, "--model", "cnn",
                        "--checkpoint-dir", folder, timeout=300)  # fmt: skip
        assert fsdp.returncode != 0 and f"is in use by another run (PID {a.pid} on " in fsdp.stderr
        assert "Traceback" not in fsdp.stderr.split("error: --checkpoint-dir")[0]
    finally:
        os.killpg(a.pid, signal.SIGKILL)
        a.communicate(timeout=60)
    assert f"PID {a.pid} " in (folder / ".lock").read_text()  # killed: its name stays, the lock itself is free
    d = run("src/train.py", *QUICK, "--epochs", "1", "--checkpoint-dir", folder)
    assert d.returncode == 0, d.stderr
    assert f"--checkpoint-dir {folder}: took over the lock of a run that is gone (PID {a.pid} on " in d.stdout
    assert not (folder / ".lock").exists() and (folder / "last.pt").is_file()  # a clean end: the lock file gone


def test_resume_with_nothing_to_resume_from_is_refused_and_deletes_nothing(tmp_path):
    """--resume on a folder without last.pt would start over: refused in one line (a new run is what leaving --resume
    out asks for). train_FSDP.py's first save would then have deleted the sharded folders a preempted job left there:
    refused before, and they are as they were. Under torchrun with restarts (--max-restarts 1) one command line
    starts and resumes the job: there an empty folder starts the run, said in one line."""
    (tmp_path / "sharded-step4").mkdir()
    (tmp_path / "sharded-step4" / "__0_0.distcp").write_bytes(b"shards of a job whose last.pt was lost")
    before = snapshot(tmp_path)
    proc = run("src/train.py", *QUICK, "--epochs", "1", "--checkpoint-dir", tmp_path, "--resume")
    assert_fault(proc, 2, f"--resume: {tmp_path} holds no last.pt to resume from; leave --resume out")
    fsdp = torchrun("--standalone", "--nproc-per-node", "2", "src/train_FSDP.py", *CPU, "--model", "cnn",
                    "--checkpoint-dir", tmp_path, "--resume", timeout=300)  # fmt: skip
    assert fsdp.returncode != 0 and "holds no last.pt to resume from" in fsdp.stderr
    assert snapshot(tmp_path) == before  # nothing deleted, nothing left (the lock's file goes with the run)
    elastic = torchrun("--standalone", "--nproc-per-node", "1", "--max-restarts", "1", "src/train_DDP_elastic.py",
                       *QUICK, "--epochs", "1", "--checkpoint-dir", tmp_path / "new", "--resume",
                       env=RESTARTABLE, timeout=300)  # fmt: skip
    assert elastic.returncode == 0, elastic.stderr
    assert f"--resume: no last.pt in {tmp_path / 'new'} yet: torchrun's attempt starts the run" in elastic.stdout


def test_a_checkpoint_without_its_digest_is_refused_unless_its_format_may_predate_the_digests(tmp_path):
    """Deleting last.pt.sha256 must not switch the check off: a file of today's format (5) without it is refused in
    one line, as a changed file is; with 64 bytes flipped as well, the same. A file of format 4 (the same contents,
    written before the digests became required) without one loads, with a line saying its bytes were not checked,
    and the run resumes. A file that names a DCP folder's digests was written after digests existed: refused."""
    folder = tmp_path / "ck"
    first = run("src/train.py", *QUICK, "--epochs", "2", "--max-steps", "4", "--checkpoint-dir", folder)
    assert first.returncode == 0, first.stderr
    last, listing = folder / "last.pt", folder / "last.pt.sha256"
    good = last.read_bytes()
    listing.unlink()
    resume = [*QUICK, "--epochs", "2", "--max-steps", "8", "--checkpoint-dir", folder, "--resume"]
    before = snapshot(folder)
    proc = run("src/train.py", *resume)
    assert_fault(proc, 2, f"--resume: {last} has no last.pt.sha256 beside it", "(format 5) is always saved with one")
    assert snapshot(folder) == before
    middle = len(good) // 2
    last.write_bytes(good[:middle] + bytes(b ^ 0xFF for b in good[middle : middle + 64]) + good[middle + 64 :])
    assert run("src/train.py", *resume).returncode == 2

    state = torch.load(io.BytesIO(good), weights_only=True)
    state["made_by"]["max_steps"] = 8  # (the resume's schedule)
    torch.save({**state, "format": 4}, last)  # today's contents under format 4, and no digest
    proc = run("src/train.py", *resume)
    assert proc.returncode == 0, proc.stderr
    assert f"{last} has no last.pt.sha256 beside it: a checkpoint of format 4" in proc.stdout
    assert "resumed from" in proc.stdout and torch.load(last, weights_only=True)["step"] == 8

    torch.save({**state, "format": 4, "sharded": "sharded-step4", "sharded_sha256": "0" * 64}, last)
    common.checkpoint.digest_path(last).unlink()
    proc = run("src/train.py", *resume)
    assert_fault(proc, 2, "has no last.pt.sha256 beside it", "(it names its shards' digests)")


# The small CNN under FSDP (2 gloo ranks): its 4 BatchNorm layers hold 16 buffers that FSDP neither shards nor
# broadcasts; 256 Fashion-MNIST images, 32 a rank a step: 4 steps an epoch, 2 epochs
CNN_SHARDED = [*CPU, "--model", "cnn", "--subset", "256", "--batch-size", "32", "--epochs", "2", "--test-subset",
               "200", "--warmup-steps", "0", "--log-every", "1000", "--deterministic"]  # fmt: skip


@pytest.mark.parametrize("script", ["src/train_FSDP.py", "src/train_async_checkpoint.py"])
def test_fsdp_resumes_a_batchnorm_model_bit_for_bit_after_a_sigterm_in_mid_epoch(script, tmp_path):
    """SIGTERM to rank 0 after step 6 (2 steps into epoch 2), every rank saves its shards there, torchrun restarts
    both, --resume: every weight and every BatchNorm statistic in last.pt and each epoch's test loss equal the
    uninterrupted run's, bit for bit. BatchNorm's running statistics follow each rank's own batches, and DCP saves one
    copy of an unsharded tensor, from whichever rank its planner picks: saved as they stood in mid-epoch, 4 of the 16
    came back as rank 1's, and the resumed run ended at another test loss (1.9908 against 1.9796: the issue's run).
    The save makes every rank hold rank 0's (which the evaluation reads) first."""
    whole = train(tmp_path / "whole", script, *CNN_SHARDED, nproc=2)
    probe = ("tests/crash_probe.py", "0:sigterm-at-step:6:0", "--")
    cut = train(tmp_path / "cut", script, *CNN_SHARDED, "--resume", nproc=2, restarts=1, probe=probe, env=RESTARTABLE)
    assert "terminated by SIGTERM at step 6" in cut["stderr"] + cut["stdout"] and "resumed from" in cut["stdout"]
    assert any("running_mean" in key for key in weights(whole))  # the buffers are compared too
    assert_identical(weights(cut), weights(whole))
    assert [e["val_loss"] for e in cut["metrics"]["epochs"]] == [e["val_loss"] for e in whole["metrics"]["epochs"]]


@pytest.fixture
def small_disk(tmp_path):
    """A tmpfs of 20 MiB mounted at tmp_path/disk (root only: skipped where mount is not permitted), unmounted after."""
    disk = tmp_path / "disk"
    disk.mkdir()
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=20m", "tmpfs", str(disk)], capture_output=True)
    if mounted.returncode != 0:
        pytest.skip(f"a small filesystem needs mount (root): {mounted.stderr.decode().strip()}")
    yield disk
    subprocess.run(["umount", "-l", str(disk)], check=False)


@pytest.mark.parametrize("script", ["src/train_FSDP.py", "src/train_async_checkpoint.py"])
def test_a_full_disk_in_a_sharded_save_is_one_line_and_the_last_good_checkpoint_resumes(script, small_disk, tmp_path):
    """A filesystem of 20 MiB holds epoch 1's save (the small ViT's shards of weights and AdamW's moments, 10.8 MB,
    and last.pt, 3.3 MB) and not epoch 2's shards next to it: DCP's write fails on the full disk (torch's zip writer
    says "unexpected pos", the line says the disk is full). One line on stderr (rank 0's) names the folder, the
    error and the checkpoint kept; exit 1; no traceback; the half-written sharded-step8/ is gone; last.pt and its
    shards still hold epoch 1, whole; and a --resume from them (on a disk with room) finishes the run."""
    vit = [*CPU, "--model", "vit", "--dataset", "synthetic", "--image-size", "32", "--subset", "128",
           "--batch-size", "32", "--epochs", "2", "--warmup-steps", "0", "--log-every", "1000"]  # fmt: skip
    folder = small_disk / "ck"
    proc = torchrun("--standalone", "--nproc-per-node", "2", script, *vit, "--checkpoint-dir", folder, timeout=300)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    errors = [line for line in proc.stderr.splitlines() if ": error: " in line]
    assert len(errors) == 1 and "Traceback" not in proc.stderr.split(errors[0])[0], proc.stderr
    assert f"cannot write {folder / 'sharded-step8'} (No space left on device" in errors[0], errors[0]
    assert f"{folder / 'last.pt'} (step 4) is kept: --resume continues from it" in errors[0], errors[0]
    assert sorted(p.name for p in folder.glob("sharded-step*")) == ["sharded-step4"]
    assert torch.load(folder / "last.pt", weights_only=True)["step"] == 4
    room = tmp_path / "room"
    room.mkdir()
    for path in folder.rglob("*"):  # the kept checkpoint, copied to a disk with room
        if path.is_file():
            (room / path.relative_to(folder)).parent.mkdir(parents=True, exist_ok=True)
            (room / path.relative_to(folder)).write_bytes(path.read_bytes())
    resumed = torchrun("--standalone", "--nproc-per-node", "2", script, *vit, "--checkpoint-dir", room, "--resume",
                       timeout=300)  # fmt: skip
    assert resumed.returncode == 0 and "1 epochs and 4 steps done" in resumed.stdout, resumed.stderr
