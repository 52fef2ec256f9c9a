"""Per-epoch records, the closing line and the metrics JSON with its provenance."""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
from pathlib import Path

import torch
import torch.distributed as dist

from . import target
from .data import TEXT_VOCAB
from .device import fp32_precision
from .env import environment, in_process_group
from .errors import die
from .io import WriteFailed, atomic_write_text
from .meter import Meter


def epoch_record(epoch: int, step: int, train_loss, val_loss, val_acc, meter: Meter, logits=None, **extra) -> dict:
    """One entry of the metrics' `epochs` list: 1-based `epoch`, global `step`, mean `train_loss` (a 0-d tensor or a
    float; None when nothing was trained), test `val_loss` / `val_acc` (fractions), training seconds so far, and
    the dtype the logits came out in (what the model really computed in). `extra` adds fields (e.g. label counts).
    Reading a tensor loss synchronises the device, so call it after `meter.pause()`. A language model's record
    (logits (N, vocab, T)) adds the validation loss in bits per character (nats / ln 2); its val_acc is the
    next-character accuracy."""
    if logits is not None and logits.dim() == 3 and val_loss is not None:
        extra.setdefault("val_bits_per_char", val_loss / math.log(2))
    return {
        "epoch": epoch,
        "step": step,
        "train_loss": train_loss.item() if torch.is_tensor(train_loss) else train_loss,
        "val_loss": val_loss,
        "val_acc": val_acc,
        "train_s": meter.train_s,
        "logits_dtype": str(logits.dtype) if logits is not None else None,
        **extra,
    }


def epoch_line(record: dict) -> str:
    """The end-of-epoch progress line of an `epoch_record`."""
    parts = [f"epoch {record['epoch']}:"]
    if record["train_loss"] is not None:
        parts.append(f"train loss {record['train_loss']:.4f},")
    if record.get("images") is not None:
        parts.append(f"{record['images']} images,")
    if record.get("val_bits_per_char") is not None:
        parts.append(
            f"val loss {record['val_loss']:.4f} nats/char ({record['val_bits_per_char']:.3f} bits), "
            f"next-char acc {100 * record['val_acc']:.2f} %,"
        )
    elif record["val_acc"] is not None:
        parts.append(f"test loss {record['val_loss']:.4f}, test acc {100 * record['val_acc']:.2f} %,")
    return " ".join(parts) + f" {record['train_s']:.1f} s of training"


def write_metrics(path: Path | None, **fields) -> dict:
    """Write `fields` plus `command` and `env` (`environment()`) as JSON to `path`, atomically; nothing if `path` is
    None. Returns the dict. If the write fails (disk full, the folder removed during the run), the metrics go to
    `./metrics-<pid>.json` and to stdout, and the script exits 1 with one line saying where: a finished run is never
    lost."""
    record = {"command": [sys.executable, *sys.argv], **fields, "env": environment()}
    if path is None:
        return record
    text = json.dumps(record, indent=2, default=str) + "\n"
    try:
        atomic_write_text(path, text)
    except WriteFailed as error:
        fallback = Path.cwd() / f"metrics-{os.getpid()}.json"
        try:
            atomic_write_text(fallback, text)
            where = f"written to {fallback} instead (and printed above)"
        except WriteFailed:
            where = "printed above"
        print(text, flush=True)
        die(f"cannot write --metrics-out {path} ({error.reason}); the run's metrics are {where}", code=1)
    return record


def text_flops(args: argparse.Namespace, params: int | None, seq_len: int, counted: float | None) -> dict:
    """A language model's training FLOPs per token two ways (floats, FLOPs a token; None where not counted):
    `flops_per_token`, as the Meter's counter (common.meter.flop_counter) counted them on a real step: the ops as they
    ran, recomputes included, except causal SDPA, counted over the lower triangle of its T x T scores by
    FlashAttention-2's convention whatever its kernel computed (on a CPU up to T = 512 it computes about the whole
    product); the tables' TFLOP/s and "of peak" use this. And `flops_per_token_palm`, the model FLOPs PaLM's MFU is
    defined on: 6 N + 12 L d T (Chowdhery et al. 2022, PaLM, appendix B: 6 FLOPs per parameter per token for the
    matmuls forward and backward, and 12 L d T for attention's two T x T products, whole, no recompute), with N the
    parameters less the token and position tables (a lookup is no matmul), L blocks of width d, T tokens of context.
    A page that says MFU means the second; the tables' of-peak is the first."""
    from .gpt import GPT_CONFIGS  # only here: metrics knows no model otherwise

    shape = GPT_CONFIGS.get(args.model)
    if shape is None or params is None:
        return {"flops_per_token": counted / seq_len if counted else None}
    depth, width = shape["depth"], shape["width"]
    vocab = getattr(args, "vocab_size", None) or TEXT_VOCAB  # the token table's rows
    embeddings = (vocab + args.seq_len) * width  # the position table: --seq-len rows (T: the mean sample)
    palm = 6 * (params - embeddings) + 12 * depth * width * seq_len
    return {"flops_per_token": counted / seq_len if counted else None, "flops_per_token_palm": palm}


def dynamo_counters() -> dict | None:
    """What torch.compile did in this process, from Dynamo's own counters (torch._dynamo.utils.counters): frames
    (total, ok), stats (unique_graphs, calls_captured, ...), graph_breaks (how many), recompiles (unique graphs beyond
    the first per frame are not told apart here: compare unique_graphs). None where Dynamo never ran (not imported):
    the run compiled nothing. The tests compare them between runs with and without the meter's probe step."""
    if "torch._dynamo.utils" not in sys.modules:
        return None
    counters = sys.modules["torch._dynamo.utils"].counters
    if not counters["frames"] and not counters["stats"]:
        return None
    return {
        "frames": dict(counters["frames"]),
        "stats": dict(counters["stats"]),
        "graph_breaks": sum(counters["graph_break"].values()),
    }


def report(args: argparse.Namespace, summary: dict, epochs: list[dict], **fields) -> dict:
    """The closing call of every script: print the run's images/s line and write its metrics JSON (--metrics-out).

    `summary` is `Meter.summary()` (made global over ranks where there are several); `epochs` the `epoch_record`s.
    `script` (the running file's name) and `technique` (its docstring's title: the first line up to the colon, e.g.
    "Mixed precision (AMP)") are derived here, so a variant passes only what really differs.
    `fields` are what the script says about itself: precision, device, steps, test_images, and
    where they differ from the defaults: world_size (default: the process group's size where one is initialised,
    else 1), gpus (devices used; default: one per process on CUDA, 0 on CPU), global_batch (default batch x world
    size), model, dataset; `compile_s` for compiled models;
    and anything else to record (loader, workers, ...); `without` (the changes an ablation row left out) comes
    from args where the script has `--without`. Derived here: test_acc (the last epoch's), the training
    seconds until the test accuracy first reached --target-acc (`time_to_target_s`, with `compile_s` taken out;
    `time_to_target_incl_compile_s` with it) or, under --target-loss, until the held-out sample's loss first reached
    it (`common.target.fields` of the Meter's summary["target"]: the same two keys, steps_to_target, every probe),
    `achieved_tflops` (flops_per_image x images/s / 1e12, TFLOP/s: the training matmul/conv/attention work done per
    second, all ranks together), Dynamo's counters (`dynamo_counters`), the resolved arguments (`args`, every flag
    with its default, `args.run` left out), and the run's `status` (`args.run`, its RunState: ok, terminated by
    SIGTERM at `stopped_at_step`, or checkpoint not written, with `failed_writes`). The metrics JSON keys are listed
    in docs/bench.md.
    """
    device = torch.device(fields.pop("device"))
    main = sys.modules["__main__"]
    fields.setdefault("script", Path(getattr(main, "__file__", None) or sys.argv[0]).name)
    fields.setdefault("technique", (getattr(main, "__doc__", None) or "").strip().split("\n")[0].split(":")[0])
    world_size = fields.setdefault("world_size", dist.get_world_size() if in_process_group() else 1)
    fields.setdefault("gpus", world_size if device.type == "cuda" else 0)
    fields.setdefault("batch_size", args.batch_size)
    fields.setdefault("global_batch", args.batch_size * world_size)
    fields.setdefault("model", args.model)
    fields.setdefault("dataset", getattr(args, "dataset", None))
    fields.setdefault("fp32_precision", fp32_precision())  # what a float32 matmul / convolution ran in on CUDA
    if hasattr(args, "without"):  # a script with ablation switches (cli.add_without): the changes left out
        fields.setdefault("without", args.without)
    reached = [e for e in epochs if args.target_acc and e["val_acc"] is not None and e["val_acc"] >= args.target_acc]
    compile_s = fields.get("compile_s") or 0.0
    tokens = summary.get("tokens_per_sample")  # a language model's: its samples are sequences of tokens
    rate = summary["images_per_s"] * tokens if tokens and summary["images_per_s"] else None
    if summary["images_per_s"] is None:
        line = summary["images_per_s_note"]
    else:
        wait = summary["data_wait_frac"]
        line = f"{rate:.0f} tokens/s" if tokens else f"{summary['images_per_s']:.1f} images/s"
        line += f", data-wait {100 * wait:.1f} %"
    flops = summary.get("flops_per_image")
    achieved = flops * summary["images_per_s"] / 1e12 if flops and summary["images_per_s"] else None
    if achieved is not None:
        per = f"{flops / tokens / 1e6:.3g} MFLOPs per token" if tokens else f"{flops / 1e9:.3g} GFLOPs per image"
        line += f", {achieved:.3g} TFLOP/s ({per})"
    if tokens:
        fields.update(text_flops(args, fields.get("params"), tokens, flops))
    if summary.get("activation_mib") is not None:
        line += f", activations saved for backward {summary['activation_mib']:.1f} MiB"
    print(f"{line}, peak host RSS {summary['peak_host_rss_gib']:.2f} GiB", flush=True)
    record = summary.pop("target", None)  # the --target-loss probe's, which the Meter was given (else none)
    probe = target.fields(record, compile_s, epochs[-1]["val_loss"] if epochs else None)  # {} without one
    if probe:
        seconds = probe["time_to_target_s"]
        took = "not reached" if seconds is None else (
            f"{seconds:.1f} s of training{' (compilation left out)' if compile_s else ''}, "
            f"{probe['steps_to_target']} steps"
        )
        print(
            f"time to held-out sample loss {probe['target_loss']}: "
            + took
            + f" (probed every {probe['target_eval_every']} steps on {probe['target_sample_blocks']} blocks, clock "
            f"stopped; at the end the sample's loss {probe['target_sample_loss_end']:.4f}"
            + (f", the whole held-out text's {epochs[-1]['val_loss']:.4f})" if epochs else ")"),
            flush=True,
        )
    return write_metrics(
        args.metrics_out,
        **fields,
        device=str(device),
        **summary,
        achieved_tflops=achieved,
        tokens_per_s=rate,
        epochs=epochs,
        test_acc=epochs[-1]["val_acc"] if epochs else None,
        target_acc=args.target_acc,
        **{
            "time_to_target_s": reached[0]["train_s"] - compile_s if reached else None,  # --target-acc's
            "time_to_target_incl_compile_s": reached[0]["train_s"] if reached else None,
            **probe,  # --target-loss's, where it ran
        },
        args={k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items() if k != "run"},  # the flags
        dynamo=dynamo_counters(),
        status=args.run.status(),
        stopped_at_step=args.run.stopped_at,
        failed_writes=args.run.failed_writes,
    )
