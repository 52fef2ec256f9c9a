"""Time to a target loss (`--target-loss`): a language model's mean cross-entropy on a fixed sample of held-out
text, every `--eval-every` optimizer steps with the training clock stopped, as modded-nanogpt counts its time to a
validation loss; `report` writes the training seconds and steps until the sample's loss first reached the target.

Measurement, not a lesson, and every part of it passed in the open: a script hands the Meter the probe it makes
with `target_probe(args, model)` (None without --target-loss), the Meter calls `after_step` at the end of every step
and puts the probe's record in its summary (`record`), and `report` turns that record into the metrics (`fields`).
`check` (parse_args calls it) only refuses what cannot be probed; no state lives in this module. Between two probes
nothing runs that a run without --target-loss would not run. The probe evaluates the model as built (a
torch.compile'd wrapper's or DDP's inner module: no recompile for eval mode), outside autocast with autograd off, so
every script's model is judged the same way (but train_float8.py's, whose Linears are converted in place, probes in
float8); a probe's seconds are not training seconds (the Meter is paused: its images/s window closes and reopens
too). The time is known to a probe: a run that crosses the target just after one is counted at the next, up to
--eval-every steps later.

The sample: `--target-sample` blocks of the held-out plays (all when fewer), drawn once with a fixed seed, so every
run and every script sees the same characters; its loss differs from the full held-out text's, and `report` records
both for the final model (`target_sample_loss_end` against the last epoch's `val_loss`).

Refused in one line by `check`: torchrun (WORLD_SIZE > 1: a probe on rank 0 would stall the other ranks at
their next collective, and that wait would count as their training time), --resume (the resumed run's clock and
steps start again at 0: its time to the target would be the last part's only) and --dataset synthetic (no held-out
text to sample).
"""

from __future__ import annotations

import os

import torch
import torch.nn as nn

from .data import shakespeare_sets
from .errors import die
from .models import TEXT_MODELS

SAMPLE_SEED = 1234  # which held-out blocks the sample holds: fixed, the same for every run


class TargetProbe:
    """The probe's state: the target (nats per token), its period in steps, the sample, the model, each probe's
    (step, training seconds, loss) and the first that reached the target."""

    def __init__(self, target: float, every: int, model: nn.Module, heldout, sample_blocks: int, chunk: int = 256):
        """`model`: the module to evaluate; `heldout`: a TensorDataset of (inputs, targets) (N, T) int64 blocks, of
        which `sample_blocks` (all when fewer) are drawn with SAMPLE_SEED and kept, on the CPU until the first probe."""
        self.target, self.every, self.model, self.chunk = target, every, model, chunk
        inputs, targets = heldout.tensors
        pick = torch.randperm(len(inputs), generator=torch.Generator().manual_seed(SAMPLE_SEED))[:sample_blocks]
        pick = pick.sort().values
        self.inputs, self.targets = inputs[pick].clone(), targets[pick].clone()  # (n, T) int64 each
        self.probes: list[dict] = []
        self.reached: dict | None = None

    @torch.no_grad()
    def loss(self) -> float:
        """The model's mean cross-entropy (nats per token) over the sample, in chunks of `chunk` blocks (the training
        batch, at least 64: forward only, autograd off, a chunk holds far less than a training step); the model is
        left in the train/eval mode it had."""
        chunk = self.chunk
        was_training = self.model.training
        self.model.eval()
        device = next(self.model.parameters()).device
        total = 0.0
        for start in range(0, len(self.inputs), chunk):
            x = self.inputs[start : start + chunk].to(device)
            y = self.targets[start : start + chunk].to(device)
            logits = self.model(x).float()  # (n, V, T)
            total += nn.functional.cross_entropy(logits, y, reduction="sum").item()
        self.model.train(was_training)
        return total / self.targets.numel()

    def after_step(self, meter) -> None:
        """Every `every` steps until the target is reached: pause the meter, take the sample's loss, resume."""
        if self.reached is not None or meter.steps % self.every:
            return
        meter.pause()  # synchronises: the steps queued so far are training time, the probe is not
        loss = self.loss()
        record = {"step": meter.steps, "train_s": meter.train_s, "loss": loss}
        self.probes.append(record)
        if loss <= self.target:
            self.reached = record
            print(
                f"target: held-out sample loss {loss:.4f} <= {self.target} at step {meter.steps}, "
                f"{meter.train_s:.1f} s of training",
                flush=True,
            )
        meter.resume()

    def record(self) -> dict:
        """What `fields` needs, as plain data (the Meter's summary carries it to `report`): target, every,
        sample_blocks, probes, reached (the first probe at or below the target, or None) and loss_end, the final
        model's loss on the sample (nats per token), taken now."""
        return {"target": self.target, "every": self.every, "sample_blocks": len(self.inputs), "probes": self.probes,
                "reached": self.reached, "loss_end": self.loss()}  # fmt: skip


def check(args) -> None:
    """Refuse, in one line and exit 2, a --target-loss that cannot be probed: under torchrun (WORLD_SIZE > 1), with
    --resume, on --dataset synthetic, or for a model that is not a language model. parse_args calls it; it keeps
    nothing."""
    if getattr(args, "target_loss", None) is None:
        return
    if args.model not in TEXT_MODELS:
        die(f"--target-loss is a language model's (--model gpt, gpt2); for --model {args.model} use --target-acc")
    if int(os.environ.get("WORLD_SIZE", "1")) > 1:
        die("--target-loss probes in one process: a probe on one rank would stall the others (run it without torchrun)")
    if getattr(args, "resume", False):
        die("--target-loss times a whole run: a resumed run's clock starts again at 0 (run it without --resume)")
    if getattr(args, "dataset", None) == "synthetic":
        die("--target-loss needs held-out text: --dataset shakespeare, not synthetic")


def target_probe(args, model: nn.Module) -> TargetProbe | None:
    """The probe of `--target-loss` for `model` (a script passes it to its Meter), or None without the flag.

    `model` is the model as built: a torch.compile wrapper (`_orig_mod`) or DistributedDataParallel (`module`) is
    looked through, so the probe never recompiles for eval mode. The sample: `--target-sample` blocks (all when
    fewer) of the held-out plays at --seq-len (`data.shakespeare_sets`: the blocks load_data hands the script, its
    first --test-subset where that is given), drawn once with SAMPLE_SEED. Evaluated in
    chunks of max(--batch-size, 64) blocks."""
    if getattr(args, "target_loss", None) is None:
        return None
    while isinstance(inner := getattr(model, "_orig_mod", getattr(model, "module", None)), nn.Module):
        model = inner  # torch.compile's OptimizedModule, DDP / DataParallel, in any order: the model inside
    heldout = shakespeare_sets(args)[1]  # the script's held-out blocks (load_data's)
    return TargetProbe(args.target_loss, args.eval_every, model, heldout, args.target_sample, max(args.batch_size, 64))


def fields(record: dict | None, compile_s: float, final_val_loss: float | None) -> dict:
    """The metrics of a --target-loss run from its probe's `record` (the Meter's summary["target"]): target_loss,
    time_to_target_s (training seconds to the first probe at or below it, compilation taken out),
    time_to_target_incl_compile_s, steps_to_target, target_probes (every probe), target_sample_blocks, and the final
    model's loss on the sample against the full held-out text's (target_sample_loss_end, target_sample_gap = sample -
    full: how far the sample stands from the whole). {} without a record (no --target-loss)."""
    if record is None:
        return {}
    reached, end = record["reached"], record["loss_end"]
    return {
        "target_loss": record["target"],
        "time_to_target_s": reached["train_s"] - compile_s if reached else None,
        "time_to_target_incl_compile_s": reached["train_s"] if reached else None,
        "steps_to_target": reached["step"] if reached else None,
        "target_eval_every": record["every"],
        "target_sample_blocks": record["sample_blocks"],
        "target_probes": record["probes"],
        "target_sample_loss_end": end,
        "target_sample_gap": end - final_val_loss if final_val_loss is not None else None,
    }
