"""What a profile costs before it runs (`bench.py --dry-run`): every planned run in order with its estimated seconds,
from recorded runs of the same configuration in earlier result folders (their runs.csv), and the total.

A run's seconds = the time outside its training (start-up, evaluation, exit) + its first step (where torch.compile
compiles and cuDNN autotunes: from a cold cache in the configuration's first run, from the cache after) + its other
steps x the recorded time per step. A configuration is matched to the recorded runs by its script and the flags that
set its work (`WORK`: model, data, shape, precision, attention ...). One that no folder ran takes the slowest recorded
configuration of the same model and shape under another script or precision ("like ..."), plus the slowest compile
recorded for that model where its script compiles and the match does not; one with neither is "no record" and the
estimate says so rather than guess. Runs recorded on another GPU kind serve too (an H100's for an H200: slower, so
the estimate errs long), and each line names its source.
"""

from __future__ import annotations

import json
import math
import re
import shlex
import statistics
from dataclasses import dataclass
from pathlib import Path

import pandas as pd

REPO = Path(__file__).resolve().parent.parent
# The flags that set what a step computes, and so its time; the others (steps, logging, seeds) do not.
WORK = ("--model", "--dataset", "--batch-size", "--seq-len", "--image-size", "--amp-dtype", "--attention", "--batching",
        "--compile-mode", "--compile-regions", "--without", "--micro-batches", "--accum-steps", "--recompute-every",
        "--channels-last", "--float8-recipe", "--width")  # fmt: skip
SHAPE = ("--model", "--dataset", "--batch-size", "--seq-len", "--image-size")  # what "like" keeps
BOOLEAN = {"--compile-regions", "--channels-last"}  # flags without a value
COMPILING = {"train_compile.py", "train_fast.py", "train_cuda_graphs.py", "train_float8.py"}  # compile at step 1
# Outside the training loop, a run forked from the bench's server spends the project's imports, the data, the model,
# CUDA's start, the evaluation, the metrics (with an nvidia-smi call) and its exit. Where no GPU folder has recorded it
# (runs.csv's `started` says forked), the estimate assumes this many seconds: forked from the server on this
# project's 2-core CPU, the GPT-2 and ResNet-50 rows' start-up took 0.8 and 0.3 s (the model's initialisation on the
# host; docs/bench.md), and a CUDA context's start and teardown and the nvidia-smi call about 1 s more.
ASSUMED_OUTSIDE_S = 2.0
FIXED_S = 25.0  # the bench's own: its matmul-peak probe (a child process, 1 s a dtype), the fork server, the tables


def work_key(script: str, args: list[str]) -> tuple:
    """(script's file name, ((flag, value), ...)) of the WORK flags in `args` (the last of a repeated flag; a
    repeatable --without keeps all): two runs with the same key compute the same steps."""
    found: dict[str, str] = {}
    withouts = []
    for i, word in enumerate(args):
        if word not in WORK:
            continue
        value = "" if word in BOOLEAN else (args[i + 1] if i + 1 < len(args) else "")
        if word == "--without":
            withouts.append(value)
        else:
            found[word] = value
    if withouts:
        found["--without"] = ",".join(sorted(withouts))
    return Path(script).name, tuple(sorted(found.items()))


def shape_of(key: tuple) -> tuple:
    return tuple(item for item in key[1] if item[0] in SHAPE)


def split_command(command: str) -> tuple[str, list[str]] | None:
    """(script, its args) of a recorded command line (runs.csv's `command`: env assignments, the interpreter or
    torchrun, the script, its flags); None if no .py file is in it."""
    words = shlex.split(command)
    at = next((i for i, w in enumerate(words) if w.endswith(".py") and not w.endswith("run.py")), None)
    return (words[at], words[at + 1 :]) if at is not None else None


@dataclass
class Recorded:
    """What the runs of one configuration in a folder took: seconds per step after the first, the first step from a
    cold cache (the configuration's slowest) and from a warm one (its fastest), and the seconds outside training."""

    step_s: float
    first_cold_s: float
    first_warm_s: float
    outside_s: float | None
    forked: bool
    source: str


def _number(value) -> bool:
    """Whether a metrics value is a finite number (not a bool, a string, a list...)."""
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


def _records(folder: Path) -> pd.DataFrame:
    """The runs a folder recorded: its runs.csv, or where it has none (a probe's folder), its metrics JSON files
    (their own `command`; no wall time, so no time outside training)."""
    try:
        return pd.read_csv(folder / "runs.csv")
    except (OSError, pd.errors.EmptyDataError):
        pass
    rows = []
    for path in sorted(folder.rglob("*.json")):
        try:
            record = json.loads(path.read_text())
        except (OSError, ValueError):
            continue
        if (
            isinstance(record, dict)
            and isinstance(record.get("command"), list)
            and all(isinstance(part, str) for part in record["command"])
            and all(_number(record.get(key)) for key in ("train_s", "steps"))
            and (record.get("first_step_s") is None or _number(record["first_step_s"]))
        ):  # a run's own record: anything else in the folder (another JSON, a damaged one) is not one
            rows.append({"command": shlex.join(record["command"]), "config": path.stem, "status": record.get("status"),
                         "steps": record.get("steps"), "train_s": record["train_s"],
                         "first_step_s": record.get("first_step_s")})  # fmt: skip
    return pd.DataFrame(rows)


def recorded(folders: list[Path]) -> dict[tuple, Recorded]:
    """Per work key, the costs its ok runs recorded in `folders` (the first folder that has a key wins)."""
    found: dict[tuple, Recorded] = {}
    for folder in folders:
        runs = _records(folder)
        for column in ("steps", "train_s", "first_step_s", "wall_s", "status", "command"):
            if column not in runs:
                runs[column] = None
        runs = runs[(runs.status == "ok") & runs.steps.notna() & (runs.steps > 1) & runs.train_s.notna()]
        keyed: dict[tuple, list] = {}
        for row in runs.itertuples():
            parsed = split_command(str(row.command))
            if parsed:
                keyed.setdefault(work_key(*parsed), []).append(row)
        for key, rows in keyed.items():
            if key in found:
                continue
            first = [r.first_step_s if pd.notna(r.first_step_s) else 0.0 for r in rows]
            per_step = [(r.train_s - f) / (r.steps - 1) for r, f in zip(rows, first, strict=True)]
            outside = [r.wall_s - r.train_s for r in rows if pd.notna(r.wall_s)]
            forked = bool(rows) and all(getattr(r, "started", "fresh") == "forked" for r in rows)
            found[key] = Recorded(
                statistics.median(per_step), max(first), min(first),
                statistics.median(outside) if outside else None, forked, f"{folder.name}: {rows[0].config}",
            )  # fmt: skip
    return found


def planned_steps(args: list[str]) -> int | None:
    """The optimizer steps a run's flags ask for where they say (--max-steps; a synthetic epoch of --subset images,
    default 10,240, times --epochs), else None."""

    def value(flag, default=None):
        return next((args[i + 1] for i in range(len(args) - 1, -1, -1) if args[i] == flag and i + 1 < len(args)),
                    default)  # fmt: skip

    max_steps = value("--max-steps")
    if value("--dataset") == "synthetic" and value("--model") not in ("gpt", "gpt2"):
        per_epoch = max(1, int(value("--subset", 10240)) // int(value("--batch-size", 128)))
        total = per_epoch * int(value("--epochs", 1))
        return min(total, int(max_steps)) if max_steps else total
    return int(max_steps) if max_steps else None


@dataclass
class Estimate:
    config: str
    round: int
    seconds: float | None
    source: str


def _without(key: tuple, flag: str) -> tuple:
    return key[0], tuple(item for item in key[1] if item[0] != flag)


def _flag(key: tuple, flag: str) -> str | None:
    return next((v for k, v in key[1] if k == flag), None)


def _batch(key: tuple) -> int | None:
    value = _flag(key, "--batch-size")
    return int(value) if value and value.isdigit() else None


def compile_group(key: tuple) -> tuple:
    """What decides whether torch.compile's cache holds a configuration's graphs: its script and work flags. Each
    script is its own group: train_fast.py's ResNet-50 compiled for 18 s after train_compile.py's had compiled for 59
    (H200, 2026-11-28), and train_float8.py's Float8Linear layers make another graph. A record's first run already
    paid what the cache of that bench run's earlier configurations left to compile, in the order the plan runs them."""
    return key


def match(key: tuple, costs: dict[tuple, Recorded]) -> tuple[Recorded | None, float, str]:
    """(the record a configuration's cost comes from, the factor on its time per step, how it was found), trying in
    turn: the same work; the same script and flags at another batch size; the same script and flags but for
    `--without` (one change apart); the same flags under another script (a compiling one first where this one
    compiles); at another batch size both times the step's time scaled by the
    batch (linear, so an estimate from a smaller batch errs long); else the slowest configuration of the same model and
    shape under another precision ("like ..."); else (None, 0, "no record ...")."""
    if key in costs:
        return costs[key], 1.0, costs[key].source
    batch = _batch(key)

    def closest(candidates, how):
        k, c = min(candidates, key=lambda kc: abs((_batch(kc[0]) or batch or 0) - (batch or 0)))
        factor = (batch / _batch(k)) if batch and _batch(k) else 1.0
        scaled = f", its step x {factor:.3g} for batch {batch}" if factor != 1.0 else ""
        return c, factor, f"{how}{c.source}{scaled}"

    same_script = [(k, c) for k, c in costs.items() if _without(k, "--batch-size") == _without(key, "--batch-size")]
    if same_script:
        return closest(same_script, "")
    # the same script and flags but another --without: one change apart (an ablation, or a row that leaves out what
    # its record's scripts did not have yet: train_fast.py's GPT-2 rows of 2026-11-28 predate its Muon)
    bare = _without(_without(key, "--batch-size"), "--without")
    ablated = [(k, c) for k, c in costs.items() if _without(_without(k, "--batch-size"), "--without") == bare]
    if ablated:
        return closest(ablated, "as (but for --without) ")
    flags = _without(key, "--batch-size")[1]
    other_script = [(k, c) for k, c in costs.items() if _without(k, "--batch-size")[1] == flags]
    if other_script:
        compiling = [(k, c) for k, c in other_script if (k[0] in COMPILING) == (key[0] in COMPILING)]
        return closest(compiling or other_script, "as ")
    alike = [c for k, c in costs.items() if shape_of(k) == shape_of(key)]
    if alike:
        c = max(alike, key=lambda c: c.step_s)
        return c, 1.0, f"like {c.source} (the slowest of its model and shape)"
    return None, 0.0, "no record of this model and shape"


def estimate(jobs, by_name: dict[str, dict], folders: list[Path], outside_s: float | None = None):
    """(estimates per job in order, outside seconds used, where that number comes from): each job (pairs.Job) of the
    plan with its estimated seconds (None: "no record") and source. `outside_s` overrides the time outside training;
    by default it is the recorded median of forked runs, else ASSUMED_OUTSIDE_S. A configuration no folder has a
    record of takes its row's `estimate_s` (profiles.toml: the seconds of its first run and of the later ones, the
    time outside training left out), marked as assumed.

    A compiling script's first step: the record's cold compile where no earlier run of the plan compiled the same
    graph (`compile_group`), else its warm one; where no earlier run compiled its model at all, the slowest cold
    compile recorded for that model (float8's apart: a record's first run may have found part of its graph in the
    cache); a record with one run only has no warm compile, which is then its cold
    one times the warm / cold ratio of the compiled configuration recorded most often. Matched to an eager record, a
    compiling script adds the compile recorded for its model (cold or warm, the slowest); an eager script matched to a
    compiling record takes two steps for its first."""
    costs = recorded(folders)
    forked_outside = [c.outside_s for c in costs.values() if c.forked and c.outside_s is not None]
    if outside_s is not None:
        outside_note = f"{outside_s:.1f} s a run outside training (given)"
    elif forked_outside:
        outside_s = statistics.median(forked_outside)
        outside_note = f"{outside_s:.1f} s a run outside training (recorded, forked runs)"
    else:
        outside_s = ASSUMED_OUTSIDE_S
        outside_note = (f"{outside_s:.1f} s a run outside training (assumed: no forked run recorded on a GPU yet; "
                        "bench.py's fork server spares the imports the recorded runs paid)")  # fmt: skip
    compiled = {k: c for k, c in costs.items() if k[0] in COMPILING and c.first_cold_s > c.first_warm_s}
    warm_ratio = min((c.first_warm_s / c.first_cold_s for c in compiled.values()), default=1.0)
    compiled_before: set[tuple] = set()
    models_compiled: set[str | None] = set()  # models whose graphs an earlier run of the plan compiled (the cache)
    assumed: set[str] = set()
    out = []
    for job in jobs:
        run = by_name[job.config]
        key = work_key(run["script"], run["args"])
        cost, factor, source = match(key, costs)
        if cost is not None and key[0] in COMPILING and "estimate_s" in run:  # its compile has no record: the guess
            model = _flag(key, "--model")
            if not any(k[0] in COMPILING and _flag(k, "--model") == model for k in costs):
                cost = None
        if (
            cost is None and "estimate_s" in run
        ):  # never run on a GPU: the profile's stated guess, until a GPU folder records it
            first, *later = run["estimate_s"]
            cold = job.config not in assumed
            assumed.add(job.config)
            seconds = first if cold or not later else later[0]
            out.append(Estimate(job.config, job.round, outside_s + seconds, "assumed in profiles.toml (estimate_s)"))
            continue
        if cost is None:
            out.append(Estimate(job.config, job.round, None, source))
            continue
        recorded_key = next(k for k, c in costs.items() if c is cost)
        step_s = cost.step_s * factor
        cold = compile_group(key) not in compiled_before
        compiles, record_compiles = key[0] in COMPILING, recorded_key[0] in COMPILING
        model = _flag(key, "--model")
        first_of_model = compiles and model not in models_compiled
        if compiles:
            compiled_before.add(compile_group(key))
            models_compiled.add(model)
        if compiles and record_compiles:
            warm = cost.first_warm_s if cost.first_warm_s < cost.first_cold_s else cost.first_cold_s * warm_ratio
            first = cost.first_cold_s if cold else warm
            if first_of_model:  # nothing of its model in the cache yet: its record may have found some there
                float8 = key[0] == "train_float8.py"  # Float8Linear layers: another graph, compiled on its own
                first = max([first] + [c.first_cold_s for k, c in costs.items() if k[0] in COMPILING
                                       and _flag(k, "--model") == model and (k[0] == "train_float8.py") == float8])  # fmt: skip
        elif compiles:
            model = _flag(key, "--model")
            same_model = [c for k, c in costs.items() if k[0] in COMPILING and _flag(k, "--model") == model]
            if not same_model:
                out.append(Estimate(job.config, job.round, None, f"{source}; no compile of its model recorded"))
                continue
            first = cost.first_warm_s + max(c.first_cold_s if cold else c.first_cold_s * warm_ratio for c in same_model)
            source += ", + the slowest compile recorded for its model"
        elif record_compiles:
            first = 2 * step_s
        else:
            first = cost.first_warm_s
        steps = planned_steps(run["args"]) or 2
        out.append(Estimate(job.config, job.round, outside_s + first + step_s * max(0, steps - 1), source))
    return out, outside_s, outside_note


def dry_run_text(profile: str, estimates: list[Estimate], outside_note: str, fixed_s: float = FIXED_S) -> str:
    """The dry run's report: a line per planned run, then the total with the bench's fixed cost."""
    lines = [f"bench: dry run of profile {profile}: {len(estimates)} runs, nothing started", ""]
    width = max((len(e.config) for e in estimates), default=10)
    for i, e in enumerate(estimates):
        seconds = f"{e.seconds:6.1f} s" if e.seconds is not None else "     ? s"
        lines.append(f"{i:3d}  round {e.round:2d}  {e.config:<{width}}  {seconds}  ({e.source})")
    known = [e.seconds for e in estimates if e.seconds is not None]
    unknown = len(estimates) - len(known)
    total = sum(known) + fixed_s
    lines += [
        "",
        f"per run: {outside_note}",
        f"estimated: {total / 60:.1f} minutes ({total:.0f} s: {sum(known):.0f} s of runs + {fixed_s:.0f} s of the "
        "bench's own: the matmul peak, the fork server, the tables)"
        + (f"; {unknown} run(s) with no record are not counted" if unknown else ""),
    ]
    return "\n".join(lines)


def total_seconds(estimates: list[Estimate], fixed_s: float = FIXED_S) -> float | None:
    """The estimate's total in seconds, None if a run has no record."""
    if any(e.seconds is None for e in estimates):
        return None
    return sum(e.seconds for e in estimates) + fixed_s


def cost_folders(kind: str | None = None) -> list[Path]:
    """The result folders whose runs the estimate reads: every folder under results/ (archive/ too: its runs are
    recorded costs, not quoted results) with "gpu" in its name, those of the GPU kind given (its name in the folder,
    e.g. "h200") first, then the others (an H100's steps are slower than an H200's: the estimate errs long); within
    each, results/'s before archive/'s, newest first."""
    folders = [p for p in (REPO / "results").rglob("*gpu*") if p.is_dir() and p.parent.name in ("results", "archive")]
    folders.sort(key=lambda p: p.name, reverse=True)
    folders.sort(key=lambda p: p.parent.name == "archive")  # a current folder's records before an archived one's
    if kind:
        folders.sort(key=lambda p: kind.lower() not in p.name.lower())
    return folders
