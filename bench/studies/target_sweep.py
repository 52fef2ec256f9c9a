"""Steps to a target loss, swept: each configuration of the GPT run once to --target-loss, two at a time with one
thread each (the step at which a run reaches the target does not depend on its speed, so runs may share the cores;
their seconds do, and this table quotes none), then table.md from their metrics: the steps to the target, the
held-out sample's loss and the whole held-out text's at the end, and how far the two stand apart.

    python bench/studies/target_sweep.py --out results/muon-sweep-DATE                 # the sweep below (20 minutes)
    python bench/studies/target_sweep.py --out results/muon-sweep-DATE --tables-only   # table.md again from metrics/
    python bench/studies/target_sweep.py --sweep vit --out results/muon-vit-DATE       # Muon on the small ViT (5 min)
    python bench/studies/target_sweep.py --sweep fast --out results/fast-gpt-sweep-DATE   # train_fast.py's GPT (10 min)

Which learning rate and schedule length reach the target in the fewest steps is what the sweep is for; the seconds
those steps take are measured apart, in interleaved pairs on a quiet machine (profile `time-to-target`).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pandas as pd

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "src"))

import common  # noqa: E402

TARGET = 1.70
COMMON = ["--model", "gpt", "--device", "cpu", "--workers", "0", "--target-loss", f"{TARGET:.2f}",
          "--eval-every", "100", "--sample-chars", "0", "--log-every", "400"]  # fmt: skip
# (name, script, flags): AdamW's peak rate around the GPT's default (6e-3), Muon's around Keller Jordan's 0.02, then
# shorter one-cycle schedules for the best of each (a schedule that ends at the target anneals sooner)
SWEEP = [
    ("AdamW lr 3e-3", "src/train.py", ["--lr", "3e-3"]),
    ("AdamW lr 6e-3 (the default)", "src/train.py", ["--lr", "6e-3"]),
    ("AdamW lr 1.2e-2", "src/train.py", ["--lr", "1.2e-2"]),
    ("Muon lr 0.01", "src/train_muon.py", ["--muon-lr", "0.01"]),
    ("Muon lr 0.02", "src/train_muon.py", ["--muon-lr", "0.02"]),
    ("Muon lr 0.04", "src/train_muon.py", ["--muon-lr", "0.04"]),
    ("Muon lr 0.08", "src/train_muon.py", ["--muon-lr", "0.08"]),
    ("Muon lr 0.02, AdamW's part at 3e-3", "src/train_muon.py", ["--muon-lr", "0.02", "--lr", "3e-3"]),
    ("AdamW lr 6e-3, 1,800 steps", "src/train.py", ["--lr", "6e-3", "--max-steps", "1800"]),
    ("AdamW lr 6e-3, 2,200 steps", "src/train.py", ["--lr", "6e-3", "--max-steps", "2200"]),
    ("Muon lr 0.02, 900 steps", "src/train_muon.py", ["--muon-lr", "0.02", "--max-steps", "900"]),
    ("Muon lr 0.02, 1,200 steps", "src/train_muon.py", ["--muon-lr", "0.02", "--max-steps", "1200"]),
]

# train_fast.py's GPT (bfloat16 autocast, compiled, Muon for the blocks): Muon's rate, the schedule's length and the
# batch, for the fewest tokens to the target (a step of 32 blocks costs about twice one of 16 on this model); then the
# stack without bfloat16 and without Muon, to see what each does to the steps
FAST = "src/train_fast.py"
FAST_SWEEP = [
    ("batch 16, Muon 0.02, 1,200 steps", FAST, ["--muon-lr", "0.02", "--max-steps", "1200"]),
    ("batch 16, Muon 0.02, 1,000 steps", FAST, ["--muon-lr", "0.02", "--max-steps", "1000"]),
    ("batch 16, Muon 0.03, 1,000 steps", FAST, ["--muon-lr", "0.03", "--max-steps", "1000"]),
    ("batch 16, Muon 0.03, 1,200 steps", FAST, ["--muon-lr", "0.03", "--max-steps", "1200"]),
    ("batch 16, Muon 0.03, 1,100 steps", FAST, ["--muon-lr", "0.03", "--max-steps", "1100"]),
    ("batch 16, Muon 0.03, 900 steps", FAST, ["--muon-lr", "0.03", "--max-steps", "900"]),
    ("batch 16, Muon 0.04, 900 steps", FAST, ["--muon-lr", "0.04", "--max-steps", "900"]),
    ("batch 16, Muon 0.04, 800 steps", FAST, ["--muon-lr", "0.04", "--max-steps", "800"]),
    ("batch 16, Muon 0.02, AdamW's part 1.2e-2, 1,000 steps", FAST,
     ["--muon-lr", "0.02", "--lr", "1.2e-2", "--max-steps", "1000"]),
    ("batch 8, Muon 0.02, 2,000 steps", FAST, ["--batch-size", "8", "--muon-lr", "0.02", "--max-steps", "2000"]),
    ("batch 32, Muon 0.02, 600 steps", FAST, ["--batch-size", "32", "--muon-lr", "0.02", "--max-steps", "600"]),
    ("batch 32, Muon 0.03, 800 steps", FAST, ["--batch-size", "32", "--muon-lr", "0.03", "--max-steps", "800"]),
    ("batch 16, Muon 0.02, 1,200 steps, float32", FAST,
     ["--muon-lr", "0.02", "--max-steps", "1200", "--amp-dtype", "float32"]),
    ("batch 16, AdamW 6e-3, 2,800 steps (--without muon)", FAST, ["--without", "muon", "--max-steps", "2800"]),
]  # fmt: skip

# The small ViT on Fashion-MNIST, train.py's 2 epochs: Muon for its blocks' matrices (the patch embedding, a
# convolution, and the classifier head stay on AdamW) at three rates against AdamW at the ViT's default 2e-3: the
# test accuracy and loss after the same epochs (a model that learns more per step is the gain here too)
VIT_COMMON = ["--model", "vit", "--device", "cpu", "--workers", "0", "--log-every", "400"]
VIT_SWEEP = [
    ("AdamW lr 2e-3 (the default)", "src/train.py", []),
    ("Muon lr 0.01", "src/train_muon.py", ["--muon-lr", "0.01"]),
    ("Muon lr 0.02", "src/train_muon.py", ["--muon-lr", "0.02"]),
    ("Muon lr 0.04", "src/train_muon.py", ["--muon-lr", "0.04"]),
    ("AdamW lr 2e-3, seed 1", "src/train.py", ["--seed", "1"]),
    ("AdamW lr 2e-3, seed 2", "src/train.py", ["--seed", "2"]),
    ("Muon lr 0.01, seed 1", "src/train_muon.py", ["--muon-lr", "0.01", "--seed", "1"]),
    ("Muon lr 0.01, seed 2", "src/train_muon.py", ["--muon-lr", "0.01", "--seed", "2"]),
]


def slug(name: str) -> str:
    return "".join(c if c.isalnum() or c in ".-" else "-" for c in name.lower()).strip("-")


def run_one(out: Path, name: str, script: str, flags: list[str], common_flags: list[str] = COMMON) -> None:
    """One run, one thread, its log in logs/ and metrics in metrics/ (written by the script atomically)."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}
    metrics = out / "metrics" / f"{slug(name)}.json"
    with open(out / "logs" / f"{slug(name)}.log", "w") as log:
        argv = [sys.executable, script, *common_flags, *flags, "--metrics-out", str(metrics)]
        log.write("$ " + " ".join(argv[1:]) + "\n")
        log.flush()
        subprocess.run(argv, cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT, check=False)


def table(out: Path, sweep: list = SWEEP, fast: bool = False) -> str:
    """table.md's text from metrics/: one row per configuration of `sweep` that has its metrics (`fast`: the
    train_fast.py sweep, whose batches differ: tokens to the target too)."""
    rows = []
    for name, script, flags in sweep:
        path = out / "metrics" / f"{slug(name)}.json"
        if not path.is_file():
            continue
        m = json.loads(path.read_text())
        final = m["epochs"][-1]["val_loss"] if m.get("epochs") else None
        reached = m.get("steps_to_target")
        tokens = f"{reached * m['global_batch'] * m['tokens_per_sample']:,}" if reached else "–"
        rows.append(
            {
                "configuration": name,
                "script": Path(script).name,
                "flags": " ".join(flags),
                "steps": m.get("steps"),
                f"steps to {TARGET:.2f}": m.get("steps_to_target") or "not reached",
                **({f"tokens to {TARGET:.2f}": tokens} if fast else {}),
                "sample loss at the end": f"{m['target_sample_loss_end']:.4f}",
                "held-out text at the end": f"{final:.4f}" if final is not None else "–",
                "sample - whole": f"{m['target_sample_gap']:+.4f}" if m.get("target_sample_gap") is not None else "–",
                "log": f"[log](logs/{slug(name)}.log)",
            }
        )
    env = json.loads((out / "env.json").read_text()) if (out / "env.json").is_file() else {}
    what = "train_fast.py's batch, rates" if fast else "the GPT's optimizer, learning rate"
    head = (
        f"# Steps to {TARGET:.2f} nats per character: {what} and schedule length\n\n"
        f"Written by `python bench/studies/target_sweep.py` from `metrics/`. CPU: {env.get('cpu_model', '?')}, "
        f"{env.get('cpu_count', '?')} cores; torch {env.get('torch', '?')}; commit "
        f"{(env.get('git') or {}).get('commit', '?')[:10]}. Each run: `--target-loss {TARGET:.2f} --eval-every 100`, "
        "the held-out sample's loss (1,024 blocks of the four held-out plays, fixed) every 100 steps; two runs at a "
        "time, one thread each, so no seconds are quoted: steps do not depend on speed.\n\n"
    )
    return head + pd.DataFrame(rows).to_markdown(index=False) + "\n"


def vit_table(out: Path) -> str:
    """table.md's text for --sweep vit: test accuracy and loss after the runs' epochs."""
    rows = []
    for name, script, flags in VIT_SWEEP:
        path = out / "metrics" / f"{slug(name)}.json"
        if not path.is_file():
            continue
        m = json.loads(path.read_text())
        last = m["epochs"][-1]
        rows.append(
            {
                "configuration": name,
                "script": Path(script).name,
                "flags": " ".join(flags) or "–",
                "epochs": last["epoch"],
                "steps": m.get("steps"),
                "test accuracy": f"{100 * last['val_acc']:.2f} %",
                "test loss": f"{last['val_loss']:.4f}",
                "log": f"[log](logs/{slug(name)}.log)",
            }
        )
    env = json.loads((out / "env.json").read_text()) if (out / "env.json").is_file() else {}
    head = (
        "# Muon on the small ViT: test accuracy after train.py's 2 epochs\n\n"
        f"Written by `python bench/studies/target_sweep.py --sweep vit` from `metrics/`. CPU: {env.get('cpu_model', '?')}, "
        f"{env.get('cpu_count', '?')} cores; torch {env.get('torch', '?')}; commit "
        f"{(env.get('git') or {}).get('commit', '?')[:10]}. Fashion-MNIST, all 60,000 training and 10,000 test "
        "images; two runs at a time, one thread each, so no seconds are quoted.\n\n"
    )
    return head + pd.DataFrame(rows).to_markdown(index=False) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description="the GPT's steps to a target loss, swept")
    parser.add_argument("--out", type=Path, required=True, help="the result folder")
    parser.add_argument("--tables-only", action="store_true", help="write table.md from metrics/ only")
    parser.add_argument(
        "--sweep", choices=["gpt", "fast", "vit"], default="gpt", help="the GPT to 1.70, train_fast.py's, the ViT"
    )
    args = parser.parse_args()
    sweep, flags, write = {
        "gpt": (SWEEP, COMMON, table),
        "fast": (FAST_SWEEP, COMMON, lambda out: table(out, FAST_SWEEP, fast=True)),
        "vit": (VIT_SWEEP, VIT_COMMON, vit_table),
    }[args.sweep]
    if not args.tables_only:
        for sub in ("logs", "metrics"):
            (args.out / sub).mkdir(parents=True, exist_ok=True)
        if not (args.out / "env.json").is_file():  # the first run's machine and commit
            common.io.atomic_write_text(args.out / "env.json", json.dumps(common.env.environment(), indent=2) + "\n")
        with ThreadPoolExecutor(max_workers=2) as pool:  # two at a time: one per core
            todo = [c for c in sweep if not (args.out / "metrics" / f"{slug(c[0])}.json").is_file()]  # a rerun resumes
            list(pool.map(lambda c: run_one(args.out, *c, flags), todo))
    common.io.atomic_write_text(args.out / "table.md", write(args.out))
    print(f"target_sweep.py: wrote {args.out / 'table.md'}")


if __name__ == "__main__":
    main()
