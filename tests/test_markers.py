"""The `# new #` checker (bench/check_markers.py): every variant passes, and each kind of mistake is caught."""

import sys
from pathlib import Path

import pytest

from conftest import REPO, run

sys.path.insert(0, str(REPO / "bench"))

import check_markers  # noqa: E402

BASE = '''"""A base script."""

import torch

torch.manual_seed(0)
model = torch.nn.Linear(4, 2)
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
for step in range(3):
    loss = model(torch.randn(8, 4)).sum()
    loss.backward()
    optimizer.step()
print("done", flush=True)
'''

GOOD = '''"""A base script."""

import torch

# new # no manual seed: the technique seeds elsewhere
model = torch.nn.Linear(4, 2)
scaler = torch.amp.GradScaler("cpu")  # new # a line the technique adds
optimizer = torch.optim.SGD(
    model.parameters(),
    lr=0.1,
)
for step in range(3):
    # new # begin: a block
    with torch.autocast("cpu"):
        loss = model(torch.randn(8, 4)).float().sum()
    # new # end
    scaler.scale(loss).backward()  # new # replaces loss.backward()
    scaler.step(optimizer)  # new #
print("done", flush=True)
'''


def write(tmp_path: Path, base: str, variant: str) -> tuple[Path, Path]:
    (tmp_path / "train.py").write_text(base)
    (tmp_path / "train_x.py").write_text(variant)
    return tmp_path / "train.py", tmp_path / "train_x.py"


def problems(tmp_path, variant, base=BASE):
    return check_markers.check(*write(tmp_path, base, variant))


def test_every_variant_in_src_passes():
    proc = run("bench/check_markers.py")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    for name in ["train_DP.py", "train_DDP.py", "train_amp.py"]:
        assert f"{name} vs train.py" in proc.stdout


def test_pairs_cover_every_variant_script():
    variants = {v.name for _, v in check_markers.pairs()}
    assert {"train_DP.py", "train_DDP.py", "train_amp.py"} <= variants
    assert all(b.name == "train.py" for b, v in check_markers.pairs() if v.name.startswith("train_"))


def test_a_well_marked_variant_passes_despite_rewrapping_and_comments(tmp_path):
    assert problems(tmp_path, GOOD) == []


def test_unmarked_insertion_is_caught(tmp_path):
    variant = GOOD.replace("for step in range(3):", 'print("hello")\nfor step in range(3):')
    found = problems(tmp_path, variant)
    assert len(found) == 1 and f"{tmp_path / 'train_x.py'}:12:" in found[0] and "without a `# new #`" in found[0]


def test_unmarked_change_is_caught(tmp_path):
    found = problems(tmp_path, GOOD.replace("lr=0.1", "lr=0.2"))
    assert len(found) == 1 and ":8:" in found[0] and "optimizer = torch . optim . SGD ( model" in found[0]


def test_unmarked_removal_is_caught(tmp_path):
    variant = GOOD.replace("# new # no manual seed: the technique seeds elsewhere\n", "")
    found = problems(tmp_path, variant)
    assert len(found) == 1 and ":5:" in found[0], found
    assert "train.py:5 is removed here" in found[0] and "torch . manual_seed ( 0 )" in found[0]


def test_marker_on_an_unchanged_line_is_caught(tmp_path):
    variant = GOOD.replace("model = torch.nn.Linear(4, 2)", "model = torch.nn.Linear(4, 2)  # new # not new at all")
    found = problems(tmp_path, variant)
    assert len(found) == 1 and ":6:" in found[0] and "identical to train.py:6" in found[0]


def test_marker_on_an_unchanged_line_inside_a_block_is_caught(tmp_path):
    """Wrapping a base line in a block marks it too: only the `with` line is new, so it alone takes a marker."""
    found = problems(tmp_path, GOOD.replace(".float().sum()", ".sum()"))
    assert len(found) == 1 and ":15:" in found[0] and "identical to train.py:9" in found[0], found


@pytest.mark.parametrize(
    "spelling", ["# New #", "#new#", "# new#", "# NEW # x", "# new: x", "# new ## x", "# nwe # x", "# new # Begin"]
)
def test_misspelled_marker_is_caught(tmp_path, spelling):
    variant = GOOD.replace("# new # a line the technique adds", spelling)
    found = problems(tmp_path, variant)
    assert any(":7:" in p and "not spelled `# new #`" in p for p in found), found


def test_unclosed_block_is_caught(tmp_path):
    found = problems(tmp_path, GOOD.replace("    # new # end\n", ""))
    assert any(":13:" in p and "unclosed block" in p for p in found), found


def test_nested_block_is_caught(tmp_path):
    variant = GOOD.replace("    with torch", "    # new # begin: inner\n    with torch")
    found = problems(tmp_path, variant)
    assert any("nested block" in p for p in found), found


def test_end_without_begin_is_caught(tmp_path):
    found = problems(tmp_path, GOOD.replace("    # new # begin: a block\n", ""))
    assert any("without a `# new # begin`" in p for p in found), found


def test_variant_without_markers_is_caught(tmp_path):
    found = problems(tmp_path, BASE)
    assert found == [f"{tmp_path / 'train_x.py'}:1: no `# new #` marker: a variant marks what it adds to train.py"]


def test_marker_in_the_base_is_caught(tmp_path):
    found = problems(tmp_path, GOOD, base=BASE.replace("import torch", "import torch  # new #"))
    assert any(f"{tmp_path / 'train.py'}:3:" in p and "base script must not" in p for p in found), found


def test_a_real_variant_with_one_marker_removed_fails_with_its_line(tmp_path):
    """Drop one marker from train_amp.py: the checker names that line, and the CLI exits 1."""
    text = (REPO / "src" / "train_amp.py").read_text()
    line = "scaler.update()  # new # lower the scale after an overflow, raise it after a run of good steps"
    assert line in text
    number = text[: text.index(line)].count("\n") + 1
    (tmp_path / "train_amp.py").write_text(text.replace(line, "scaler.update()"))
    proc = run("bench/check_markers.py", REPO / "src" / "train.py", tmp_path / "train_amp.py")
    assert proc.returncode == 1
    assert proc.stdout.splitlines() == [
        f"{tmp_path / 'train_amp.py'}:{number}: changed or added without a `# new #` marker: scaler . update ( )"
    ]


def test_cli_refuses_one_file():
    proc = run("bench/check_markers.py", "src/train.py")
    assert proc.returncode == 2 and "exactly two" in proc.stderr and "Traceback" not in proc.stderr
