"""The bench runner (bench.py, runs.py), as a real subprocess: failures that become rows (failed, oom, timeout, skipped), Ctrl-C that
keeps the finished rows, --resume, and --tables-only (the smoke profile's outputs: test_smoke.py); and, in this
process, a signal at each moment of a run (before its child starts, while it starts, while it runs)."""

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
import tomllib
from pathlib import Path

import pandas as pd
import pytest
from conftest import BENCH, REPO, run

sys.path.insert(0, str(REPO / "bench"))

import profiles  # noqa: E402
import runs  # noqa: E402
import summary  # noqa: E402

PNGS = ["throughput.png", "accuracy_vs_time.png", "memory.png", "data_wait.png"]


def _is_png(path):
    return path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and path.stat().st_size > 1000


def test_failures_become_rows_and_the_rest_still_runs(tmp_path):
    matrix = tmp_path / "matrix.toml"
    matrix.write_text("""
[t]
repeats = 1
timeout_s = 300
[[t.runs]]
name = "good"
script = "src/train.py"
args = ["--device", "cpu", "--dataset", "synthetic", "--image-size", "28", "--subset", "512", "--batch-size", "64",
        "--epochs", "1", "--warmup-steps", "2"]
baseline = "good"
[[t.runs]]
name = "crash"
script = "src/train.py"
args = ["--device", "cpu", "--data-dir", "/nonexistent/fashion-mnist"]
baseline = "good"
[[t.runs]]
name = "slow"
script = "src/train.py"
args = ["--device", "cpu", "--epochs", "50"]
timeout_s = 3
[[t.runs]]
name = "needs two gpus"
script = "src/train.py"
min_gpus = 64
""")
    out = tmp_path / "out"
    proc = run("bench/bench.py", "--profile", "t", "--matrix", matrix, "--out", out, timeout=600)
    assert proc.returncode == 1  # something failed: say so, after writing everything
    configs = pd.read_csv(out / "summary.csv").set_index("config")
    assert configs.loc["good", "status"] == "ok" and configs.loc["good", "images_per_s"] > 0
    assert configs.loc["crash", "status"] == "failed"
    assert "exit 2" in configs.loc["crash", "reason"] and "does not exist" in configs.loc["crash", "reason"]
    assert configs.loc["slow", "status"] == "timeout"
    assert configs.loc["needs two gpus", "status"] == "skipped"
    assert "needs ≥ 64 GPUs" in configs.loc["needs two gpus", "reason"]
    table = (out / "table.md").read_text()
    assert "failed: exit 2" in table and "timeout" in table and "skipped" in table
    for name in PNGS:
        assert _is_png(out / name), name


@pytest.mark.parametrize(
    "argv, fragment",
    [
        (["--profile", "nope"], "profile 'nope' is not in"),
        (["--repeats", "0"], "--repeats"),
    ],
)
def test_bad_bench_flags_are_one_line(argv, fragment):
    proc = run("bench/bench.py", *argv, timeout=120)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr and fragment in proc.stderr


QUICK_RUN = """
[[t.runs]]
name = "quick"
script = "src/train.py"
args = ["--device", "cpu", "--dataset", "synthetic", "--image-size", "28", "--subset", "512", "--batch-size", "64",
        "--epochs", "1", "--warmup-steps", "2"]
baseline = "quick"
"""


def _matrix(tmp_path, body):
    matrix = tmp_path / f"matrix{len(list(tmp_path.glob('matrix*')))}.toml"
    matrix.write_text("[t]\nrepeats = 1\ntimeout_s = 300\ngemm_seconds = 0.05\n" + QUICK_RUN + body)  # a short probe
    return matrix


def test_out_of_memory_is_an_oom_row(tmp_path):
    """A batch of 3 x 30000 x 30000 images cannot be allocated: the row says oom with the script's error line."""
    matrix = _matrix(
        tmp_path,
        """
[[t.runs]]
name = "too big"
script = "src/train.py"
args = ["--device", "cpu", "--dataset", "synthetic", "--image-size", "30000", "--batch-size", "64"]
""",
    )
    proc = run("bench/bench.py", "--profile", "t", "--matrix", matrix, "--out", tmp_path / "out", timeout=600)
    assert proc.returncode == 1
    configs = pd.read_csv(tmp_path / "out" / "summary.csv").set_index("config")
    assert configs.loc["quick", "status"] == "ok"
    assert configs.loc["too big", "status"] == "oom"
    assert "exit 3: train.py: error: out of memory" in configs.loc["too big", "reason"]


def _pids(marker: str, exclude: str | None = None) -> list[int]:
    """The processes whose command line contains `marker` (and not `exclude`, when given)."""
    found = []
    for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
        try:
            text = cmdline.read_bytes().decode(errors="replace")
        except OSError:
            continue
        if marker in text and (exclude is None or exclude not in text):
            found.append(int(cmdline.parent.name))
    return found


def _alive(marker: str) -> bool:
    """Whether a process whose command line contains `marker` still runs."""
    return bool(_pids(marker))


def test_ctrl_c_keeps_finished_rows_and_resume_runs_only_the_rest(tmp_path):
    out = tmp_path / "out"
    long = '\n[[t.runs]]\nname = "long"\nscript = "src/train.py"\nargs = ["--device", "cpu", "--epochs", "{}"]\n'
    bench = subprocess.Popen(
        [sys.executable, "bench/bench.py", "--profile", "t", "--matrix", _matrix(tmp_path, long.format(50)),
         "--out", out], cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    deadline = time.monotonic() + 300
    log = out / "logs" / "long-r1.log"
    while not (log.exists() and "training cnn" in log.read_text()):  # the first run finished, the second trains
        assert bench.poll() is None and time.monotonic() < deadline, bench.communicate()
        time.sleep(0.2)
    bench.send_signal(signal.SIGINT)  # what Ctrl-C sends
    stdout, stderr = bench.communicate(timeout=120)
    assert bench.returncode == 130, stdout + stderr
    assert "interrupted" in stderr and "--resume" in stderr
    rows = pd.read_csv(out / "runs.csv").set_index("config")
    assert rows.loc["quick", "status"] == "ok" and rows.loc["quick", "images_per_s"] > 0
    assert rows.loc["long", "status"] == "interrupted"
    assert (out / "table.md").exists() and (out / "summary.csv").exists()
    assert not list(out.rglob("*.tmp"))  # every file was written whole, then renamed
    assert not _alive(str(out / "metrics" / "long-r1.json"))  # the interrupted run was killed, not orphaned

    quick_log = (out / "logs" / "quick-r1.log").stat().st_mtime_ns
    matrix = _matrix(tmp_path, long.format(1).replace('"--epochs"', '"--subset", "1024", "--epochs"'))
    proc = run("bench/bench.py", "--profile", "t", "--matrix", matrix, "--out", out, "--resume", timeout=600)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "quick r1: ok (already there, --resume)" in proc.stdout + proc.stderr
    assert (out / "logs" / "quick-r1.log").stat().st_mtime_ns == quick_log  # not run again
    configs = pd.read_csv(out / "summary.csv").set_index("config")
    assert (configs.status == "ok").all() and configs.loc["quick", "images_per_s"] > 0
    assert configs.loc["long", "test_acc"] > 0.3  # 8 steps on 1,024 images; chance is 0.1


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
@pytest.mark.parametrize("moment", ["before the child starts", "while it starts", "while it runs"])
def test_a_signal_at_any_moment_of_a_run_kills_its_child_and_leaves_an_interrupted_row(
    moment, signum, tmp_path, monkeypatch
):  # fmt: skip
    """runs.execute with the runner's signal handling installed (runs.Stop, as main() does), the signal sent to this
    process at a chosen moment: right after the run's log is opened (before subprocess.Popen), inside Popen once the
    child exists (the moment a KeyboardInterrupt used to escape the kill and orphan the child), or once the child
    prints its first training line. Each time: the row says interrupted, and no process of the run is left."""
    run_ = {"name": "long", "script": "src/train.py", "args": ["--device", "cpu", "--epochs", "50"],
            "launcher": "python", "timeout_s": 300}  # fmt: skip
    me, children = os.getpid(), []
    if moment == "before the child starts":
        monkeypatch.setattr(runs, "open", lambda *a, **k: (os.kill(me, signum), open(*a, **k))[1], raising=False)
    real_popen = subprocess.Popen

    def popen(*args, **kwargs):
        child = real_popen(*args, **kwargs)
        children.append(child.pid)
        if moment == "while it starts":
            os.kill(me, signum)
        return child

    monkeypatch.setattr(runs.subprocess, "Popen", popen)
    log = runs.run_paths(run_, 1, tmp_path)[0]

    def signal_once_training():
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline and not (log.exists() and "training cnn" in log.read_text()):
            time.sleep(0.1)
        os.kill(me, signum)

    if moment == "while it runs":
        threading.Thread(target=signal_once_training, daemon=True).start()
    with runs.Stop() as stop:
        row = runs.execute(run_, 1, tmp_path, sys.executable, 0, stop)
    assert stop.signal == signum and row["status"] == "interrupted", row
    assert children == ([] if moment == "before the child starts" else children[:1])
    for pid in children:
        assert not Path(f"/proc/{pid}").exists()  # killed and reaped: no orphan, no zombie
    assert not _alive(str(tmp_path / "metrics" / "long-r1.json"))
    if moment == "while it runs":
        assert "training cnn" in log.read_text()


def test_a_killed_runner_takes_its_running_run_with_it(tmp_path):
    """SIGKILL to the bench (nothing can catch it) while a run trains: the run, in a session of its own, gets SIGTERM
    from the kernel (PR_SET_PDEATHSIG, set by the launcher every run starts through) and ends; no process is left."""
    out = tmp_path / "out"
    long = '\n[[t.runs]]\nname = "long"\nscript = "src/train.py"\nargs = ["--device", "cpu", "--epochs", "50"]\n'
    bench = subprocess.Popen(
        [sys.executable, "bench/bench.py", "--profile", "t", "--matrix", _matrix(tmp_path, long), "--out", out,
         "--only", "long"], cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    log, marker = out / "logs" / "long-r1.log", str(out / "metrics" / "long-r1.json")
    deadline = time.monotonic() + 300
    while not (log.exists() and "training cnn" in log.read_text()):  # the run is training
        assert bench.poll() is None and time.monotonic() < deadline
        time.sleep(0.2)
    assert _alive(marker)
    bench.kill()
    bench.wait(timeout=60)
    deadline = time.monotonic() + 60
    while _alive(marker):  # the kernel's SIGTERM, then the process's exit: allow for a busy machine
        assert time.monotonic() < deadline, "the run outlived its killed runner"
        time.sleep(0.2)


def test_a_stopped_torchrun_run_takes_its_workers_with_it(tmp_path):
    """The same with a torchrun run of 2 workers, stopped (SIGINT to the runner) once it trains. torchrun starts each
    worker in a session of its own, which a kill of the run's process group does not reach: the runner sends the
    group SIGTERM first, which torchrun passes on to its workers before it exits. No worker may be left."""
    run_ = {"name": "ddp", "script": "src/train_DDP.py", "launcher": "torchrun", "nproc": 2, "timeout_s": 300,
            "args": ["--device", "cpu", "--epochs", "50", "--workers", "0"]}  # fmt: skip
    log, metrics = runs.run_paths(run_, 1, tmp_path)
    me, workers = os.getpid(), []

    def signal_once_training():
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline and not (log.exists() and "training cnn" in log.read_text()):
            time.sleep(0.1)
        workers.extend(_pids(f"{REPO / 'src' / 'train_DDP.py'}", exclude="torch.distributed.run"))
        os.kill(me, signal.SIGINT)

    threading.Thread(target=signal_once_training, daemon=True).start()
    with runs.Stop() as stop:
        row = runs.execute(run_, 1, tmp_path, sys.executable, 0, stop)
    assert row["status"] == "interrupted", row
    assert "training cnn" in log.read_text() and len(workers) == 2  # both workers were there when it stopped
    assert not _alive(str(metrics)), "a torchrun worker outlived its stopped run"


def test_limited_by_reads_data_wait_and_the_ratio_to_the_ceiling():
    """A run that waits for data 25 % of its steps is input-bound; one that hardly waits but runs under 90 % of its
    synthetic ceiling is limited by its input's cost on the host (loader.py end to end on 2 cores: 2.4 % wait, 59 %
    of the ceiling); else compute."""
    assert summary.limited_by(0.5) == "input"
    assert summary.limited_by(0.024, 0.59) == "input (below ceiling)"
    assert summary.limited_by(0.024, 0.95) == summary.limited_by(0.024) == "compute"
    assert summary.limited_by(float("nan"), 0.5) == "–"


def _ladder_cells(text: str) -> dict[str, list[tuple[str, str, str]]]:
    """ladder.md's ladders: {name: [(rung, its "× its base" cell, its "× first rung" cell)]}, read off the page."""
    ladders = {}
    for section in text.split("\n## ")[1:]:
        name, *lines = section.removeprefix("Ladder: ").splitlines()
        if not section.startswith("Ladder: "):
            continue
        rows = [[c.strip() for c in line.strip("|").split("|")] for line in lines if line.startswith("| ")]
        header = rows[0]
        base, first = header.index("× its base"), header.index("× its base") + 1  # "× train.py" comes next
        ladders[name] = [(r[0], r[base], r[first]) for r in rows[1:]]
    return ladders


def test_the_end_of_a_run_fits_a_terminal_and_says_what_ladder_md_says(tmp_path):
    """`bench.py --tables-only` (the same end as a run's) on a copy of the current CPU ladders' folder (results/
    current.toml: its runs are the cpu profile's rows), no training: every printed line within 100 columns; each
    ladder rung measured against its base in a line of its own with the ratio and verdict that ladder.md prints for
    it, and the whole ladder's "× train.py"; the noise floor of table.md's header;
    the rows not measured counted; where the tables, plots and side-by-side pages are; and the wide tables left in
    table.md, not printed (what the end printed before: rows of 20-30 columns that wrapped on any screen)."""
    out = tmp_path / "r"
    topics = tomllib.loads((REPO / "results" / "current.toml").read_text())["topic"]
    current = next(t["folder"] for t in topics if t["name"] == "CPU ladders")  # its runs cover the cpu profile's rows
    shutil.copytree(REPO / "results" / current, out)
    proc = run("bench/bench.py", "--tables-only", "--out", out, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    lines = proc.stdout.splitlines()
    long_path = f"In {out}/:"  # a path longer than a line stands alone (pytest's tmp_path can be)
    assert lines and all(len(line) <= 100 or line == long_path for line in lines), max(lines, key=len)
    assert not any(line.lstrip().startswith("|") for line in lines) and "## Training scripts" not in proc.stdout
    floor = re.search(r"^Noise floor: (±\d+\.\d %)", (out / "table.md").read_text(), re.MULTILINE).group(1)
    assert lines[0].startswith("On this machine (AMD EPYC, 2 cores") and f"noise floor {floor}" in lines[0]
    ladders = _ladder_cells((out / "ladder.md").read_text())
    assert len(ladders) == 4 and ladders == _ladder_cells((out / "table.md").read_text())
    measured = 0
    for name, rungs in ladders.items():
        at = next(i for i, line in enumerate(lines) if re.fullmatch(rf"Ladder \((images|tokens)/s ×\): {re.escape(name)}", line))
        block = lines[at + 1 : next(i for i in range(at + 1, len(lines)) if not lines[i].startswith("  "))]
        for rung, cell, _ in rungs:
            if cell == "–":
                continue  # the first rung; a skipped one (counted below)
            ratio = re.match(r"\d+\.\d\d× \([^)]*\)", cell).group()  # "1.36× (1.27–1.36), faster (train.py cnn)"
            verdict = cell[len(ratio) :].removeprefix(", ").split(" (")[0]
            shown = [line for line in block if rung.startswith(line[2:].split("  ")[0].rstrip("…")[:12])]
            assert any(ratio in line and line.rstrip("*").endswith("  " + verdict) for line in shown), (rung, block)
            measured += 1
        whole = rungs[-1][2]  # the last rung over the first: the ladder's product
        if rungs[-1][1] != "–" and sum(c != "–" for _, c, _ in rungs) > 1:
            assert any(re.search(r"whole, (images|tokens)/s", line) and whole.split(",")[0] in line for line in block), (
                name, block)
    assert measured == 12  # 4 + 3 + 3 + 2: every measured link of the four ladders (train_fast.py in each)
    assert "Not measured: 1 skipped" in proc.stdout  # train_channels_last.py gpt, in two ladders: one row
    for place in ("table.md", "ladder.md", "*.png", "index.html"):
        assert place in proc.stdout
    if long_path in lines:
        assert "table.md" in lines[lines.index(long_path) + 1] and "index.html" in lines[lines.index(long_path) + 2]
    else:
        assert f"{out}/table.md" in proc.stdout and f"{out}/*.png" in proc.stdout and f"{out}/index.html" in proc.stdout


def test_a_folder_to_commit_under_results_gets_no_side_by_side_pages_and_the_end_says_how_to_write_them(tmp_path):
    """tests/test_docs.py refuses index.html, diff-*.html and chain-*.html in a committed folder, so `bench.py --out
    results/NAME` writes none there (results/local/ and a folder outside results/ get them), and the end of the run
    names the command that writes them instead of a page that is not there."""
    import bench
    import terminal

    assert not bench.holds_side_by_side_pages(REPO / "results" / "cpu-2core-new")
    assert bench.holds_side_by_side_pages(REPO / "results" / "local" / "cpu")
    assert bench.holds_side_by_side_pages(tmp_path / "mine")
    folder = REPO / "results" / "cpu-2core-avx512bf16-2026-11-27"
    rows, env = pd.read_csv(folder / "summary.csv"), json.loads((folder / "env.json").read_text())
    text = terminal.end_of_run(rows, env, None, tmp_path)
    assert "python bench/pages/diff_pages.py --out DIR" in text and "index.html" not in text, text
    (tmp_path / "index.html").write_text("")
    text = terminal.end_of_run(rows, env, None, tmp_path)
    # the page named with its folder: on one line, or under the folder's path where that path fills a line alone
    assert f"{tmp_path}/index.html" in text or (f"In {tmp_path}/:" in text and "side by side: index.html" in text), text


def test_bf16_rows_skip_on_a_cpu_without_bf16_and_say_which_ladder_runs_them():
    """A bf16 row runs where the CPU multiplies bfloat16 natively, a no-bf16 row (the scripts' float32 defaults) only
    where it would emulate it; each says why where it is skipped. The bench reads the scripts' own test
    (common.native_bfloat16), so oneDNN kept below AVX512-BF16 (ONEDNN_MAX_CPU_ISA=AVX2) counts as no bf16, and
    every row of a profile whose name says bf16 either requires it or asks for it (--amp-dtype bfloat16): the
    scripts' default is float32 on a CPU without native bfloat16."""
    bf16 = {"name": "train_compile.py cnn, bf16", "requires": "bf16"}
    assert profiles.skip_reason(bf16, gpus=0, bf16=True) is None
    assert "no native bfloat16" in profiles.skip_reason(bf16, gpus=0, bf16=False)
    float32 = {"name": "train_fast.py gpt, float32, Muon, to 1.70", "requires": "no-bf16"}
    assert profiles.skip_reason(float32, gpus=0, bf16=False) is None
    assert "runs bfloat16 natively" in profiles.skip_reason(float32, gpus=0, bf16=True)
    probe = "import torch, common; print(common.native_bfloat16(torch.device('cpu')))"
    limited = run("-c", probe, env={**os.environ, "PYTHONPATH": str(REPO / "src"), "ONEDNN_MAX_CPU_ISA": "AVX2"})
    assert limited.stdout.strip() == "False", limited.stderr
    chain = ("train_amp.py", "train_channels_last.py", "train_compile.py", "train_fast.py")
    for name, table in tomllib.loads((BENCH / "profiles.toml").read_text()).items():
        for row in table.get("runs", []):
            args = [str(a) for a in [*table.get("args", []), *row.get("args", [])]]
            on_cpu = row.get("requires") != "cuda" and "cuda" not in args
            if "bf16" in row["name"].split(", ") and row["script"].endswith(chain) and on_cpu:
                asked = "--amp-dtype" in args and args[args.index("--amp-dtype") + 1] == "bfloat16"
                assert row.get("requires") == "bf16" or asked, f"[{name}] {row['name']}"


def test_a_busy_machine_is_noticed_re_run_and_never_turned_into_a_verdict(tmp_path):
    """A synthetic hog, deterministic: real training runs whose steps are slowed where tests/slow_steps says (as if
    another program took the cores). Run 2 of T takes 4 times as long in every step (its pair's ratio lies far from
    its siblings); run 3 of its copy 20 times as long in three steps of one block (its steps scatter). Each disturbed
    pair is named, re-run (a progress line says why) and left out of the ratios; re-runs are bounded."""
    quick = ('["--device", "cpu", "--model", "mlp", "--dataset", "synthetic", "--image-size", "28", "--subset", '
             '"1024", "--batch-size", "64", "--epochs", "1", "--warmup-steps", "2", "--workers", "0"]')  # fmt: skip
    matrix = tmp_path / "matrix.toml"
    matrix.write_text(
        f"[h]\npairs = 3\nreruns = 2\ntimeout_s = 300\ngemm_seconds = 0.05\n"
        f'[[h.runs]]\nname = "T"\nscript = "src/train.py"\nargs = {quick}\n'
        f'[[h.runs]]\nname = "T again"\nscript = "src/train.py"\nargs = {quick}\nsame_as = "T"\n'
    )
    # every step 4x as long; 3 steps 20x. The runs' steps are timed on tests/slow_steps' simulated clock (each other
    # step exactly 10 ms): on the machine's clock, CI's load (both cores busy) scattered undisturbed runs too
    slow = {"T-r2.json": [0, 99, 4], "T-again-r3.json": [6, 8, 20]}
    env = {**os.environ, "SLOW_STEPS": json.dumps(slow), "SLOW_STEPS_PYTHON": sys.executable, "OMP_NUM_THREADS": "1"}
    out = tmp_path / "out"
    proc = subprocess.run(
        [sys.executable, "bench/bench.py", "--profile", "h", "--matrix", matrix, "--out", out,
         "--python", REPO / "tests" / "slow_steps" / "python"],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=900,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-2000:]
    plan = pd.read_csv(out / "pairs.csv", dtype={"disturbed": str}).fillna({"disturbed": ""})
    runs_ = pd.read_csv(out / "runs.csv").set_index("job")
    log = lambda job: Path(runs_.log[job]).stem  # noqa: E731
    hit = plan[plan.disturbed != ""]
    reasons = dict(zip(hit.row_job, hit.disturbed)) | dict(zip(hit.reference_job, hit.disturbed))
    named = {log(j): why for j, why in reasons.items()}
    assert "far from its siblings" in named.get("T-r2", ""), hit  # every step slow: the pair's ratio stands out
    assert "spread" in named.get("T-again-r3", ""), hit  # one block slow: the run's steps scatter
    assert (proc.stdout + proc.stderr).count("bench: re-running") >= 2
    reruns = plan[plan["round"] >= 3]
    assert 2 <= len(reruns) <= 2  # each disturbed pair re-ran once; `reruns` bounds them
    assert not {log(j) for j in [*reruns.row_job, *reruns.reference_job]} & {"T-r2", "T-again-r3"}
    assert "left out" in (out / "table.md").read_text() or "disturbed" in (out / "table.md").read_text()


def test_a_row_s_env_reaches_its_process_and_its_command_line(tmp_path):
    """`env` of a row is set in the run's process (here WORLD_SIZE=2, which train_fast.py refuses in one line) and
    shown before the command in its log and in runs.csv; a non-string value is refused before anything runs."""
    run_ = {"name": "env", "script": "src/train_fast.py", "args": ["--device", "cpu"], "launcher": "python",
            "timeout_s": 120, "env": {"WORLD_SIZE": "2"}}  # fmt: skip
    with runs.Stop() as stop:
        row = runs.execute(run_, 1, tmp_path, sys.executable, 0, stop)
    log = (tmp_path / row["log"]).read_text()
    assert row["status"] == "failed" and "train_fast.py is a single-process script" in log
    assert log.startswith("$ WORLD_SIZE=2 ") and row["command"].startswith("WORLD_SIZE=2 ")
    matrix = _matrix(tmp_path, '\n[[t.runs]]\nname = "bad"\nscript = "src/train.py"\nenv = {WORLD_SIZE = 2}\n')
    with pytest.raises(SystemExit):
        profiles.load_profile(matrix, "t")


def test_a_row_preloading_a_missing_library_is_skipped_with_the_reason():
    """An allocator row (env LD_PRELOAD) on a machine without the library is skipped, not run with glibc's malloc."""
    run_ = {"name": "jemalloc", "env": {"LD_PRELOAD": "/nonexistent/libjemalloc.so.2"}}
    assert profiles.skip_reason(run_, 0) == "LD_PRELOAD names /nonexistent/libjemalloc.so.2, which this machine does not have"
    assert profiles.skip_reason({"name": "glibc", "env": {"OMP_NUM_THREADS": "1"}}, 0) is None


# -- A run costs its steps: the fork server, the dry run, bench/lease.sh -----------------------------------------

import estimate  # noqa: E402
import zygote  # noqa: E402


def test_the_fork_server_checks_that_a_fork_copies_no_thread():
    """`zygote.clean_fork_check()`, which the server runs before it serves: None in a process whose only thread is
    the one that forks; a reason once another thread runs (a C++ object that owns a thread would be copied into the
    child without it, and could abort at exit). Shown in a bare interpreter (no numpy, so no OpenBLAS pool)."""
    code = (
        "import sys, threading, time; sys.path.insert(0, 'bench'); import zygote; print(zygote.clean_fork_check()); "
        "threading.Thread(target=time.sleep, args=(5,), daemon=True).start(); print(zygote.clean_fork_check())"
    )
    proc = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=60)
    first, second = proc.stdout.splitlines()
    assert first == "None" and second.startswith("2 threads at a fork"), proc.stdout + proc.stderr


def test_a_run_forked_from_the_server_trains_what_a_fresh_interpreter_trains(tmp_path):
    """train.py on 512 Fashion-MNIST images (8 steps, --deterministic, no workers) started by `bench/zygote.py
    --client` from a server that imported torch (as the bench starts its runs) and in a fresh interpreter: the same
    weights bit for bit, and the fork took the imports off the start-up (the server passed its clean-fork check)."""
    flags = ["--device", "cpu", "--subset", "512", "--epochs", "1", "--batch-size", "64", "--workers", "0",
             "--deterministic", "--log-every", "1000"]  # fmt: skip
    server = zygote.start(cwd=str(REPO))
    try:
        forked = subprocess.run(
            [sys.executable, "bench/zygote.py", "--client", "src/train.py", *flags, "--checkpoint-dir", tmp_path / "f"],
            cwd=REPO, env=server.env(), capture_output=True, text=True, timeout=300,
        )  # fmt: skip
    finally:
        server.close()
    fresh = subprocess.run([sys.executable, "src/train.py", *flags, "--checkpoint-dir", tmp_path / "n"], cwd=REPO,
                           capture_output=True, text=True, timeout=300)  # fmt: skip
    assert forked.returncode == fresh.returncode == 0, forked.stderr + fresh.stderr
    import torch

    a, b = (torch.load(tmp_path / d / "last.pt", weights_only=True)["model"] for d in ("f", "n"))
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    assert server.import_s > 0.3


def test_a_pair_whose_one_row_cannot_fork_starts_both_fresh():
    """runs.settle_fresh: a row whose environment changes what the server fixed (OMP_NUM_THREADS, torch's own
    variables) or a torchrun row
    starts fresh, and so does the row it is compared with (the two runs of a pair start the same way); a row in no
    such comparison still forks, and a row the matrix marks `fresh` leaves its partner forked (the fork-server
    profile compares the two ways on purpose)."""
    import pairs

    class Server:
        fixed = zygote.fixed_env(os.environ)

    def row(name, **keys):
        return {"name": name, "script": "src/train.py", "args": [name], "launcher": "python", **keys}

    threads = str(int(os.environ.get("OMP_NUM_THREADS", "1")) + 1)  # a thread count the server did not start with
    matrix = [
        row("a"), row("b", env={"OMP_NUM_THREADS": threads}, memory="m"), row("a2", memory="m"),
        row("c"), row("d", launcher="torchrun", rung_base="c"),
        row("e"), row("f", fresh=True, memory="n"), row("e2", memory="n"),
    ]  # fmt: skip
    marked = runs.settle_fresh(matrix, pairs.comparisons(matrix), Server())
    assert sorted(marked) == ["a2", "c"]
    # torch reads its own variables at import, in the server: a row that sets one starts fresh (a forked child's
    # TORCHINDUCTOR_FORCE_DISABLE_CACHES=1 would compile from the warm cache as if it were unset)
    for variable in ("TORCHINDUCTOR_FORCE_DISABLE_CACHES", "TORCH_LOGS", "PYTORCH_CUDA_ALLOC_CONF"):
        assert not runs.can_fork(row("g", env={variable: "1"}), Server()), variable
    assert [runs.forked(r, Server()) for r in matrix] == [True, False, False, False, False, True, False, True]


def test_the_estimate_reads_the_records_scales_the_batch_and_compiles_each_script_once(tmp_path):
    """bench/estimate.py on a folder of three recorded runs: train.py at batch 8 (0.1 s a step after a first step of
    2 s) and train_compile.py twice (a first step of 30 s from a cold cache, 5 s from a warm one). Planned, with the
    assumed 2 s outside training: train.py at batch 16 (0.2 s a step: 2 + 2 + 20 x 0.2 = 8 s), train_compile.py at
    batch 8 twice (cold 30, then warm 5, each + 2 + 20 x 0.1), train_fast.py at batch 8 (no record of its own: the
    same flags under train_compile.py, and its own first compile, cold: 34 s; on the H200 of 2026-11-28
    train_fast.py's ResNet-50 compiled 18 s after train_compile.py's 59, not a cache hit), and a model no folder
    ran, from its row's estimate_s [7, 3]."""
    folder = tmp_path / "gpu-x"
    folder.mkdir()
    recorded = [("a", "src/train.py", 2.0), ("c", "src/train_compile.py", 30.0), ("c", "src/train_compile.py", 5.0)]
    pd.DataFrame(
        [{"config": c, "status": "ok", "command": f"python {s} --model gpt2 --batch-size 8 --max-steps 11",
          "steps": 11, "train_s": first + 10 * 0.1, "first_step_s": first, "wall_s": first + 9} for c, s, first in recorded]
    ).to_csv(folder / "runs.csv", index=False)  # fmt: skip

    def row(name, script, batch, **keys):
        return {"name": name, "script": script, "args": ["--model", keys.pop("model", "gpt2"), "--batch-size", batch,
                                                         "--max-steps", "21"], **keys}  # fmt: skip

    rows = [row("t16", "src/train.py", "16"), row("c8", "src/train_compile.py", "8"),
            row("f8", "src/train_fast.py", "8"), row("new", "src/train.py", "8", model="gpt-wide", estimate_s=[7, 3])]  # fmt: skip
    import pairs

    jobs = [pairs.Job(name, 0, i) for i, name in enumerate(("t16", "c8", "c8", "f8", "new", "new"))]
    found, outside, note = estimate.estimate(jobs, {r["name"]: r for r in rows}, [folder])
    assert outside == estimate.ASSUMED_OUTSIDE_S == 2.0 and "assumed" in note
    assert [round(e.seconds, 6) for e in found] == [8.0, 34.0, 9.0, 34.0, 9.0, 5.0]
    assert "batch 16" in found[0].source and found[3].source.startswith("as ") and "assumed" in found[4].source


@pytest.mark.parametrize(
    "profile,rounds",
    [("gpu", 3), ("gpu-more", 3), ("gpu-rest", 3), ("gpu-compile", 3), ("chunked-ce-gpu", 2), ("flex-attention-gpu", 2),
     ("float8-gpu", 2)],  # fmt: skip
    ids=lambda p: f"profile={p}" if isinstance(p, str) else None,
)
def test_a_gpu_profile_s_dry_run_fits_8_minutes_on_the_recorded_h200_costs(profile, rounds):
    """`bench.py --profile gpu --dry-run --gpu-kind h200` (and gpu-more, gpu-rest and gpu-compile, a rented GPU's next
    quarter-hours, and the topics' GPU profiles: chunked-ce-gpu, flex-attention-gpu, float8-gpu): every planned run has
    an estimate from the results/ GPU folders' recorded runs (or its row's stated estimate_s), the profile's
    interleaved rounds (3, or the topics' 2) are all there, and the total, the bench's own seconds included, is at most 8
    minutes: what one quarter-hour of a rented GPU leaves room for (bench/lease.sh). A row added to the profile without
    a record or an estimate fails here."""
    proc = run("bench/bench.py", "--profile", profile, "--dry-run", "--gpu-kind", "h200", timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    total = int(re.search(r"estimated: [\d.]+ minutes \((\d+) s:", proc.stdout).group(1))
    assert "? s" not in proc.stdout and "not counted" not in proc.stdout
    assert set(re.findall(r"round +(\d+)", proc.stdout)) == {str(i) for i in range(rounds)}
    assert total <= 8 * 60, proc.stdout[-400:]


def test_the_lease_on_a_machine_without_a_gpu_is_one_line(tmp_path):
    proc = subprocess.run(["bash", "bench/lease.sh", "gpu"], cwd=REPO, env={**os.environ, "OUT": str(tmp_path)},
                          capture_output=True, text=True, timeout=120)  # fmt: skip
    assert proc.returncode == 2 and proc.stderr.strip() == "lease: error: torch sees no CUDA GPU here"


def test_a_sigterm_to_the_bench_s_process_group_ends_the_run_as_interrupted_not_failed(tmp_path):
    """`timeout` (bench/lease.sh), a terminal's hang-up or `kill -- -PGID` signal the whole process group: the bench,
    the client of the running run and, unless it has a session of its own, the fork server and the handler that
    waits on the run's child. The server starts in its own session: the client passes SIGTERM on to the child, the
    handler reports its death, and the run ends killed by SIGTERM (the bench's row: `interrupted`), not `failed` with
    the client's JSONDecodeError (the handler gone before it answered: the H200's last run, 2026-11-28)."""
    script = tmp_path / "sleeper.py"
    script.write_text("import time\nprint('running', flush=True)\ntime.sleep(60)\n")
    driver = (
        "import signal, subprocess, sys; sys.path.insert(0, 'bench'); import zygote\n"
        "signal.signal(signal.SIGTERM, lambda *_: None)  # this driver stands for the bench: it outlives the signal\n"
        "server = zygote.start(cwd='.')\n"
        f"client = subprocess.Popen([sys.executable, 'bench/zygote.py', '--client', {str(script)!r}], env=server.env(),"
        " stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)\n"
        "print(client.stdout.readline().strip(), flush=True)\n"
        "out, err = client.communicate(timeout=60)\n"
        "print(client.returncode, repr(err[-300:]), server.alive(), flush=True)\n"
        "server.close()\n"
    )  # fmt: skip
    proc = subprocess.Popen([sys.executable, "-c", driver], cwd=REPO, stdout=subprocess.PIPE, text=True,
                            start_new_session=True)  # fmt: skip
    try:
        assert proc.stdout.readline().strip() == "running"
        os.killpg(proc.pid, signal.SIGTERM)
        last = proc.communicate(timeout=90)[0].strip()
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert last.startswith(f"-{int(signal.SIGTERM)} ''") and last.endswith("True"), last


def test_a_transformer_s_throughput_rung_of_train_fast_or_cuda_graphs_runs_without_muon():
    """One technique per rung (issue 62). On a transformer (the GPTs, the ViT) train_fast.py, and train_cuda_graphs.py
    built on it, also swap AdamW for Muon on the blocks' matrices, whose gain is fewer steps to a loss and whose
    Newton-Schulz iterations cost time per step: a tokens/s row of theirs with Muon on measures two things. Every row of
    these two scripts on a transformer in bench/profiles.toml (the profile's args, then the row's, the last --model
    winning): judged by throughput (no --target-loss / --target-acc), it runs `--without muon` and its name says
    "without Muon"; with Muon on, it is judged by the time to a target and its name says "Muon"."""
    import tomllib

    import common

    matrix = tomllib.loads((REPO / "bench" / "profiles.toml").read_text())
    checked, problems = set(), []
    for profile, table in matrix.items():
        for row in table.get("runs", []):
            if Path(row["script"]).name not in ("train_fast.py", "train_cuda_graphs.py"):
                continue
            args = [*table.get("args", []), *row.get("args", [])]
            models = [value for flag, value in zip(args, args[1:]) if flag == "--model"]
            if not models or models[-1] not in ("vit", *common.TEXT_MODELS):
                continue  # the CNNs have no transformer block: no Muon
            checked.add(profile)
            muon_off = ("--without", "muon") in set(zip(args, args[1:]))
            to_target = "--target-loss" in args or "--target-acc" in args
            where = f"[{profile}] {row['name']}"
            if not muon_off and not to_target:
                problems.append(f"{where}: a throughput row with Muon on (add --without muon, or run it to a target)")
            if muon_off and "without Muon" not in row["name"]:
                problems.append(f"{where}: runs --without muon, its name does not say so")
            if not muon_off and ("Muon" not in row["name"] or "without Muon" in row["name"]):
                problems.append(f"{where}: Muon on, its name does not say so")
    assert not problems, "\n".join(problems)
    assert {"gpu", "gpu-rest", "gpu-full", "ladder-to-target"} <= checked  # the rows this rule is about were seen


def test_the_estimate_takes_a_row_one_without_apart_from_its_record(tmp_path):
    """A row that leaves one change out (`--without muon`) and has no record of its own takes the record of the same
    script and flags without it, one change apart (the GPU rows of train_fast.py recorded before it had Muon ran
    without it), not the slowest record of its model and shape (float8's, 10 times slower a step here)."""
    folder = tmp_path / "gpu-x"
    folder.mkdir()
    recorded = [("f", "src/train_fast.py", 0.1), ("8", "src/train_float8.py", 1.0)]
    pd.DataFrame(
        [{"config": c, "status": "ok", "command": f"python {s} --model gpt2 --batch-size 8 --max-steps 11",
          "steps": 11, "train_s": 5.0 + 10 * step, "first_step_s": 5.0, "wall_s": 20.0} for c, s, step in recorded]
    ).to_csv(folder / "runs.csv", index=False)  # fmt: skip
    row = {"name": "f-", "script": "src/train_fast.py", "args": ["--model", "gpt2", "--batch-size", "8", "--max-steps",
                                                                 "21", "--without", "muon"]}  # fmt: skip
    import pairs

    found, outside, _ = estimate.estimate([pairs.Job("f-", 0, 0)], {"f-": row}, [folder])
    assert found[0].seconds == pytest.approx(outside + 5.0 + 20 * 0.1)
    assert found[0].source == "as (but for --without) gpu-x: f"


def test_a_bench_under_isa_limits_compiles_into_a_cache_of_its_own(tmp_path):
    """torch 2.15 keys Inductor's graph cache without the vector instruction set, so a bench run with
    ATEN_CPU_CAPABILITY set (a CPU without bf16 instructions, imitated) gets TORCHINDUCTOR_CACHE_DIR of its own
    (common.env.limited_inductor_cache), recorded in env.json. Importing torch._inductor sets the variable to the
    default folder when it is unset: the bench's choice once lost to it, and the limited runs shared the default cache."""
    env = {k: v for k, v in os.environ.items() if k != "TORCHINDUCTOR_CACHE_DIR"}
    argv = ["--profile", "smoke", "--only", "train.py cnn, batch 128", "--repeats", "1", "--out", str(tmp_path)]
    done = run(str(BENCH / "bench.py"), *argv, env={**env, "ATEN_CPU_CAPABILITY": "avx2"})
    assert done.returncode == 0, done.stderr[-2000:]
    recorded = json.loads((tmp_path / "env.json").read_text())
    assert recorded["TORCHINDUCTOR_CACHE_DIR"].endswith("-avx2"), recorded["TORCHINDUCTOR_CACHE_DIR"]
    assert recorded["isa_limits"] == {"ATEN_CPU_CAPABILITY": "avx2"}
