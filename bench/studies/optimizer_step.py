"""What AdamW's step costs alone, eager against compiled: the share of a training step that
train_compiled_optimizer.py can shorten.

For each model: its parameters with random gradients, then AdamW as train_compiled_optimizer.py builds it (the rate and
betas in float32 tensors, weight decay 5e-4) timed eagerly (`optimizer.step()`, as train.py) and under torch.compile
(the step compiled once, then replayed); `gpt-muon`: train_fast.py's GPT optimizers, Muon on the blocks' matrices
(Newton-Schulz in bfloat16 where the CPU multiplies it natively, else float32, as train_fast.py chooses) and fused
AdamW on the rest, both steps eager or compiled together; with torch.utils.benchmark's Timer (`blocked_autorange`: repeated blocks
of calls until at least --min-run-time seconds; its median). Writes table.md (ms per step, eager and compiled, and
their ratio), env.json and log.txt into --out.

    python bench/studies/optimizer_step.py --out results/optimizer-step-DATE
    python bench/studies/optimizer_step.py --models gpt --out /tmp/optimizer-step     # one model
"""

import argparse
import json
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path[:0] = [str(REPO / "src"), str(REPO / "bench")]  # src: common; bench: cells (the tables' hardware line)

import pandas as pd  # noqa: E402
import torch  # noqa: E402
from torch.utils import benchmark  # noqa: E402
from cells import hardware_line  # noqa: E402

import common  # noqa: E402

SHAPES = {
    "cnn": (1, 28),
    "gpt": (common.data.TEXT_VOCAB, 64),
    "gpt2": (common.data.TEXT_VOCAB, 1024),
    "gpt-muon": (common.data.TEXT_VOCAB, 64),
}  # as the scripts build


def train_fast_step(model: torch.nn.Module):
    """train_fast.py's optimizers for a transformer: Muon (its rate, momentum and decay) on the blocks' 2-D weights,
    fused AdamW on the rest; returns one function that steps both."""
    matrices = [p for block in model.blocks for p in block.parameters() if p.ndim == 2]
    ns_dtype = torch.bfloat16 if common.native_bfloat16(torch.device("cpu")) else torch.float32
    muon = common.Muon(matrices, lr=0.02, momentum=0.95, nesterov=True, weight_decay=5e-4, ns_dtype=ns_dtype)
    rest = [p for p in model.parameters() if all(p is not m for m in matrices)]
    adamw = torch.optim.AdamW(rest, lr=2e-3, weight_decay=5e-4, fused=True)

    def step():
        adamw.step()
        muon.step()

    return step


def step_ms(model: torch.nn.Module, compiled: bool, min_run_time: float, muon: bool = False) -> float:
    """Median milliseconds of one AdamW step over `model`'s parameters (gradients already set), eager or compiled;
    `muon`: train_fast.py's two optimizers instead (train_fast_step)."""
    lr, beta1, beta2 = (torch.tensor(v) for v in (1e-3, 0.9, 0.999))
    if muon:
        step = train_fast_step(model)
    else:
        optimizer = torch.optim.AdamW(model.parameters(), lr=lr, betas=(beta1, beta2), weight_decay=5e-4)
        step = optimizer.step
    step = torch.compile(step) if compiled else step
    for _ in range(3):  # the state's first allocation, and the compile
        step()
    timer = benchmark.Timer(stmt="step()", globals={"step": step}, num_threads=torch.get_num_threads())
    return timer.blocked_autorange(min_run_time=min_run_time).median * 1e3


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", default="cnn,gpt,gpt2,gpt-muon", help="comma-separated, of: " + ", ".join(SHAPES))
    parser.add_argument("--min-run-time", type=float, default=2.0, help="seconds each timing runs at least")
    parser.add_argument("--out", type=Path, required=True, help="folder for table.md, env.json and log.txt")
    args = parser.parse_args()
    models = args.models.split(",")
    if args.min_run_time <= 0:
        parser.error(f"--min-run-time must be above 0 seconds, not {args.min_run_time}")
    if unknown := [m for m in models if m not in SHAPES]:
        parser.error(f"--models: unknown {', '.join(unknown)} (expected {', '.join(SHAPES)})")
    if problem := common.output_problem(args.out, is_folder=True):
        parser.error(f"--out {args.out} {problem}")
    torch.manual_seed(0)
    rows, lines = [], []
    for name in models:
        model = common.build_model(name.removesuffix("-muon"), *SHAPES[name])
        for p in model.parameters():
            p.grad = torch.randn_like(p)
        eager, compiled = (step_ms(model, c, args.min_run_time, name.endswith("-muon")) for c in (False, True))
        params = sum(p.numel() for p in model.parameters())
        rows.append({"model": name, "params (M)": round(params / 1e6, 2), "eager (ms)": round(eager, 3),
                     "compiled (ms)": round(compiled, 3), "eager / compiled": round(eager / compiled, 2)})  # fmt: skip
        lines.append(
            f"{name}: {params / 1e6:.2f} M parameters, {'Muon + fused AdamW' if name.endswith('-muon') else 'AdamW'} "
            f"step {eager:.3f} ms eager, {compiled:.3f} ms compiled"
        )
        print(lines[-1], flush=True)
    env = common.env.environment()
    table = pd.DataFrame(rows).to_markdown(index=False)
    head = (f"# The optimizer's step alone, eager against compiled\n\n`python bench/studies/optimizer_step.py "
            f"--models {args.models} --out {args.out}`.\n\n{hardware_line(env)}\n\nMedian ms per step of torch.utils.benchmark's blocked_autorange "
            f"(at least {args.min_run_time} s per timing), gradients random, the rate and betas in float32 tensors; gpt-muon: train_fast.py's "
            "Muon on the blocks' matrices and fused AdamW on the rest, stepped together.\n\n")  # fmt: skip
    common.io.atomic_write_text(args.out / "table.md", head + table + "\n")
    common.io.atomic_write_text(args.out / "env.json", json.dumps(env, indent=2) + "\n")
    common.io.atomic_write_text(args.out / "log.txt", "\n".join(lines) + "\n")
    print(f"{args.out}/table.md", flush=True)


if __name__ == "__main__":
    try:
        main()
    except KeyboardInterrupt:  # nothing is written before the last model's timing: no half-written table
        sys.exit("optimizer_step.py: interrupted; nothing written")
