"""The command line: the flags every script shares and the checks made before any work."""

from __future__ import annotations

import argparse
import math
import os
import sys
from pathlib import Path

from . import target
from .checkpoint import lock_checkpoint_dir
from .data import DEBIAN_FASHION_MNIST, TEXT_VOCAB
from .env import REPO
from .errors import die, install_error_hook, one_line
from .io import output_problem
from .models import DEFAULTS, MODELS, SCHEDULE_DEFAULTS, TEXT_MODELS, vit_patch_size
from .runstate import RunState


def _as_given(text: str) -> str:
    """A flag's value in its one-line error: as typed, or quoted with escapes where it holds a line break or another
    character that does not print (`--epochs $'\\r0'` would else split the line)."""
    return text if text.isprintable() else repr(text)


def positive_int(text: str) -> int:
    """argparse type: an integer >= 1 (otherwise one usage error, exit 2)."""
    value = int(text)
    if value <= 0:
        raise argparse.ArgumentTypeError(f"must be a positive integer, got {_as_given(text)}")
    return value


def non_negative_int(text: str) -> int:
    """argparse type: an integer >= 0."""
    value = int(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be 0 or more, got {_as_given(text)}")
    return value


def seed_int(text: str) -> int:
    """argparse type: a seed, an integer from 0 to 2**32 - 1 (NumPy's range: `seed_everything` seeds NumPy too)."""
    value = int(text)
    if not 0 <= value < 2**32:
        raise argparse.ArgumentTypeError(f"must be an integer from 0 to 4294967295, got {_as_given(text)}")
    return value


def finite_float(text: str) -> float:
    """argparse type: a finite number (nan and infinities refused: no run reaches or computes with them)."""
    value = float(text)
    if not math.isfinite(value):
        raise argparse.ArgumentTypeError(f"must be a finite number, got {_as_given(text)}")
    return value


def positive_float(text: str) -> float:
    """argparse type: a finite number > 0 (nan and inf refused)."""
    value = float(text)
    if not 0 < value < math.inf:
        raise argparse.ArgumentTypeError(f"must be a positive number, got {_as_given(text)}")
    return value


def non_negative_float(text: str) -> float:
    """argparse type: a finite number >= 0 (nan and inf refused)."""
    value = float(text)
    if not 0 <= value < math.inf:
        raise argparse.ArgumentTypeError(f"must be 0 or more, got {_as_given(text)}")
    return value


def _fraction(text: str) -> float:
    value = float(text)
    if not 0 < value <= 1:
        raise argparse.ArgumentTypeError(f"must be in (0, 1], e.g. 0.91 for 91 %, got {_as_given(text)}")
    return value


class _HelpFormatter(argparse.RawDescriptionHelpFormatter):
    """Each default said once: "(default: X)" after a flag's help unless the help already names its default, or
    there is none to name (None, or off for an on/off flag); the epilog (the script's run lines) kept as written."""

    def _get_help_string(self, action: argparse.Action) -> str:
        text = action.help or ""
        if (
            "default" in text
            or any(action.default is x for x in (None, False, argparse.SUPPRESS))
            or not action.option_strings
        ):
            return text
        return text + " (default: %(default)s)"


def _new_parser(doc: str | None) -> argparse.ArgumentParser:
    """A parser whose description is the docstring's first line and whose --help ends with its run lines."""
    lines = (doc or "").strip().splitlines()
    run_lines = [line for line in lines if line.startswith("    ")]
    return argparse.ArgumentParser(
        description=lines[0] if lines else None,
        epilog="run lines:\n" + "\n".join(run_lines) if run_lines else None,
        formatter_class=_HelpFormatter,
    )


def get_parser(doc: str | None = None, datasets: tuple[str, ...] = ("fashion-mnist", "shakespeare", "synthetic")):
    """The flags of the train*.py scripts; a script adds its own with `parser.add_argument` before parsing.

    `doc` is the script's docstring: its first line describes the script in --help, its indented run lines end it.
    `datasets` are the --dataset choices the script supports. Invalid values (a non-positive batch size, an unknown
    model, ...) make argparse print one usage error on stderr and exit with status 2.
    """
    p = _new_parser(doc)
    p.add_argument(
        "--data-dir",
        type=Path,
        default=None,
        help="folder with the four Fashion-MNIST *-ubyte.gz files (default: data/, then "
        f"{DEBIAN_FASHION_MNIST}, then torchvision's download into data/); with --dataset imagefolder (train_fast.py), "
        "the ImageFolder root",
    )
    p.add_argument(
        "--dataset",
        choices=list(datasets),
        default=None,
        help="default per model: shakespeare (character tokens) for gpt, fashion-mnist for the others; synthetic: one "
        "random batch already on the device, to measure the compute ceiling",
    )
    p.add_argument(
        "--seq-len",
        type=positive_int,
        default=64,
        help="--model gpt / gpt2: tokens of context per sample (blocks of seq-len + 1 characters)",
    )
    p.add_argument(
        "--vocab-size",
        type=positive_int,
        default=None,
        help="--model gpt / gpt2: rows of the token embedding and outputs of the head (default: the corpus's 84 "
        "characters); 50257 gives GPT-2's head and loss their real size (the tokens stay characters: the other ids "
        "are never inputs or targets)",
    )
    p.add_argument(
        "--image-size",
        type=positive_int,
        default=None,
        help="side in pixels of synthetic images, 3 x S x S (default 224), or of the crops of --dataset imagefolder; "
        "Fashion-MNIST is always 1 x 28 x 28",
    )
    p.add_argument(
        "--subset",
        type=positive_int,
        default=None,
        help="train on the first N training images (or text blocks) only (synthetic: N per epoch, default 10240)",
    )
    p.add_argument(
        "--test-subset",
        type=positive_int,
        default=None,
        help="evaluate on the first N of Fashion-MNIST's 10,000 test images (default: all): a throughput run that "
        "needs no accuracy spends its seconds training",
    )
    p.add_argument(
        "--sample-chars",
        type=non_negative_int,
        default=300,
        help="--model gpt / gpt2: characters the trained model writes after a fixed prompt, at the end (0: none, as in "
        "the bench's runs, whose tables do not read them)",
    )
    _training_flags(p)
    p.add_argument(
        "--clip-grad-norm",
        type=non_negative_float,
        default=None,
        help="clip the gradients' global L2 norm to this, 0 for no clipping (default per model: vit, gpt, gpt2 1.0, "
        "the others "
        "none; common/models.py's DEFAULTS)",
    )
    return p


def add_without(parser: argparse.ArgumentParser, *changes: str) -> None:
    """Add `--without X` (repeatable; X one of `changes`): leave one of a script's changes out, for the bench's
    ablation rows (bench/profiles.toml `ablation_of`). `args.without` is the list given, [] by default; `report`
    records it as the metrics' `without`. An unknown X exits 2 (argparse's usage error)."""
    parser.add_argument(
        "--without",
        choices=list(changes),
        action="append",
        default=[],
        help="ablation: leave out one of this script's changes (repeatable), to measure its share",
    )


def get_image_folder_parser(doc: str | None = None) -> argparse.ArgumentParser:
    """The flags of the loader*.py scripts, which read an ImageFolder of image files (train/ and val/ inside).

    The training flags of `get_parser` (not --dataset, --subset or --clip-grad-norm), with `--data-dir` the ImageFolder
    root, `--image-size` the crop side,
    `--loader-only` to time the input pipeline alone, and `--amp-dtype` / `--channels-last` so that the end-to-end
    rows can run the model at the compute rate of train_amp.py / train_channels_last.py. Bad values exit 2.
    """
    p = _new_parser(doc)
    p.add_argument(
        "--data-dir",
        type=Path,
        default=REPO / "data" / "fashion-mnist-jpeg",
        help="an ImageFolder root with train/<class>/*.jpg and val/<class>/*.jpg "
        "(python bench/prepare/prepare_data.py writes data/fashion-mnist-jpeg and data/imagenet-synthetic)",
    )
    p.add_argument("--image-size", type=positive_int, default=32, help="side in pixels of the square crops")
    p.add_argument("--loader-only", action="store_true", help="iterate the input pipeline without the model")
    p.add_argument(
        "--amp-dtype",
        choices=["float16", "bfloat16"],
        default=None,
        help="autocast the model in this dtype, as train_amp.py does (GradScaler for float16); default: float32",
    )
    p.add_argument("--channels-last", action="store_true", help="NHWC memory format for model and images")
    _training_flags(p)
    return p


def _training_flags(p: argparse.ArgumentParser) -> None:
    """The flags every script shares: model, schedule, batch, workers, seed, device, metrics and checkpoints."""
    p.add_argument("--model", choices=MODELS, default="cnn", help="what to train (see common.build_model)")
    p.add_argument(
        "--epochs",
        type=positive_int,
        default=None,
        help="passes over the training set (default per model: gpt 1, the others 2)",
    )
    p.add_argument(
        "--max-steps",
        type=positive_int,
        default=None,
        help="stop after this many optimizer steps (default per model: gpt 2800, under 5 minutes on 2 CPU cores; the "
        "others none)",
    )
    p.add_argument(
        "--batch-size",
        type=positive_int,
        default=None,
        help="images (text blocks) per process per step (default per model: gpt 16, the others 128)",
    )
    p.add_argument(
        "--lr",
        type=positive_float,
        default=None,
        help="peak learning rate of the one-cycle schedule (default per model: vit 2e-3, gpt 6e-3, gpt2 6e-4, the "
        "others 5e-3; "
        "common/models.py's DEFAULTS)",
    )
    p.add_argument("--workers", type=non_negative_int, default=2, help="DataLoader worker processes")
    p.add_argument("--seed", type=seed_int, default=0, help="seed of every random number generator (0 to 2**32 - 1)")
    p.add_argument(
        "--deterministic",
        action="store_true",
        help="repeatable runs for a seed: torch's deterministic kernels where it has them, no cuDNN autotuning "
        "(slower). An op without a deterministic kernel warns and runs as usual (warn_only), so bit for bit only "
        "where none warned: on a CPU, every run here (tests/test_reliability.py)",
    )
    p.add_argument("--device", choices=["auto", "cpu", "cuda"], default="auto", help="auto: cuda when available")
    p.add_argument(
        "--warmup-steps",
        type=non_negative_int,
        default=10,
        help="steps left out of the images/s window (compilation, cuDNN autotuning, worker start)",
    )
    p.add_argument(
        "--target-acc",
        type=_fraction,
        default=None,
        help="report the training seconds until the test accuracy first reaches this fraction",
    )
    p.add_argument(
        "--target-loss",
        type=finite_float,
        default=None,
        help="--model gpt / gpt2: report the training seconds and steps until the loss on a fixed sample of the "
        "held-out text first reaches this (nats per character), probed every --eval-every steps with the clock stopped",
    )
    p.add_argument("--eval-every", type=positive_int, default=100, help="--target-loss: steps between two probes")
    p.add_argument(
        "--target-sample", type=positive_int, default=1024, help="--target-loss: held-out blocks the probe evaluates"
    )
    p.add_argument("--metrics-out", type=Path, default=None, help="write the run's metrics JSON here")
    p.add_argument("--log-every", type=positive_int, default=50, help="print a progress line every N steps")
    p.add_argument("--checkpoint-dir", type=Path, default=None, help="save last.pt here at the end of every epoch")
    p.add_argument("--resume", action="store_true", help="continue from --checkpoint-dir/last.pt if it exists")


def check_checkpoint_dir(folder: Path, resume: bool) -> None:
    """What a run may do with its --checkpoint-dir, decided before any work. One run owns it: the process that will
    write last.pt (rank 0 under torchrun, by RANK) takes its lock (`checkpoint.lock_checkpoint_dir`: a second run is
    refused in one line naming the first). A folder that holds last.pt needs --resume (a new run would overwrite the
    earlier one's checkpoint); --resume needs a last.pt (without it the run would start over, and a sharded script's
    first save would delete the folders already there), except under torchrun with restarts (--max-restarts > 0),
    where one command line starts the job and resumes it: there an empty folder starts fresh, said in one line."""
    if os.environ.get("RANK", "0") == "0":
        lock_checkpoint_dir(folder)
    has_checkpoint = (folder / "last.pt").exists()
    if has_checkpoint and not resume:
        die(
            f"--checkpoint-dir {folder} already holds last.pt from an earlier run: add --resume to continue it, or "
            "pick another folder (this run would overwrite it)"
        )
    if resume and not has_checkpoint:
        if int(os.environ.get("TORCHELASTIC_MAX_RESTARTS") or 0) == 0:
            die(
                f"--resume: {folder} holds no last.pt to resume from; leave --resume out to start a new run there, or "
                "name the folder that holds the run's last.pt"
            )
        if os.environ.get("RANK", "0") == "0":
            print(one_line(f"--resume: no last.pt in {folder} yet: torchrun's attempt starts the run"), flush=True)


def parse_args(parser: argparse.ArgumentParser, recipe: dict[str, dict] | None = None) -> argparse.Namespace:
    """Parse the command line, check the flags that only make sense together (argparse: usage and exit 2) and the
    outputs (`output_problem`: one line, exit 2), all before any work, and install the one-line error hook
    (`errors.install_error_hook`). A --checkpoint-dir that already holds last.pt needs --resume: a new run would
    overwrite the earlier one's checkpoint. Where the command line leaves them out, --lr, --batch-size, --epochs,
    --max-steps and --clip-grad-norm get the model's own defaults (models.DEFAULTS: what trains it well; --help names
    them), and --dataset the model's data (text for a language model): the returned namespace holds the values used.
    `recipe` ({model: {key: value}}) is a script's own defaults over the model's (train_fast.py's GPT schedule)."""
    install_error_hook()
    for action in parser._actions:  # --help names the script's own defaults beside the model's
        mine = [f"{model} {keys[action.dest]}" for model, keys in (recipe or {}).items() if action.dest in keys]
        if mine and action.help:
            action.help += f"; this script's: {', '.join(mine)}"
    args = parser.parse_args()
    if "dataset" in args and args.dataset is None:  # the model's own data: text for a language model
        args.dataset = "shakespeare" if args.model in TEXT_MODELS else "fashion-mnist"  # (--help says so)
    if "dataset" in args and (args.model in TEXT_MODELS) != (args.dataset in ("shakespeare", "synthetic")):
        if args.model in TEXT_MODELS:
            parser.error(f"--model {args.model} trains on text: --dataset shakespeare or synthetic, not {args.dataset}")
        if args.dataset == "shakespeare":
            parser.error(f"--dataset shakespeare is text: --model gpt or gpt2, not {args.model}")
    if "dataset" not in args and args.model in TEXT_MODELS:
        parser.error(f"{Path(sys.argv[0]).name} reads images: --model {args.model} trains on text (train.py does)")
    defaults = {**DEFAULTS[args.model], **(recipe or {}).get(args.model, {})}  # where the command line says nothing
    args.lr = args.lr if args.lr is not None else defaults["lr"]
    for key in ("batch_size", "epochs", "max_steps"):  # (--help names each model's default)
        if getattr(args, key) is None:
            setattr(args, key, defaults.get(key, SCHEDULE_DEFAULTS[key]))
    if "clip_grad_norm" in args:
        clip = args.clip_grad_norm
        args.clip_grad_norm = defaults["clip_grad_norm"] if clip is None else (clip or None)  # 0: no clipping
    if args.resume and args.checkpoint_dir is None:
        parser.error("--resume needs --checkpoint-dir (the folder that holds last.pt)")
    if getattr(args, "dataset", None) == "fashion-mnist" and args.image_size not in (None, 28):
        parser.error("--image-size applies to --dataset synthetic; Fashion-MNIST images are 28 x 28")
    if getattr(args, "vocab_size", None) is not None:
        if args.model not in TEXT_MODELS:
            parser.error(f"--vocab-size is a language model's; --model {args.model} has classes, not a vocabulary")
        if args.vocab_size < TEXT_VOCAB:
            parser.error(f"--vocab-size {args.vocab_size} is below the corpus's {TEXT_VOCAB} characters")
    if args.model in TEXT_MODELS and getattr(args, "image_size", None) is not None:
        parser.error(f"--image-size is for images; --model {args.model} reads --seq-len tokens")
    if args.model == "vit":
        side = 28 if getattr(args, "dataset", None) == "fashion-mnist" else (args.image_size or 224)
        if side % vit_patch_size(side):
            parser.error(
                f"--model vit cuts images into {vit_patch_size(side)} px patches: --image-size {side} is not a multiple"
            )
    # Check the outputs now rather than after hours of training, when a failed write would lose the results.
    for flag, path, is_folder in (
        ("--metrics-out", args.metrics_out, False),
        ("--checkpoint-dir", args.checkpoint_dir, True),
    ):
        problem = output_problem(path, is_folder) if path is not None else None
        if problem:
            die(f"{flag} {path} {problem}")
    target.check(args)  # --target-loss: one line and exit where no probe can run (common/target.py)
    if args.checkpoint_dir is not None:  # the folder's lock, and --resume with something to resume
        check_checkpoint_dir(args.checkpoint_dir, args.resume)
    args.run = RunState()  # what this run does with checkpoints and signals (common/runstate.py): not a flag
    return args
