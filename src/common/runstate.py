"""What one run did with its checkpoints and signals, and the status its metrics report: a RunState, made by
parse_args for each run (`args.run`) and passed to whoever records or reads it."""

from __future__ import annotations

import dataclasses
from pathlib import Path


@dataclasses.dataclass
class RunState:
    """One run's record, for its closing report and its exit status: `failed_writes`, the one-line messages of the
    checkpoint writes that failed (`save_checkpoint` appends them); `saved`, the last checkpoint written or loaded
    as (path, step) (`save_checkpoint`, `load_checkpoint`); `stopped_at`, the step a SIGTERM stopped the run at
    (`Preemption.requested`). parse_args makes one per run as `args.run`; `report` reads it, `Preemption.exit` and
    `distributed.sharded_save_failed` too. Not a flag: the metrics' `args` leave it out."""

    failed_writes: list[str] = dataclasses.field(default_factory=list)
    saved: tuple[Path, int] | None = None
    stopped_at: int | None = None

    def status(self) -> str:
        """The metrics' `status`: "ok"; "terminated" (SIGTERM stopped the run, `Preemption`); or "checkpoint not
        written" (a checkpoint write failed: the run trained on and reports its numbers, `save_checkpoint`)."""
        if self.failed_writes:
            return "checkpoint not written"
        return "terminated" if self.stopped_at is not None else "ok"
