"""Run src/loader.py or src/loader_DALI.py unchanged (runpy, as `__main__`), then save its first validation batch.

    python tests/loader_probe.py OUT.pt src/loader_DALI.py -- <the script's flags>

The validation pipelines (resize, centre crop, normalise) are deterministic and read the files in the same sorted
order in both scripts, so their tensors for the same files can be compared.
"""

import runpy
import sys
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "src"))

out, script = Path(sys.argv[1]), str(REPO / sys.argv[2])
sys.argv = [script, *sys.argv[sys.argv.index("--") + 1 :]]
g = runpy.run_path(script, run_name="__main__")
images, labels = next(iter(g["val_loader"]))
torch.save({"images": images.cpu(), "labels": labels.cpu()}, out)
