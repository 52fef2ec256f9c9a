"""bench/pages/diff_pages.py: a page per (variant, base) pair with every marked line highlighted, an index whose links
resolve and whose speed-ups come from the result folders, and both rendered by headless Chromium. Every measured row
names its host, folder and noise floor; a self pair is no effect; a floor past ±15 % gives no ratio; a chain's page
shows its last rung over the root and each rung on the way."""

import html
import html.parser
import json
import os
import re
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
from cells import cpu_kind  # noqa: E402
from results_index import floor_pct  # noqa: E402

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


def test_the_chain_page_shows_the_last_rung_over_the_root_and_each_rung_on_the_way(pages):
    """chain-train_fast.html once said "Not measured" beside a ladder the folder measured (its rows were never passed
    to the chain's page): each train_fast.py row over train.py, and the ratio of every rung its pairs climbed."""
    text = (pages / "chain-train_fast.html").read_text()
    summary = pd.read_csv(RESULTS[0] / "summary.csv")
    by_config = {r["config"]: r for r in summary.to_dict("records")}
    fast = summary[(summary.script == "train_fast.py") & (summary.status == "ok") & summary.speedup.notna()]
    assert len(fast) >= 1 and "Not measured" not in text
    for r in fast.to_dict("records"):
        assert f"{r['speedup']:.2f}×" in text and html.escape(r["config"]) in text, r["config"]
        rung = r
        while isinstance(rung.get("rung_base"), str):  # each rung of the pairs' ladder, its ratio over the one below
            assert f"{rung['script']} <b>{rung['speedup_rung']:.2f}×</b>" in text, rung["config"]
            rung = by_config[rung["rung_base"]]


FOLDERS = sorted(p.parent for p in (REPO / "results").glob("*/summary.csv"))  # what the pages read by default


@pytest.fixture(scope="module")
def every_folder(tmp_path_factory):
    """The pages as diff_pages.py writes them by default: from every folder of results/ with a summary.csv."""
    out = tmp_path_factory.mktemp("every")
    diff_pages.write(out, results=FOLDERS)
    return out


def measured_entries(out: Path) -> list[tuple[str, str, str]]:
    """Every measured row on every page of `out` (an item of a page's list, a line of the index's effect cells):
    (page, its text, its folder)."""
    found = []
    for page in sorted(out.glob("*.html")):
        for part in re.split(r"<br>|<li>|</li>|</td>", page.read_text()):
            folder = re.search(r"<code>(results/[^<]+)</code>", part)
            if folder:
                found.append((page.name, html.unescape(re.sub(r"<[^>]+>", "", part)), folder[1]))
    return found


def test_every_number_on_the_html_pages_names_its_host_its_folder_and_its_floor(every_folder):
    """train_amp.py's 1.36× on an AVX512-BF16 EPYC and its 0.19× where torch's kernels were kept at AVX2 once both
    read "CPU, 2 cores": each row names the GPUs, else the CPU's model, cores and kind, and its folder's floor."""
    entries = measured_entries(every_folder)
    assert {page for page, _, _ in entries} >= {"index.html", "diff-train_amp.html", "chain-train_fast.html"}
    for page, text, folder in entries:
        env = json.loads((REPO / folder / "env.json").read_text())
        if env.get("gpus"):
            assert f"{len(env['gpus'])} × {env['gpus'][0]}" in text, (page, text)
        else:
            assert f"{env['cpu_model']}, {env['cpu_count']} cores ({cpu_kind(env)})" in text, (page, text)
        floor = floor_pct(REPO / folder)
        assert (f"noise floor ±{floor:.1f} %" if floor is not None else "no noise floor measured") in text, text
    amp = {  # the same row on two hosts: their kinds tell them apart
        folder: text for page, text, folder in entries if page == "index.html" and "(train_amp.py cnn, bf16, " in text
    }
    fast_host = amp["results/cpu-2core-avx512bf16-2026-11-27"]
    slow_host = amp["results/cpu-2core-limited-to-avx2-2026-11-29-b"]
    assert "1.36×" in fast_host and "2 cores (AVX512-BF16)" in fast_host, fast_host
    assert "0.19×" in slow_host and "2 cores (AVX512-BF16, limited to AVX2)" in slow_host, slow_host


def test_a_self_pair_is_the_floor_not_a_technique_s_effect(every_folder):
    """A row measured against a copy of itself (`same_as`: "train_DDP.py vit, 2 processes (gloo), again") is the
    folder's noise floor, which every row names; it is listed as no technique's effect."""
    copies = {
        (f"results/{folder.name}", r["config"])
        for folder in FOLDERS
        for r in pd.read_csv(folder / "summary.csv").to_dict("records")
        if isinstance(r.get("same_as"), str)
    }
    assert any("train_DDP.py" in config for _, config in copies)  # a variant's self pair, once listed as its effect
    for page, text, folder in measured_entries(every_folder):
        for copy_folder, config in copies:
            assert not (folder == copy_folder and f" {config}, " in f" {text}"), (page, config)


def test_no_html_page_shows_a_ratio_from_a_folder_whose_floor_is_past_15_percent(every_folder):
    """As on the Markdown pages (bench/pages/pages.py's `allowed`): past ±15 % a copy of one run strayed that far, so
    the folder's ratios are noise; its rows say "no verdict (floor ±N %)" and keep their rates."""
    noisy = [(page, text, folder) for page, text, folder in measured_entries(every_folder)
             if (floor_pct(REPO / folder) or 0) > 15]  # fmt: skip
    assert noisy, "no folder of results/ has a floor past ±15 %: this test would prove nothing"
    for page, text, folder in noisy:
        assert not re.search(r"\d\.\d\d×", text), (page, folder, text)
        assert "no verdict (floor ±" in text, (page, folder, text)
