"""The bench matrix: a profile of bench/profiles.toml read and checked whole before anything runs, and why a row
cannot run on this machine."""

from __future__ import annotations

import sys
import tomllib
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
# What a sweep may vary: metrics fields (the learning rate from the resolved arguments), with their axis labels.
KNOBS = {"workers": "DataLoader workers", "global_batch": "global batch", "lr": "peak learning rate"}


def fail(message: str) -> None:
    print(f"bench.py: error: {message}", file=sys.stderr)
    raise SystemExit(2)


PROFILE_KEYS = {
    "repeats",
    "pairs",
    "reruns",
    "timeout_s",
    "args",
    "gemm_seconds",
    "runs",
}  # what profiles.toml's header comment documents
RUN_KEYS = {
    "name", "script", "args", "baseline", "ladder", "rung_base", "ceiling", "ablation_of", "memory", "launcher", "nproc",
    "requires", "min_gpus", "without_bf16", "repeats", "timeout_s", "note", "sweep", "knob", "same_as", "skip",
    "paired", "env", "fresh", "estimate_s",
}  # fmt: skip


def load_profile(matrix: Path, profile: str) -> dict:
    """The profile's table from the TOML `matrix`, with every run's defaults filled in.

    Checks the whole profile before anything runs, so a typo costs seconds, not a run of the matrix: unknown keys
    (PROFILE_KEYS, RUN_KEYS), unique names, a script that exists, args as lists of strings, launcher python or
    torchrun, nproc a number or "gpus", repeats / timeout_s / min_gpus positive integers, and baseline / rung_base
    / ceiling naming a run of the profile. Exits 2 with one line naming the run and the key.
    """
    try:
        profiles = tomllib.loads(matrix.read_text())
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError) as error:
        fail(f"cannot read the matrix {matrix}: {error}")
    if profile not in profiles:
        fail(f"profile {profile!r} is not in {matrix} (it has: {', '.join(profiles)})")
    table = profiles[profile]
    where = f"profile {profile!r} in {matrix}"
    _known_keys_only(table, PROFILE_KEYS, where)
    runs = table.get("runs", [])
    if not isinstance(runs, list) or not all(isinstance(run, dict) for run in runs):
        fail(f"{where}: runs must be tables ([[{profile}.runs]])")
    names = [run.get("name") for run in runs]
    if not runs or not all(isinstance(name, str) and name for name in names) or len(set(names)) != len(names):
        fail(f"{where} needs runs, each with a unique name (a string)")
    _check_values(table, where)
    if "pairs" in table and not (isinstance(table["pairs"], int) and not isinstance(table["pairs"], bool)
                                 and table["pairs"] >= 0):  # fmt: skip
        fail(f"{where}: pairs must be a whole number, 0 or more (0: no interleaved pairs), got {table['pairs']!r}")
    if "reruns" in table and not (isinstance(table["reruns"], int) and not isinstance(table["reruns"], bool)
                                  and table["reruns"] >= 0):  # fmt: skip
        fail(f"{where}: reruns must be a whole number, 0 or more (0: no re-run of a disturbed pair), got "
             f"{table['reruns']!r}")  # fmt: skip
    for run in runs:
        at = f"run {run['name']!r} of {where}"
        _known_keys_only(run, RUN_KEYS, at)
        if not isinstance(run.get("script"), str) or not (REPO / run["script"]).is_file():
            fail(f'{at}: script {run.get("script")!r} is not a file of the repository (e.g. "src/train.py")')
        for key in ("paired", "fresh"):
            if not isinstance(run.get(key, True), bool):
                fail(f"{at}: {key} must be true or false, got {run[key]!r}")
        if run.get("launcher", "python") not in ("python", "torchrun"):
            fail(f'{at}: launcher must be "python" or "torchrun", got {run["launcher"]!r}')
        if "nproc" in run and run["nproc"] != "gpus" and not (isinstance(run["nproc"], int) and run["nproc"] > 0):
            fail(f'{at}: nproc must be a positive number or "gpus", got {run["nproc"]!r}')
        for key in ("baseline", "rung_base", "ceiling", "ablation_of", "same_as"):
            if key in run and run[key] not in names:
                fail(f"{at}: {key} {run[key]!r} is not the name of a run of the profile")
        if name_list(run.get("ladder", [])) is None:
            fail(f"{at}: ladder must be a name or a list of names, got {run['ladder']!r}")
        if run.get("requires", "cuda") not in ("cuda", "bf16", "no-bf16"):
            fail(f'{at}: requires must be "cuda", "bf16" or "no-bf16", got {run["requires"]!r}')
        sweeps, knobs = (name_list(run.get(key, [])) for key in ("sweep", "knob"))
        if sweeps is None or knobs is None or len(sweeps) != len(knobs) or not set(knobs) <= set(KNOBS):
            fail(
                f"{at}: a sweep row needs sweep (its name) and knob, one of {', '.join(KNOBS)} (or two lists of "
                "the same length: the row is a point of each sweep)"
            )
        estimate = run.get("estimate_s", [1.0])
        if not (isinstance(estimate, list) and 1 <= len(estimate) <= 2
                and all(isinstance(x, int | float) and not isinstance(x, bool) and x > 0 for x in estimate)):
            fail(f"{at}: estimate_s must be [seconds of its first run] or [first, later], positive, got {estimate!r}")
        _check_values(run, at)
    shared = table.get("args", [])  # the profile's flags for every row, before the row's own (which win)
    for run in runs:
        run["args"] = [*shared, *run.get("args", [])]
        run.setdefault("launcher", "python")
        run.setdefault("repeats", table.get("repeats", 1))
        run.setdefault("timeout_s", table.get("timeout_s", 600))
    return table


def name_list(value) -> list[str] | None:
    """A `ladder` / `sweep` / `knob` value as a list (one name, or a list of them), None when it is neither."""
    if isinstance(value, str):
        return [value]
    return value if isinstance(value, list) and all(isinstance(v, str) for v in value) else None


def _known_keys_only(entry, known: set[str], at: str) -> None:
    """Exits with one line when `entry` is not a TOML table or has a key outside `known` (a typo would else be
    ignored and the row run without it)."""
    if not isinstance(entry, dict):
        fail(f"{at} must be a table of keys, got {entry!r}")
    if set(entry) - known:
        fail(f"{at}: unknown key(s) {', '.join(sorted(set(entry) - known))} (known: {', '.join(sorted(known))})")


def _check_values(entry: dict, at: str) -> None:
    """args / without_bf16 lists of strings or numbers; env a table of strings; repeats, timeout_s, min_gpus positive
    integers."""
    for key in ("args", "without_bf16"):
        if key in entry and not (
            isinstance(entry[key], list) and all(isinstance(a, str | int | float) for a in entry[key])
        ):
            fail(f'{at}: {key} must be a list of flags, e.g. ["--epochs", "1"], got {entry[key]!r}')
    if "env" in entry and not (
        isinstance(entry["env"], dict) and all(isinstance(v, str) for v in entry["env"].values())
    ):
        fail(f'{at}: env must be a table of strings, e.g. {{TORCHINDUCTOR_FORCE_DISABLE_CACHES = "1"}}')
    for key in ("repeats", "timeout_s", "min_gpus"):
        if key in entry and not (isinstance(entry[key], int) and not isinstance(entry[key], bool) and entry[key] > 0):
            fail(f"{at}: {key} must be a positive integer, got {entry[key]!r}")


def skip_reason(run: dict, gpus: int, bf16: bool = True) -> str | None:
    """Why `run` cannot run on this machine (`requires` "cuda"; "bf16": a CPU that runs bfloat16 natively, `bf16`;
    "no-bf16": one that would emulate it, where the scripts' defaults are float32 and the row says so;
    `min_gpus`; `skip`: a rung whose technique does not apply to the row's model, with the reason; a library its
    env's LD_PRELOAD names that is not there), or None."""
    if run.get("skip"):
        return run["skip"]
    if run.get("requires") == "cuda" and gpus == 0:
        return "needs a CUDA GPU"
    if run.get("requires") == "bf16" and not bf16:
        return "no native bfloat16 on this CPU (no AVX512-BF16 or AMX, or oneDNN kept below them): it would be emulated"
    if run.get("requires") == "no-bf16" and bf16:
        return "this CPU runs bfloat16 natively: the scripts' defaults are its bf16 row's"
    if gpus < run.get("min_gpus", 0):
        return f"needs ≥ {run['min_gpus']} GPUs, this machine has {gpus}"
    missing = [lib for lib in run.get("env", {}).get("LD_PRELOAD", "").split() if not Path(lib).is_file()]
    if missing:  # the loader would print an error, ignore the library and run with the default allocator: a lie
        return f"LD_PRELOAD names {missing[0]}, which this machine does not have"
    return None
