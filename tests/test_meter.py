"""common.meter: what the images/s window leaves out (warm-up, evaluation, a recompiling step)."""

import time

import pytest
import torch

import common


def test_meter_leaves_warmup_and_evaluation_out():
    meter = common.Meter(torch.device("cpu"), warmup_steps=2)
    meter.resume()
    for delay in [0.3, 0.3, 0.02, 0.02, 0.02, 0.02]:  # two slow warm-up steps, then four fast ones
        for _ in meter.loader([None]):
            time.sleep(delay)
            meter.step(10)
    meter.pause()
    time.sleep(0.3)  # evaluation: outside every window
    meter.resume()
    for _ in meter.loader(range(2)):
        time.sleep(0.02)
        meter.step(10)
    stats = meter.summary()
    assert stats["measured_steps"] == 6
    # 60 images over ~6 x 20 ms: far above what the warm-up or the pause would allow (60 / 0.72 s = 83)
    assert 150 < stats["images_per_s"] <= 60 / 0.12
    assert stats["data_wait_frac"] < 0.2 and stats["step_ms_p50"] >= 20
    assert stats["train_s"] >= 0.7 and stats["peak_host_rss_gib"] > 0


def test_meter_keeps_a_step_marked_unmeasured_out_of_the_window(monkeypatch):
    """train_compile.py marks a step that recompiled `measured=False`: its seconds, images and step time are left
    out, and the window goes on after it. A fake clock makes the arithmetic exact: 10 ms per step, 5 s for the
    recompiling step."""
    clock = [0.0]
    monkeypatch.setattr(common.meter.time, "perf_counter", lambda: clock[0])
    meter = common.Meter(torch.device("cpu"), warmup_steps=1)
    meter.resume()
    for seconds, measured in [(2.0, True), (0.01, True), (0.01, True), (5.0, False), (0.01, True), (0.01, True)]:
        for _ in meter.loader([None]):
            clock[0] += seconds  # the step's work
            meter.step(8, measured=measured)
    stats = meter.summary()
    assert stats["excluded_steps"] == 1 and stats["measured_steps"] == 4  # the warm-up and the recompile left out
    assert stats["images_per_s"] == pytest.approx(4 * 8 / 0.04)  # 32 images in 40 ms, not in 5.04 s
    assert stats["step_ms_p50"] == pytest.approx(10) and stats["windows"] == 2
