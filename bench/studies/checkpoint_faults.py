"""Each checkpoint-folder fault of tests/test_checkpoint_dir.py tried several times: tries and held, per case.

    python bench/studies/checkpoint_faults.py --tries 3 --out results/checkpoint-faults-DATE

A case is one test of tests/test_checkpoint_dir.py (one parametrization: a second run on the folder and a killed
run's lock; --resume with nothing to resume; a deleted digest; a full disk in FSDP's and in the async rung's sharded
save; FSDP's and the async rung's BatchNorm model resumed after a SIGTERM in mid-epoch), run `--tries` times, each in
a pytest of its own (real scripts, real torchrun launches, a real tmpfs for the full disk: root only, skipped
elsewhere). "held" counts the tries that passed. Writes OUT/README.md (the table), OUT/log.txt (every try's last
lines) and OUT/env.json; each write atomic. Ctrl-C stops it; the folder then holds no table.
"""

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "src"))

import common  # noqa: E402

TESTS = "tests/test_checkpoint_dir.py"


def cases() -> list[str]:
    """The node ids of the file's tests, as pytest collects them (one per parametrization)."""
    listed = subprocess.run(
        [sys.executable, "-m", "pytest", TESTS, "--collect-only", "-q", "-p", "no:cacheprovider"],
        cwd=REPO, capture_output=True, text=True, check=False,
    )  # fmt: skip
    name = Path(TESTS).name  # pytest names them from its rootdir: tests/ here (tests/pytest.ini), or the repository
    ids = [
        f"{TESTS}::{line.split('::', 1)[1]}"
        for line in listed.stdout.splitlines()
        if line.split("::")[0].endswith(name)
    ]
    if not ids:
        said = (listed.stdout + listed.stderr).strip().splitlines()[-1:] or ["nothing"]
        common.die(f"no test collected from {TESTS} (pytest: {said[0]})")
    return ids


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tries", type=common.positive_int, default=3, help="runs of each case")
    parser.add_argument("--out", type=Path, required=True, help="the results folder (README.md, log.txt, env.json)")
    args = parser.parse_args()
    problem = common.output_problem(args.out, is_folder=True)
    if problem:
        common.die(f"--out {args.out} {problem}")
    rows, log = [], []
    for case in cases():
        held = skipped = 0
        seconds = []
        for attempt in range(1, args.tries + 1):
            started = time.monotonic()
            proc = subprocess.run(
                [sys.executable, "-m", "pytest", case, "-q", "-rs", "-p", "no:cacheprovider"],
                cwd=REPO, capture_output=True, text=True, check=False,
            )  # fmt: skip
            seconds.append(time.monotonic() - started)
            summary = (proc.stdout.strip().splitlines() or [""])[-1]  # pytest's "1 passed in 20.1s"
            outcome = "passed" if proc.returncode == 0 else "failed"
            if outcome == "passed" and " skipped" in summary and " passed" not in summary:
                outcome, skipped = "skipped", skipped + 1
            held += outcome == "passed"
            log.append(f"## {case}, try {attempt}: {outcome}\n" + "\n".join(proc.stdout.splitlines()[-15:]) + "\n")
            print(f"{case} try {attempt}: {outcome} ({seconds[-1]:.0f} s)", flush=True)
        rows.append((case.split("::", 1)[1], args.tries - skipped, held, sum(seconds) / len(seconds)))
    table = "| case (tests/test_checkpoint_dir.py) | tries | held | seconds a try |\n|---|---:|---:|---:|\n" + "".join(
        f"| `{name}` | {tries} | {held} | {secs:.0f} |\n" for name, tries, held, secs in rows
    )
    env = common.env.environment()
    page = (
        f"# Checkpoint folder faults, {time.strftime('%Y-%m-%d')}\n\n"
        f"`python bench/studies/checkpoint_faults.py --tries {args.tries} --out {args.out}` on "
        f"{env['cpu_model']}, {env['cpu_count']} cores, torch {env['torch']}, commit {(env['git']['commit'] or '?')[:10]}"
        f"{' (dirty)' if env['git']['dirty'] else ''}. Each case is one test, run {args.tries} times in a pytest of its "
        "own; held: the tries that passed (a skipped try, where mount is not permitted, counts as no try).\n\n" + table
    )
    common.io.atomic_write_text(args.out / "log.txt", "\n".join(log))
    common.io.atomic_write_text(args.out / "env.json", json.dumps(env, indent=2) + "\n")
    common.io.atomic_write_text(args.out / "README.md", page)
    print(table, end="")


if __name__ == "__main__":
    main()
