"""Run src/train_varlen.py unchanged (runpy, as `__main__`) and save every training batch it took, epoch by epoch, in
the order it took them: (inputs, targets) int64 (B, T) as its collate_fn made them.

    python tests/varlen_probe.py OUT.pt -- src/train_varlen.py <the script's flags>

common.Meter.loader, through which the training loop takes its batches (one call per epoch), is observed, not
replaced.
"""

import runpy
import sys
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "src"))

import common  # noqa: E402

out, rest = Path(sys.argv[1]), sys.argv[sys.argv.index("--") + 1 :]
script = str(REPO / rest[0])
epochs = []
loader = common.Meter.loader


def observed_loader(self, iterable):
    epochs.append([])
    for inputs, targets in loader(self, iterable):
        epochs[-1].append((inputs.clone(), targets.clone()))
        yield inputs, targets


common.Meter.loader = observed_loader
sys.argv = [script, *rest[1:]]
runpy.run_path(script, run_name="__main__")
torch.save(epochs, out)
