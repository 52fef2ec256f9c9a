"""bench/pages/diff_pages.py: a page per (variant, base) pair with every marked line highlighted, an index whose links
resolve and whose speed-ups come from the result folders, and both rendered by headless Chromium."""

import html
import html.parser
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest
from conftest import REPO, run

sys.path.insert(0, str(REPO / "bench" / "pages"))

import check_markers  # noqa: E402
import diff_pages  # noqa: E402

RESULTS = [REPO / "results" / "cpu-2core-avx512bf16-2026-11-27"]  # the current CPU ladders (results/current.toml)


class Page(html.parser.HTMLParser):
    """Collects the code lines (`<span id="v12" class="l new">`), the links, and the text of the `why` cells."""

    def __init__(self, text: str):
        super().__init__()
        self.lines: dict[str, dict] = {}  # id -> {"classes", "text"}
        self.links: list[str] = []
        self.why: list[str] = []
        self._line, self._number, self._in_why = None, False, False
        self.feed(text)

    def handle_starttag(self, tag, attrs):
        attrs = dict(attrs)
        if tag == "a" and "href" in attrs:
            self.links.append(attrs["href"])
        if tag == "td" and attrs.get("class") == "why":
            self._in_why = True
        if tag == "span" and attrs.get("id"):
            assert attrs["id"] not in self.lines, f"line {attrs['id']} shown twice"
            self._line = self.lines[attrs["id"]] = {"classes": attrs.get("class", "").split(), "text": ""}
        elif tag == "span" and attrs.get("class") == "n":
            self._number = True

    def handle_endtag(self, tag):
        if tag == "td":
            self._in_why = False
        if tag == "span":
            if self._number:
                self._number = False
            else:
                self._line = None

    def handle_data(self, data):
        if self._in_why:
            self.why.append(data)
        elif self._line is not None and not self._number:
            self._line["text"] += data


@pytest.fixture(scope="module")
def pages(tmp_path_factory):
    out = tmp_path_factory.mktemp("pages")
    proc = run("bench/pages/diff_pages.py", "--out", out, "--results", *RESULTS, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return out


def test_a_page_for_every_pair(pages):
    pairs = check_markers.pairs()
    assert {v.name for _, v in pairs} >= {
        "train_DP.py",
        "train_DDP.py",
        "train_amp.py",
        "loader_DALI.py",
        "train_fast.py",
    }
    for _, variant in pairs:
        assert (pages / diff_pages.page_name(variant)).is_file(), variant


@pytest.mark.parametrize("base, variant", check_markers.pairs(), ids=lambda p: p.name)
def test_every_marked_line_is_shown_highlighted_with_its_explanation(pages, base, variant):
    page = Page((pages / diff_pages.page_name(variant)).read_text())
    parsed = check_markers.parse(variant)
    marked = check_markers.compare(base, variant).new_lines  # new relative to this base, not inherited
    assert marked, "a variant marks something"
    variant_lines, base_lines = variant.read_text().splitlines(), base.read_text().splitlines()
    for n, text in enumerate(variant_lines, start=1):  # every line once, with its text; highlighted iff marked
        line = page.lines[f"v{n}"]
        assert line["text"] == text, (n, line["text"], text)
        assert ("new" in line["classes"]) == (n in marked), (variant.name, n, text)
    for n, text in enumerate(base_lines, start=1):
        assert page.lines[f"b{n}"]["text"] == text
        assert "new" not in page.lines[f"b{n}"]["classes"]
    explanations = "".join(page.why)
    for s in parsed.statements:
        if s.line in marked and s.why:
            assert s.why in explanations, (variant.name, s.line, s.why)


def test_the_index_links_resolve_and_show_the_measured_speedup(pages):
    index = Page((pages / "index.html").read_text())
    pairs = check_markers.pairs()
    chains = [v for _, v in pairs if len(diff_pages.chain_of(v)) >= 3]  # 2+ rungs down
    assert len(index.links) == len(pairs) + len(chains) and len(chains) >= 5  # a page per pair, then per chain
    assert "chain-train_fast.html" in index.links
    for link in index.links:
        target = pages / link
        assert target.is_file(), link
        assert "index.html" in Page(target.read_text()).links and (pages / "index.html").is_file()
    text = (pages / "index.html").read_text()
    summary = pd.read_csv(RESULTS[0] / "summary.csv")
    amp = summary[(summary.script == "train_amp.py") & (summary.status == "ok")].iloc[0]
    assert f"{amp.speedup:.2f}×" in text and amp.config in text  # the number of the committed result folder
    for _, variant in pairs:
        assert diff_pages.technique(variant) and html.escape(diff_pages.technique(variant)) in text


def test_the_chain_page_names_the_rung_that_introduced_each_line(pages):
    """train.py -> train_fast.py: every line any rung marked is highlighted, and each is put down to its rung."""
    train, fast = REPO / "src" / "train.py", REPO / "src" / "train_fast.py"
    page = Page((pages / "chain-train_fast.html").read_text())
    marked = check_markers.compare(train, fast).new_lines
    for n, text in enumerate(fast.read_text().splitlines(), start=1):
        assert page.lines[f"v{n}"]["text"] == text and ("new" in page.lines[f"v{n}"]["classes"]) == (n in marked)
    why = "".join(page.why)
    rungs = ["train_amp.py", "train_channels_last.py", "train_compile.py", "train_fast.py"]
    assert all(f"{rung}: " in why for rung in rungs), why[:500]
    chain = diff_pages.chain_of(fast)
    assert [c.name for c in chain] == ["train.py", *rungs]
    rung = diff_pages.introduced_by(chain)
    for needle, expected in [
        ("with torch.autocast(", "train_amp.py"),
        ("images = images.to(device, non_blocking=True, memory_format=memory_format)", "train_channels_last.py"),
        ("compiled = torch.compile(model", "train_compile.py"),
        ("weight_decay=5e-4, fused=fused", "train_fast.py"),
    ]:
        doc = check_markers.parse(fast).docstring
        n = next(n for n, line in enumerate(fast.read_text().splitlines(), 1) if needle in line and n not in doc)
        assert rung[n] == expected, (needle, n, rung.get(n))


def test_an_unmeasured_variant_says_so(tmp_path):
    diff_pages.write(tmp_path, results=[])
    assert "not measured" in (tmp_path / "index.html").read_text()
    assert "Not measured" in (tmp_path / "diff-train_amp.html").read_text()


def _chromium() -> str:
    found = shutil.which("chromium") or shutil.which("chromium-browser")
    could_install = shutil.which("apt-get") and (os.geteuid() == 0 or shutil.which("sudo") and subprocess.run(
        ["sudo", "-n", "true"], capture_output=True).returncode == 0)  # as bench/setup.sh's apt_install can
    if found is None and not could_install:
        pytest.skip("no Chromium, and set-up could not install it (no apt-get, or neither root nor password-less "
                    "sudo): sudo apt-get install chromium, then run the tests again")
    assert found, "the test set-up (bench/setup.sh --test) should have installed the Debian package chromium"
    return found


@pytest.mark.parametrize("name", ["index.html", "diff-train_DDP.html"])
def test_headless_chromium_renders_the_pages(pages, name, tmp_path):
    png = tmp_path / f"{Path(name).stem}.png"
    proc = subprocess.run(
        [_chromium(), "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars", f"--screenshot={png}",
         "--window-size=1400,1200", (pages / name).as_uri()],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 10_000


def test_bad_results_folder_is_one_line(tmp_path):
    proc = run("bench/pages/diff_pages.py", "--out", tmp_path / "o", "--results", tmp_path, timeout=60)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert "has no summary.csv" in proc.stderr.splitlines()[-1]
