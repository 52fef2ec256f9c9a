"""Benchmark runner: every configuration of a profile as a subprocess, repeated, then tables and plots.

    python bench/bench.py --profile smoke --out /tmp/smoke          # CPU, seconds per run (what the tests run)
    python bench/bench.py --profile cpu --out results/cpu-2core     # 2 cores: minutes (docs/bench.md, Profiles)
    python bench/bench.py --profile auto                            # gpu when CUDA is present, else cpu
    python bench/bench.py --profile cpu --out results/cpu-2core --resume   # after a crash or Ctrl-C: what is missing
    python bench/bench.py --profile cpu --out results/cpu-2core --only compile     # the configurations named so
    python bench/bench.py --profile cpu --out results/cpu-2core --tables-only      # tables again from runs.csv
    python bench/bench.py --profile cpu --out results/cpu-2core --max-floor 5      # stop where the floor passes ±5 %
    python bench/bench.py --out results/cpu-2core --floors-only     # floors.json of a folder written before it
    python bench/bench.py --profile gpu --dry-run                   # its runs and their estimated seconds, none run
    python bench/bench.py --peak-table results/gpu-h100-2026-11-23-ladder        # peak.md of a result folder

The matrix is data: bench/profiles.toml (or --matrix FILE). Each run gets a timeout, its own log in OUT/logs/ and
its metrics JSON in OUT/metrics/; a run that fails, runs out of memory or times out becomes a row with its status
(failed / oom / timeout) and its error line, and the others go on. runs.csv is rewritten after every run, so Ctrl-C
(or a crash of the runner) keeps the finished rows, and --resume skips the runs that are already there. Writes into
OUT, each file atomically:
runs.csv (one row per run), summary.csv (one row per configuration: median and min-max over the repeats, speed-up
vs its baseline, over its rung's base, of its ceiling, and what limited it), floors.json (the noise floors and each
comparison's ratio, spread and verdict as data: what results/README.md and the pages read), table.md, ladder.md and
ladder.png (the profile's speed-up ladders: each rung with its speed-up over its base and over the first rung),
env.json (versions, hardware, CPU instruction sets, git commit, the rounds asked, --max-floor, and the device's
measured dense matmul peak per dtype, `gemm_peak_tflops`), the plots throughput.png, accuracy_vs_time.png, memory.png, data_wait.png and sweeps.png (the
workers and batch-size sweeps), and, into a folder of one's own (results/local/ or outside results/), index.html with
one side-by-side page per technique (bench/pages/diff_pages.py) with this run's speed-ups: a committed folder under
results/ gets none (`python bench/pages/diff_pages.py --out DIR --results FOLDER` writes them). docs/bench.md
describes every flag, profile key, column and metrics key.

bench/ holds the runner and its reports at its top, and one folder per other job:

    bench.py     the entry point and the flow (it puts src/ and bench/pages/ on the path before it imports the rest)
    profiles.py  the matrix: load_profile (checked whole before any run), skip_reason, KNOBS, fail
    pairs.py     interleaved pairs: plan (the order of the runs), assess (disturbed pairs), reruns_due, pair_ratios,
                 noise_floor, the verdicts, --max-floor's refusal, floors.json (floors_record, read_floors)
    runs.py      one run: command, execute (a subprocess in its own session, timeout, log, metrics JSON), Stop (the
                 signals, read at safe points), end_run, finished_rows (--resume)
    summary.py   from runs to configurations: summarise (medians, ratios to the baseline, the rung's base, the
                 ceiling, the whole), limited_by
    peak.py      the measured matmul peak per dtype (measure_gemm_peak, in a child process), datasheet peaks, of_peak,
                 count_flops_per_image
    cells.py     a table cell's text (numbers, ratios, statuses) and the hardware line
    tables.py    table.md, ladder.md, the memory / sweep / ablation / input-pipeline tables, peak.md
    terminal.py  what a run prints at its end: each rung's ratio and verdict, the noise floor, where the files are
    plots.py     the PNGs: throughput, accuracy vs time, memory, data-wait, ladder, sweeps
    zygote.py    the fork server single-process runs start from (torch imported once; the clean-fork check)
    estimate.py  --dry-run: each planned run's seconds from the recorded runs of earlier result folders
    setup.sh, python.sh, activate.sh, lease.sh   the user's entry scripts: set-up, its Python, a rented GPU
    pages/       the pages' generators and checks: pages.py (the README's and the technique pages' generated blocks),
                 results_index.py (results/README.md), diff_pages.py (the side-by-side pages), check_markers.py (the
                 `# new #` convention, the chains), readme_table.toml (which folder row each README cell quotes)
    prepare/     the data: prepare_data.py (the JPEG ImageFolders), prepare_text.py (Shakespeare)
    studies/     one-off studies, each of which made a results folder (studies/README.md: which, and the command)
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
from datetime import datetime, timezone
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(REPO / "bench" / "pages"), str(REPO / "src")]  # bench/pages: diff_pages; src: common

import diff_pages  # noqa: E402
import estimate  # noqa: E402
import pandas as pd  # noqa: E402
import torch  # noqa: E402
from cells import RATIO_STATISTICS, hardware_line, provenance_line, rate_text  # noqa: E402
from peak import gemm_peak_in_a_child, peak_line  # noqa: E402
import floors  # noqa: E402
import pairs  # noqa: E402
from plots import plot  # noqa: E402
from profiles import fail, load_profile, skip_reason  # noqa: E402
from runs import Stop, command, execute, finished_rows, relabel, run_paths, settle_fresh  # noqa: E402
from summary import floor_comparisons, summarise, summary_floors  # noqa: E402
from tables import ladder_markdown, noise_line, peak_table, table_markdown  # noqa: E402
from terminal import end_of_run  # noqa: E402
from tqdm import tqdm  # noqa: E402
import zygote  # noqa: E402

import common  # noqa: E402


def holds_side_by_side_pages(out: Path) -> bool:
    """Whether the bench writes the side-by-side pages (index.html, diff-*.html, chain-*.html) into `out`: into a
    folder outside results/ or under results/local/ (not committed), not into a folder to be committed under results/,
    which the pages would tie to one commit's scripts (tests/test_docs.py refuses them there)."""
    results = (REPO / "results").resolve()
    out = Path(out).resolve()
    return not out.is_relative_to(results) or out.is_relative_to(results / "local")


def write_csv(frame: pd.DataFrame, path: Path) -> None:
    common.io.atomic_write_text(path, frame.to_csv(index=False))


def write_tables(
    out: Path, runs: pd.DataFrame, matrix: list[dict], env: dict, profile: str, stopped: str | None = None
) -> pd.DataFrame:
    """summary.csv, pairs.csv (each pair's ratio), table.md, floors.json, ladder.md and the plots and pages, from the
    runs (one row per run), the pairs the runs made (OUT/pairs.csv, written when the runs were planned; none in a
    folder older than the pairs) and the matrix (order, ladders, comparisons); `env` is the machine's (env.json, with
    the rounds asked, `pairs_asked`, and --max-floor as a fraction, `max_floor`); `stopped`: why the runs stopped
    before the plan's end (None: they did not, or it is not known). A noise floor past `max_floor` gives no
    comparison a verdict. Returns the summary."""
    for key in ["status", "reason", "dataset", "epochs", "images_per_s", "job"]:
        if key not in runs:
            runs[key] = None
    try:
        plan = pairs.read_plan(pd.read_csv(out / "pairs.csv"))
    except (OSError, pd.errors.EmptyDataError, AttributeError, ValueError):
        plan = []  # a folder from before the pairs: its tables show no ratio
    runs = relabel(runs)  # labels an older commit's scripts got wrong, from each run's command line
    ratios = pairs.pair_ratios(runs, plan)  # the undisturbed pairs' ratios (pairs.assess)
    self_pairs = [c for c in ratios if pairs.is_self_pair(c, matrix)]
    floor = pairs.noise_floor([r for c in self_pairs for r in ratios[c]])
    noise = {"floor": floor, "self_pairs": [(c.row, c.reference, ratios[c]) for c in self_pairs]}
    target = pairs.pair_ratios(runs, plan, to_target=True)  # runs to a target: their times to it, in the same pairs
    target_floor = pairs.noise_floor([r for c in target if pairs.is_self_pair(c, matrix) for r in target[c]])
    if any(target.values()):
        noise["target_floor"] = target_floor
        noise["target_self_pairs"] = [(c.row, c.reference, target[c]) for c in target if pairs.is_self_pair(c, matrix)]
    to_target = (target, target_floor, pairs.disturbed_counts(runs, plan, to_target=True))
    max_floor = env.get("max_floor")
    refused = pairs.refusal(floor, max_floor)  # a floor past --max-floor: no verdict for any comparison
    summary = summarise(runs, matrix, ratios, floor, pairs.disturbed_counts(runs, plan), to_target, refused)
    write_csv(summary, out / "summary.csv")
    write_csv(pairs.plan_table(plan, runs), out / "pairs.csv")  # the plan again, each pair's ratio beside it
    asked, ran = pairs.pairs_ran(runs, plan, env.get("pairs_asked"))
    if stopped is None and refused:
        stopped = pairs.too_busy(floor, max_floor)
    elif stopped is None and ran is not None and ran < asked:
        stopped = "the runs ended before the plan did (why is not recorded in runs.csv)"
    stop = ""  # the tables' line on a stop: how far the pairs got, and why
    if stopped and ran is not None and ran < asked:
        stop = f"Stopped after {ran} of {asked} pairs a comparison: {stopped}."
    elif refused:
        stop = f"No verdict: {stopped}."
    repeats = sorted({run["repeats"] for run in matrix})
    table_md = table_markdown(summary, env, profile, " / ".join(map(str, repeats)) + " run(s)", noise, out, stop)
    common.io.atomic_write_text(out / "table.md", table_md)
    record = floors.floors_record(
        floor,
        floor_comparisons(summary, list(dict.fromkeys(c for c, *_ in plan)), floor, noise.get("target_floor"), target),
        "bench/bench.py",
        target_floor=noise.get("target_floor"),
        pairs_asked=asked,
        pairs_run=ran,
        stopped=stopped,
        max_floor=max_floor,
    )
    common.io.atomic_write_text(out / floors.FLOORS, floors.floors_text(record))  # the floors and verdicts as data
    ladders = ladder_markdown(summary, env)
    if ladders:
        common.io.atomic_write_text(
            out / "ladder.md",
            f"# Speed-up ladders, profile `{profile}`\n\n{hardware_line(env)}\n\n{provenance_line(out, env)}\n\n"
            f"{noise_line(noise)}\n\n" + (f"{stop}\n\n" if stop else "") + f"{RATIO_STATISTICS}\n\n{ladders}",
        )
    plot(summary, runs, out, f"profile {profile}, {hardware_line(env).split(' · ')[0]}", floor)
    if holds_side_by_side_pages(out):
        diff_pages.write(out, [out])  # index.html: each technique's side-by-side page with this run's speed-up
    print(end_of_run(summary, env, noise, out))  # the wide tables stay in table.md: a terminal gets what pays here
    return summary


def parse_args() -> tuple[argparse.ArgumentParser, argparse.Namespace]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--profile",
        default="auto",
        help="smoke, cpu, gpu or any profile of --matrix; auto: gpu when torch sees a CUDA GPU, else cpu (with "
        "--tables-only: the profile the folder's env.json names)",
    )
    parser.add_argument("--out", type=Path, default=None, help="result folder (default: results/local/PROFILE)")
    parser.add_argument(
        "--repeats", type=int, default=None, help="runs of each configuration in no comparison (default: the profile's)"
    )
    parser.add_argument(
        "--pairs",
        type=int,
        default=None,
        help="interleaved rounds: pair ratios per comparison (default: the profile's `pairs`)",
    )
    parser.add_argument("--matrix", type=Path, default=REPO / "bench" / "profiles.toml", help="the profiles (TOML)")
    parser.add_argument("--python", default=sys.executable, help="interpreter for the scripts")
    parser.add_argument(
        "--fresh",
        action="store_true",
        help="start every run in a fresh interpreter (default on Linux: single-process runs fork from a server that "
        "has imported torch once, bench/zygote.py; torchrun's runs always start fresh)",
    )
    parser.add_argument(
        "--only", action="append", default=None, help="run only configurations whose name contains this (repeatable)"
    )
    parser.add_argument(
        "--resume",
        action="store_true",
        help="keep the ok runs already in OUT/runs.csv (same command, metrics JSON present) and run only the others",
    )
    parser.add_argument(
        "--dry-run",
        action="store_true",
        help="run nothing: print the runs the profile would make, in order, and each one's estimated seconds from the "
        "recorded runs of earlier result folders (--costs), and the total",
    )
    parser.add_argument(
        "--costs",
        type=Path,
        action="append",
        default=None,
        help="with --dry-run: a result folder whose runs.csv gives the recorded costs (repeatable; default: every GPU "
        "folder under results/ for a GPU profile, the GPU kind of --gpu-kind first)",
    )
    parser.add_argument(
        "--gpu-kind", default=None, help="with --dry-run: the GPU whose records come first (h100, h200; default: any)"
    )
    parser.add_argument(
        "--tables-only",
        action="store_true",
        help="run nothing: write the tables, plots and pages of OUT from its runs.csv and env.json (e.g. after the "
        "runner itself was killed before it wrote them)",
    )
    parser.add_argument(
        "--max-floor",
        type=float,
        default=None,
        metavar="PCT",
        help="stop once the self pairs' noise floor is measured (3 undisturbed pairs) and past ±PCT %%: the host is "
        "too busy for verdicts; the tables of what ran say no verdict (default: never stop)",
    )
    parser.add_argument(
        "--floors-only",
        action="store_true",
        help="run nothing: write OUT/floors.json (the noise floors and each comparison's ratio, spread and verdict) "
        "from OUT's summary.csv, pairs.csv, runs.csv and env.json, as its tables gave them, for a folder written "
        "before the bench wrote floors.json; nothing else is written",
    )
    parser.add_argument(
        "--peak-table",
        type=Path,
        metavar="OUT",
        help="run nothing: write OUT/peak.md, where OUT's rows stand against the datasheet and measured peaks (FLOPs "
        "per image counted here for runs made before the runs counted them)",
    )
    args = parser.parse_args()
    if args.repeats is not None and args.repeats < 1:
        parser.error("--repeats must be 1 or more")
    if args.pairs is not None and args.pairs < 1:
        parser.error("--pairs must be 1 or more")
    if args.max_floor is not None and not 0 < args.max_floor < float("inf"):
        parser.error(f"--max-floor must be a percentage above 0, not {args.max_floor:g}")
    if args.floors_only and args.out is None:
        parser.error("--floors-only needs --out FOLDER (a result folder with summary.csv)")
    return parser, args


def write_peak_table(folder: Path) -> None:
    """--peak-table: folder/peak.md from a result folder's runs (nothing runs)."""
    try:
        text = peak_table(folder)
    except (OSError, ValueError, KeyError) as error:
        fail(f"--peak-table needs a result folder with runs.csv, metrics/ and env.json ({error})")
    common.io.atomic_write_text(folder / "peak.md", text)
    print(text)


def the_matrix(parser: argparse.ArgumentParser, args: argparse.Namespace, gpus: int, bf16: bool):
    """(profile name, its table, its runs as --only and --repeats leave them, with a self pair, the interleaved
    rounds): the profile is the folder's own with --tables-only, else --profile (auto: gpu with CUDA, else cpu)."""
    if args.tables_only and args.profile == "auto" and args.out and (args.out / "env.json").is_file():
        with contextlib.suppress(OSError, ValueError):  # the folder's own profile, not this machine's
            args.profile = json.loads((args.out / "env.json").read_text()).get("profile") or "auto"
    profile = args.profile if args.profile != "auto" else ("gpu" if gpus else "cpu")
    table = load_profile(args.matrix, profile)
    matrix = table["runs"]
    if args.only:
        matrix = [run for run in matrix if any(part in run["name"] for part in args.only)]
        if not matrix:
            parser.error(f"no configuration of profile {profile!r} matches --only {' / '.join(args.only)}")
    if args.repeats:
        for run in matrix:
            run["repeats"] = args.repeats
    rounds = args.pairs or table.get("pairs", pairs.MIN_PAIRS)  # fewer than 3 pairs give no verdict
    added = pairs.ensure_self_pair(matrix)  # no verdict without a noise floor: a matrix without a self pair gets one
    if added:
        print(f"bench: the matrix compares rows but has no self pair: added {added!r} (the noise floor)", flush=True)
    for run in matrix:
        if run.get("without_bf16") and not bf16:  # emulated bfloat16 is several times slower: run it shorter
            run["args"] = [*run["args"], *map(str, run["without_bf16"])]
            shorter = " ".join(map(str, run["without_bf16"]))
            run["note"] = (
                run.get("note", "") + f" bf16 emulated on this CPU (no bf16 instructions): shorter ({shorter})"
            ).strip()
    return profile, table, matrix, rounds


def tables_again(out: Path, matrix: list[dict], profile: str) -> None:
    """--tables-only: the tables, plots and pages of `out` from its runs.csv and env.json (nothing runs); why the
    runs stopped early, where they did, from its floors.json (a malformed one is rewritten without it)."""
    try:
        runs, env = pd.read_csv(out / "runs.csv", dtype={"config": str}), json.loads((out / "env.json").read_text())
    except (OSError, ValueError) as error:
        fail(f"--tables-only needs {out}/runs.csv and env.json from an earlier run ({error})")
    try:
        stopped = (floors.read_floors(out) or {}).get("stopped")
    except ValueError:
        stopped = None
    write_tables(out, runs, matrix, env, env.get("profile", profile), stopped)


def floors_again(out: Path) -> None:
    """--floors-only: `out`/floors.json from its summary.csv (each comparison's cells, the floors from its self
    pairs' min-max: summary.summary_floors), pairs.csv (which comparisons, the rounds), runs.csv (the pairs that ran)
    and env.json (the rounds asked, --max-floor), as its tables gave them: for a folder written before the bench
    wrote floors.json. Nothing runs and no other file changes. Exits with one line where one of them is missing or
    unreadable."""
    try:
        summary = pd.read_csv(out / "summary.csv", dtype={"config": str})
        plan = pairs.read_plan(pd.read_csv(out / "pairs.csv")) if (out / "pairs.csv").is_file() else []
        runs = pd.read_csv(out / "runs.csv") if (out / "runs.csv").is_file() else None
        env = json.loads((out / "env.json").read_text())
        env.get("pairs_asked")  # AttributeError where env.json is not a JSON object
    except (OSError, ValueError, AttributeError, KeyError, pd.errors.EmptyDataError) as error:
        fail(f"--floors-only needs {out}/summary.csv, pairs.csv, runs.csv and env.json from a bench run ({error})")
    try:
        before = floors.read_floors(out)  # a stop's reason, where an earlier floors.json said it
    except ValueError:
        before = None  # malformed: rewritten whole
    floor, target_floor = summary_floors(summary)
    asked, ran = pairs.pairs_ran(runs, plan, env.get("pairs_asked"))
    stopped = (before or {}).get("stopped")
    if stopped is None and ran is not None and ran < asked:
        stopped = "the runs ended before the plan did (why is not recorded in runs.csv)"
    comparisons = floor_comparisons(summary, list(dict.fromkeys(c for c, *_ in plan)), floor, target_floor)
    record = floors.floors_record(
        floor, comparisons, "bench/bench.py --floors-only", target_floor=target_floor, pairs_asked=asked,
        pairs_run=ran, stopped=stopped, max_floor=env.get("max_floor"),
    )  # fmt: skip
    common.io.atomic_write_text(out / floors.FLOORS, floors.floors_text(record))
    print(f"bench: wrote {out / floors.FLOORS}")


def dry_run(args: argparse.Namespace, profile: str, matrix: list[dict], rounds: int, gpus: int, bf16: bool) -> None:
    """--dry-run: the plan of the profile (as this machine would run it, or as a GPU machine would for a profile
    whose rows need one) with each run's estimated seconds, printed; nothing runs."""
    needs_gpu = any(run.get("requires") == "cuda" or "cuda" in run["args"] for run in matrix)
    skipped = {run["name"] for run in matrix if skip_reason(run, max(gpus, int(needs_gpu)), bf16)}
    jobs, _ = pairs.plan(matrix, rounds, skipped)
    folders = args.costs or estimate.cost_folders(args.gpu_kind)
    for folder in args.costs or []:  # a folder given by hand must hold recorded runs
        if not (folder / "runs.csv").is_file() and not any(folder.rglob("*.json")):
            fail(f"--costs {folder} holds no recorded runs (a result folder with runs.csv or metrics JSON files)")
    found, _, note = estimate.estimate(jobs, {run["name"]: run for run in matrix}, folders)
    print(estimate.dry_run_text(profile, found, note))


def bench_environment(args: argparse.Namespace, profile: str, gpus: int, table: dict) -> dict:
    """env.json: the machine and software (common.env), the profile and matrix, the start time, the command line and
    the device's measured matmul peak per dtype (once per bench run, before the matrix: what the of-peak columns
    divide by)."""
    matrix = args.matrix.resolve()
    return {
        **common.env.environment(),
        "profile": profile,
        "matrix": str(matrix.relative_to(REPO)) if matrix.is_relative_to(REPO) else str(args.matrix),
        "started": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "command": sys.argv,
        "gemm_peak_tflops": gemm_peak_in_a_child(args.python, gpus, float(table.get("gemm_seconds", 1.0))),
    }


CUDA_AFTER_FORK = "import torch\ntorch.zeros(1, device='cuda').add_(1).cpu()\n"  # a forked child starts CUDA


def fork_server(args: argparse.Namespace, gpus: int):
    """The fork server the single-process runs start from (bench/zygote.py), or None with a line saying why: --fresh,
    not Linux, a server that failed its clean-fork check, or (on a machine with a GPU) a forked child that could not
    start CUDA."""
    if args.fresh or sys.platform != "linux":
        return None
    try:
        server = zygote.start(python=args.python, cwd=str(REPO))
    except (zygote.Unclean, OSError) as error:
        print(f"bench: every run starts a fresh interpreter: the fork server did not start cleanly ({error})")
        return None
    if gpus:
        import subprocess
        import tempfile

        with tempfile.NamedTemporaryFile("w", suffix=".py") as probe:
            probe.write(CUDA_AFTER_FORK)
            probe.flush()
            launch = [args.python, str(REPO / "bench" / "zygote.py"), "--client", probe.name]  # as execute() does
            done = subprocess.run(launch, env=server.env(), capture_output=True, text=True, timeout=120)
        if done.returncode != 0:
            server.close()
            print(f"bench: every run starts a fresh interpreter: a forked child could not start CUDA "
                  f"({(done.stderr.strip().splitlines() or ['?'])[-1]})")  # fmt: skip
            return None
    print(f"bench: single-process runs fork from a server that imported torch once ({server.import_s:.1f} s each "
          "spared; --fresh: none)", flush=True)  # fmt: skip
    return server


class Matrix:
    """The runs of one bench run and their rows: `run_all` runs the interleaved plan (or takes a finished run from
    --resume), `rerun_disturbed` the disturbed pairs again; runs.csv and pairs.csv are rewritten after every run.
    `server`: the fork server single-process runs start from (None: each in a fresh interpreter). With --max-floor,
    both stop once the self pairs' floor is measured and past it (`too_busy`); `stopped` then says so."""

    def __init__(self, args, matrix: list[dict], rounds: int, skipped: dict, out: Path, gpus: int, stop, server=None):
        self.args, self.out, self.gpus, self.stop, self.rounds = args, out, gpus, stop, rounds
        self.server, self.matrix, self.stopped = server, matrix, None
        self.jobs, self.plan = pairs.plan(matrix, rounds, set(skipped))
        write_csv(pairs.plan_table(self.plan), out / "pairs.csv")  # which runs pair up: the tables read it back
        self.by_name, self.seen = {run["name"]: run for run in matrix}, {}
        self.rows = [{"config": name, "repeat": 1, "status": "skipped", "reason": why} for name, why in skipped.items()]
        self.done = finished_rows(out) if args.resume else {}

    def too_busy(self, job: int, bar) -> bool:
        """Whether to stop after job `job`: --max-floor is given, the job is a self pair's run, and the self pairs'
        floor from the rows so far (pairs.floor_now, what the tables will print) is measured and past it; then
        `stopped` says so and a progress line prints it."""
        if self.args.max_floor is None or self.stopped is not None:
            return self.stopped is not None
        if not any(job in (a, b) for c, _, a, b in self.plan if pairs.is_self_pair(c, self.matrix)):
            return False
        floor, most = pairs.floor_now(pd.DataFrame(self.rows), self.plan, self.matrix), self.args.max_floor / 100
        if pairs.refusal(floor, most) is None:
            return False
        self.stopped = pairs.too_busy(floor, most)
        bar.write(f"bench: {self.stopped}; stopping")
        return True

    def _run(self, name: str) -> tuple[dict, int]:
        run, k = self.by_name[name], self.seen.get(name, 0) + 1  # k: this row's k-th run
        self.seen[name] = k
        return run, k

    def _keep(self, row: dict) -> None:
        self.rows.append(row)
        write_csv(pd.DataFrame(self.rows), self.out / "runs.csv")  # after every run: an interruption keeps the rest

    def run_all(self, bar) -> None:
        for job in bar:
            if self.stop.signal is not None:
                break
            run, k = self._run(job.config)
            bar.set_description(f"{run['name']} r{k}")
            previous = self.done.get((run["name"], k))
            same = " ".join(command(run, run_paths(run, k, self.out)[1], self.args.python, self.gpus))
            if previous and previous.get("command") == same:
                row = previous  # --resume: this run already finished with the same command
            else:
                row = execute(run, k, self.out, self.args.python, self.gpus, self.stop, self.server)
            row.update(job=job.index, round=job.round)
            self._keep(row)
            bar.write(
                f"{row['config']} r{k}: {row['status']}"
                + (" (already there, --resume)" if row is previous else "")
                + (f", {rate_text(row)}" if pd.notna(row.get("images_per_s") or None) else "")  # tokens/s for a GPT
                + (f" ({row['reason']})" if isinstance(row.get("reason"), str) and row["reason"] else "")
            )
            if self.too_busy(job.index, bar):
                break

    def rerun_disturbed(self, bar, most: int) -> None:
        """A pair that one of its runs' scatter or its distance from its siblings marks as disturbed (pairs.assess) is
        run again, its two runs next to each other, up to `most` times per comparison (the profile's `reruns`); a
        comparison still short of undisturbed pairs reads "disturbed"."""
        done_reruns, extra_round = {}, self.rounds
        while self.stop.signal is None and self.stopped is None and most > 0:
            due = pairs.reruns_due(pd.DataFrame(self.rows), self.plan, self.rounds, done_reruns, most)
            if not due:
                break
            for comparison, why in due:
                if self.stop.signal is not None or self.stopped is not None:
                    break
                done_reruns[comparison] = done_reruns.get(comparison, 0) + 1
                bar.write(f"bench: re-running {comparison.row} against {comparison.reference}: {why}")
                order = [comparison.row, comparison.reference]
                if done_reruns[comparison] % 2 == 0:
                    order.reverse()  # alternate which of the two runs first
                indices = {}
                for name in order:
                    run, k = self._run(name)
                    row = execute(run, k, self.out, self.args.python, self.gpus, self.stop, self.server)
                    indices[name] = len(self.jobs)
                    row.update(job=len(self.jobs), round=extra_round)
                    self.jobs.append(pairs.Job(name, extra_round, len(self.jobs)))
                    self._keep(row)
                    bar.write(f"{row['config']} r{k} (re-run): {row['status']}")
                self.plan.append((comparison, extra_round, indices[comparison.row], indices[comparison.reference]))
                write_csv(pairs.plan_table(self.plan), self.out / "pairs.csv")
                self.too_busy(indices[comparison.row], bar)  # a self pair's re-run may give the floor
            extra_round += 1


def main() -> None:
    parser, args = parse_args()
    if args.peak_table:
        return write_peak_table(args.peak_table)
    if args.floors_only:
        return floors_again(args.out)
    gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    bf16 = common.native_bfloat16(torch.device("cpu"))  # the scripts' own test: instructions, and oneDNN let use them
    profile, table, matrix, rounds = the_matrix(parser, args, gpus, bf16)
    if args.dry_run:
        return dry_run(args, profile, matrix, rounds, gpus, bf16)
    out = args.out or REPO / "results" / "local" / profile
    problem = common.output_problem(out, is_folder=True)  # before any run: a folder it can write
    if problem:
        fail(f"--out {out} {problem}")
    if args.tables_only:
        return tables_again(out, matrix, profile)

    # A compiling run starts torch.compile's pool of compile workers at its first compile (one per core, each its own
    # Python), and a run whose graphs the cache already holds ends while they are still starting and waits for them:
    # 8 to 12 s at the exit of each such run on the 16-core H200 of 2026-11-28 (runs.csv's after_s), 0.3 s
    # without compiling. TORCH_WARM_POOL=0 (torch._dynamo's inductor backend reads it) starts the pool only when a
    # graph must be compiled; the steps do not change. A value set by the caller wins; env.json records it.
    os.environ.setdefault("TORCH_WARM_POOL", "0")
    limited_cache = common.env.limited_inductor_cache()
    # ISA limits (a CPU without bf16 instructions): a cache of their own; a value set by the caller wins
    if limited_cache:
        os.environ.setdefault("TORCHINDUCTOR_CACHE_DIR", limited_cache)
    env = bench_environment(args, profile, gpus, table)
    env["pairs_asked"] = rounds  # the interleaved rounds planned: floors.json says how many a stop left
    env["max_floor"] = args.max_floor / 100 if args.max_floor is not None else None  # the tables read it back
    env["TORCH_WARM_POOL"] = os.environ["TORCH_WARM_POOL"]
    env["TORCHINDUCTOR_CACHE_DIR"] = os.environ.get("TORCHINDUCTOR_CACHE_DIR")
    print(f"bench: measured matmul peak {peak_line(env)}", flush=True)
    common.io.atomic_write_text(out / "env.json", json.dumps(env, indent=2) + "\n")
    skipped = {run["name"]: reason for run in matrix if (reason := skip_reason(run, gpus, bf16))}
    server = fork_server(args, gpus)
    settle_fresh(matrix, pairs.comparisons(matrix), server)  # a pair's two runs start the same way
    with Stop() as stop, contextlib.ExitStack() as cleanup:  # Ctrl-C and SIGTERM stop the matrix at a safe point
        if server is not None:
            cleanup.callback(server.close)
        runs = Matrix(args, matrix, rounds, skipped, out, gpus, stop, server)
        print(
            f"bench: profile {profile}, {len(matrix)} configurations, {len(runs.jobs)} runs ({len(runs.plan)} pairs in "
            f"{rounds} interleaved rounds) -> {out}",
            flush=True,
        )
        bar = tqdm(runs.jobs, unit="run", dynamic_ncols=True)
        runs.run_all(bar)
        runs.rerun_disturbed(bar, int(table.get("reruns", 2)))
        if stop.signal is not None:
            print(
                f"bench: interrupted ({stop.name}); writing the rows that finished (add --resume to run the rest)",
                file=sys.stderr,
                flush=True,
            )
        frame = pd.DataFrame(runs.rows)
        write_csv(frame, out / "runs.csv")
        stopped = runs.stopped or (f"interrupted ({stop.name})" if stop.signal is not None else None)
        summary = write_tables(out, frame, matrix, env, profile, stopped)
    if stop.signal is not None:
        raise SystemExit(128 + stop.signal)  # the shell's code for a signal: 130 for Ctrl-C, 143 for SIGTERM, 129 HUP
    if runs.stopped is not None:  # --max-floor: the rows after the stop did not run, by design
        print(f"bench: stopped: {runs.stopped} (the tables of what ran say no verdict)", file=sys.stderr)
        raise SystemExit(3)
    failed = (summary.status != "ok") & (summary.status != "skipped")
    if failed.any():
        print(f"bench: {failed.sum()} configuration(s) did not finish: see their logs in {out / 'logs'}",
              file=sys.stderr)  # fmt: skip
        raise SystemExit(1)


if __name__ == "__main__":
    try:
        main()
    except common.io.WriteFailed as error:  # disk full, I/O error: the file named, its previous version left as it was
        print(f"bench.py: error: {error}", file=sys.stderr)
        raise SystemExit(1) from None
    except KeyboardInterrupt:  # Ctrl-C before the matrix starts (reading the profile, the environment): no run yet
        print("bench.py: interrupted before any run (Ctrl-C)", file=sys.stderr)
        raise SystemExit(130) from None
