"""Compile's cold start, cold against warm: seconds to the first step, and train_fast.py's time to 1.70 with compile.

Three ways a run can start, each run with an Inductor folder of its own (TORCHINDUCTOR_CACHE_DIR):
- cold: an empty folder and no cache file (a fresh container, a new machine, a CI job);
- file: an empty folder and the compile cache file an earlier run wrote (torch's Mega-Cache,
  `torch.compiler.save_cache_artifacts()` / `load_cache_artifacts()`: what train_compile_cache.py carries);
- folder: the Inductor folder an earlier run filled, kept (a second run on the same machine).
For `train_compile_cache.py` (whole and --compile-regions, the GPT and the ViT) each start is timed on a short run
(--max-steps 3); for `train_fast.py` (no cache lines of its own) this file runs the rung's lines around it (load
before, save after). A preparatory cold run of each configuration writes the file and fills the folder that the warm
starts copy. Then --rounds rounds, each running every start of a configuration and a second cold one (the self
pair, the noise floor), in an order that reverses from round to round. Measured per run: seconds from the launch to
the end of the first step (start-up, data, compile), the first step alone (`first_step_s`), and with --to-target the
GPT's time to 1.70 with compile included; for the rung, Inductor's cache hits and misses (a file start should miss
nothing; train_fast.py's metrics do not count them). Writes runs.csv, table.md, floors.json (the floors and each
ratio's spread and verdict as data, what results/README.md reads), env.json and logs/ (every run's output) to --out.

    python bench/studies/compile_cold_start.py --out results/compile-cold-start-DATE     # about 45 minutes on 2 cores
    python bench/studies/compile_cold_start.py --configs compile-gpt --rounds 1 --no-to-target --out /tmp/cold
    python bench/studies/compile_cold_start.py --out results/compile-cold-start-DATE --tables-only   # tables again
"""

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path[:0] = [str(REPO / "src"), str(REPO / "bench")]

import pandas as pd  # noqa: E402
from cells import hardware_line  # noqa: E402
from floors import FLOORS, comparison_entry, floors_record, floors_text  # noqa: E402
from pairs import noise_floor, ratio_cell  # noqa: E402

import common  # noqa: E402

SHORT = ["--max-steps", "3", "--test-subset", "1000", "--sample-chars", "0", "--log-every", "1"]
CONFIGS = {  # name: (script, flags)
    "compile-gpt": ("src/train_compile_cache.py", ["--model", "gpt", *SHORT]),
    "compile-regions-gpt": ("src/train_compile_cache.py", ["--model", "gpt", "--compile-regions", *SHORT]),
    "compile-vit": ("src/train_compile_cache.py", ["--model", "vit", *SHORT]),
    "compile-regions-vit": ("src/train_compile_cache.py", ["--model", "vit", "--compile-regions", *SHORT]),
    "fast-gpt": ("src/train_fast.py", ["--model", "gpt", *SHORT]),
    "fast-vit": ("src/train_fast.py", ["--model", "vit", *SHORT]),
}
TO_TARGET = ("src/train_fast.py", ["--model", "gpt", "--target-loss", "1.70", "--sample-chars", "0"])
# train_compile_cache.py's lines, around a script that has none: load the file before it runs, save after
AROUND = """import os, runpy, sys, torch
from pathlib import Path
file = Path(os.environ["COLD_START_FILE"])
if file.exists():
    torch.compiler.load_cache_artifacts(file.read_bytes())
sys.argv = sys.argv[1:]
sys.path.insert(0, os.path.dirname(os.path.abspath(sys.argv[0])))  # as `python script.py` would
try:
    runpy.run_path(sys.argv[0], run_name="__main__")
finally:
    saved = torch.compiler.save_cache_artifacts()
    if saved is not None and not file.exists():
        file.write_bytes(saved[0])
"""


def launch(script: str, flags: list[str], inductor: Path, cache: Path, log: Path) -> dict:
    """One run of `script` with Inductor's folder `inductor` and the cache folder (or, around train_fast.py, file)
    `cache`; its output in `log`. Returns the launch's wall clock and the run's metrics JSON."""
    metrics = log.with_suffix(".json")
    env = {**os.environ, "TORCHINDUCTOR_CACHE_DIR": str(inductor), "COLD_START_FILE": str(cache)}
    if script.endswith("train_compile_cache.py"):
        argv = [sys.executable, script, *flags, "--compile-cache", str(cache), "--metrics-out", str(metrics)]
    else:
        argv = [sys.executable, "-c", AROUND, script, *flags, "--metrics-out", str(metrics)]
    started = time.time()
    with open(log, "w") as out:
        proc = subprocess.run(argv, cwd=REPO, env=env, stdout=out, stderr=subprocess.STDOUT, timeout=1800, check=False)
    if proc.returncode:
        sys.exit(f"compile_cold_start.py: error: {script} {' '.join(flags)} failed (exit {proc.returncode}): see {log}")
    return {"launched_unix": started, **json.loads(metrics.read_text())}


def du_mib(path: Path) -> float:
    files = [path] if path.is_file() else [p for p in path.rglob("*") if p.is_file()]
    return sum(p.stat().st_size for p in files) / 2**20


def measure(name, script, flags, rounds, out, work, rows, lines):
    """The preparatory run, then `rounds` rounds of cold, file, folder and cold again, for one configuration."""
    prepared_inductor, prepared_cache = work / f"{name}-inductor", work / f"{name}-cache"
    if not script.endswith("train_compile_cache.py"):
        prepared_cache = work / f"{name}-cache.bin"
    launch(script, flags, prepared_inductor, prepared_cache, out / "logs" / f"{name}-prepare.txt")
    file_mib, folder_mib = du_mib(prepared_cache), du_mib(prepared_inductor)
    starts = ["cold", "file", "folder", "cold again"]
    for round_ in range(rounds):
        for start in starts if round_ % 2 == 0 else starts[::-1]:
            run_dir = Path(tempfile.mkdtemp(dir=work))
            inductor, cache = run_dir / "inductor", run_dir / prepared_cache.name
            if start == "folder":
                shutil.copytree(prepared_inductor, inductor)
            elif start == "file":
                copy = shutil.copytree if prepared_cache.is_dir() else shutil.copy
                copy(prepared_cache, cache)
            tag = f"{name}-{start.replace(' ', '-')}-{round_ + 1}"
            m = launch(script, flags, inductor, cache, out / "logs" / f"{tag}.txt")
            shutil.rmtree(run_dir)
            first_step_end = m["train_started_unix"] + m["first_step_s"]
            row = {"config": name, "start": start, "round": round_ + 1,
                   "launch_to_first_step_s": round(first_step_end - m["launched_unix"], 2),
                   "first_step_s": round(m["first_step_s"], 2),
                   "time_to_target_s": m.get("time_to_target_s"),
                   "time_to_target_incl_compile_s": m.get("time_to_target_incl_compile_s"),
                   "steps_to_target": m.get("steps_to_target"),
                   "graphs_compiled": m.get("graphs_compiled"), "cache_hits": m.get("cache_hits"),
                   "cache_misses": m.get("cache_misses"), "cache_file_mib": round(file_mib, 2),
                   "inductor_folder_mib": round(folder_mib, 2)}  # fmt: skip
            rows.append(row)
            lines.append(", ".join(f"{k} {v}" for k, v in row.items()))
            print(lines[-1], flush=True)


def ratios(runs: pd.DataFrame, column: str, warm: str) -> list[float]:
    """Per round: the cold run's `column` over the `warm` start's (above 1: the warm start is sooner)."""
    by_round = runs.pivot(index="round", columns="start", values=column)
    return list(by_round["cold"] / by_round[warm])


def table(runs: pd.DataFrame, column: str) -> str:
    """Median seconds per start, and cold over each warm start with its spread and verdict against the self pair."""
    out = []
    for name, group in runs.groupby("config", sort=False):
        floor = noise_floor(ratios(group, column, "cold again"))
        medians = group.groupby("start")[column].median()
        cells = {w: ratio_cell(ratios(group, column, w), floor) for w in ("file", "folder")}
        out.append({"configuration": name, "cold (s)": medians["cold"], "file (s)": medians["file"],
                    "folder (s)": medians["folder"], "cold / file": cells["file"].replace("faster", "sooner"),
                    "cold / folder": cells["folder"].replace("faster", "sooner"),
                    "noise floor": f"±{100 * floor:.1f} %" if floor is not None else "–",
                    "cache file (MiB)": group["cache_file_mib"].iloc[0],
                    "Inductor folder (MiB)": group["inductor_folder_mib"].iloc[0]})  # fmt: skip
    return pd.DataFrame(out).to_markdown(index=False)


def tables(runs: pd.DataFrame, env: dict, out: Path) -> str:
    """table.md's text from runs.csv's rows and env.json: the command that made them (read back from the rows), the
    hardware, the folder's noise floor (the widest of the starts' self pairs, seconds to the first step: what
    results/README.md reads) and the three tables."""
    configs = [c for c in dict.fromkeys(runs["config"]) if c in CONFIGS]
    rounds, to_target = int(runs["round"].max()), runs["time_to_target_s"].notna().any()
    short = runs[runs["time_to_target_s"].isna()]
    floors = [noise_floor(ratios(g, "launch_to_first_step_s", "cold again")) for _, g in short.groupby("config")]
    floor = max((f for f in floors if f is not None), default=None)
    text = (f"# Compile's cold start, cold against warm\n\n`python bench/studies/compile_cold_start.py --configs "
            f"{','.join(configs)} --rounds {rounds}{'' if to_target else ' --no-to-target'} --out {out}`.\n\n"
            f"{hardware_line(env)}\n\n"
            + (f"Noise floor: ±{100 * floor:.1f} %, the widest of the configurations' self pairs (a cold start against "
               "a second cold start, seconds to the end of the first step); each row's own is in its column, and "
               "train_fast.py's time to 1.70 has its own below.\n\n" if floor is not None else "")
            + f"Each start in {rounds} rounds, its order reversed from round to round, "
            "every run with an Inductor folder of its own. cold: empty folder, no cache file; file: empty folder and "
            "the compile cache file (torch's Mega-Cache) of a preparatory run; folder: that run's Inductor folder. "
            "Ratios: the cold run's seconds over the warm start's in the same round (above 1: the warm start is "
            "sooner), median (min–max); the noise floor from cold against a second cold run.\n\n"
            "## Seconds from the launch to the end of the first step\n\n" + table(short, "launch_to_first_step_s")
            + "\n\n## The first step alone (the compile)\n\n" + table(short, "first_step_s"))  # fmt: skip
    target = runs[runs["time_to_target_s"].notna()]
    if len(target):
        text += ("\n\n## train_fast.py's GPT to 1.70 nats per character, compile included\n\n"
                 + table(target, "time_to_target_incl_compile_s")
                 + "\n\nTraining alone (compile left out), the same runs:\n\n" + table(target, "time_to_target_s"))  # fmt: skip
    return text + "\n"


MEASURES = {  # floors.json's measures: the cold run's seconds over the warm start's in the same round (x sooner)
    "launch_to_first_step": "the cold start's seconds from the launch to the end of the first step over the row's",
    "first_step": "the cold start's seconds of the first step (the compile) over the row's",
    "time_to_target_incl_compile": "the cold start's seconds to 1.70, compile included, over the row's",
    "time_to_target": "the cold start's training seconds to 1.70 (compile left out) over the row's",
}


def floors(runs: pd.DataFrame) -> str:
    """floors.json's text (bench/pairs.py floors_record) from runs.csv's rows, as table.md gives them: each table's
    configurations, a cold start against a second cold one (kind "same_as") and the file and folder starts against
    cold (kind "warm_start", row "CONFIG, file"), each measure's ratios (MEASURES) judged against that row's own
    floor; `floor` the folder's (the widest of the short runs' self pairs, seconds to the first step, as table.md's
    header), `target_floor` the self pair's of train_fast.py's seconds to 1.70 with compile included."""
    short, target = runs[runs["time_to_target_s"].isna()], runs[runs["time_to_target_s"].notna()]
    entries, own = [], {}
    for rows, columns in ((short, ("launch_to_first_step_s", "first_step_s")),
                          (target, ("time_to_target_incl_compile_s", "time_to_target_s"))):  # fmt: skip
        for column in columns:
            for name, group in rows.groupby("config", sort=False):
                floor = own[(name, column)] = noise_floor(ratios(group, column, "cold again"))
                measure = column.removesuffix("_s")
                entries.append(comparison_entry(f"{name}, cold again", f"{name}, cold", "same_as", measure,
                                                ratios(group, column, "cold again"), floor))  # fmt: skip
                for warm in ("file", "folder"):
                    entries.append(comparison_entry(f"{name}, {warm}", f"{name}, cold", "warm_start", measure,
                                                    ratios(group, column, warm), floor))  # fmt: skip
    widest = [f for (_, column), f in own.items() if column == "launch_to_first_step_s" and f is not None]
    aimed = [f for (_, column), f in own.items() if column == "time_to_target_incl_compile_s" and f is not None]
    record = floors_record(max(widest, default=None), entries, "bench/studies/compile_cold_start.py",
                           target_floor=max(aimed, default=None), measures=MEASURES)  # fmt: skip
    return floors_text(record)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--configs", default=",".join(CONFIGS), help="comma-separated, of: " + ", ".join(CONFIGS))
    parser.add_argument("--rounds", type=common.positive_int, default=3, help="rounds of cold, file, folder, cold")
    parser.add_argument("--no-to-target", action="store_true", help="leave out train_fast.py's GPT to 1.70")
    parser.add_argument("--out", type=Path, required=True, help="folder for runs.csv, table.md, env.json and logs/")
    parser.add_argument("--tables-only", action="store_true", help="table.md again from --out's runs.csv and env.json")
    args = parser.parse_args()
    if args.tables_only:
        try:
            runs, env = pd.read_csv(args.out / "runs.csv"), json.loads((args.out / "env.json").read_text())
        except (OSError, ValueError) as error:
            parser.error(f"--tables-only needs {args.out}/runs.csv and env.json from an earlier run ({error})")
        common.io.atomic_write_text(args.out / "table.md", tables(runs, env, args.out))
        common.io.atomic_write_text(args.out / FLOORS, floors(runs))
        print(f"{args.out}/table.md", flush=True)
        return
    configs = args.configs.split(",")
    if unknown := [c for c in configs if c not in CONFIGS]:
        parser.error(f"--configs: unknown {', '.join(unknown)} (expected {', '.join(CONFIGS)})")
    if problem := common.output_problem(args.out / "logs", is_folder=True):
        parser.error(f"--out {args.out} {problem}")
    rows, lines = [], []
    with tempfile.TemporaryDirectory(prefix="cold-start-") as work:
        for name in configs:
            measure(name, *CONFIGS[name], args.rounds, args.out, Path(work), rows, lines)
        if not args.no_to_target:
            measure("fast-gpt-to-1.70", *TO_TARGET, args.rounds, args.out, Path(work), rows, lines)
    runs = pd.DataFrame(rows)
    env = common.env.environment()
    common.io.atomic_write_text(args.out / "runs.csv", runs.to_csv(index=False))
    common.io.atomic_write_text(args.out / "table.md", tables(runs, env, args.out))
    common.io.atomic_write_text(args.out / FLOORS, floors(runs))
    common.io.atomic_write_text(args.out / "env.json", json.dumps(env, indent=2) + "\n")
    common.io.atomic_write_text(args.out / "log.txt", "\n".join(lines) + "\n")
    print(f"{args.out}/table.md", flush=True)


if __name__ == "__main__":
    try:
        main()
    except KeyboardInterrupt:  # the runs' logs stay; no table is written from part of the rounds
        sys.exit("compile_cold_start.py: interrupted; no table written (the runs' logs are in --out/logs)")
