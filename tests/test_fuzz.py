"""Any bytes, one clear line: every reader of a file or a value that a user or a crash can hand the project, fuzzed
with Hypothesis (docs/errors.md, "Any bytes").

For each reader, whatever the bytes or the value: either a clean success, or one line on stderr and a non-zero exit
(SystemExit: `die`'s exit 2, argparse's usage error), never another exception (a traceback), never a resume from bytes
nobody saved, and the file that was read left as it was. The readers run in this process (a subprocess costs seconds
of torch import); a few end-to-end runs check the same through the scripts.

  checkpoints   last.pt (random bytes, truncated at any length, bits flipped anywhere, with and without the digest
                list beside it; the list itself damaged) and a DCP folder's files (common.checkpoint)
  data          Fashion-MNIST's four IDX files (common.data.load_data), JPEG files and ImageFolder trees
                (common.images), the Shakespeare corpus and its vocabulary (common.text)
  flags         every numeric flag of common/cli.py, any text or number
  bench         bench/profiles.toml (`bench.py --matrix FILE --dry-run`, in this process), results/current.toml
                (results_index.load_topics), the results folder `bench.py --resume` reads (runs.finished_rows), metrics
                JSON (`bench.py --dry-run --costs FOLDER`, `bench.py --peak-table FOLDER`)

Reproducible: derandomized (the same examples every run, no database), and what fuzzing found once kept as explicit
examples. The default run tries dozens of examples per reader (this file: under a minute on 2 cores);
`pytest tests/test_fuzz.py -m fuzz -s` tries FUZZ_FACTOR (20) times as many and prints how many of each kind it tried.
"""

import argparse
import gzip
import io
import json
import math
import os
import random
import shutil
import struct
import sys
import warnings
import zlib
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import REPO, run
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

import common
from common.checkpoint import FOLDER_DIGESTS, digest_path

pytestmark = pytest.mark.fuzz
FUZZ_FACTOR = 20  # `-m fuzz`: examples per reader, times the default run's
TRIED = Counter()  # examples per kind, printed at the end of a long run


@pytest.fixture(scope="module", autouse=True)
def _counts():
    yield
    if TRIED:
        print("\nfuzz examples tried: " + ", ".join(f"{kind} {n}" for kind, n in sorted(TRIED.items())))


def explore(request, strategy, check, examples: int, known=()) -> None:
    """Run `check(value)` on each of `known` (what fuzzing found once: kept as regressions) and on `examples` values
    drawn from `strategy` (FUZZ_FACTOR times as many under `-m fuzz`), derandomized: the same values on every run."""
    long = "fuzz" in (request.config.getoption("markexpr") or "")

    @settings(
        max_examples=examples * (FUZZ_FACTOR if long else 1),
        derandomize=True,
        database=None,
        deadline=None,
        suppress_health_check=list(HealthCheck),
        print_blob=True,
    )
    @given(strategy)
    def each(value):
        check(value)

    for value in known:
        each = example(value)(each)
    each()


def one_line(call, capsys) -> str | None:
    """Call `call()`: None when it returns; when it exits (SystemExit, code not 0), its one error line. Any other
    exception propagates (the test fails with its traceback: what a user would have seen)."""
    capsys.readouterr()
    try:
        call()
    except SystemExit as exit:
        err = capsys.readouterr().err
        if isinstance(exit.code, str):  # raise SystemExit("message"): Python prints it, exit 1
            err, code = err + exit.code + "\n", 1
        else:
            code = exit.code
        assert code not in (0, None), (code, err)
        assert "Traceback" not in err, err
        # argparse prints its usage (a line, maybe wrapped, continuation lines indented) before its error line
        lines = [line for line in err.splitlines() if line.strip() and not line.startswith(("usage:", " "))]
        assert len(lines) == 1 and ": error: " in lines[0], err
        return lines[0]
    capsys.readouterr()
    return None


# -- byte strategies -------------------------------------------------------------------------------------------------


def random_bytes(max_size: int = 1 << 20):
    """Bytes of any kind: Hypothesis's (small, structured), a seeded random buffer of 100 B to `max_size` (as a broken
    copy leaves), and random bytes behind a zip's or a gzip's signature (readers go further in)."""
    seeded = st.builds(
        lambda seed, n: random.Random(seed).randbytes(n), st.integers(0, 2**32), st.integers(100, max_size)
    )
    prefixed = st.builds(
        lambda head, tail: head + tail, st.sampled_from([b"PK\x03\x04", b"\x1f\x8b\x08\x00"]), st.binary()
    )
    return st.one_of(st.binary(max_size=4096), seeded, prefixed)


def truncated(raw: bytes):
    """`raw` cut at any length short of its own."""
    return st.integers(0, len(raw) - 1).map(lambda n: raw[:n])


def flipped(raw: bytes, most: int = 20):
    """`raw` with 1 to `most` of its bits flipped, anywhere."""

    def flip(bits):
        out = bytearray(raw)
        for bit in bits:
            out[bit // 8] ^= 1 << (bit % 8)
        return bytes(out)

    return st.lists(st.integers(0, 8 * len(raw) - 1), min_size=1, max_size=most, unique=True).map(flip)


def damaged(raw: bytes):
    """`raw` damaged one way or another: other bytes, cut short, bits flipped."""
    return st.one_of(random_bytes(4096), truncated(raw), flipped(raw))


# -- checkpoints -----------------------------------------------------------------------------------------------------


def _args(**flags) -> argparse.Namespace:
    base = {"model": "mlp", "dataset": "fashion-mnist", "image_size": None, "seed": 0, "batch_size": 64, "epochs": 1}
    return argparse.Namespace(**{**base, "max_steps": None, "lr": 0.1, "run": common.runstate.RunState(), **flags})


def _parts():
    torch.manual_seed(1)
    model = common.build_model("mlp")
    return model, torch.optim.AdamW(model.parameters(), lr=0.1)


@pytest.fixture(scope="module")
def saved(tmp_path_factory) -> dict:
    """A real checkpoint (the MLP after one AdamW step, 2.4 MB) and the digest list saved beside it, as bytes."""
    folder = tmp_path_factory.mktemp("saved")
    model, optimizer = _parts()
    model(torch.randn(4, 1, 28, 28)).sum().backward()
    optimizer.step()
    assert common.save_checkpoint(folder / "last.pt", _args(), model, optimizer, 1, 10, [])
    return {"last.pt": (folder / "last.pt").read_bytes(), "sha256": digest_path(folder / "last.pt").read_bytes()}


def resume_from(folder: Path, capsys, kind: str) -> str | None:
    """load_checkpoint on folder/last.pt into a fresh MLP and AdamW, as --resume does: None when it resumed, else the
    one line it exited with. Whatever happens, last.pt and its list are left as they were and a refused file loaded
    nothing into the model."""
    TRIED[kind] += 1
    model, optimizer = _parts()
    before = {key: value.clone() for key, value in model.state_dict().items()}
    files = {path.name: path.read_bytes() for path in folder.iterdir()}
    with warnings.catch_warnings(record=True) as warned:  # a warning would be lines beside the one line
        warnings.simplefilter("always")
        line = one_line(lambda: common.load_checkpoint(folder / "last.pt", _args(), model, optimizer), capsys)
    assert not warned, [str(w.message) for w in warned]
    assert {path.name: path.read_bytes() for path in folder.iterdir()} == files  # nothing overwritten
    if line is not None:
        assert "error: --resume: " in line, line
        if "does not fit this model" not in line:  # (load_state_dict copies what fits, then raises: the exit drops it)
            assert all(torch.equal(before[key], value) for key, value in model.state_dict().items())  # nothing loaded
    return line


def _checkpoint_folder(tmp_path: Path, raw: bytes, listing: bytes | None) -> Path:
    folder = tmp_path / "ck"
    folder.mkdir(exist_ok=True)
    (folder / "last.pt").write_bytes(raw)
    digest_path(folder / "last.pt").unlink(missing_ok=True)
    if listing is not None:
        digest_path(folder / "last.pt").write_bytes(listing)
    return folder


@pytest.mark.parametrize("make", ["random bytes", "truncated", "bits flipped"])
def test_a_damaged_checkpoint_with_its_digest_is_never_resumed(make, saved, tmp_path, capsys, request):
    """last.pt damaged after it was written, its digest list beside it: refused in one line naming the file and what
    to do, every time (torch's zip reader checks no CRC: without the digest most flipped bits load)."""
    raw = saved["last.pt"]
    strategy = {"random bytes": random_bytes(), "truncated": truncated(raw), "bits flipped": flipped(raw)}[make]

    def check(data):
        folder = _checkpoint_folder(tmp_path, data, saved["sha256"])
        line = resume_from(folder, capsys, f"checkpoint {make}")
        assert line is not None, "resumed from a damaged checkpoint"
        assert f"{folder / 'last.pt'} changed after it was written" in line, line
        assert "use a new --checkpoint-dir or the file's original copy" in line

    explore(request, strategy, check, examples=60)


@pytest.mark.parametrize("make", ["random bytes", "truncated", "bits flipped"])
def test_a_damaged_checkpoint_from_before_the_digests_is_one_line_or_a_resume(make, saved, tmp_path, capsys, request):
    """The same without the digest list (deleted, or never copied): a file of today's format is refused, as a changed
    one is (only format 4, which may predate the digests, loads unchecked: tests/test_checkpoint_dir.py), and nothing
    ends in a traceback (torch.load raises IndexError, KeyError, ... on some random bytes: one line "is not a readable
    checkpoint"); random bytes and a cut file never load."""
    raw = saved["last.pt"]
    strategy = {"random bytes": random_bytes(), "truncated": truncated(raw), "bits flipped": flipped(raw)}[make]

    def check(data):
        line = resume_from(_checkpoint_folder(tmp_path, data, None), capsys, f"checkpoint without digest {make}")
        if make != "bits flipped":
            assert line is not None, "resumed from random bytes or a cut file"

    # found by fuzzing: buffers on which torch.load(weights_only=True) raises IndexError, KeyError
    known = [random.Random(2).randbytes(1953), random.Random(20).randbytes(5054)] if make == "random bytes" else []
    explore(request, strategy, check, examples=60, known=known)


def test_a_damaged_digest_list_refuses_or_vouches_for_the_right_file(saved, tmp_path, capsys, request):
    """last.pt.sha256 damaged, last.pt whole: one line naming the list (or, where a flipped bit left another valid
    list that still holds last.pt's digest, the whole file resumes); never a traceback."""

    def check(listing):
        line = resume_from(_checkpoint_folder(tmp_path, saved["last.pt"], listing), capsys, "digest list damaged")
        assert line is None or "last.pt" in line

    explore(request, damaged(saved["sha256"]), check, examples=60)


def test_a_save_interrupted_at_any_write_resumes_the_previous_or_the_new_checkpoint(saved, tmp_path, capsys):
    """A kill at any moment of a save: each rename (os.replace) the save makes is, in turn, the one the process dies
    at (before it). The folder then resumes from the previous checkpoint or from the new one, whole, never neither;
    no good file is refused. The same for a DCP save (a folder's digests.sha256 written before last.pt names it)."""

    class Killed(BaseException):
        pass

    real_replace = os.replace
    for sharded in (False, True):
        for at in range(10):
            folder = tmp_path / f"{sharded}-{at}"
            folder.mkdir()
            (folder / "last.pt").write_bytes(saved["last.pt"])  # the previous checkpoint, step 10
            digest_path(folder / "last.pt").write_bytes(saved["sha256"])
            if sharded:
                (folder / "sharded-step11").mkdir()
                (folder / "sharded-step11" / "__0_0.distcp").write_bytes(b"shard bytes")
            calls = []

            def replace(src, dst, calls=calls, at=at):
                calls.append(dst)
                if len(calls) > at:
                    raise Killed
                real_replace(src, dst)

            model, optimizer = _parts()
            os.replace = replace
            try:
                extra = {"sharded": "sharded-step11"} if sharded else {}
                common.save_checkpoint(folder / "last.pt", _args(), model, optimizer, 1, 11, **extra)
                finished = True
            except Killed:
                finished = False
            finally:
                os.replace = real_replace
            state = common.load_checkpoint(folder / "last.pt", _args(), *_parts())
            assert state["step"] in (10, 11)
            if len(calls) <= at:  # a save with fewer renames than `at` finished
                assert finished and state["step"] == 11
        assert finished and len(calls) < 10  # every rename of the save was a point of death in turn


@pytest.fixture(scope="module")
def sharded(tmp_path_factory) -> Path:
    """A folder as train_FSDP.py leaves it: last.pt naming sharded-step8/, whose files (DCP's .metadata and two
    ranks' shards, made up here) are listed in its digests.sha256."""
    folder = tmp_path_factory.mktemp("sharded")
    shards = folder / "sharded-step8"
    shards.mkdir()
    for name, size in ((".metadata", 900), ("__0_0.distcp", 5000), ("__1_0.distcp", 4000)):
        (shards / name).write_bytes(random.Random(name).randbytes(size))
    model, _ = _parts()
    assert common.distributed.write_full_state(folder / "last.pt", _args(), {"model": model.state_dict()}, 1, 8,
                                               sharded="sharded-step8")  # fmt: skip
    assert (shards / FOLDER_DIGESTS).is_file()
    assert common.load_checkpoint(folder / "last.pt", _args(), None)["sharded"] == "sharded-step8"
    return folder


def test_a_damaged_dcp_folder_is_never_resumed(sharded, tmp_path, capsys, request):
    """A file of the DCP folder last.pt names (a rank's shards, DCP's .metadata, the digest list) damaged, cut,
    replaced or removed: refused in one line naming that file, before dcp.load could read any of it."""
    names = sorted(p.name for p in (sharded / "sharded-step8").iterdir())

    def damage(name):
        raw = (sharded / "sharded-step8" / name).read_bytes()
        return st.one_of(damaged(raw), st.just(None))  # None: the file removed

    strategy = st.sampled_from(names).flatmap(lambda name: st.tuples(st.just(name), damage(name)))

    def check(case):
        name, data = case
        TRIED["DCP folder damaged"] += 1
        folder = tmp_path / "run"
        shutil.rmtree(folder, ignore_errors=True)
        shutil.copytree(sharded, folder)
        target = folder / "sharded-step8" / name
        if data is None:
            target.unlink()
        else:
            target.write_bytes(data)
        line = one_line(lambda: common.load_checkpoint(folder / "last.pt", _args(), None), capsys)
        assert line is not None, f"resumed with {name} damaged"
        assert str(folder / "sharded-step8" / (FOLDER_DIGESTS if name == FOLDER_DIGESTS else name)) in line, line

    explore(request, strategy, check, examples=60)


def test_a_changed_checkpoint_is_refused_by_the_script_in_one_line(tmp_path):
    """End to end: train.py saves last.pt (and its digest list); one bit of it flipped, `--resume` exits 2 with one
    line naming the file, trains nothing and leaves the folder as it was; the file restored, it resumes."""
    flags = ["--device", "cpu", "--workers", "0", "--model", "mlp", "--subset", "256", "--batch-size", "128",
             "--epochs", "1", "--warmup-steps", "1", "--log-every", "100", "--checkpoint-dir", tmp_path]  # fmt: skip
    first = run("src/train.py", *flags, timeout=300)
    assert first.returncode == 0, first.stderr
    good = (tmp_path / "last.pt").read_bytes()
    (tmp_path / "last.pt").write_bytes(bytes([good[0] ^ 1]) + good[1:])
    before = {p.name: p.read_bytes() for p in tmp_path.iterdir()}
    refused = run("src/train.py", *flags, "--resume", timeout=300)
    lines = refused.stderr.strip().splitlines()
    assert refused.returncode == 2 and len(lines) == 1 and "Traceback" not in refused.stderr, refused.stderr
    assert lines[0].startswith(f"train.py: error: --resume: {tmp_path / 'last.pt'} changed after it was written")
    assert "resumed from" not in refused.stdout and "training" not in refused.stdout
    assert {p.name: p.read_bytes() for p in tmp_path.iterdir()} == before
    (tmp_path / "last.pt").write_bytes(good)
    again = run("src/train.py", *flags, "--resume", timeout=300)
    assert again.returncode == 0 and "holds a finished run" in again.stdout, again.stderr


# -- Fashion-MNIST's IDX files -----------------------------------------------------------------------------------


def _idx(array: np.ndarray) -> bytes:
    header = b"\x00\x00\x08" + bytes([array.ndim]) + b"".join(struct.pack(">I", n) for n in array.shape)
    return header + array.astype(np.uint8).tobytes()


@pytest.fixture(scope="module")
def idx_files(tmp_path_factory) -> dict[str, bytes]:
    """Four small, valid Fashion-MNIST files (64 training images, 16 test), gzipped, by name."""
    rng = np.random.default_rng(0)
    arrays = {
        "train_images": rng.integers(0, 256, (64, 28, 28)), "train_labels": rng.integers(0, 10, 64),
        "test_images": rng.integers(0, 256, (16, 28, 28)), "test_labels": rng.integers(0, 10, 16),
    }  # fmt: skip
    return {common.data.FASHION_MNIST_FILES[key]: gzip.compress(_idx(a), mtime=0) for key, a in arrays.items()}


def idx_damage(raw_gz: bytes):
    """A Fashion-MNIST .gz damaged: its gzip bytes (cut, flipped: the deflate stream or the CRC), or a valid gzip
    of damaged IDX bytes (a header of other sizes, a cut or flipped payload), or other bytes altogether."""
    idx = gzip.decompress(raw_gz)
    header = st.builds(
        lambda ndim, dims, tail: b"\x00\x00\x08" + bytes([ndim]) + b"".join(struct.pack(">I", d) for d in dims) + tail,
        st.integers(0, 255), st.lists(st.integers(0, 2**32 - 1), max_size=5), st.binary(max_size=64),
    )  # fmt: skip
    inner = st.one_of(truncated(idx), flipped(idx), header).map(lambda b: gzip.compress(b, mtime=0))
    return st.one_of(damaged(raw_gz), inner)


def test_fashion_mnist_files_of_any_bytes(idx_files, tmp_path, capsys, request):
    """One of the four Fashion-MNIST files damaged any way: load_data exits with one line naming it (or, where the
    damage left a valid file, loads it)."""
    strategy = st.sampled_from(sorted(idx_files)).flatmap(
        lambda name: st.tuples(st.just(name), idx_damage(idx_files[name]))
    )
    args = argparse.Namespace(dataset="fashion-mnist", data_dir=tmp_path, subset=None, test_subset=None, batch_size=16)

    test_images = common.data.FASHION_MNIST_FILES["test_images"]
    flip = bytearray(idx_files[test_images])
    flip[10] ^= 1  # a bit of the deflate stream: zlib.error, which is no OSError (found by fuzzing)

    def check(case):
        name, data = case
        TRIED["IDX file damaged"] += 1
        for other, raw in idx_files.items():
            (tmp_path / other).write_bytes(data if other == name else raw)
        line = one_line(lambda: common.data.load_data(args), capsys)
        assert line is None or name in line, line
        assert (tmp_path / name).read_bytes() == data

    explore(request, strategy, check, examples=100, known=[(test_images, bytes(flip))])


# -- JPEG files and ImageFolder trees ----------------------------------------------------------------------------


@pytest.fixture(scope="module")
def jpeg() -> bytes:
    """A real JPEG of the prepared Fashion-MNIST export when there is one, else one made here (64 x 48, RGB)."""
    found = next((REPO / "data" / "fashion-mnist-jpeg" / "train" / "0_T-shirt").glob("*.jpg"), None)
    if found is not None:
        return found.read_bytes()
    from PIL import Image

    buffer = io.BytesIO()
    Image.fromarray(np.random.default_rng(0).integers(0, 256, (48, 64, 3), dtype=np.uint8)).save(buffer, "JPEG")
    return buffer.getvalue()


def _sized(jpeg: bytes, png: bytes):
    """The two images with any width and height in their headers: the JPEG's start-of-frame (16-bit sizes), the PNG's
    IHDR (32-bit sizes, its CRC made again so that the decoder reads on): sizes a decoder must refuse, not allocate."""

    def jpeg_sized(height, width):
        at = jpeg.index(b"\xff\xc0") + 5  # SOF0: length (2), precision (1), then height and width
        return jpeg[:at] + struct.pack(">HH", height, width) + jpeg[at + 4 :]

    def png_sized(width, height):
        ihdr = b"IHDR" + struct.pack(">II", width, height) + png[24:29]
        return png[:12] + ihdr + struct.pack(">I", zlib.crc32(ihdr)) + png[33:]

    return st.one_of(
        st.builds(jpeg_sized, st.integers(0, 2**16 - 1), st.integers(0, 2**16 - 1)),
        st.builds(png_sized, st.integers(0, 2**32 - 1), st.integers(0, 2**32 - 1)),
    )


def test_an_image_file_of_any_bytes(jpeg, tmp_path, request):
    """load_rgb (the loaders' ImageFolder loader) on a damaged JPEG or PNG, or one whose header gives any size: an
    RGB image, or BadImage naming the file (the scripts' one line, exit 2), never another exception (a decoder's
    IndexError; PIL's DecompressionBombError for a size of billions of pixels, which is not an OSError)."""
    from PIL import Image

    png = io.BytesIO()
    Image.open(io.BytesIO(jpeg)).save(png, "PNG")
    strategy = st.one_of(damaged(jpeg), damaged(png.getvalue()), _sized(jpeg, png.getvalue()))
    path = tmp_path / "image.jpg"
    at = jpeg.index(b"\xff\xc0") + 5
    bomb = jpeg[:at] + struct.pack(">HH", 60000, 60000) + jpeg[at + 4 :]  # 3.6 billion pixels: found by fuzzing

    def check(data):
        TRIED["image file damaged"] += 1
        path.write_bytes(data)
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("error")  # a warning would be lines on stderr beside the one line
                image = common.images.load_rgb(str(path))
        except common.images.BadImage as error:
            assert str(path) in str(error) and "\n" not in str(error)
        else:
            assert image.mode == "RGB"

    explore(request, strategy, check, examples=150, known=[bomb])


def _tree(root: Path, spec: dict) -> None:
    for name, value in spec.items():
        if isinstance(value, dict):
            (root / name).mkdir(exist_ok=True)
            _tree(root / name, value)
        else:
            (root / name).write_bytes(value)


NAMES = st.one_of(st.sampled_from(["train", "val", "a", "b", "x.jpg", "y.png", "z.txt", ".hidden.jpg"]),
                  st.text(st.characters(codec="utf-8", exclude_characters="/\x00"), min_size=1, max_size=12)
                  .filter(lambda n: n not in (".", "..")))  # fmt: skip
TREES = st.recursive(
    st.binary(max_size=8), lambda children: st.dictionaries(NAMES, children, max_size=4), max_leaves=12
).filter(lambda tree: isinstance(tree, dict))


def test_an_image_folder_of_any_shape(tmp_path, capsys, request):
    """image_folders on any tree of folders and files (names of any characters, train/ or val/ files, classes
    that differ, too few images): the three paths, or one line and exit 2."""
    count = [0]

    def check(spec):
        TRIED["ImageFolder tree"] += 1
        count[0] += 1
        root = tmp_path / str(count[0])
        root.mkdir()
        _tree(root, spec)
        line = one_line(lambda: common.images.image_folders(root, 2), capsys)
        assert line is None or str(root) in line, line

    explore(request, TREES, check, examples=80)


# -- the Shakespeare corpus and its vocabulary -------------------------------------------------------------------


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> Path:
    """A copy of data/shakespeare/ (skipped where the set-up has not put it there)."""
    if not (common.text.CORPUS_DIR / "vocab.txt").is_file():
        pytest.skip("no Shakespeare corpus: python bench/prepare/prepare_text.py")
    folder = tmp_path_factory.mktemp("corpus") / "shakespeare"
    shutil.copytree(common.text.CORPUS_DIR, folder)
    return folder


def test_the_corpus_and_its_vocabulary_of_any_bytes(corpus, tmp_path, request):
    """vocab.txt or one of the 42 texts damaged (other bytes, cut, bits flipped, the vocabulary's characters in
    another order): text.shakespeare raises BadCorpus naming what is wrong (load_data's one line), never another
    exception (a vocabulary of other bytes is not UTF-8; one of other characters would map the text to wrong tokens)."""
    vocab = (corpus / "vocab.txt").read_bytes()
    work = corpus / "texts" / "hamlet_gut.txt"
    text = work.read_bytes()
    shuffled = st.permutations(list(vocab.decode())).map(lambda chars: "".join(chars).encode())
    strategy = st.one_of(
        st.tuples(st.just("vocab.txt"), st.one_of(damaged(vocab), shuffled)),
        st.tuples(st.just("texts/hamlet_gut.txt"), st.one_of(random_bytes(4096), truncated(text), flipped(text, 3))),
    )

    def check(case):
        name, data = case
        TRIED["corpus file damaged"] += 1
        (corpus / name).write_bytes(data)
        try:
            common.text.shakespeare(64, corpus)
        except common.text.BadCorpus as error:
            assert "\n" not in str(error)
        else:
            assert data == (vocab if name == "vocab.txt" else text)  # only the file itself loads
        finally:
            (corpus / "vocab.txt").write_bytes(vocab)
            work.write_bytes(text)

    swapped = vocab[:1] + vocab[2:3] + vocab[1:2] + vocab[3:]  # two characters swapped: every token after them moves
    explore(request, strategy, check, examples=40, known=[("vocab.txt", b"\x80"), ("vocab.txt", swapped)])


# -- numeric flags -----------------------------------------------------------------------------------------------

NUMERIC_FLAGS = [
    "--epochs", "--max-steps", "--batch-size", "--lr", "--workers", "--seed", "--warmup-steps", "--target-acc",
    "--target-loss", "--eval-every", "--target-sample", "--log-every", "--seq-len", "--image-size", "--subset",
    "--test-subset", "--sample-chars", "--clip-grad-norm",
]  # fmt: skip
VALUES = st.one_of(
    st.integers(-(2**70), 2**70).map(str),
    st.floats(allow_nan=True, allow_infinity=True).map(repr),
    st.sampled_from(["nan", "inf", "-inf", "1e309", "0x10", "1_000", " 3", "3 ", "٣", "", "-0", "1e-400"]),
    st.text(st.characters(codec="utf-8", exclude_characters="\x00"), max_size=12),
)


def test_a_numeric_flag_of_any_value(tmp_path, capsys, request, monkeypatch):
    """Every numeric flag given any text or number (`--flag=VALUE`): parse_args returns values a run can use (the
    seed seeds Python, NumPy and torch; the numbers are finite), or argparse's usage error (one error line, exit
    2)."""
    monkeypatch.setattr(sys, "excepthook", sys.excepthook)  # parse_args installs the one-line hook: put it back after
    state = (random.getstate(), np.random.get_state(), torch.get_rng_state())

    def check(case):
        flag, value = case
        TRIED["numeric flag"] += 1
        monkeypatch.setattr(sys, "argv", ["train.py", "--model", "gpt" if flag == "--target-loss" else "mlp",
                                          f"{flag}={value}"])  # fmt: skip
        parsed = []
        line = one_line(lambda: parsed.append(common.parse_args(common.get_parser())), capsys)
        if line is not None:
            assert flag in line or "--target-loss" in line, line
            return
        args = parsed[0]
        dest = flag[2:].replace("-", "_")
        assert getattr(args, dest) is None or math.isfinite(getattr(args, dest))
        common.seeding.seed_everything(args.seed)  # whatever seed parses, seeds every generator

    try:
        found = [("--seed", "-1"), ("--seed", str(2**32)), ("--lr", "inf"), ("--target-loss", "nan"),
                 ("--epochs", "\r0")]  # by fuzzing (the last: a line break in the error line)  # fmt: skip
        explore(request, st.tuples(st.sampled_from(NUMERIC_FLAGS), VALUES), check, examples=300, known=found)
    finally:
        random.setstate(state[0]), np.random.set_state(state[1]), torch.set_rng_state(state[2])


# -- the bench's inputs ------------------------------------------------------------------------------------------
# What fuzzing found in bench/ (a run name that is a list, bytes that are not UTF-8, a runs.csv row without a repeat
# or a log, a metrics file that is not an object or has numbers as text) is fixed where each file is read:
# bench/profiles.py, results_index.py, runs.py, estimate.py and tables.py.


def toml_value(value) -> str:
    """`value` (str, int, float, bool, list, dict) as a TOML value (inline tables for dicts)."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        return "nan" if math.isnan(value) else ("inf" if value > 0 else "-inf") if math.isinf(value) else repr(value)
    if isinstance(value, str):
        return json.dumps(value, ensure_ascii=False).replace("\x7f", "\\u007f")
    if isinstance(value, list):
        return "[" + ", ".join(map(toml_value, value)) + "]"
    return "{" + ", ".join(f"{json.dumps(k, ensure_ascii=False)} = {toml_value(v)}" for k, v in value.items()) + "}"


SCALARS = st.one_of(
    st.text(st.characters(codec="utf-8", exclude_characters="\x7f"), max_size=10), st.integers(-5, 2**63 - 1),
    st.floats(), st.booleans(), st.sampled_from(["src/train.py", "torchrun", "python", "gpus", "cuda", "bf16", "a"]),
)  # fmt: skip
TOML_VALUES = st.recursive(
    SCALARS,
    lambda inner: st.one_of(st.lists(inner, max_size=3), st.dictionaries(st.text(max_size=5), inner, max_size=3)),
    max_leaves=6,
)


def _profile_toml():
    from profiles import PROFILE_KEYS, RUN_KEYS

    run = st.dictionaries(st.sampled_from(sorted(RUN_KEYS)), TOML_VALUES, max_size=6).map(
        lambda r: {"name": "a", "script": "src/train.py", **r}
    )
    table = st.fixed_dictionaries(
        {"runs": st.lists(run, min_size=1, max_size=3)},
        optional={key: TOML_VALUES for key in sorted(PROFILE_KEYS - {"runs"})},
    )

    def lines(table: dict) -> str:
        return "".join(f"{key} = {toml_value(value)}\n" for key, value in table.items())

    def document(profiles: dict) -> bytes:
        return "".join(
            f"[{name}]\n" + lines({k: v for k, v in t.items() if k != "runs"})
            + "".join(f"[[{name}.runs]]\n" + lines(run) for run in t["runs"])
            for name, t in profiles.items()
        ).encode()  # fmt: skip

    return st.dictionaries(st.sampled_from(["smoke", "cpu", "x"]), table, min_size=1, max_size=2).map(document)


def test_a_bench_matrix_of_any_bytes(tmp_path, capsys, request, monkeypatch):
    """`bench.py --matrix FILE --profile smoke --dry-run` (in this process: bench.main) on any bytes, and on TOML
    documents of profiles whose keys are the known ones with values of any type: the plan, or one line and exit 2."""
    import bench

    matrix, costs = tmp_path / "matrix.toml", tmp_path / "costs"
    costs.mkdir()
    (costs / "runs.csv").write_text("config,status,command,steps,train_s,first_step_s,wall_s\n")
    argv = ["bench.py", "--matrix", str(matrix), "--profile", "smoke", "--dry-run", "--costs", str(costs)]
    monkeypatch.setattr(sys, "argv", argv)
    good = (REPO / "bench" / "profiles.toml").read_bytes()

    def check(data):
        TRIED["bench matrix"] += 1
        matrix.write_bytes(data)
        one_line(bench.main, capsys)

    known = [b'[smoke]\n[[smoke.runs]]\nname = []\nscript = "src/train.py"\n']  # a name that is a list
    explore(request, st.one_of(random_bytes(4096), flipped(good, 4), _profile_toml()), check, examples=60, known=known)


def test_results_current_toml_of_any_bytes(tmp_path, capsys, request, monkeypatch):
    """results_index's load_topics on results/current.toml of any bytes or any TOML: the topics, each a table with
    name, folder and what, or one line."""
    import results_index

    monkeypatch.setattr(results_index, "RESULTS", tmp_path)
    good = (REPO / "results" / "current.toml").read_bytes()
    topic = st.dictionaries(st.sampled_from(["name", "folder", "what", "x"]), TOML_VALUES, max_size=4)
    documents = st.one_of(
        st.lists(topic, max_size=3).map(lambda ts: "".join("[[topic]]\n" + "".join(f"{k} = {toml_value(v)}\n"
                                                                                   for k, v in t.items()) for t in ts)),
        TOML_VALUES.map(lambda v: f"topic = {toml_value(v)}\n"),
    ).map(str.encode)  # fmt: skip

    def check(data):
        TRIED["results/current.toml"] += 1
        (tmp_path / "current.toml").write_bytes(data)
        topics = []
        if one_line(lambda: topics.append(results_index.load_topics()), capsys) is None:
            assert all(isinstance(t, dict) and {"name", "folder", "what"} <= set(t) for t in topics[0])

    known = [b"\x80", b'topic = ["name folder what"]\n']  # not UTF-8; a topic that is a string
    explore(request, st.one_of(random_bytes(4096), flipped(good, 4), documents), check, examples=40, known=known)


CSV_CELLS = st.one_of(
    st.text(st.characters(codec="utf-8", exclude_characters="\x00"), max_size=8),
    st.integers(-3, 3).map(str),
    st.sampled_from(["ok", "failed", "nan", "", "1.5", "r0.log"]),
)


def test_a_results_folder_read_by_bench_resume(tmp_path, capsys, request):
    """`bench.py --resume`'s finished_rows on OUT/runs.csv of any bytes, or of rows whose cells are any text (config,
    repeat, status, log): the rows it may keep, or one line."""
    import pandas as pd
    from runs import finished_rows

    (tmp_path / "metrics").mkdir()
    (tmp_path / "metrics" / "r0.json").write_text("{}")
    columns = st.lists(st.sampled_from(["config", "repeat", "status", "log", "images_per_s"]), min_size=1, max_size=5,
                       unique=True)  # fmt: skip
    tables = columns.flatmap(
        lambda cols: st.lists(st.lists(CSV_CELLS, min_size=len(cols), max_size=len(cols)), max_size=4).map(
            lambda rows: pd.DataFrame(rows, columns=cols).to_csv(index=False).encode()
        )
    )

    def check(data):
        TRIED["bench runs.csv"] += 1
        (tmp_path / "runs.csv").write_bytes(data)
        one_line(lambda: finished_rows(tmp_path), capsys)

    known = [b"\x80", b"status,repeat\nok\n", b"config,repeat,status,log\na,,ok,r0.log\n"]  # no config, no repeat
    explore(request, st.one_of(random_bytes(4096), tables), check, examples=40, known=known)


JSON_VALUES = st.recursive(
    st.one_of(st.none(), st.booleans(), st.integers(-(2**70), 2**70), st.floats(), st.text(max_size=8),
              st.sampled_from(["ok", "mlp", "cnn", "fashion-mnist", "synthetic", "src/train.py", "bf16"])),
    lambda inner: st.one_of(st.lists(inner, max_size=3), st.dictionaries(st.text(max_size=6), inner, max_size=3)),
    max_leaves=8,
)  # fmt: skip
METRICS_KEYS = ["command", "train_s", "steps", "status", "first_step_s", "args", "model", "dataset", "image_size",
                "flops_per_image", "images_per_s", "script", "precision", "epochs"]  # fmt: skip
METRICS = st.one_of(
    random_bytes(4096),
    st.dictionaries(st.sampled_from(METRICS_KEYS), JSON_VALUES, max_size=8).map(lambda d: json.dumps(d).encode()),
    JSON_VALUES.map(lambda v: json.dumps(v).encode()),
)


def test_metrics_json_of_any_bytes(tmp_path, capsys, request, monkeypatch):
    """A run's metrics JSON of any bytes, or any JSON, where the bench reads it: `bench.py --dry-run --costs FOLDER`
    (estimate: the recorded costs of a folder of metrics files) and `bench.py --peak-table FOLDER` (a result
    folder's runs.csv, env.json and metrics/): the plan or the table, or one line."""
    import bench

    costs, folder = tmp_path / "costs", tmp_path / "result"
    (costs / "metrics").mkdir(parents=True)
    (folder / "metrics").mkdir(parents=True)
    (folder / "runs.csv").write_text("config,repeat,status,log,command,images_per_s\nrow,0,ok,logs/row-r0.log,x,100\n")
    shutil.copy(REPO / "results" / "cpu-2core-avx512bf16-2026-11-27" / "env.json", folder / "env.json")
    dry = ["bench.py", "--profile", "smoke", "--dry-run", "--costs", str(costs)]

    def check(data):
        TRIED["metrics JSON"] += 1
        (costs / "metrics" / "row-r0.json").write_bytes(data)
        monkeypatch.setattr(sys, "argv", dry)
        one_line(bench.main, capsys)
        (folder / "metrics" / "row-r0.json").write_bytes(data)
        monkeypatch.setattr(sys, "argv", ["bench.py", "--peak-table", str(folder)])
        one_line(bench.main, capsys)

    known = [b"null", b'{"command": [], "train_s": null, "steps": ""}']  # not an object; steps as text
    explore(request, METRICS, check, examples=10, known=known)
