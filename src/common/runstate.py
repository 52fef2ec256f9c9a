"""What this process's run did with its checkpoints and signals, and the status its metrics report."""

from __future__ import annotations

# What this process's run did with its checkpoints and signals, for its closing report and its exit status: the
# checkpoint writes that failed (their one-line messages), the last checkpoint written (path, step), and the step a
# SIGTERM stopped the run at (`Preemption`).
RUN = {"failed_writes": [], "saved": None, "stopped_at": None}


def run_status() -> str:
    """The metrics' `status`: "ok"; "terminated" (SIGTERM stopped the run, `Preemption`); or "checkpoint not
    written" (a checkpoint write failed: the run trained on and reports its numbers, `save_checkpoint`)."""
    if RUN["failed_writes"]:
        return "checkpoint not written"
    return "terminated" if RUN["stopped_at"] is not None else "ok"
