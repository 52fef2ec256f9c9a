"""Time to a target loss (`--target-loss`): a language model's mean cross-entropy on a fixed sample of held-out
text, every `--eval-every` optimizer steps with the training clock stopped, as modded-nanogpt counts its time to a
validation loss; `report` writes the training seconds and steps until the sample's loss first reached the target.

Measurement, not a lesson: no script calls this module. `parse_args` turns it on (`configure`) when the command line
has --target-loss; `load_data` hands it the held-out set (`watch_heldout`), `build_model` the model it built (the
probe asks for it: `configure` hands `watch_model` to `models.watch`), and the Meter calls `after_step` at the end of
every step. Between two probes nothing runs that a run without --target-loss would not run. The probe evaluates the
model as built (not a torch.compile'd wrapper: no recompile for eval mode), outside autocast with autograd off, so
every script's model is judged the same way (but train_float8.py's, whose Linears are converted in place, probes in
float8); a probe's seconds are not training seconds (the Meter is paused: its images/s window closes and reopens
too). The time is known to a probe: a run that crosses the target just after one is counted at the next, up to
--eval-every steps later.

The sample: `--target-sample` blocks of the held-out plays (all when fewer), drawn once with a fixed seed, so every
run and every script sees the same characters; its loss differs from the full held-out text's, and `report` records
both for the final model (`target_sample_loss_end` against the last epoch's `val_loss`).

Refused in one line by `configure`: torchrun (WORLD_SIZE > 1: a probe on rank 0 would stall the other ranks at
their next collective, and that wait would count as their training time), --resume (the resumed run's clock and
steps start again at 0: its time to the target would be the last part's only) and --dataset synthetic (no held-out
text to sample).
"""

from __future__ import annotations

import os

import torch
import torch.nn as nn

from . import models
from .errors import die

SAMPLE_SEED = 1234  # which held-out blocks the sample holds: fixed, the same for every run


class TargetProbe:
    """The probe's state: the target (nats per token), its period in steps, the sample, the model, each probe's
    (step, training seconds, loss) and the first that reached the target."""

    def __init__(self, target: float, every: int, sample_blocks: int, chunk: int = 256):
        self.target, self.every, self.sample_blocks, self.chunk = target, every, sample_blocks, chunk
        self.model: nn.Module | None = None
        self.inputs = self.targets = None  # (n, T) int64 each, on the CPU until the first probe
        self.probes: list[dict] = []
        self.reached: dict | None = None

    def heldout(self, dataset) -> None:
        """Keep `sample_blocks` blocks of a TensorDataset of (inputs, targets) (N, T) int64, drawn with SAMPLE_SEED."""
        inputs, targets = dataset.tensors
        pick = torch.randperm(len(inputs), generator=torch.Generator().manual_seed(SAMPLE_SEED))[: self.sample_blocks]
        pick = pick.sort().values
        self.inputs, self.targets = inputs[pick].clone(), targets[pick].clone()

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
        if self.reached is not None or meter.steps % self.every or self.model is None or self.inputs is None:
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


ACTIVE: TargetProbe | None = None


def configure(args) -> None:
    """Turn the probe on for this process when `args.target_loss` is set (parse_args calls this). Exits with one
    line under torchrun (WORLD_SIZE > 1) and for a model that is not a language model."""
    global ACTIVE
    ACTIVE = None
    if getattr(args, "target_loss", None) is None:
        return
    if args.model not in models.TEXT_MODELS:
        die(f"--target-loss is a language model's (--model gpt, gpt2); for --model {args.model} use --target-acc")
    if int(os.environ.get("WORLD_SIZE", "1")) > 1:
        die("--target-loss probes in one process: a probe on one rank would stall the others (run it without torchrun)")
    if getattr(args, "resume", False):
        die("--target-loss times a whole run: a resumed run's clock starts again at 0 (run it without --resume)")
    if getattr(args, "dataset", None) == "synthetic":
        die("--target-loss needs held-out text: --dataset shakespeare, not synthetic")
    ACTIVE = TargetProbe(args.target_loss, args.eval_every, args.target_sample, max(args.batch_size, 64))
    models.watch(watch_model)  # the first GPT build_model makes: the model the probe evaluates


def watch_heldout(dataset) -> None:
    """The held-out set `load_data` made (text): the probe draws its sample from it."""
    if ACTIVE is not None and ACTIVE.inputs is None:
        ACTIVE.heldout(dataset)


def watch_model(model: nn.Module) -> nn.Module:
    """The first model `build_model` made in this process (`configure` asked `models.watch` for them) is the one the
    probe evaluates; returns `model`."""
    if ACTIVE is not None and ACTIVE.model is None:
        ACTIVE.model = model
    return model


def after_step(meter) -> None:
    if ACTIVE is not None:
        ACTIVE.after_step(meter)


def fields(compile_s: float, final_val_loss: float | None) -> dict:
    """The metrics of a --target-loss run: target_loss, time_to_target_s (training seconds to the first probe at or
    below it, compilation taken out), time_to_target_incl_compile_s, steps_to_target, target_probes (every probe),
    target_sample_blocks, and the final model's loss on the sample against the full held-out text's
    (target_sample_loss_end, target_sample_gap = sample - full: how far the sample stands from the whole). {} when
    the probe is off."""
    if ACTIVE is None or ACTIVE.model is None or ACTIVE.inputs is None:
        return {}
    reached = ACTIVE.reached
    end = ACTIVE.loss()
    return {
        "target_loss": ACTIVE.target,
        "time_to_target_s": reached["train_s"] - compile_s if reached else None,
        "time_to_target_incl_compile_s": reached["train_s"] if reached else None,
        "steps_to_target": reached["step"] if reached else None,
        "target_eval_every": ACTIVE.every,
        "target_sample_blocks": len(ACTIVE.inputs),
        "target_probes": ACTIVE.probes,
        "target_sample_loss_end": end,
        "target_sample_gap": end - final_val_loss if final_val_loss is not None else None,
    }
