"""Run src/loader.py or src/loader_DALI.py unchanged (runpy, as `__main__`) and save the labels of every training
batch it took, epoch by epoch, in the order it took them.

    python tests/order_probe.py OUT.pt src/loader_DALI.py -- <the script's flags>

common.Meter.loader, through which every script's training loop takes its batches (one call per epoch), is observed,
not replaced. With one file per class, a label names its file, so OUT.pt holds each epoch's order of the files.
"""

import runpy
import sys
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "src"))

import common  # noqa: E402

out, script = Path(sys.argv[1]), str(REPO / sys.argv[2])
epochs = []
loader = common.Meter.loader


def observed_loader(self, iterable):
    epochs.append([])
    for images, labels in loader(self, iterable):
        epochs[-1].extend(labels.tolist())
        yield images, labels


common.Meter.loader = observed_loader
sys.argv = [script, *sys.argv[sys.argv.index("--") + 1 :]]
runpy.run_path(script, run_name="__main__")
torch.save(epochs, out)
