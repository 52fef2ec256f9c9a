"""The `# new #` checker (bench/pages/check_markers.py): every chain passes, and each kind of mistake is caught."""

import ast
import sys
from pathlib import Path

import pytest
from conftest import REPO, run

sys.path.insert(0, str(REPO / "bench" / "pages"))

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
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
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


# The chains are read from the scripts' declarations (check_markers.pairs), never listed here. What the README's
# chains fix is checked: the two roots, and the bases of the lessons it names (the speed-up ladder is one chain, each rung on
# the one below; the distributed lessons on train_DDP.py).
ROOTS = {"train.py", "loader.py"}
LADDER = ["train.py", "train_amp.py", "train_channels_last.py", "train_compile.py", "train_fast.py"]
FIXED_BASES = {
    **{rung: base for base, rung in zip(LADDER, LADDER[1:])},
    "train_DP.py": "train.py",
    "train_DDP.py": "train.py",
    "train_DDP_elastic.py": "train_DDP.py",
    "train_accum.py": "train_DDP.py",
    "train_FSDP.py": "train_DDP.py",
    "train_DDP_comm_hooks.py": "train_DDP.py",
    "train_model_parallel.py": "train.py",
    "train_pipeline.py": "train_model_parallel.py",
    "train_activation_checkpointing.py": "train.py",
    "train_profile.py": "train.py",
    "train_TP.py": "train.py",
    "loader_DALI.py": "loader.py",
}


def chains() -> dict[str, str]:
    """variant -> its declared base, for every variant under src/."""
    return {v.name: b.name for b, v in check_markers.pairs()}


def test_every_chain_in_src_passes():
    proc = run("bench/pages/check_markers.py")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    for variant, base in chains().items():
        assert f"{variant} vs {base}" in proc.stdout


def test_the_declarations_cover_every_script_and_the_fixed_lessons_keep_their_bases():
    """Every script is a variant (it declares a base) or one of the two roots; each chain ends at a root; the
    speed-up ladder train.py -> train_amp.py -> train_channels_last.py -> train_compile.py -> train_fast.py and the
    other lessons the README's chains name declare the bases they give them."""
    found = chains()
    scripts = {p.name for p in check_markers.scripts()}
    assert scripts == set(found) | ROOTS and not ROOTS & set(found), sorted(scripts - set(found) - ROOTS)
    for variant in found:
        current, seen = variant, set()
        while current in found:
            assert current not in seen, f"{variant}: its chain loops"
            seen.add(current)
            current = found[current]
        assert current in ROOTS, f"{variant}: its chain ends at {current}, not at a root"
    wrong = {v: (found.get(v), b) for v, b in FIXED_BASES.items() if found.get(v) != b}
    assert not wrong, f"declared, the README's chains': {wrong}"
    assert check_markers.chain_problems() == []


def test_tree_shows_the_chains_and_the_readme_has_it():
    text = check_markers.tree()
    assert text.startswith("train.py\n") and text.endswith("loader.py\n└── loader_DALI.py")
    assert (
        "├── train_amp.py\n│   └── train_channels_last.py\n│       └── train_compile.py\n│           ├── "
        "train_compile_cache.py\n│           ├── train_fast.py\n│           │   └── train_cuda_graphs.py\n│           └── "
        "train_float8.py" in text
    )
    assert sorted(check_markers.in_tree_order()) == sorted(p.name for p in check_markers.scripts())
    assert text in (REPO / "README.md").read_text()  # the README shows the same tree (bench/pages/pages.py writes it)
    proc = run("bench/pages/check_markers.py", "--tree")
    assert proc.returncode == 0 and proc.stdout.strip() == text


def test_the_whole_chain_differs_from_its_root_only_in_marked_lines():
    """Markers are inherited along a chain, so train_fast.py against train.py is clean as well."""
    assert check_markers.check(REPO / "src" / "train.py", REPO / "src" / "train_fast.py") == []


def test_no_line_in_src_is_longer_than_120_characters():
    """The scripts are read as tutorials and side by side in a diff: no line of src/ (code, comments, docstrings) over
    120 characters."""
    long = [
        f"{path.relative_to(REPO)}:{n}: {len(line)} characters"
        for path in sorted((REPO / "src").rglob("*.py"))
        for n, line in enumerate(path.read_text().splitlines(), 1)
        if len(line) > 120
    ]
    assert not long, "\n".join(long)


def test_every_script_s_docstring_ends_with_its_page():
    """A script's docstring says what it does and how to run it; the rest is on its page, which it names."""
    for script in check_markers.scripts():
        doc = ast.get_docstring(ast.parse(script.read_text())) or ""
        page = f"docs/techniques/{script.stem}.md"
        assert doc.rstrip().endswith(f"More: {page}"), f"{script.name}: its docstring does not end with its page"
        assert (REPO / page).is_file(), page


def test_a_well_marked_variant_passes_despite_indentation(tmp_path):
    assert problems(tmp_path, GOOD) == []


def test_a_note_explains_a_removal_or_the_marked_lines_below_it_and_marks_nothing(tmp_path):
    """A comment-only `# new # <why>` line (a note) is what a removed base statement needs where it was (GOOD's
    "no manual seed"); above marked lines it explains them (train_amp.py's autocast block); a note alone does not
    mark the unmarked line below it."""
    explained = GOOD.replace('    scaler.step(optimizer)  # new #\n',
                             '    # new # the scaler unscales, then steps\n    scaler.step(optimizer)  # new #\n')  # fmt: skip
    assert problems(tmp_path, explained) == []
    assert "# new # convs/matmuls in low precision" in (REPO / "src" / "train_amp.py").read_text()
    unmarked = explained.replace("    scaler.step(optimizer)  # new #\n", "    scaler.step(optimizer)\n")
    found = problems(tmp_path, unmarked)
    assert any("changed or added without a `# new #` marker: scaler . step" in p for p in found), found


def test_unmarked_insertion_is_caught(tmp_path):
    variant = GOOD.replace("for step in range(3):", 'print("hello")\nfor step in range(3):')
    found = problems(tmp_path, variant)
    assert len(found) == 1 and f"{tmp_path / 'train_x.py'}:9:" in found[0] and "without a `# new #`" in found[0]


def test_unmarked_change_is_caught(tmp_path):
    found = problems(tmp_path, GOOD.replace("lr=0.1", "lr=0.2"))
    assert len(found) == 1 and ":8:" in found[0] and "optimizer = torch . optim . SGD ( model" in found[0], found


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
    assert len(found) == 1 and ":12:" in found[0] and "identical to train.py:9" in found[0], found


PARTIAL_BASE = '''"""A base script."""

import torch

torch.manual_seed(0)
result = dict(
    name="base",
    size=3,
    kind="plain",
)
print(result, flush=True)
'''


def test_a_partly_changed_call_needs_a_marker_on_each_changed_line(tmp_path):
    good = PARTIAL_BASE.replace('    name="base",\n', '    name="variant",  # new #\n')
    assert problems(tmp_path, good, base=PARTIAL_BASE) == []
    # the same change with the marker on the call's first line: the changed line 7 is unmarked, line 6 needlessly
    wrong = PARTIAL_BASE.replace("result = dict(", "result = dict(  # new #").replace('"base"', '"variant"')
    found = problems(tmp_path, wrong, base=PARTIAL_BASE)
    assert any(":7:" in p and "changed in part, without its own marker" in p for p in found), found
    assert any(":6:" in p and "mark the changed lines only" in p for p in found), found
    # two lines changed, one marked
    two = good.replace('    kind="plain",\n', '    kind="fancy",\n')
    found = problems(tmp_path, two, base=PARTIAL_BASE)
    assert len(found) == 1 and ":9:" in found[0] and "without its own marker" in found[0], found


def test_a_rewritten_comment_line_needs_a_marker(tmp_path):
    base = PARTIAL_BASE.replace("torch.manual_seed(0)", "# -- data ----\ntorch.manual_seed(0)")
    variant = base.replace('    name="base",\n', '    name="variant",  # new #\n')
    changed = variant.replace("# -- data ----", "# -- data, on the GPU ----")
    found = problems(tmp_path, changed, base=base)
    assert len(found) == 1 and ":5:" in found[0] and "a comment line" in found[0], found
    assert problems(tmp_path, variant.replace("# -- data ----", "# -- data, on the GPU  # new #"), base=base) == []


def test_a_changed_comment_or_wrapping_of_unchanged_code_is_caught(tmp_path):
    variant = GOOD.replace("lr=0.1)", "lr=0.1)  # the same rate")
    found = problems(tmp_path, variant)
    assert len(found) == 1 and ":8:" in found[0] and "only a comment or the wrapping differs" in found[0], found
    rewrapped = GOOD.replace("SGD(model.parameters(), lr=0.1)", "SGD(\n    model.parameters(),\n    lr=0.1,\n)")
    found = problems(tmp_path, rewrapped)
    assert found and all("only a comment or the wrapping differs" in p for p in found), found


def test_markers_are_inherited_along_a_chain(tmp_path):
    """A variant of a variant keeps its base's markers; dropping or editing one is a change of its own."""
    (tmp_path / "train.py").write_text(BASE)
    (tmp_path / "train_x.py").write_text(
        GOOD.replace('"""A base script."""', '"""X: train.py + a technique."""  # new #')
    )
    third = (tmp_path / "train_x.py").read_text()
    third = third.replace("X: train.py + a technique", "Y: train_x.py + another").replace(
        'print("done", flush=True)', 'print("done", flush=True)\nprint("more")  # new # what Y adds'
    )
    (tmp_path / "train_y.py").write_text(third)
    assert check_markers.check(tmp_path / "train_x.py", tmp_path / "train_y.py") == []
    assert check_markers.check(tmp_path / "train.py", tmp_path / "train_y.py") == []  # cumulative: still clean
    dropped = third.replace("  # new # a line the technique adds", "")
    (tmp_path / "train_y.py").write_text(dropped)
    found = check_markers.check(tmp_path / "train_x.py", tmp_path / "train_y.py")
    assert len(found) == 1 and ":7:" in found[0] and "only its comment or marker differs" in found[0], found
    (tmp_path / "train_z.py").write_text((tmp_path / "train_x.py").read_text())  # only inherited markers
    found = check_markers.check(tmp_path / "train_x.py", tmp_path / "train_z.py")
    assert any("no `# new #` marker" in p for p in found), found  # inherited markers are not a new one


def test_declarations_must_resolve(tmp_path):
    (tmp_path / "train.py").write_text(BASE)
    (tmp_path / "train_x.py").write_text(GOOD.replace('"""A base script."""', '"""X: train_missing.py + a."""'))
    (tmp_path / "train_y.py").write_text(GOOD)  # markers, no declaration
    (tmp_path / "a.py").write_text(GOOD.replace('"""A base script."""', '"""A: b.py + a loop."""'))
    (tmp_path / "b.py").write_text(GOOD.replace('"""A base script."""', '"""B: a.py + a loop."""'))
    found = check_markers.chain_problems(tmp_path)
    assert any("train_x.py:1: declares base train_missing.py" in p for p in found), found
    assert any("train_y.py:1: has `# new #` markers but declares no base" in p for p in found), found
    assert any("a.py:1: its chain of bases loops" in p for p in found), found


@pytest.mark.parametrize(
    "spelling", ["# New #", "#new#", "# new#", "# NEW # x", "# new: x", "# new ## x", "# nwe # x", "# new # Begin"]
)
def test_misspelled_marker_is_caught(tmp_path, spelling):
    variant = GOOD.replace("# new # a line the technique adds", spelling)
    found = problems(tmp_path, variant)
    assert any(":7:" in p and "not spelled `# new #`" in p for p in found), found


def test_unclosed_block_is_caught(tmp_path):
    found = problems(tmp_path, GOOD.replace("    # new # end\n", ""))
    assert any(":10:" in p and "unclosed block" in p for p in found), found


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
    proc = run("bench/pages/check_markers.py", REPO / "src" / "train.py", tmp_path / "train_amp.py")
    assert proc.returncode == 1
    assert proc.stdout.splitlines() == [
        f"{tmp_path / 'train_amp.py'}:{number}: changed or added without a `# new #` marker: scaler . update ( )"
    ]


def test_cli_refuses_one_file():
    proc = run("bench/pages/check_markers.py", "src/train.py")
    assert proc.returncode == 2 and "exactly two" in proc.stderr and "Traceback" not in proc.stderr


def test_a_variant_s_docstring_is_its_own_text_and_left_out_of_the_diff_size(tmp_path):
    """A variant's module docstring always differs from its base's: it needs no marker, and --stats leaves it out,
    while a changed code line outside it still counts and still needs its marker."""
    own = GOOD.replace(
        '"""A base script."""', '"""X: train.py + a technique.\n\nWhy it is faster.\n\n    python x.py\n"""'
    )
    assert problems(tmp_path, own) == []
    base, variant = write(tmp_path, BASE, GOOD)
    size = check_markers.changed_lines(base, variant)
    assert size > 0 and check_markers.changed_lines(*write(tmp_path, BASE, own)) == size
    assert problems(tmp_path, own.replace('print("done", flush=True)', 'print("over", flush=True)'))


def test_stats_prints_each_pair_and_the_mean_and_refuses_a_missing_folder(tmp_path):
    proc = run("bench/pages/check_markers.py", "--stats", "src")
    lines = proc.stdout.splitlines()
    assert proc.returncode == 0 and len(lines) == len(check_markers.pairs()) + 1
    assert lines[-1].split()[1:] == ["mean", "lines", "changed", "per", "pair", f"({len(lines) - 1}", "pairs)"]
    proc = run("bench/pages/check_markers.py", "--stats", tmp_path / "nope")
    assert proc.returncode == 2 and "is not a folder" in proc.stderr.splitlines()[-1] and "Traceback" not in proc.stderr
