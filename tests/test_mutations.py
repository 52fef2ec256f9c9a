"""The mutation table's list (tests/mutations.py) follows the scripts: every bug still applies, names a real test, and
every lesson has one. Running the table itself takes about 25 minutes, so it runs apart (`python tests/mutations.py`)
and its committed output is in results/mutations/*/."""

import sys

from conftest import REPO

sys.path.insert(0, str(REPO / "bench" / "pages"))
sys.path.insert(0, str(REPO / "tests"))

import check_markers  # noqa: E402
import mutations  # noqa: E402


def test_every_bug_applies_once_to_the_scripts_as_they_are_and_names_a_test_that_exists():
    problems = [problem for problem in map(mutations.check, mutations.MUTATIONS) if problem]
    assert not problems, "\n".join(problems)


def test_every_lesson_has_a_bug_in_the_table():
    lessons = {variant.name for _, variant in check_markers.pairs()}
    assert lessons - {m[0] for m in mutations.MUTATIONS} == set()


def test_a_bug_whose_text_is_gone_is_reported():
    stale = ("train_DDP.py", "a bug", "src/train_DDP.py", "text that is not there", "x", mutations.MUTATIONS[0][5])
    assert "occurs 0 times" in mutations.check(stale)
    missing = (*mutations.MUTATIONS[0][:5], "tests/test_equivalence.py::test_that_does_not_exist")
    assert "has no test test_that_does_not_exist" in mutations.check(missing)
