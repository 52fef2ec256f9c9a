"""The PNG plots of a result folder: throughput, accuracy against time, peak memory, data-wait, the ladders and the
sweeps, each written atomically."""

from __future__ import annotations

import json
from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # no display needed
import matplotlib.pyplot as plt  # noqa: E402
import pandas as pd  # noqa: E402
from cells import cell_text, fmt, pair_cell, rate_text, row_groups, sweep_groups  # noqa: E402
from matplotlib.patches import Patch  # noqa: E402
from profiles import KNOBS  # noqa: E402

import common  # noqa: E402


def _save(fig, path: Path) -> None:
    """Write `fig` to `path` as PNG, atomically (`common.io.atomic_write`: raises WriteFailed when it cannot)."""
    try:
        common.io.atomic_write(path, lambda f: fig.savefig(f, format="png", dpi=120, bbox_inches="tight"))
    finally:
        plt.close(fig)


def plot(summary: pd.DataFrame, runs: pd.DataFrame, out: Path, title: str, floor: float | None = None) -> None:
    """The PNGs: images/s (labelled with × its base rung), accuracy vs training time, peak memory, data-wait vs
    compute, the ladders (`plot_ladders`, against the noise floor `floor`) and the sweeps."""
    ok = summary[summary.status == "ok"].copy()
    labels = ok.config.tolist()
    height = 1 + 0.5 * max(len(ok), 1)

    fig, ax = plt.subplots(figsize=(9, height))
    ips = pd.to_numeric(ok.images_per_s, errors="coerce").fillna(0)
    err = (
        [
            ips - pd.to_numeric(ok.images_per_s_min, errors="coerce").fillna(ips),
            pd.to_numeric(ok.images_per_s_max, errors="coerce").fillna(ips) - ips,
        ]
        if len(ok)
        else None
    )
    bars = ax.barh(labels, ips, xerr=err, color="tab:blue", capsize=3)
    ax.bar_label(bars, [pair_cell(r, "speedup_rung").split(",")[0] if pd.notna(r.get("speedup_rung")) else ""
                        for r in ok.to_dict("records")], padding=4, fontsize=7)  # fmt: skip
    ax.invert_yaxis()
    ax.set_xlabel("images/s (median, min–max)")
    ax.set_title(f"Throughput: {title}")
    _save(fig, out / "throughput.png")

    fig, ax = plt.subplots(figsize=(8, 5))
    for r in runs[(runs.status == "ok") & (runs.dataset != "synthetic")].itertuples():
        epochs = json.loads(r.epochs) if isinstance(r.epochs, str) else []
        epochs = [e for e in epochs if e.get("val_acc") is not None]  # loader-only runs do not evaluate
        if epochs:
            ax.plot(
                [e["train_s"] for e in epochs],
                [100 * e["val_acc"] for e in epochs],
                marker="o",
                label=f"{r.config} (r{r.repeat})",
            )
    ax.set_xlabel("training time (s, evaluation excluded)")
    ax.set_ylabel("test accuracy (%)")
    ax.set_title(f"Accuracy vs time: {title}")
    if ax.lines:
        ax.legend(fontsize=7)
    ax.grid(alpha=0.3)
    _save(fig, out / "accuracy_vs_time.png")

    fig, ax = plt.subplots(figsize=(9, height))
    y = range(len(ok))
    for offset, (key, name) in enumerate(
        [
            ("peak_mem_allocated_gib", "peak allocated (device)"),
            ("peak_mem_reserved_gib", "peak reserved (device)"),
            ("peak_host_rss_gib", "peak host RSS"),
        ]
    ):
        values = pd.to_numeric(ok[key], errors="coerce").fillna(0) if key in ok else [0] * len(ok)
        ax.barh([i + (offset - 1) * 0.27 for i in y], values, height=0.27, label=name)
    ax.set_yticks(list(y), labels)
    ax.invert_yaxis()
    ax.set_xlabel("GiB (device memory is 0 on CPU runs)")
    ax.set_title(f"Peak memory: {title}")
    ax.legend(fontsize=8)
    _save(fig, out / "memory.png")

    fig, ax = plt.subplots(figsize=(9, height))
    wait = 100 * pd.to_numeric(ok.data_wait_frac, errors="coerce").fillna(0)
    ax.barh(labels, wait, color="tab:red", label="waiting for data")
    ax.barh(labels, 100 - wait, left=wait, color="tab:green", label="compute and the rest")
    ax.invert_yaxis()
    ax.set_xlabel("% of steady-state step time")
    ax.set_title(f"Data-wait vs compute: {title}")
    ax.legend(fontsize=8)
    _save(fig, out / "data_wait.png")
    plot_ladders(summary, out, title, floor)
    plot_sweeps(summary, out, title)


def plot_ladders(summary: pd.DataFrame, out: Path, title: str, floor: float | None = None) -> None:
    """ladder.png: one panel per ladder, each rung's speed-up over its base rung from the interleaved pairs (the bar:
    the median; the error bar: min–max over the pairs), green when faster, red when slower, grey when the pairs show
    no measurable difference (within the noise floor `floor`, shaded around 1.0); the label adds × the ladder's first
    rung. A ladder measured before the pairs (no ratio) shows each rung's images/s instead, in grey, as single runs."""
    ladders = row_groups(summary, "ladder")
    if not ladders:
        return
    colors = {"faster": "tab:green", "slower": "tab:red", "disturbed": "tab:orange"}  # grey: no measurable difference
    fig, axes = plt.subplots(len(ladders), 1, figsize=(10, 1.2 + 2.2 * len(ladders)), squeeze=False)
    for ax, (name, rungs) in zip(axes[:, 0], ladders, strict=True):
        ips = pd.to_numeric(rungs.images_per_s, errors="coerce")
        names = [f"{str(r['config'])[:50]} ({rate_text(r)})" for r in rungs.to_dict("records")]  # tokens/s for text
        median = pd.to_numeric(rungs.speedup_rung, errors="coerce")
        measured_rungs = (rungs.status.astype(str) == "ok").iloc[1:].any()  # a rung after the first that ran
        if median.isna().all() and measured_rungs:  # no pairs: the single runs' images/s, no ratio
            bars = ax.barh(names, ips.fillna(0), color="tab:gray")
            ax.bar_label(bars, ["single run" if pd.notna(v) else cell_text(r.status) for r, v in
                                zip(rungs.itertuples(), ips, strict=True)], padding=4, fontsize=8)  # fmt: skip
            ax.set_xlabel("images/s (single runs, measured before interleaved pairs: no ratio)")
        else:
            lo = pd.to_numeric(rungs.speedup_rung_lo, errors="coerce")
            hi = pd.to_numeric(rungs.speedup_rung_hi, errors="coerce")
            color = [colors.get(cell_text(v), "tab:gray") for v in rungs.speedup_rung_verdict]
            err = [(median - lo).fillna(0), (hi - median).fillna(0)]
            bars = ax.barh(names, median.fillna(0), xerr=err, color=color, capsize=3)
            labels = [
                "the ladder's first rung" if i == 0 else (
                    f"{pair_cell(r, 'speedup_rung')} · {pair_cell(r, 'speedup').split(',')[0]} the first rung"
                    if pd.notna(m) else cell_text(r.get("status")) or "not measured")
                for i, (r, m) in enumerate(zip(rungs.to_dict("records"), median, strict=True))
            ]  # fmt: skip
            ax.bar_label(bars, labels, padding=4, fontsize=7)
            ax.axvline(1.0, color="black", lw=0.8)
            if floor:
                ax.axvspan(1 - floor, 1 + floor, color="tab:gray", alpha=0.15, lw=0)
            ax.set_xlim(0, max(hi.max() if hi.notna().any() else 1, 1) * 1.9)
            shown = {cell_text(v) for v in rungs.speedup_rung_verdict}
            legend = [(w, c) for w, c in (*colors.items(), ("no measurable difference", "tab:gray")) if w in shown]
            if legend:  # each colour named where it is drawn: a disturbed rung is not a rung without a difference
                ax.legend(
                    handles=[Patch(color=c, label=w) for w, c in legend],
                    fontsize=7,
                    loc="upper left",
                    bbox_to_anchor=(1.01, 1.0),
                    borderaxespad=0,
                )  # beside the axes: never over a label
            ax.set_xlabel(
                "× its base rung: median of the interleaved pairs, min–max as error bars; grey: no measurable "
                "difference; orange: disturbed" + (f" (noise floor ±{100 * floor:.1f} %, shaded)" if floor else "")
            )
        ax.invert_yaxis()
        ax.tick_params(axis="y", labelsize=8)
        ax.set_title(f"Ladder: {name}", fontsize=10)
    fig.suptitle(f"Speed-up ladder: {title}", fontsize=11)
    fig.tight_layout()
    _save(fig, out / "ladder.png")


def plot_sweeps(summary: pd.DataFrame, out: Path, title: str) -> None:
    """sweeps.png: one panel per sweep, images/s against the knob (left axis) and data-wait in % (right axis); for a
    learning-rate sweep, the test accuracy."""
    sweeps = sweep_groups(summary)
    if not sweeps:
        return
    fig, axes = plt.subplots(1, len(sweeps), figsize=(5.5 * len(sweeps), 4), squeeze=False)
    for ax, (name, rows, knob) in zip(axes[0], sweeps, strict=True):
        ok = rows[rows.status == "ok"]
        if ok.empty or knob not in ok:  # no point of this sweep finished: an empty panel
            ax.set_title(f"{name}: no point finished", fontsize=9)
            continue
        x = pd.to_numeric(ok[knob], errors="coerce")
        if knob == "lr":  # a learning-rate sweep asks what it learns, not how fast
            ax.plot(x, 100 * pd.to_numeric(ok.test_acc, errors="coerce"), marker="o", color="tab:blue")
            ax.set_ylabel("test accuracy (%)", color="tab:blue")
        else:
            ax.plot(x, pd.to_numeric(ok.images_per_s, errors="coerce"), marker="o", color="tab:blue")
            ax.set_ylabel("images/s", color="tab:blue")
        ax.set_xlabel(KNOBS.get(knob, knob))
        ax.set_ylim(bottom=0)
        if knob in ("global_batch", "lr"):
            ax.set_xscale("log", base=2 if knob == "global_batch" else 10)
            ax.minorticks_off()
        ax.set_xticks(list(x), [f"{v:.6g}" for v in x])
        if knob != "lr":
            wait = ax.twinx()
            wait.plot(x, 100 * pd.to_numeric(ok.data_wait_frac, errors="coerce"), marker="s", color="tab:red", ls="--")
            wait.set_ylabel("data-wait (% of step time)", color="tab:red")
            wait.set_ylim(0, 100)
        ax.set_title(name, fontsize=9)
        ax.grid(alpha=0.3)
    fig.suptitle(f"Sweeps: {title}", fontsize=11)
    fig.tight_layout()
    _save(fig, out / "sweeps.png")
