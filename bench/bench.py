"""Benchmark runner: every configuration of a profile as a subprocess, repeated, then tables and plots.

    python bench/bench.py --profile smoke --out /tmp/smoke          # CPU, seconds per run (what the tests run)
    python bench/bench.py --profile cpu --out results/cpu-2core     # 2 cores: 12 min 39 s with data preparation
    python bench/bench.py --profile auto                            # gpu when CUDA is present, else cpu
    python bench/bench.py --profile cpu --out results/cpu-2core --resume   # after a crash or Ctrl-C: only what is missing
    python bench/bench.py --profile cpu --out results/cpu-2core --only compile     # the configurations named so
    python bench/bench.py --profile cpu --out results/cpu-2core --tables-only      # tables again from runs.csv
    python bench/bench.py --peak-table results/gpu-h100-2026-11-23-ladder        # peak.md of a result folder

The matrix is data: bench/profiles.toml (or --matrix FILE). Each run gets a timeout, its own log in OUT/logs/ and
its metrics JSON in OUT/metrics/; a run that fails, runs out of memory or times out becomes a row with its status
(failed / oom / timeout) and its error line, and the others go on. runs.csv is rewritten after every run, so Ctrl-C
(or a crash of the runner) keeps the finished rows, and --resume skips the runs that are already there. Writes into
OUT, each file atomically:
runs.csv (one row per run), summary.csv (one row per configuration: median and min-max over the repeats, speed-up
vs its baseline, over its rung's base, of its ceiling, and what limited it), table.md, ladder.md and ladder.png (the
profile's speed-up ladders: each rung with its speed-up over its base and over the first rung), env.json (versions,
hardware, CPU instruction sets, git commit, and the device's measured dense matmul peak per dtype,
`gemm_peak_tflops`), the plots throughput.png, accuracy_vs_time.png, memory.png, data_wait.png and sweeps.png (the
workers and batch-size sweeps), and index.html with one side-by-side page per technique (bench/diff_pages.py) with
this run's speed-ups. docs/bench.md describes every flag, profile key, column and metrics key.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import time
import tomllib
from datetime import datetime, timezone
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "src"))

import matplotlib  # noqa: E402

matplotlib.use("Agg")  # no display needed
import diff_pages  # noqa: E402
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402
import torch  # noqa: E402
from tqdm import tqdm  # noqa: E402

import common  # noqa: E402
from torch.utils.flop_counter import FlopCounterMode  # noqa: E402

# What a configuration is (the same in each of its runs), then what a run measures.
CONFIG_FIELDS = [
    "loader",
    "workers",
    "loader_only",
    "image_size",
    "model",
    "dataset",
    "device",
    "world_size",
    "gpus",
    "global_batch",
    "precision",
]
RUN_FIELDS = [
    "script",
    "technique",
    *CONFIG_FIELDS,
    "images_per_s",
    "images_per_s_note",
    "first_step_s",
    "compile_s",
    "time_to_target_incl_compile_s",
    "allreduces_per_step",
    "step_ms_p50",
    "step_ms_p90",
    "data_wait_frac",
    "peak_mem_allocated_gib",
    "peak_mem_reserved_gib",
    "peak_host_rss_gib",
    "activation_mib",
    "flops_per_image",
    "achieved_tflops",
    "graphs_compiled",
    "recompiled_steps",
    "params",
    "params_per_rank",
    "test_acc",
    "time_to_target_s",
    "train_s",
    "steps",
    "lr",
]
MEDIAN_FIELDS = [
    "images_per_s",
    "first_step_s",
    "compile_s",
    "time_to_target_incl_compile_s",
    "allreduces_per_step",
    "step_ms_p50",
    "step_ms_p90",
    "data_wait_frac",
    "peak_mem_allocated_gib",
    "peak_mem_reserved_gib",
    "peak_host_rss_gib",
    "activation_mib",
    "flops_per_image",
    "achieved_tflops",
    "graphs_compiled",
    "recompiled_steps",
    "params",
    "params_per_rank",
    "test_acc",
    "time_to_target_s",
    "train_s",
    "lr",
]


INPUT_BOUND = 0.25  # data-wait fraction from which a run counts as limited by its input
BELOW_CEILING = 0.9  # share of its synthetic ceiling under which a run is limited by its input's cost on the host
KNOBS = {"workers": "DataLoader workers", "global_batch": "global batch"}  # what a sweep may vary (metrics fields)

# Dense (no sparsity) peak TFLOP/s per dtype of known GPUs, from NVIDIA's published figures: the of-datasheet column.
# The datasheets print the tensor-core figures with 2:4 sparsity; the dense ones are half, as the whitepapers list.
DATASHEET_PEAKS = {
    "H100 80GB HBM3": (  # H100 SXM5
        {"float16": 989.4, "bfloat16": 989.4, "tf32": 494.7, "float32": 66.9},
        "NVIDIA H100 Tensor Core GPU Architecture whitepaper, H100 SXM5: dense FP16/BF16 tensor 989.4, TF32 494.7, "
        "FP32 66.9 TFLOP/s",
    ),
    "H100 PCIe": (
        {"float16": 756.5, "bfloat16": 756.5, "tf32": 378.0, "float32": 51.2},
        "NVIDIA H100 Tensor Core GPU Architecture whitepaper, H100 PCIe: dense FP16/BF16 tensor 756.5, TF32 378.0, "
        "FP32 51.2 TFLOP/s",
    ),
    "H200": (
        {"float16": 989.4, "bfloat16": 989.4, "tf32": 494.7, "float32": 66.9},
        "NVIDIA H200 datasheet (SXM): FP16/BF16 tensor 1,979 and TF32 989 TFLOP/s with sparsity (dense: half), FP32 67",
    ),
    "A100": (
        {"float16": 312.0, "bfloat16": 312.0, "tf32": 156.0, "float32": 19.5},
        "NVIDIA A100 Tensor Core GPU datasheet: dense FP16/BF16 tensor 312, TF32 156, FP32 19.5 TFLOP/s",
    ),
}


def fail(message: str) -> None:
    print(f"bench.py: error: {message}", file=sys.stderr)
    raise SystemExit(2)


PROFILE_KEYS = {"repeats", "timeout_s", "args", "gemm_seconds", "runs"}  # what profiles.toml's header comment documents
RUN_KEYS = {
    "name", "script", "args", "baseline", "ladder", "rung_base", "ceiling", "ablation_of", "memory", "launcher", "nproc",
    "requires", "min_gpus", "without_bf16", "repeats", "timeout_s", "note", "sweep", "knob",
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
    if not runs or None in names or len(set(names)) != len(names):
        fail(f"{where} needs runs, each with a unique name")
    _check_values(table, where)
    for run in runs:
        at = f"run {run['name']!r} of {where}"
        _known_keys_only(run, RUN_KEYS, at)
        if not isinstance(run.get("script"), str) or not (REPO / run["script"]).is_file():
            fail(f'{at}: script {run.get("script")!r} is not a file of the repository (e.g. "src/train.py")')
        if run.get("launcher", "python") not in ("python", "torchrun"):
            fail(f'{at}: launcher must be "python" or "torchrun", got {run["launcher"]!r}')
        if "nproc" in run and run["nproc"] != "gpus" and not (isinstance(run["nproc"], int) and run["nproc"] > 0):
            fail(f'{at}: nproc must be a positive number or "gpus", got {run["nproc"]!r}')
        for key in ("baseline", "rung_base", "ceiling", "ablation_of"):
            if key in run and run[key] not in names:
                fail(f"{at}: {key} {run[key]!r} is not the name of a run of the profile")
        if _names(run.get("ladder", [])) is None:
            fail(f"{at}: ladder must be a name or a list of names, got {run['ladder']!r}")
        if run.get("requires", "cuda") not in ("cuda", "bf16"):
            fail(f'{at}: requires must be "cuda" or "bf16", got {run["requires"]!r}')
        sweeps, knobs = (_names(run.get(key, [])) for key in ("sweep", "knob"))
        if sweeps is None or knobs is None or len(sweeps) != len(knobs) or not set(knobs) <= set(KNOBS):
            fail(
                f"{at}: a sweep row needs sweep (its name) and knob, one of {', '.join(KNOBS)} (or two lists of "
                "the same length: the row is a point of each sweep)"
            )
        _check_values(run, at)
    shared = table.get("args", [])  # the profile's flags for every row, before the row's own (which win)
    for run in runs:
        run["args"] = [*shared, *run.get("args", [])]
        run.setdefault("launcher", "python")
        run.setdefault("repeats", table.get("repeats", 1))
        run.setdefault("timeout_s", table.get("timeout_s", 600))
    return table


def _names(value) -> list[str] | None:
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
    """args / without_bf16 lists of strings or numbers; repeats, timeout_s, min_gpus positive integers."""
    for key in ("args", "without_bf16"):
        if key in entry and not (
            isinstance(entry[key], list) and all(isinstance(a, str | int | float) for a in entry[key])
        ):
            fail(f'{at}: {key} must be a list of flags, e.g. ["--epochs", "1"], got {entry[key]!r}')
    for key in ("repeats", "timeout_s", "min_gpus"):
        if key in entry and not (isinstance(entry[key], int) and not isinstance(entry[key], bool) and entry[key] > 0):
            fail(f"{at}: {key} must be a positive integer, got {entry[key]!r}")


def skip_reason(run: dict, gpus: int, bf16: bool = True) -> str | None:
    """Why `run` cannot run on this machine (`requires` "cuda" or "bf16": a CPU with bf16 instructions, `bf16`;
    `min_gpus`), or None."""
    if run.get("requires") == "cuda" and gpus == 0:
        return "needs a CUDA GPU"
    if run.get("requires") == "bf16" and not bf16:
        return "this CPU has no bf16 instructions (bf16 would run emulated, several times slower)"
    if gpus < run.get("min_gpus", 0):
        return f"needs ≥ {run['min_gpus']} GPUs, this machine has {gpus}"
    return None


def command(run: dict, metrics: Path, python: str, gpus: int) -> list[str]:
    """The argv that runs `run` once and writes its metrics JSON to `metrics`."""
    script = str(REPO / run["script"])
    out = str(metrics.parent.parent.resolve())  # an argument may name the result folder as {out} (a trace's folder)
    tail = [script, *(str(a).replace("{out}", out) for a in run["args"]), "--metrics-out", str(metrics)]
    if run["launcher"] == "torchrun":
        nproc = gpus if run.get("nproc") == "gpus" else int(run.get("nproc", 1))
        return [python, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", str(nproc), *tail]
    return [python, *tail]


def last_line(log: Path) -> str:
    """The line that says why a run ended: the last `...: error: ...` line of `log` (the scripts' one-line errors,
    which torchrun's own failure report follows), else its last non-empty line; at most 200 characters."""
    try:
        lines = [line.strip() for line in re.split(r"[\r\n]", log.read_text(errors="replace")) if line.strip()]
    except OSError:
        return ""
    errors = [line for line in lines if ": error: " in line]
    return (errors or lines or [""])[-1][:200]


def is_out_of_memory(text: str) -> bool:
    """CUDA's "CUDA out of memory", the scripts' one-line "out of memory", Python's MemoryError, or the CPU
    allocator's "can't allocate memory"."""
    return "out of memory" in text.lower() or "MemoryError" in text or "can't allocate memory" in text


def run_paths(run: dict, repeat: int, out: Path) -> tuple[Path, Path]:
    """(log, metrics JSON) of repeat `repeat` of `run` under `out`."""
    slug = re.sub(r"[^A-Za-z0-9]+", "-", run["name"]).strip("-")
    return out / "logs" / f"{slug}-r{repeat}.log", out / "metrics" / f"{slug}-r{repeat}.json"


def finished_rows(out: Path) -> dict:
    """For --resume: the ok rows of OUT/runs.csv whose metrics JSON is still there, by (config, repeat)."""
    try:
        previous = pd.read_csv(out / "runs.csv", dtype={"config": str})
    except (OSError, pd.errors.EmptyDataError, pd.errors.ParserError):
        return {}
    if "status" not in previous or "repeat" not in previous:
        return {}
    rows = {}
    for row in previous[previous.status == "ok"].to_dict("records"):
        metrics = out / "metrics" / Path(str(row.get("log", ""))).with_suffix(".json").name
        if metrics.exists():
            rows[(row["config"], int(row["repeat"]))] = row
    return rows


class Stop:
    """Ctrl-C (SIGINT), SIGTERM and SIGHUP (the terminal closed) turned into a flag that the runner reads at safe
    points, installed for the time of a `with Stop() as stop:` block (the previous handlers come back after it).

    A signal raises nothing, so it cannot land between starting a child and being ready to kill it (inside
    subprocess.Popen, or before the `try` around the wait), nor in the middle of writing a file: `execute` checks
    the flag before it starts a child and every POLL_S while it waits, and kills the child's process group when it
    is set. `signal` is the first signal's number (None until one arrives); later ones change nothing.
    """

    def __init__(self):
        self.signal: int | None = None

    def __enter__(self) -> "Stop":
        self._previous = {s: signal.signal(s, self._handle) for s in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)}
        return self

    def __exit__(self, *exc) -> None:
        for number, handler in self._previous.items():
            signal.signal(number, handler)

    def _handle(self, number, frame) -> None:
        self.signal = self.signal or number

    @property
    def name(self) -> str:
        return "Ctrl-C" if self.signal == signal.SIGINT else signal.Signals(self.signal).name


POLL_S = 0.2  # how often a waiting runner looks at the stop flag and the timeout
# On Linux each run starts through this launcher: it asks the kernel to send the run SIGTERM when the runner dies, even
# by SIGKILL (prctl PR_SET_PDEATHSIG), checks that the runner did not die before that, then becomes the run's command.
# A run is in its own session, so without it a killed runner would leave it running. torchrun ends its workers on
# SIGTERM; a script's DataLoader workers end when their parent does.
DIE_WITH_RUNNER = """import ctypes, os, signal, sys
ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM)
if os.getppid() != int(sys.argv[1]):
    os._exit(143)
os.execvp(sys.argv[2], sys.argv[2:])
"""


# How long a run has to end on SIGTERM before SIGKILL: torchrun gives its workers TORCH_ELASTIC_SHUTDOWN_TIMEOUT
# (default 30 s) between its own SIGTERM and SIGKILL, plus a margin for its own exit.
GRACE_S = int(os.environ.get("TORCH_ELASTIC_SHUTDOWN_TIMEOUT", "30")) + 15


def exited(process: subprocess.Popen, timeout_s: float = 0.0) -> bool:
    """Whether the run's first process (its group's leader) has exited, waiting up to `timeout_s` seconds for it.
    The exit is seen without reaping the process (waitid WNOWAIT): while it is not reaped its process-group id cannot
    be given to another process, so the group can still be signalled safely."""
    deadline = time.monotonic() + timeout_s
    while True:
        if os.waitid(os.P_PID, process.pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is not None:
            return True
        if time.monotonic() >= deadline:
            return False
        time.sleep(min(POLL_S, max(0.0, deadline - time.monotonic())))


def end_run(process: subprocess.Popen) -> None:
    """End a run started in a session of its own, then reap it. If its first process still runs, SIGTERM goes to
    its whole process group: a script and its DataLoader workers exit, and torchrun, whose workers run in sessions
    of their own that a group signal does not reach, stops them before it exits; if it is still running after
    GRACE_S, SIGKILL. Then SIGKILL to whatever is left in the group (nothing, normally), before the first process is
    reaped, so the group id cannot have been reused meanwhile."""
    if not exited(process):
        os.killpg(process.pid, signal.SIGTERM)
        exited(process, GRACE_S)
    with contextlib.suppress(ProcessLookupError):  # the group is empty once its members have exited
        os.killpg(process.pid, signal.SIGKILL)
    process.wait()


def execute(run: dict, repeat: int, out: Path, python: str, gpus: int, stop: Stop) -> dict:
    """Run `run` once as a subprocess with its timeout; return its row for runs.csv.

    status: ok, failed (non-zero exit or no metrics), oom (out of memory in its log), timeout (killed after
    `timeout_s`), or interrupted (`stop` was signalled before or while it ran: the run is not started, or its whole
    process group is killed, and the caller stops the matrix).
    """
    log, metrics = run_paths(run, repeat, out)
    log.parent.mkdir(parents=True, exist_ok=True)
    metrics.parent.mkdir(parents=True, exist_ok=True)
    metrics.unlink(missing_ok=True)
    argv = command(run, metrics, python, gpus)
    row = {"config": run["name"], "repeat": repeat, "log": str(log.relative_to(out)), "command": " ".join(argv)}
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    started = time.perf_counter()
    rc = None
    with open(log, "w") as f:
        f.write("$ " + " ".join(argv) + "\n")
        f.flush()
        if stop.signal is None:
            # A new session, so that a timeout or a stop kills the whole process group (DataLoader workers,
            # torchrun's children), and Ctrl-C in the terminal reaches the runner only.
            launch = [sys.executable, "-c", DIE_WITH_RUNNER, str(os.getpid())] if sys.platform == "linux" else []
            process = subprocess.Popen(
                [*launch, *argv], stdout=f, stderr=subprocess.STDOUT, cwd=REPO, env=env, start_new_session=True
            )
            try:
                deadline = time.monotonic() + run["timeout_s"]
                while stop.signal is None and time.monotonic() < deadline and not exited(process, POLL_S):
                    pass
                finished = exited(process)  # on its own, before any signal of ours
            finally:  # timed out, stopped, or an error in this loop: the whole run goes, then it is reaped
                end_run(process)
            rc = process.returncode if finished else None
    row["wall_s"] = time.perf_counter() - started
    text = log.read_text(errors="replace")
    if stop.signal is not None and rc is None:
        row.update(status="interrupted", reason=f"{stop.name}: killed; --resume runs it again")
    elif rc is None:
        row.update(status="timeout", reason=f"killed after {run['timeout_s']} s; last line: {last_line(log)}")
    elif rc != 0:
        row.update(status="oom" if is_out_of_memory(text) else "failed", reason=f"exit {rc}: {last_line(log)}")
    elif not metrics.exists():
        row.update(status="failed", reason="exit 0 but no metrics JSON written")
    else:
        record = json.loads(metrics.read_text())
        row.update({key: record.get(key) for key in RUN_FIELDS}, status=record.get("status", "ok"), reason="")
        resolved = record.get("args") or {}  # the script's flags, every one with its value
        row["lr"] = resolved.get("lr")  # a batch-size sweep scales it: the table shows it
        if row.get("workers") is None:  # the loaders report their workers; the training scripts have the flag
            row["workers"] = resolved.get("workers")
        if record.get("images_per_s") is None:
            row["reason"] = record.get("images_per_s_note") or "images/s not measured"
        row["epochs"] = json.dumps(record.get("epochs", []))
    return row


def summarise(runs: pd.DataFrame, matrix: list[dict]) -> pd.DataFrame:
    """One row per configuration, in matrix order: medians over its ok runs (min-max for images/s) and speed-up."""
    rows = []
    for run in matrix:
        mine = runs[runs.config == run["name"]]
        ok = mine[mine.status == "ok"]
        row = {
            "config": run["name"],
            "script": Path(run["script"]).name,
            "technique": None,
            "note": run.get("note", ""),
            "baseline": run.get("baseline", ""),
            # a row may be a rung of several ladders (a point of several sweeps): the names joined by " | "
            **{key: " | ".join(_names(run.get(key, [])) or []) for key in ("ladder", "sweep", "knob")},
            "rung_base": run.get("rung_base", ""),
            "ceiling": run.get("ceiling", ""),
            "ablation_of": run.get("ablation_of", ""),
            "memory": run.get("memory", ""),
            "runs_ok": len(ok),
            "runs": len(mine),
        }
        if len(ok):
            first = ok.iloc[0]
            row.update({key: first.get(key) for key in CONFIG_FIELDS}, technique=first.get("technique"))
            for key in MEDIAN_FIELDS:
                values = pd.to_numeric(ok[key], errors="coerce").dropna() if key in ok else pd.Series(dtype=float)
                row[key] = values.median() if len(values) else None
            row["images_per_s_min"] = pd.to_numeric(ok.images_per_s, errors="coerce").min()
            row["images_per_s_max"] = pd.to_numeric(ok.images_per_s, errors="coerce").max()
            row["status"], row["reason"] = (
                "ok",
                ""
                if len(ok) == len(mine)
                else "; ".join(f"r{r.repeat}: {r.status} {r.reason}" for r in mine.itertuples() if r.status != "ok"),
            )
        else:
            row["status"] = mine.status.iloc[0] if len(mine) else "not run"
            row["reason"] = mine.reason.iloc[0] if len(mine) else "interrupted before this configuration"
        rows.append(row)
    summary = pd.DataFrame(rows)
    if "images_per_s" not in summary:
        summary["images_per_s"] = None
    speed = dict(zip(summary.config, pd.to_numeric(summary.images_per_s, errors="coerce"), strict=True))
    # images/s over another configuration's: the baseline (speed-up), the rung's base (its lesson), its ceiling,
    # and for an ablation the whole configuration it leaves one change out of
    ratios = (
        ("speedup", "baseline"),
        ("speedup_rung", "rung_base"),
        ("of_ceiling", "ceiling"),
        ("of_whole", "ablation_of"),
    )
    for column, other in ratios:
        summary[column] = [
            speed.get(c, float("nan")) / speed[b] if b in speed else None
            for c, b in zip(summary.config, summary[other], strict=True)
        ]
    summary["limited_by"] = [
        limited_by(w, c)
        for w, c in zip(
            pd.to_numeric(summary.data_wait_frac, errors="coerce"),
            pd.to_numeric(summary.of_ceiling, errors="coerce"),
            strict=True,
        )
    ]
    return summary


def measure_gemm_peak(device: torch.device, seconds: float = 1.0) -> dict[str, float]:
    """The device's dense matmul throughput, measured: TFLOP/s of `torch.matmul` on two square random matrices (side
    8192 on CUDA, 2048 on CPU, 1024 for the 16-bit types on CPU; halved while one call takes over a tenth of
    `seconds`, as emulated dtypes do), timed over `seconds` after two warm-up calls, per dtype: float32 (on CUDA with TF32
    off), tf32 (CUDA: float32 inputs, TensorFloat-32 tensor cores), bfloat16 and float16 (on a CPU without native
    support these run emulated and show it). A matmul of side n is 2 n^3 FLOPs. This is the ceiling a training
    run's matmuls and convolutions can reach in that dtype on this machine (what cuBLAS or oneDNN/MKL achieve),
    usually below the datasheet's peak. A few seconds in all."""
    cuda = device.type == "cuda"
    n = 8192 if cuda else 2048
    peaks = {}

    def matmul(a, b) -> None:  # one call, finished (CUDA queues it: wait for it)
        torch.matmul(a, b)
        if cuda:
            torch.cuda.synchronize(device)

    tf32 = torch.backends.cuda.matmul.allow_tf32
    try:
        for name, dtype, allow_tf32 in [
            ("float32", torch.float32, False),
            *([("tf32", torch.float32, True)] if cuda else []),
            ("bfloat16", torch.bfloat16, False),
            ("float16", torch.float16, False),
        ]:
            torch.backends.cuda.matmul.allow_tf32 = allow_tf32
            side = n if cuda or dtype == torch.float32 else n // 2  # CPUs may emulate the 16-bit types: slow
            while True:  # a smaller side while one call is slow (emulated)
                a, b = (torch.randn(side, side, device=device).to(dtype) for _ in range(2))
                start = time.perf_counter()
                matmul(a, b)
                if time.perf_counter() - start < seconds / 10 or side <= 128:
                    break
                side //= 2
            matmul(a, b)  # a second warm-up call at that side (handles, kernel choice, threads are ready)
            calls, start = 0, time.perf_counter()
            while (elapsed := time.perf_counter() - start) < seconds or not calls:
                matmul(a, b)
                calls += 1
            peaks[name] = 2 * side**3 * calls / elapsed / 1e12
    finally:
        torch.backends.cuda.matmul.allow_tf32 = tf32
    return peaks


def matmul_dtype(precision, model=None) -> str:
    """The dtype a run's matmuls and convolutions ran in, from its metrics' `precision` (e.g. "amp bfloat16 +
    channels_last", "fp32 (TF32 convs)", "fp32") and model: the key of `gemm_peak_tflops` its of-peak share is taken
    against. "TF32 convs" is cuDNN's default for convolutions; matmuls stay float32 (torch's default), so a model
    without convolutions (mlp, vit) is measured against the float32 peak."""
    text = str(precision)
    for name in ("bfloat16", "float16"):
        if name in text:
            return name
    return "tf32" if "TF32" in text and model not in ("mlp", "vit") else "float32"


def of_peak(achieved, precision, env: dict, model=None, gpus=0):
    """achieved TFLOP/s (all devices of the run together) over the measured matmul peak of one device in the run's
    dtype (`measure_gemm_peak`) times the GPUs it used (on a CPU the processes share the one measured), or None."""
    devices = int(gpus) if pd.notna(gpus) and gpus else 1
    return _share(achieved, env.get("gemm_peak_tflops") or {}, precision, model, devices)


def _share(achieved, peaks: dict, precision, model, devices: int):
    """achieved TFLOP/s over `peaks`' entry for the run's dtype (`matmul_dtype`) times `devices`, or None."""
    peak = peaks.get(matmul_dtype(precision, model))
    return achieved / (peak * devices) if peak and pd.notna(achieved) and achieved else None


def gemm_peak_in_a_child(python: str, gpus: int, seconds: float = 1.0) -> dict[str, float]:
    """`measure_gemm_peak` in a subprocess, so that this process never holds a CUDA context or cached blocks on a
    GPU the runs train on. {} (and a line) if it fails."""
    code = (
        f"import json, sys, torch; sys.path[:0] = [{str(REPO / 'bench')!r}, {str(REPO / 'src')!r}]; import bench; "
        f"print(json.dumps(bench.measure_gemm_peak(torch.device({'cuda' if gpus else 'cpu'!r}), {float(seconds)})))"
    )
    proc = subprocess.run([python, "-c", code], capture_output=True, text=True, timeout=300)
    try:
        return json.loads(proc.stdout.strip().splitlines()[-1])
    except (IndexError, ValueError):
        print(f"bench: the matmul peak could not be measured: {proc.stderr.strip()[-300:]}", file=sys.stderr)
        return {}


def limited_by(data_wait: float, of_ceiling: float | None = None) -> str:
    """What limited a run: "input" when its steps waited for data 25 % of the time or more; "input (below ceiling)"
    when they waited less but the run reached under 90 % of its ceiling (the same model on a synthetic batch already
    on the device): the input pipeline's work takes time the training needs, which data-wait alone does not show (on
    a CPU, decoding takes the cores it trains on; on a GPU, workers compete with the host thread that queues the
    kernels, and DALI's `mixed` decoding runs on the same GPU); else
    "compute" (the device and the host's queueing of its work). "–" when not measured. A loader-only row is input by
    construction."""
    if data_wait is None or pd.isna(data_wait):
        return "–"
    if data_wait >= INPUT_BOUND:
        return "input"
    if of_ceiling is not None and pd.notna(of_ceiling) and of_ceiling < BELOW_CEILING:
        return "input (below ceiling)"
    return "compute"


def datasheet(env: dict) -> tuple[dict, str] | None:
    """(dense peak TFLOP/s by dtype, source) of the run's GPU when it is in DATASHEET_PEAKS, else None (a CPU,
    an unknown GPU)."""
    for name in (env.get("gpus") or [])[:1]:
        for key, value in DATASHEET_PEAKS.items():
            if key in name and "NVL" not in name:  # H200 NVL / H100 NVL have lower clocks: not listed
                return value
    return None


def of_datasheet(achieved, precision, env: dict, model=None, gpus=0):
    """achieved TFLOP/s (all GPUs of the run) over the datasheet's dense peak of the run's dtype times its GPUs, or
    None (no datasheet for this device, nothing counted)."""
    sheet = datasheet(env)
    if not sheet or not pd.notna(gpus) or not gpus:  # a run on the CPU of a GPU machine has no GPU datasheet
        return None
    return _share(achieved, sheet[0], precision, model, int(gpus))


def cpu_line(env: dict) -> str:
    """The CPU, its core count and whether it has bf16 instructions (which decide whether bf16 autocast is fast)."""
    flags = ", ".join(env.get("cpu_flags") or []) or "none of avx2/avx512f/avx512_bf16/amx"
    bf16 = "with" if env.get("bf16_instructions") else "without"
    return f"{env.get('cpu_model') or env.get('cpu')}, {env['cpu_count']} cores, {bf16} bf16 instructions ({flags})"


def peak_line(env: dict) -> str:
    """The measured matmul peaks of env.json, e.g. "float32 1.2, bfloat16 3.4 TFLOP/s", or "not measured"."""
    peaks = env.get("gemm_peak_tflops") or {}
    return ", ".join(f"{k} {v:.3g}" for k, v in peaks.items()) + " TFLOP/s" if peaks else "peak not measured"


def hardware_line(env: dict) -> str:
    """One line naming the hardware, versions and commit, for the table's header."""
    if env["gpu_count"]:
        names = sorted(set(env["gpus"]))
        info = (env.get("gpu_info") or [{}])[0]
        driver = f", driver {info['driver']}" if info.get("driver") else ""
        hw = f"{env['gpu_count']} × {' + '.join(names)}{driver} · CPU: {cpu_line(env)}"
    else:
        hw = f"CPU only: {cpu_line(env)}, no GPU"
    git = env.get("git") or {}
    commit = (git.get("commit") or "unknown")[:10] + (" (dirty)" if git.get("dirty") else "")
    return (
        f"{hw} · torch {env['torch']} · torchvision {env['torchvision']} · CUDA {env['cuda'] or '–'} · "
        f"cuDNN {env['cudnn'] or '–'} · DALI {env['dali'] or '–'} · Python {env['python']} · host {env['hostname']} · "
        f"commit {commit}"
    )


def _fmt(value, spec: str, scale: float = 1.0, missing: str = "–") -> str:
    try:
        if value is None or pd.isna(value):
            return missing
        return format(float(value) * scale, spec)
    except (TypeError, ValueError):
        return missing


def _peak_cells(r: dict, env: dict) -> dict:
    """A row's FLOP/s cells: TFLOP/s achieved, its share of the measured matmul peak and, for a GPU with a known
    datasheet, of the datasheet's dense peak."""
    args = (r.get("achieved_tflops"), r.get("precision"), env, r.get("model"), r.get("gpus") or 0)
    cells = {"TFLOP/s": _fmt(r.get("achieved_tflops"), ".3g"), "of peak": _fmt(of_peak(*args), ".1%")}
    if datasheet(env):
        cells["of datasheet"] = _fmt(of_datasheet(*args), ".1%")
    return cells


def _groups(summary: pd.DataFrame, key: str) -> list[tuple[str, pd.DataFrame]]:
    """(name, rows in matrix order) per group of `key` ("ladder", "memory", "sweep"); a row's ladder cell may name
    several ladders, joined by " | " (train.py is the first rung of the bf16 and of the float32 ladder)."""
    names = [[n for n in _text(v).split(" | ") if n] for v in summary[key]]
    order = list(dict.fromkeys(n for row in names for n in row))
    return [(n, summary[[n in row for row in names]]) for n in order]


def table_markdown(summary: pd.DataFrame, env: dict, profile: str, repeats: str) -> str:
    """table.md: hardware, versions and commit in the header, then the ladder(s), the training table and the
    input-pipeline table."""
    is_loader = (
        summary.script.astype(str).str.startswith("loader")
        | summary.get("loader", pd.Series(index=summary.index, dtype=object)).notna().to_numpy()
    )
    when = datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    header = (
        f"# Benchmark, profile `{profile}` ({when})\n\n{hardware_line(env)}\n\n"
        f"images/s: global (summed over processes), steady state (warm-up steps excluded), median over {repeats} "
        '(min–max in brackets when repeated); "not measured" when a run had no step after its warm-up. Speed-up: '
        "median images/s over the baseline configuration's. Limited by: input when the steps waited for data "
        f"{100 * INPUT_BOUND:.0f} % of the time or more; input (below ceiling) when they waited less but the row reached "
        f"under {100 * BELOW_CEILING:.0f} % of its ceiling (the same model on a synthetic batch already on the "
        "device): decoding takes the CPU time training needs, which data-wait does not show; else compute. "
        "World size: processes; GPUs: devices the run "
        "used (0 on CPU). Peak memory per device; host RSS of the training process. Test accuracy over the 10,000 "
        "Fashion-MNIST test images after the last epoch (loaders: over the folder's val/ images). First step: "
        "seconds of the first training step, where torch.compile compiles (its `compile_s`), cuDNN autotunes and "
        "workers start; time to target leaves compile_s out, the column after it includes it. On CPU, bfloat16 "
        "autocast is native with bf16 instructions and emulated (slow) without: see the CPU line above. "
        "GFLOPs/image: training FLOPs (forward + backward matmuls, convolutions, attention) counted with "
        "torch.utils.flop_counter on one step, as they ran (an activation-checkpointing recompute counts: hardware "
        "FLOPs); TFLOP/s: that x images/s, all devices together; of peak: over this machine's measured matmul peak "
        f"in the dtype the run computed in, per device used ({peak_line(env)}): how much of the hardware the run "
        "uses, the rest is what is left to gain"
        + (f"; of datasheet: over the GPU's dense peak in that dtype ({datasheet(env)[1]})" if datasheet(env) else "")
        + ".\n\n"
    )
    is_ablation = summary.ablation_of.map(_text).to_numpy() != ""
    text = header + ladder_markdown(summary, env)
    if (~is_loader & ~is_ablation).any():
        text += "## Training scripts\n\n" + _training_table(summary[~is_loader & ~is_ablation], env) + "\n"
    text += memory_markdown(summary, env) + sweep_markdown(summary)
    if is_ablation.any():
        text += (
            "## Ablations: one change left out\n\nEach row runs a configuration with one of its changes left out "
            "(train_fast.py --without X); × the whole: its images/s over the whole configuration's; the change "
            "buys: the inverse, the speed-up that change alone is worth there.\n\n"
            + _ablation_table(summary[is_ablation])
            + "\n"
        )
    if is_loader.any():
        text += "## Input pipelines (JPEG files)\n\n" + _loader_table(summary[is_loader], env) + "\n"
    return text


def ladder_markdown(summary: pd.DataFrame, env: dict | None = None) -> str:
    """One table per ladder of the profile (rows with `ladder = NAME`, in matrix order): each rung's images/s, its
    speed-up over its base rung (the lesson of that step) and over the ladder's first rung (cumulative), TFLOP/s and
    share of the peak (`env`'s), what torch.compile compiled, peak memory, test accuracy and time to the target."""
    text = ""
    for name, rungs in _groups(summary, "ladder"):
        rows = []
        first = rungs.iloc[0]
        for r in rungs.to_dict("records"):
            on_cpu = r.get("device") == "cpu"
            cumulative = _ratio(r.get("images_per_s"), first.get("images_per_s"))
            rows.append(
                {
                    "rung": r["config"],
                    "technique": r.get("technique") or "–",
                    "precision": r.get("precision") or "–",
                    "images/s": _images_per_s(r),
                    "× its base": _x(r.get("speedup_rung"))
                    + (f" ({_text(r.get('rung_base'))})" if _text(r.get("rung_base")) else ""),
                    f"× {first['script']}": _x(cumulative),
                    "of its ceiling": _fmt(r.get("of_ceiling"), ".0f", 100) + " %"
                    if pd.notna(r.get("of_ceiling"))
                    else "–",
                    "limited by": r.get("limited_by") or "–",
                    **_peak_cells(r, env or {}),
                    "compiled": _compiled(r),
                    "peak mem (GiB)": ("host " + _fmt(r.get("peak_host_rss_gib"), ".2f"))
                    if on_cpu
                    else _fmt(r.get("peak_mem_allocated_gib"), ".2f"),
                    "test acc": _acc(r),
                    "time to target (s)": _fmt(r.get("time_to_target_s"), ".1f"),
                    "incl. compile (s)": _fmt(r.get("time_to_target_incl_compile_s"), ".1f"),
                    "status": _status(r),
                }
            )
        table = pd.DataFrame(rows)
        table = table[[c for c in table.columns if c == "rung" or (table[c] != "–").any()]]  # drop empty columns
        text += f"## Ladder: {name}\n\n" + table.to_markdown(index=False) + "\n\n"
    return text


def _compiled(r: dict) -> str:
    """torch.compile's count: graphs compiled and the later steps that recompiled (kept out of images/s)."""
    graphs = r.get("graphs_compiled")
    if graphs is None or pd.isna(graphs):
        return "–"
    return f"{graphs:.0f} graph(s), {_fmt(r.get('recompiled_steps'), '.0f', missing='0')} recompile(s)"


def _sweeps(summary: pd.DataFrame) -> list[tuple[str, pd.DataFrame, str]]:
    """(name, rows sorted by the knob's value, knob) per sweep of the summary."""
    sweeps = []
    for name, rows in _groups(summary, "sweep"):
        first = rows.iloc[0]
        knob = _text(first.knob).split(" | ")[_text(first.sweep).split(" | ").index(name)]
        order = pd.to_numeric(rows[knob], errors="coerce") if knob in rows else pd.Series(range(len(rows)))
        sweeps.append((name, rows.iloc[np.argsort(order.to_numpy(dtype=float), kind="stable")], knob))  # NaN last
    return sweeps


def sweep_markdown(summary: pd.DataFrame) -> str:
    """One table per sweep (rows with `sweep = NAME` and `knob`, in matrix order): the knob's value, images/s and
    × the first point, data-wait, step time, the learning rate (a batch-size sweep scales it linearly) and test
    accuracy."""
    text = ""
    for name, rows, knob in _sweeps(summary):
        first = rows.iloc[0]
        table = [
            {
                KNOBS.get(knob, knob): _fmt(r.get(knob), ".0f"),
                "images/s": _images_per_s(r),
                "× the first": _x(_ratio(r.get("images_per_s"), first.get("images_per_s"))),
                "data-wait": _wait(r),
                "step p50 (ms)": _fmt(r.get("step_ms_p50"), ".1f"),
                "lr": _fmt(r.get("lr"), ".3g"),
                "test acc": _acc(r),
                "status": _status(r),
            }
            for r in rows.to_dict("records")
        ]
        text += (
            f"## Sweep: {name}\n\nOne knob varied, everything else fixed; images/s against it, with data-wait beside "
            "it (sweeps.png plots both).\n\n" + pd.DataFrame(table).to_markdown(index=False) + "\n\n"
        )
    return text


def memory_markdown(summary: pd.DataFrame, env: dict | None = None) -> str:
    """One table per memory comparison of the profile (rows with `memory = NAME`, in matrix order; the first is the
    reference): parameters per process, activation memory (what autograd kept for backward in one step, measured),
    peak memory per process, images/s, and each against the reference's."""
    text = ""
    for name, rows in _groups(summary, "memory"):
        first = rows.iloc[0]
        table = []
        for r in rows.to_dict("records"):
            on_cpu = r.get("device") == "cpu"
            per_rank = r.get("params_per_rank") if pd.notna(r.get("params_per_rank")) else r.get("params")
            table.append(
                {
                    "configuration": r["config"],
                    "technique": r.get("technique") or "–",
                    "world size": _fmt(r.get("world_size"), ".0f"),
                    "global batch": _fmt(r.get("global_batch"), ".0f"),
                    "params per process": _fmt(per_rank, ",.0f"),
                    "activations (MiB)": _fmt(r.get("activation_mib"), ".1f"),
                    "activations ×": _x(_ratio(r.get("activation_mib"), first.get("activation_mib"))),
                    "peak per process (GiB)": ("host " + _fmt(r.get("peak_host_rss_gib"), ".2f"))
                    if on_cpu
                    else _fmt(r.get("peak_mem_allocated_gib"), ".2f"),
                    "images/s": _images_per_s(r),
                    "images/s ×": _x(_ratio(r.get("images_per_s"), first.get("images_per_s"))),
                    **_peak_cells(r, env or {}),
                    "status": _status(r),
                }
            )
        text += (
            f"## Memory: {name}\n\nActivations: the memory of the tensors autograd kept for backward in one "
            "training step, per process (measured with saved_tensors_hooks on the first step); params per process: "
            "what one process holds (FSDP shards them); × the first row's.\n\n"
            + pd.DataFrame(table).to_markdown(index=False)
            + "\n\n"
        )
    return text


def _ratio(a, b):
    try:
        a, b = float(a), float(b)
    except (TypeError, ValueError):
        return None
    return a / b if b and not pd.isna(a) and not pd.isna(b) else None


def _x(value) -> str:
    return _fmt(value, ".2f") + ("×" if value is not None and pd.notna(value) else "")


def _acc(r: dict) -> str:
    if r.get("dataset") == "synthetic":
        return "synthetic"
    if str(r.get("loader_only")).lower() == "true":
        return "–"
    return _fmt(r.get("test_acc"), ".2f", 100) + (" %" if pd.notna(r.get("test_acc")) else "")


def _images_per_s(r: dict) -> str:
    if r.get("status") == "ok" and (r.get("images_per_s") is None or pd.isna(r.get("images_per_s"))):
        return "not measured"
    ips = _fmt(r.get("images_per_s"), ".1f")
    if r.get("runs_ok", 0) > 1:
        ips += f" ({_fmt(r.get('images_per_s_min'), '.0f')}–{_fmt(r.get('images_per_s_max'), '.0f')})"
    return ips


def _text(value) -> str:
    """A table cell's text: "" for None and NaN (what an empty cell of a CSV reads back as)."""
    return "" if value is None or (isinstance(value, float) and pd.isna(value)) else str(value)


def _status(r: dict) -> str:
    reason, note = _text(r.get("reason")), _text(r.get("note"))
    return r["status"] + (f": {reason}" if reason else "") + (f" ({note})" if note else "")


def _wait(r: dict) -> str:
    return _fmt(r.get("data_wait_frac"), ".1f", 100) + (" %" if pd.notna(r.get("data_wait_frac")) else "")


def _loader_table(summary: pd.DataFrame, env: dict | None = None) -> str:
    """One row per input-pipeline configuration: pipeline, workers / threads, loader-only or end to end, data-wait."""
    rows = []
    for r in summary.to_dict("records"):
        loader_only = str(r.get("loader_only")).lower() == "true"
        on_cpu = r.get("device") == "cpu"
        rows.append(
            {
                "configuration": r["config"],
                "script": r["script"],
                "pipeline": r.get("loader") or "–",
                "workers / threads": _fmt(r.get("workers"), ".0f"),
                "measures": "loader only" if loader_only else f"end to end ({r.get('model') or '–'})",
                "data": r.get("dataset") or "–",
                "crop (px)": _fmt(r.get("image_size"), ".0f"),
                "device": r.get("device") or "–",
                "batch": _fmt(r.get("global_batch"), ".0f"),
                "precision": "–" if loader_only else r.get("precision") or "–",
                "images/s": _images_per_s(r),
                "speed-up": _x(r.get("speedup")),
                "step p50 (ms)": _fmt(r.get("step_ms_p50"), ".1f"),
                "data-wait": _wait(r),
                "limited by": r.get("limited_by") or "–",
                "of its ceiling": _fmt(r.get("of_ceiling"), ".0%"),
                **_peak_cells(r, env or {}),
                "peak alloc (GiB)": "n/a (CPU)" if on_cpu else _fmt(r.get("peak_mem_allocated_gib"), ".2f"),
                "host RSS (GiB)": _fmt(r.get("peak_host_rss_gib"), ".2f"),
                "test acc": _acc(r),
                "status": _status(r),
            }
        )
    return pd.DataFrame(rows).to_markdown(index=False) + "\n"


def _ablation_table(summary: pd.DataFrame) -> str:
    """One row per ablation: the configuration left out of, images/s, over the whole, what the change buys."""
    rows = [
        {
            "configuration": r["config"],
            "one change left out of": _text(r.get("ablation_of")),
            "images/s": _images_per_s(r),
            "× the whole": _x(r.get("of_whole")),
            "the change buys": _x(1 / r["of_whole"]) if pd.notna(r.get("of_whole")) and r["of_whole"] else "–",
            "step p50 (ms)": _fmt(r.get("step_ms_p50"), ".1f"),
            "data-wait": _wait(r),
            "test acc": _acc(r),
            "status": _status(r),
        }
        for r in summary.to_dict("records")
    ]
    return pd.DataFrame(rows).to_markdown(index=False) + "\n"


def _training_table(summary: pd.DataFrame, env: dict) -> str:
    """One row per training configuration; `env` gives the measured matmul peaks (of-peak column)."""
    rows = []
    for r in summary.to_dict("records"):
        on_cpu = r.get("device") == "cpu"
        rows.append(
            {
                "configuration": r["config"],
                "script": r["script"],
                "model": r.get("model") or "–",
                "data": r.get("dataset") or "–",
                "device": r.get("device") or "–",
                "world size": _fmt(r.get("world_size"), ".0f"),
                "GPUs": _fmt(r.get("gpus"), ".0f"),
                "global batch": _fmt(r.get("global_batch"), ".0f"),
                "precision": r.get("precision") or "–",
                "images/s": _images_per_s(r),
                "speed-up": _x(r.get("speedup")),
                "step p50 (ms)": _fmt(r.get("step_ms_p50"), ".1f"),
                "data-wait": _wait(r),
                "limited by": r.get("limited_by") or "–",
                "peak alloc (GiB)": "n/a (CPU)" if on_cpu else _fmt(r.get("peak_mem_allocated_gib"), ".2f"),
                "peak reserved (GiB)": "n/a (CPU)" if on_cpu else _fmt(r.get("peak_mem_reserved_gib"), ".2f"),
                "host RSS (GiB)": _fmt(r.get("peak_host_rss_gib"), ".2f"),
                "activations (MiB)": _fmt(r.get("activation_mib"), ".1f"),
                "GFLOPs/image": _fmt(r.get("flops_per_image"), ".3g", 1e-9),
                **_peak_cells(r, env),
                "test acc": _acc(r),
                "first step (s)": _fmt(r.get("first_step_s"), ".1f"),
                "time to target (s)": _fmt(r.get("time_to_target_s"), ".1f"),
                "incl. compile (s)": _fmt(r.get("time_to_target_incl_compile_s"), ".1f"),
                "status": _status(r),
            }
        )
    return pd.DataFrame(rows).to_markdown(index=False) + "\n"


def _save(fig, path: Path) -> None:
    """Write `fig` to `path` as PNG, atomically (`common.atomic_write`: raises WriteFailed when it cannot)."""
    try:
        common.atomic_write(path, lambda f: fig.savefig(f, format="png", dpi=120, bbox_inches="tight"))
    finally:
        plt.close(fig)


def plot(summary: pd.DataFrame, runs: pd.DataFrame, out: Path, title: str) -> None:
    """The four PNGs: images/s with speed-up labels, accuracy vs training time, peak memory, data-wait vs compute."""
    ok = summary[summary.status == "ok"].copy()
    labels = ok.config.tolist()
    height = 1 + 0.5 * max(len(ok), 1)

    fig, ax = plt.subplots(figsize=(9, height))
    ips = pd.to_numeric(ok.images_per_s, errors="coerce").fillna(0)
    err = (
        [
            ips - pd.to_numeric(ok.images_per_s_min, errors="coerce").fillna(ips),
            pd.to_numeric(ok.images_per_s_max, errors="coerce").fillna(ips) - ips,
        ]
        if len(ok)
        else None
    )
    bars = ax.barh(labels, ips, xerr=err, color="tab:blue", capsize=3)
    ax.bar_label(bars, [_fmt(s, ".2f") + "×" if pd.notna(s) else "" for s in ok.speedup], padding=4)
    ax.invert_yaxis()
    ax.set_xlabel("images/s (median, min–max)")
    ax.set_title(f"Throughput: {title}")
    _save(fig, out / "throughput.png")

    fig, ax = plt.subplots(figsize=(8, 5))
    for r in runs[(runs.status == "ok") & (runs.dataset != "synthetic")].itertuples():
        epochs = json.loads(r.epochs) if isinstance(r.epochs, str) else []
        epochs = [e for e in epochs if e.get("val_acc") is not None]  # loader-only runs do not evaluate
        if epochs:
            ax.plot(
                [e["train_s"] for e in epochs],
                [100 * e["val_acc"] for e in epochs],
                marker="o",
                label=f"{r.config} (r{r.repeat})",
            )
    ax.set_xlabel("training time (s, evaluation excluded)")
    ax.set_ylabel("test accuracy (%)")
    ax.set_title(f"Accuracy vs time: {title}")
    if ax.lines:
        ax.legend(fontsize=7)
    ax.grid(alpha=0.3)
    _save(fig, out / "accuracy_vs_time.png")

    fig, ax = plt.subplots(figsize=(9, height))
    y = range(len(ok))
    for offset, (key, name) in enumerate(
        [
            ("peak_mem_allocated_gib", "peak allocated (device)"),
            ("peak_mem_reserved_gib", "peak reserved (device)"),
            ("peak_host_rss_gib", "peak host RSS"),
        ]
    ):
        values = pd.to_numeric(ok[key], errors="coerce").fillna(0) if key in ok else [0] * len(ok)
        ax.barh([i + (offset - 1) * 0.27 for i in y], values, height=0.27, label=name)
    ax.set_yticks(list(y), labels)
    ax.invert_yaxis()
    ax.set_xlabel("GiB (device memory is 0 on CPU runs)")
    ax.set_title(f"Peak memory: {title}")
    ax.legend(fontsize=8)
    _save(fig, out / "memory.png")

    fig, ax = plt.subplots(figsize=(9, height))
    wait = 100 * pd.to_numeric(ok.data_wait_frac, errors="coerce").fillna(0)
    ax.barh(labels, wait, color="tab:red", label="waiting for data")
    ax.barh(labels, 100 - wait, left=wait, color="tab:green", label="compute and the rest")
    ax.invert_yaxis()
    ax.set_xlabel("% of steady-state step time")
    ax.set_title(f"Data-wait vs compute: {title}")
    ax.legend(fontsize=8)
    _save(fig, out / "data_wait.png")
    plot_ladders(summary, out, title)
    plot_sweeps(summary, out, title)


def plot_ladders(summary: pd.DataFrame, out: Path, title: str) -> None:
    """ladder.png: one panel per ladder, images/s per rung, labelled with × its base rung and × the first rung; a
    rung slower than its base in red, so that a technique that does not pay on this machine stands out."""
    ladders = _groups(summary, "ladder")
    if not ladders:
        return
    fig, axes = plt.subplots(len(ladders), 1, figsize=(10, 1.2 + 2.2 * len(ladders)), squeeze=False)
    for ax, (name, rungs) in zip(axes[:, 0], ladders, strict=True):
        ips = pd.to_numeric(rungs.images_per_s, errors="coerce").fillna(0)
        first = ips.iloc[0] or float("nan")
        slower = [pd.notna(r.speedup_rung) and r.speedup_rung < 1 for r in rungs.itertuples()]  # than its base rung
        colors = ["tab:red" if s else "tab:green" for s in slower]
        bars = ax.barh([str(r.config)[:60] for r in rungs.itertuples()], ips, color=colors)
        labels = [
            f"{_x(r.speedup_rung)} base, {_x(v / first)} cumulative"
            if v
            else (_text(r.status) if r.status != "ok" else "not measured")
            for r, v in zip(rungs.itertuples(), ips, strict=True)
        ]
        ax.bar_label(bars, labels, padding=4, fontsize=8)
        ax.invert_yaxis()
        ax.set_title(f"Ladder: {name}", fontsize=10)
        ax.set_xlabel("images/s")
        ax.set_xlim(0, max(ips.max(), 1) * 1.45)
    fig.suptitle(f"Speed-up ladder: {title}", fontsize=11)
    fig.tight_layout()
    _save(fig, out / "ladder.png")


def plot_sweeps(summary: pd.DataFrame, out: Path, title: str) -> None:
    """sweeps.png: one panel per sweep, images/s against the knob (left axis) and data-wait in % (right axis)."""
    sweeps = _sweeps(summary)
    if not sweeps:
        return
    fig, axes = plt.subplots(1, len(sweeps), figsize=(5.5 * len(sweeps), 4), squeeze=False)
    for ax, (name, rows, knob) in zip(axes[0], sweeps, strict=True):
        ok = rows[rows.status == "ok"]
        if ok.empty or knob not in ok:  # no point of this sweep finished: an empty panel
            ax.set_title(f"{name}: no point finished", fontsize=9)
            continue
        x = pd.to_numeric(ok[knob], errors="coerce")
        ax.plot(x, pd.to_numeric(ok.images_per_s, errors="coerce"), marker="o", color="tab:blue")
        ax.set_xlabel(KNOBS.get(knob, knob))
        ax.set_ylabel("images/s", color="tab:blue")
        ax.set_ylim(bottom=0)
        if knob == "global_batch":
            ax.set_xscale("log", base=2)
            ax.minorticks_off()
        ax.set_xticks(list(x), [f"{v:.0f}" for v in x])
        wait = ax.twinx()
        wait.plot(x, 100 * pd.to_numeric(ok.data_wait_frac, errors="coerce"), marker="s", color="tab:red", ls="--")
        wait.set_ylabel("data-wait (% of step time)", color="tab:red")
        wait.set_ylim(0, 100)
        ax.set_title(name, fontsize=9)
        ax.grid(alpha=0.3)
    fig.suptitle(f"Sweeps: {title}", fontsize=11)
    fig.tight_layout()
    _save(fig, out / "sweeps.png")


def count_flops_per_image(model: str, channels: int, image_size: int) -> float:
    """Training FLOPs of one image (forward + backward of `model` on a (2, channels, image_size, image_size) float32
    batch, cross-entropy loss), counted with torch.utils.flop_counter.FlopCounterMode on the CPU, divided by 2. The
    count depends on the shapes only, not on the device, dtype or memory format: the same number the Meter counts
    in a run."""
    net = common.build_model(model, channels, image_size)
    x, y = torch.randn(2, channels, image_size, image_size), torch.tensor([0, 1])
    with FlopCounterMode(display=False) as counter:
        torch.nn.functional.cross_entropy(net(x), y).backward()
    return counter.get_total_flops() / 2


def peak_table(out: Path) -> str:
    """peak.md for a result folder measured before the runs counted their FLOPs (or on a GPU this machine does not
    have): every ok row's GFLOPs per image (from its metrics, else counted here with `count_flops_per_image` from
    its model and input shape), its TFLOP/s (that x its images/s) and the share of the datasheet's dense peak of its
    GPU in its dtype (DATASHEET_PEAKS) and of the measured matmul peak when env.json has one. Raises OSError /
    ValueError when OUT has no runs.csv or env.json."""
    runs, env = pd.read_csv(out / "runs.csv", dtype={"config": str}), json.loads((out / "env.json").read_text())
    counted, rows = {}, []
    for r in runs[runs.status == "ok"].to_dict("records"):
        record = json.loads((out / "metrics" / Path(str(r["log"])).with_suffix(".json").name).read_text())
        resolved = record.get("args") or {}
        argv = str(r.get("command", "")).split()  # older metrics have no resolved args: the command line has them
        for flag in ("--model", "--image-size"):
            if flag in argv[:-1] and not resolved.get(flag[2:].replace("-", "_")):
                resolved[flag[2:].replace("-", "_")] = argv[argv.index(flag) + 1]
        model = record.get("model") or resolved.get("model")
        if not model or model not in ("mlp", "cnn", "resnet18", "resnet50", "vit"):
            continue  # a loader-only row trains no model
        fashion_mnist = record.get("dataset") == "fashion-mnist" and not str(record.get("script")).startswith("loader")
        channels = 1 if fashion_mnist else 3  # common.input_shape; the loaders read RGB JPEGs
        size = 28 if fashion_mnist else int(record.get("image_size") or resolved.get("image_size") or 224)
        flops, where = record.get("flops_per_image"), "in the run"
        if not flops:
            key = (model, channels, size)
            counted.setdefault(key, count_flops_per_image(*key))
            flops, where = counted[key], "counted here"
        achieved = flops * r["images_per_s"] / 1e12
        rows.append(
            {
                "configuration": r["config"],
                "model": model,
                "input": f"{channels}x{size}x{size}",
                "precision": r.get("precision") or "–",
                "images/s": _fmt(r["images_per_s"], ",.1f"),
                "GFLOPs/image": f"{flops / 1e9:.3g} ({where})",
                "TFLOP/s": _fmt(achieved, ".3g"),
                "of peak": _fmt(of_peak(achieved, r.get("precision"), env, model, r.get("gpus") or 0), ".1%"),
                "of datasheet": _fmt(of_datasheet(achieved, r.get("precision"), env, model, r.get("gpus") or 0), ".1%"),
            }
        )
    sheet = datasheet(env)
    return (
        f"# Where the rows stand against the peak\n\n{hardware_line(env)}\n\n"
        "Written by `python bench/bench.py --peak-table OUT` from this folder's runs.csv, metrics/ and env.json: "
        "GFLOPs/image are training FLOPs (forward + backward) counted with torch.utils.flop_counter, in the run or, "
        "for a run made before the runs counted them, here on the CPU from the model and its input shape (the count "
        "does not depend on the device or dtype); TFLOP/s = that x images/s; of peak: over this machine's measured "
        f"matmul peak in the run's dtype ({peak_line(env)}); of datasheet: over "
        + (f"the GPU's dense peak in that dtype ({sheet[1]})" if sheet else "a datasheet (none known for this device)")
        + ". A dtype: amp float16 / bfloat16 rows against the 16-bit tensor-core peak; fp32 rows with TF32 "
        "convolutions against TF32 (the MLP and ViT, whose matmuls stay float32, against FP32).\n\n"
        + pd.DataFrame(rows).to_markdown(index=False)
        + "\n"
    )


def write_csv(frame: pd.DataFrame, path: Path) -> None:
    common.atomic_write_text(path, frame.to_csv(index=False))


def write_tables(out: Path, runs: pd.DataFrame, matrix: list[dict], env: dict, profile: str) -> pd.DataFrame:
    """summary.csv, table.md, ladder.md and the plots and pages, from the runs (one row per run) and the matrix
    (order, baselines, ladders); `env` is the machine's (env.json). Returns the summary."""
    for key in ["status", "reason", "dataset", "epochs", "images_per_s"]:
        if key not in runs:
            runs[key] = None
    summary = summarise(runs, matrix)
    write_csv(summary, out / "summary.csv")
    repeats = sorted({run["repeats"] for run in matrix})
    table_md = table_markdown(summary, env, profile, " / ".join(map(str, repeats)) + " run(s)")
    common.atomic_write_text(out / "table.md", table_md)
    ladders = ladder_markdown(summary, env)
    if ladders:
        common.atomic_write_text(
            out / "ladder.md", f"# Speed-up ladders, profile `{profile}`\n\n{hardware_line(env)}\n\n{ladders}"
        )
    plot(summary, runs, out, f"profile {profile}, {hardware_line(env).split(' · ')[0]}")
    diff_pages.write(out, [out])  # index.html: each technique's side-by-side page with this run's speed-up
    print(table_md)
    print(f"bench: tables, plots and the side-by-side pages are in {out} (open {out / 'index.html'})")
    return summary


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--profile",
        default="auto",
        help="smoke, cpu, gpu or any profile of --matrix; auto: gpu when torch sees a CUDA GPU, else cpu (with "
        "--tables-only: the profile the folder's env.json names)",
    )
    parser.add_argument("--out", type=Path, default=None, help="result folder (default: results/local/PROFILE)")
    parser.add_argument("--repeats", type=int, default=None, help="runs per configuration (default: the profile's)")
    parser.add_argument("--matrix", type=Path, default=REPO / "bench" / "profiles.toml", help="the profiles (TOML)")
    parser.add_argument("--python", default=sys.executable, help="interpreter for the scripts")
    parser.add_argument(
        "--only", action="append", default=None, help="run only configurations whose name contains this (repeatable)"
    )
    parser.add_argument(
        "--resume",
        action="store_true",
        help="keep the ok runs already in OUT/runs.csv (same command, metrics JSON present) and run only the others",
    )
    parser.add_argument(
        "--tables-only",
        action="store_true",
        help="run nothing: write the tables, plots and pages of OUT from its runs.csv and env.json (e.g. after the "
        "runner itself was killed before it wrote them)",
    )
    parser.add_argument(
        "--peak-table",
        type=Path,
        metavar="OUT",
        help="run nothing: write OUT/peak.md, where OUT's rows stand against the datasheet and measured peaks (FLOPs "
        "per image counted here for runs made before the runs counted them)",
    )
    args = parser.parse_args()
    if args.peak_table:
        try:
            text = peak_table(args.peak_table)
        except (OSError, ValueError, KeyError) as error:
            fail(f"--peak-table needs a result folder with runs.csv, metrics/ and env.json ({error})")
        common.atomic_write_text(args.peak_table / "peak.md", text)
        print(text)
        return
    if args.repeats is not None and args.repeats < 1:
        parser.error("--repeats must be 1 or more")

    gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
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
    bf16 = common.cpu_info()["bf16_instructions"]
    for run in matrix:
        if run.get("without_bf16") and not bf16:  # emulated bfloat16 is several times slower: run it shorter
            run["args"] = [*run["args"], *map(str, run["without_bf16"])]
            shorter = " ".join(map(str, run["without_bf16"]))
            run["note"] = (
                run.get("note", "") + f" bf16 emulated on this CPU (no bf16 instructions): shorter ({shorter})"
            ).strip()
    out = args.out or REPO / "results" / "local" / profile
    problem = common.output_problem(out, is_folder=True)  # before any run: a folder it can write
    if problem:
        fail(f"--out {out} {problem}")
    done = finished_rows(out) if args.resume else {}
    if args.tables_only:
        try:
            runs, env = pd.read_csv(out / "runs.csv", dtype={"config": str}), json.loads((out / "env.json").read_text())
        except (OSError, ValueError) as error:
            fail(f"--tables-only needs {out}/runs.csv and env.json from an earlier run ({error})")
        write_tables(out, runs, matrix, env, env.get("profile", profile))
        return

    env = {
        **common.environment(),
        "profile": profile,
        "matrix": str(args.matrix.resolve().relative_to(REPO))
        if args.matrix.resolve().is_relative_to(REPO)
        else str(args.matrix),
        "started": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "command": sys.argv,
        # once per bench run, before the matrix: what the of-peak columns divide by
        "gemm_peak_tflops": gemm_peak_in_a_child(args.python, gpus, float(table.get("gemm_seconds", 1.0))),
    }
    print(f"bench: measured matmul peak {peak_line(env)}", flush=True)
    common.atomic_write_text(out / "env.json", json.dumps(env, indent=2) + "\n")
    jobs = [(run, k) for run in matrix for k in range(1, run["repeats"] + 1)]
    rows = []
    print(f"bench: profile {profile}, {len(matrix)} configurations, {len(jobs)} runs -> {out}", flush=True)
    with Stop() as stop:  # from here on, Ctrl-C and SIGTERM stop the matrix at a safe point, never mid-write
        for run, k in (bar := tqdm(jobs, unit="run", dynamic_ncols=True)):
            if stop.signal is not None:
                break
            bar.set_description(f"{run['name']} r{k}")
            reason = skip_reason(run, gpus, bf16)
            previous = done.get((run["name"], k))
            if reason:
                row = {"config": run["name"], "repeat": k, "status": "skipped", "reason": reason}
            elif previous and previous.get("command") == " ".join(
                command(run, run_paths(run, k, out)[1], args.python, gpus)
            ):
                row = previous  # --resume: this run already finished with the same command
            else:
                row = execute(run, k, out, args.python, gpus, stop)
            rows.append(row)
            write_csv(pd.DataFrame(rows), out / "runs.csv")  # after every run: an interruption keeps what finished
            bar.write(
                f"{row['config']} r{k}: {row['status']}"
                + (" (already there, --resume)" if row is previous else "")
                + (f", {row['images_per_s']:.1f} images/s" if pd.notna(row.get("images_per_s") or None) else "")
                + (f" ({row['reason']})" if isinstance(row.get("reason"), str) and row["reason"] else "")
            )
        if stop.signal is not None:
            print(
                f"bench: interrupted ({stop.name}); writing the rows that finished (add --resume to run the rest)",
                file=sys.stderr,
                flush=True,
            )
        runs = pd.DataFrame(rows)
        write_csv(runs, out / "runs.csv")
        summary = write_tables(out, runs, matrix, env, profile)
    if stop.signal is not None:
        raise SystemExit(128 + stop.signal)  # the shell's code for a signal: 130 for Ctrl-C, 143 for SIGTERM, 129 HUP
    failed = (summary.status != "ok") & (summary.status != "skipped")
    if failed.any():
        print(
            f"bench: {failed.sum()} configuration(s) did not finish: see their logs in {out / 'logs'}", file=sys.stderr
        )
        raise SystemExit(1)


if __name__ == "__main__":
    try:
        main()
    except common.WriteFailed as error:  # disk full, I/O error: the file named, its previous version left as it was
        print(f"bench.py: error: {error}", file=sys.stderr)
        raise SystemExit(1) from None
    except KeyboardInterrupt:  # Ctrl-C before the matrix starts (reading the profile, the environment): no run yet
        print("bench.py: interrupted before any run (Ctrl-C)", file=sys.stderr)
        raise SystemExit(130) from None
