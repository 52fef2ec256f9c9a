"""common.meter: what the images/s window leaves out (warm-up, evaluation, a recompiling step)."""

import pytest
import torch

import common


def test_meter_leaves_warmup_and_evaluation_out(monkeypatch):
    """Two slow warm-up steps (0.3 s), four fast ones (20 ms), an evaluation (0.3 s, between pause and resume), two
    more fast steps, one of which waits 5 ms for its batch. A fake clock makes the arithmetic exact (no test here
    depends on how fast this machine is): images/s counts the 6 fast steps only."""
    clock = [0.0]
    monkeypatch.setattr(common.meter.time, "perf_counter", lambda: clock[0])

    def batches(n, wait=0.0):  # a loader whose next() takes `wait` seconds
        for _ in range(n):
            clock[0] += wait
            yield None

    meter = common.Meter(torch.device("cpu"), warmup_steps=2)
    meter.resume()
    for seconds in [0.3, 0.3, 0.02, 0.02, 0.02, 0.02]:
        for _ in meter.loader(batches(1)):
            clock[0] += seconds
            meter.step(10)
    meter.pause()
    clock[0] += 0.3  # evaluation: outside every window
    meter.resume()
    for _ in meter.loader(batches(2, wait=0.005)):
        clock[0] += 0.015
        meter.step(10)
    stats = meter.summary()
    assert stats["measured_steps"] == 6 and stats["windows"] == 2
    assert stats["images_per_s"] == pytest.approx(60 / 0.12)  # 60 images in 6 x 20 ms, not in 0.72 s or 1.02 s
    assert stats["data_wait_frac"] == pytest.approx(2 * 0.005 / 0.12) and stats["step_ms_p50"] == pytest.approx(20)
    assert stats["train_s"] == pytest.approx(0.72) and stats["first_step_s"] == pytest.approx(0.3)
    assert stats["peak_host_rss_gib"] > 0


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


def test_the_blocked_step_time_is_the_median_block_and_ignores_one_disturbed_block():
    """30 steps of 20 ms in 5 blocks of 6; another program takes the cores during one block (its steps 100 ms):
    the median block is still 20 ms, the spread says one block was 5 times as slow; steps that recur within a
    block (a refill every third step) stay in every block's mean."""
    steady = [0.02] * 30
    hit = steady[:12] + [0.1] * 6 + steady[18:]
    assert common.meter.blocked(steady)[0] == pytest.approx(20) and common.meter.blocked(steady)[1] == 0
    middle, spread = common.meter.blocked(hit)
    assert middle == pytest.approx(20) and spread == pytest.approx((100 - 20) / 20)
    refill = [0.02, 0.02, 0.05] * 10  # every third step waits for a worker: the mean counts it, as images/s does
    assert common.meter.blocked(refill)[0] == pytest.approx(30)
    assert common.meter.blocked([0.02, 0.04]) == (pytest.approx(30), pytest.approx(20 / 30))  # a block per step
    assert common.meter.blocked([]) == (None, None)
