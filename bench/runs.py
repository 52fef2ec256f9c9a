"""One run of the matrix: its command line, a subprocess in a session of its own with a timeout, the signals that
stop it at a safe point, and its row for runs.csv."""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd

REPO = Path(__file__).resolve().parent.parent
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
    "ac_mode",  # full (train_activation_checkpointing.py) or selective (train_selective_AC.py)
    "batching",  # train_varlen.py: pad, bucket or pack
    "schedule",  # train_pipeline.py: gpipe, 1f1b, interleaved1f1b, interleavedzerobubble, zbvzerobubble
    "stages_per_rank",  # train_pipeline.py
    "tp",  # train_FSDP_TP.py: the tensor-parallel ranks of each data-parallel group
]
RUN_FIELDS = [
    "script",
    "technique",
    *CONFIG_FIELDS,
    "images_per_s",
    "images_per_s_note",
    "tokens_per_sample",  # a language model's context: its samples/s (the images_per_s column) x this = tokens/s
    "tokens_per_s",
    "flops_per_token",
    "flops_per_token_palm",
    "first_step_s",
    "compile_s",
    "time_to_target_incl_compile_s",
    "allreduces_per_step",
    "allreduce_mib_per_step",  # train_DDP_comm_hooks.py: the size of what each rank all-reduces in a step
    "step_ms_p50",
    "step_ms_p90",
    "step_ms_blocked",  # the median block's mean step time (common.meter.blocked): what pairs compare
    "step_blocks_spread",  # (slowest - fastest block) / median block: a run disturbed within its window scatters
    "data_wait_frac",
    "peak_mem_allocated_gib",
    "peak_mem_reserved_gib",
    "peak_host_rss_gib",
    "activation_mib",
    "flops_per_image",
    "achieved_tflops",
    "graphs_compiled",
    "recompiled_steps",
    "compiled_blocks",  # train_compile.py --compile-regions: the blocks sharing the compiled graph
    "checkpointed_blocks",  # train_activation_checkpointing.py
    "pad_share",  # train_varlen.py: the share of the batches' tokens that were padding
    "checkpoints",  # train_FSDP.py: its sharded saves, and the seconds its training loop stood still for them
    "checkpoint_s",
    "params",
    "params_per_rank",
    "bubble_measured",
    "bubble_theory",
    "test_acc",
    "time_to_target_s",
    "steps_to_target",  # --target-loss: the step of the first probe at or below the target
    "target_sample_gap",  # --target-loss: the probe's sample's loss - the whole held-out text's, at the end
    "train_s",
    "steps",
    "lr",
]


def command(run: dict, metrics: Path, python: str, gpus: int) -> list[str]:
    """The argv that runs `run` once and writes its metrics JSON to `metrics`."""
    script = str(REPO / run["script"])
    out = str(metrics.parent.parent.resolve())  # an argument may name the result folder as {out} (a trace's folder)
    unique = f"{metrics.stem}-{time.strftime('%Y%m%d-%H%M%S')}"  # {run}: this run's own name, never an earlier one's
    args = (str(a).replace("{out}", out).replace("{run}", unique) for a in run["args"])
    tail = [script, *args, "--metrics-out", str(metrics)]
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
    except (OSError, UnicodeDecodeError, pd.errors.EmptyDataError, pd.errors.ParserError):
        return {}  # no rows to keep: every run runs again
    if not {"status", "repeat", "config", "log"} <= set(previous.columns):
        return {}
    rows = {}
    for row in previous[previous.status == "ok"].to_dict("records"):
        try:
            key = (row["config"], int(row["repeat"]))
            metrics = out / "metrics" / Path(str(row["log"])).with_suffix(".json").name
        except (TypeError, ValueError, OverflowError):
            continue  # a damaged row (no repeat number, no log name): its run runs again
        if isinstance(key[0], str) and metrics.is_file():
            rows[key] = row
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


POLL_S = 0.05  # how often a waiting runner looks at the stop flag, the timeout and the run's exit
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


def can_fork(run: dict, server) -> bool:
    """Whether `run` could start in a child of the fork server `server` (bench/zygote.py; None: no server): a
    single-process run (torchrun's workers start fresh) whose environment changes nothing the server fixed at its
    start (a thread count, LD_PRELOAD, torch's own variables: zygote.fixed_env)."""
    if server is None or run["launcher"] != "python":
        return False
    import zygote

    return zygote.fixed_env({**os.environ, **run.get("env", {})}) == server.fixed


def forked(run: dict, server) -> bool:
    """Whether `run` starts in a child of the fork server: it `can_fork` and is not marked `fresh` (in the matrix,
    or by `settle_fresh`)."""
    return can_fork(run, server) and not run.get("fresh")


def settle_fresh(matrix: list[dict], comparisons, server) -> list[str]:
    """Mark `fresh` every row compared with a row that cannot fork (a torchrun run, an environment the server did not
    start with), and so on along the comparisons: the two runs of a pair start the same way, so that a ratio measures
    the technique and never the way its runs started. A row the matrix itself marks `fresh` (a comparison of the two
    ways) changes nothing. Returns the names marked."""
    if server is None:
        return []
    rows, marked = {run["name"]: run for run in matrix}, []
    chosen = {name for name, run in rows.items() if run.get("fresh")}  # the matrix's own: left as they are
    changed = True
    while changed:
        changed = False
        for c in comparisons:
            a, b = rows.get(c.row), rows.get(c.reference)
            if a and b and not {a["name"], b["name"]} & chosen and forked(a, server) != forked(b, server):
                fresh = a if forked(a, server) else b
                fresh["fresh"], changed = True, True
                marked.append(fresh["name"])
    return marked


def execute(run: dict, repeat: int, out: Path, python: str, gpus: int, stop: Stop, server=None) -> dict:
    """Run `run` once as a subprocess with its timeout; return its row for runs.csv.

    status: ok, failed (non-zero exit or no metrics), oom (out of memory in its log), timeout (killed after
    `timeout_s`), or interrupted (`stop` was signalled before or while it ran: the run is not started, or its whole
    process group is killed, and the caller stops the matrix). With a fork server (`server`, bench/zygote.py) a run
    that `forked` allows starts as its child (`zygote.py --client`; the row's `started`: forked / fresh); the
    command recorded is the one a reader types either way. `startup_s` and `after_s`: the seconds from the launch to
    the training's start and from its end to the run's exit (the metrics' wall-clock marks).
    """
    log, metrics = run_paths(run, repeat, out)
    log.parent.mkdir(parents=True, exist_ok=True)
    metrics.parent.mkdir(parents=True, exist_ok=True)
    metrics.unlink(missing_ok=True)
    argv = command(run, metrics, python, gpus)
    shown = " ".join([*(f"{k}={v}" for k, v in run.get("env", {}).items()), *argv])  # the command line, as typed
    row = {"config": run["name"], "repeat": repeat, "log": str(log.relative_to(out)), "command": shown}
    env = {**os.environ, "PYTHONUNBUFFERED": "1", **run.get("env", {})}
    row["started"] = "forked" if forked(run, server) else "fresh"
    if row["started"] == "forked":
        argv, env = [python, str(REPO / "bench" / "zygote.py"), "--client", *argv[1:]], server.env(env)
    launched = time.time()
    started = time.perf_counter()
    rc = None
    with open(log, "w") as f:
        f.write(f"$ {shown}\n")
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
    ended = time.time()
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
        if isinstance(row.get("bubble_measured"), list):  # per pipeline stage: their mean idle share of a step
            stages = [b for b in row["bubble_measured"] if b is not None]
            row["bubble_measured"] = sum(stages) / len(stages) if stages else None
        if row.get("workers") is None:  # the loaders report their workers; the training scripts have the flag
            row["workers"] = resolved.get("workers")
        if record.get("images_per_s") is None:
            row["reason"] = record.get("images_per_s_note") or "images/s not measured"
        row["epochs"] = json.dumps(record.get("epochs", []))
        if record.get("train_started_unix") and record.get("train_stopped_unix"):
            row["startup_s"] = record["train_started_unix"] - launched
            row["after_s"] = ended - record["train_stopped_unix"]
    return row


def relabel(runs: pd.DataFrame) -> pd.DataFrame:
    """Labels that the scripts of an older commit got wrong, corrected from each run's own command line (runs.csv's
    `command`, the first line of its log), never by hand: before the loaders said so, a loader row run with
    --channels-last reported its precision without "+ channels_last". Returns `runs` with `precision` corrected."""
    if "command" not in runs or "precision" not in runs:
        return runs
    runs = runs.copy()
    for i, (command_line, precision) in enumerate(zip(runs.command, runs.precision, strict=True)):
        words = str(command_line).split()
        if "--channels-last" in words and isinstance(precision, str) and "channels_last" not in precision:
            runs.loc[runs.index[i], "precision"] = precision + " + channels_last"
    return runs
