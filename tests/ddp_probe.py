"""Run src/train_DDP.py inside this torchrun worker, then save what a test must see from outside the process.

    torchrun --nproc-per-node 2 tests/ddp_probe.py OUT -- <train_DDP.py flags>

The script runs unchanged (runpy, as `__main__`); afterwards this rank writes OUT/rank<R>.pt with the indices its
DistributedSampler gave for each epoch, the sampler's last epoch, its model's state, its test shard size, and which
of common.metrics.write_metrics / common.save_checkpoint it called with a real path (observed, not replaced).
"""

import runpy
import sys
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "src"))

import common  # noqa: E402

out = Path(sys.argv[1])
flags = sys.argv[sys.argv.index("--") + 1 :]
writes = []


def observe(module, name):
    original = getattr(module, name)

    def wrapper(path, *args, **kwargs):
        if path is not None:
            writes.append(name)
        return original(path, *args, **kwargs)

    return wrapper


common.metrics.write_metrics = observe(common.metrics, "write_metrics")  # what common.report calls
common.save_checkpoint = observe(common, "save_checkpoint")  # what the script calls
script = str(REPO / "src" / "train_DDP.py")
sys.argv = [script, *flags]
g = runpy.run_path(script, run_name="__main__")

sampler, shards = g["sampler"], {}
last_epoch = sampler.epoch
for epoch in range(g["args"].epochs):
    sampler.set_epoch(epoch)
    shards[epoch] = list(sampler)
torch.save(
    {
        "rank": g["rank"],
        "world_size": g["world_size"],
        "shards": shards,
        "sampler_epoch": last_epoch,
        "state": g["model"].module.state_dict(),
        "parameters": [name for name, _ in g["model"].module.named_parameters()],
        "test_indices": list(g["test_set"].indices),
        "writes": writes,
    },
    out / f"rank{g['rank']}.pt",
)
