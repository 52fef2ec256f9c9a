"""common.meter: what the images/s window leaves out (warm-up, evaluation, a recompiling step), and the FLOP counter's
causal attention: causal SDPA counted over the lower triangle of its scores, diagonal included (FlashAttention-2's
counting convention, the useful FLOPs, not what every kernel computes: torch's CPU kernel computes about the whole
product up to 512 tokens), against the whole product counted for the written-out attention and an explicit mask."""

import contextlib
import functools
import math

import pytest
import torch
import torch.nn.functional as F

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
    for seconds in [0.3, 0.3, 0.02, 0.02, 0.02, 0.02]:  # the second, the probe step, within the warm-up
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
    recompiling step. Without the probe step (METER_PROBE=0), which the next test keeps out."""
    clock = [0.0]
    monkeypatch.setattr(common.meter.time, "perf_counter", lambda: clock[0])
    monkeypatch.setenv("METER_PROBE", "0")
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


def test_the_probe_step_runs_eagerly_is_counted_and_stays_out_of_the_window(monkeypatch):
    """The meter's probe step is the second: only it runs under torch.compiler's force_eager stance (so no compiled
    frame ever runs under the FLOP counter or the saved-tensor hooks), only its matmul is counted (2 x 4 x 8 x 16
    FLOPs for its 4 images) and its activations (the matmul's input, tanh's output: float32), and it is kept out of images/s even with --warmup-steps 1: 10 ms
    per step, 3 s for the probe step, on a fake clock."""
    clock = [0.0]
    monkeypatch.setattr(common.meter.time, "perf_counter", lambda: clock[0])
    meter = common.Meter(torch.device("cpu"), warmup_steps=1)
    weight = torch.randn(8, 16, requires_grad=True)
    stances = []
    meter.resume()
    for seconds in [2.0, 3.0, 0.01, 0.01, 0.01]:
        for _ in meter.loader([None]):
            stances.append(torch._dynamo.eval_frame._stance.stance)
            (torch.randn(4, 8) @ weight).tanh().sum()  # a matmul (counted once): its input saved, and tanh's output
            clock[0] += seconds
            meter.step(4)
    stats = meter.summary()
    assert stances == ["default", "force_eager", "default", "default", "default"]
    assert torch._dynamo.eval_frame._stance.stance == "default"
    assert stats["flops_per_image"] == 2 * 4 * 8 * 16 / 4 and stats["activation_mib"] == (4 * 8 + 4 * 16) * 4 / 2**20
    assert stats["excluded_steps"] == 1 and stats["measured_steps"] == 3
    assert stats["images_per_s"] == pytest.approx(3 * 4 / 0.03)  # 12 images in 30 ms, the probe's 3 s left out


@pytest.mark.gpu
def test_a_gpu_s_peak_memory_leaves_the_probe_step_out():
    """On a GPU the probe step runs eagerly: what it alone allocates (here 1 GiB, freed before the step ends) is not
    the run's peak, which the steps after it set (64 MiB each)."""
    device = torch.device("cuda")
    meter = common.Meter(device, warmup_steps=1)
    meter.resume()
    for mib in [64, 1024, 64, 64]:
        for _ in meter.loader([None]):
            torch.empty(mib * 2**20, dtype=torch.uint8, device=device).fill_(1)
            meter.step(1)
    assert 0.06 < meter.summary()["peak_mem_allocated_gib"] < 0.5


def test_a_probe_step_that_raises_or_is_left_closes_what_it_opened(monkeypatch):
    """An exception inside the probe step, or a loop that leaves it (SIGTERM's break, then pause()): the stance is
    back to default, no dispatch mode or saved-tensor hook is left on as soon as the loop is left (a traceback's
    process goes on with none of them), and nothing partial is reported (no FLOPs, no activations)."""
    import torch._dynamo  # noqa: F401  (a compiled script's process: the stance is set)
    from torch.utils._python_dispatch import _get_current_dispatch_mode_stack

    for leave in ("raise", "break"):
        meter = common.Meter(torch.device("cpu"), warmup_steps=1)
        meter.resume()
        with pytest.raises(RuntimeError) if leave == "raise" else contextlib.nullcontext():
            for step, _ in enumerate(meter.loader([None] * 4)):
                if step == 1:  # the probe step
                    assert torch._dynamo.eval_frame._stance.stance == "force_eager"
                    (torch.randn(2, 3, requires_grad=True) * 2).sum()
                    if leave == "raise":
                        raise RuntimeError("a bug in the step")
                    break
                meter.step(2)
        assert torch._dynamo.eval_frame._stance.stance == "default" and not _get_current_dispatch_mode_stack()
        assert not torch._C._autograd._top_saved_tensors_default_hooks(True)  # before pause(): the loop closed them
        stats = meter.summary()
        assert stats["flops_per_image"] is None and stats["activation_mib"] is None, leave


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


def written_out_attention(q, k, v, is_causal=False):
    """train_sdpa.py's --attention written-out, line for line (a script runs when imported): every score computed,
    then the upper triangle set to -inf."""
    scores = q @ k.transpose(-2, -1) / math.sqrt(q.size(-1))
    if is_causal:
        future = torch.ones(scores.shape[-2:], dtype=torch.bool, device=scores.device).triu(diagonal=1)
        scores = scores.masked_fill(future, float("-inf"))
    return torch.softmax(scores, dim=-1) @ v


def training_flops(step) -> int:
    """FLOPs common.flop_counter counts over `step()` (a forward and its backward)."""
    with common.flop_counter() as counter:
        step()
    return counter.get_total_flops()


def test_causal_sdpa_counts_the_lower_triangle_a_mask_or_written_out_attention_the_whole_product():
    """One attention, (2, 4 heads, T = 64, 16) float32, forward and backward. A T x T x d matmul of one head is
    2 T^2 d FLOPs; SDPA runs 7 of them (2 forward, 5 backward: q kᵀ recomputed), the written-out attention 6 (2
    forward, 2 x 2 backward). is_causal=True: the 7 over the lower triangle, T (T + 1) / 2 of the T^2 entries,
    0.5078 of the whole at T = 64 (FlashAttention-2's convention, half, with the diagonal counted; this CPU's kernel
    computes every entry at that length). The same causal mask passed as attn_mask: the whole product, as torch
    counts it (a mask is data: no kernel skips what it hides)."""
    n, heads, t, d = 2, 4, 64, 16
    q, k, v = (torch.randn(n, heads, t, d, requires_grad=True) for _ in range(3))
    matmul = 2 * n * heads * t * t * d  # one T x T x d product, all heads and batch
    triangle = t * (t + 1) // 2

    def run(attend, **kwargs):
        return training_flops(lambda: attend(q, k, v, **kwargs).sum().backward())

    full, causal = run(F.scaled_dot_product_attention), run(F.scaled_dot_product_attention, is_causal=True)
    assert full == 7 * matmul  # torch's count: the whole product
    assert causal == 7 * matmul * triangle // (t * t) == 7 * 2 * n * heads * d * triangle
    assert causal / full == pytest.approx(0.5, abs=1 / (2 * t) + 1e-12)  # half, and the diagonal
    mask = torch.ones(t, t, dtype=torch.bool).tril()
    assert run(F.scaled_dot_product_attention, attn_mask=mask) == full
    assert run(written_out_attention, is_causal=True) == run(written_out_attention) == 6 * matmul
    for rows, cols in [(5, 5), (3, 7), (7, 3), (1, 4)]:  # torch's is_causal: the top-left lower triangle
        assert common.meter.causal_entries(rows, cols) == int(torch.ones(rows, cols).tril().sum())


def test_the_gpt_s_sdpa_count_is_the_written_out_one_less_its_strict_upper_triangles():
    """The small GPT (4 causal blocks of 4 heads of 32, width 128) on one sequence of T = 64 tokens, forward and
    backward, with SDPA and with the written-out attention in every block (the same weights). Everything but
    attention counts the same; per block and head, one T x T x d matmul over e score entries is 2 d e FLOPs. Written
    out: 6 matmuls over all T^2 entries. SDPA: 7 over the lower triangle (the convention's count, whatever the kernel
    computed). So SDPA = written-out - 6 strict upper triangles (T (T - 1) / 2 entries each, what the convention
    leaves out) + 1 lower triangle (T (T + 1) / 2: the backward's recompute of q kᵀ). With the mask ignored (torch's
    own formulas), SDPA would count 7 whole matmuls: more than the written-out attention that computes every
    score."""
    t, depth, heads, head_dim = 64, 4, 4, 32
    model = common.build_model("gpt", common.data.TEXT_VOCAB, t)
    tokens = torch.randint(0, common.data.TEXT_VOCAB, (1, t), generator=torch.Generator().manual_seed(0))

    def step():
        F.cross_entropy(model(tokens), tokens).backward()

    sdpa = training_flops(step)
    for block in model.blocks:
        block.attn.attend = written_out_attention
    written = training_flops(step)
    per_entry = depth * heads * 2 * head_dim  # one matmul, one score entry, every block and head
    skipped = 6 * (t * (t - 1) // 2) - t * (t + 1) // 2
    assert sdpa == written - per_entry * skipped
    assert written - sdpa == pytest.approx(per_entry * 2.5 * t * t, rel=4 / t)  # about 6 T^2 / 2 - T^2 / 2


def test_every_sdpa_kernel_s_aten_ops_count_causal_over_the_lower_triangle():
    """The ops F.scaled_dot_product_attention dispatches to on a GPU (flash, its float8 `quantized` overload,
    memory-efficient, cuDNN) and on a CPU, forward and backward, called as the dispatcher calls them on meta tensors
    (shapes only: no GPU needed), each with is_causal at its own place in its schema: the lower triangle when causal,
    torch's whole count when not. Self-attention, T (T + 1) / 2 of T^2 = 0.5078 at T = 64; and T queries against
    S keys both ways (16 x 48, 48 x 16), where torch's is_causal keeps the top-left triangle, `ones(T, S).tril()`:
    136 and 648 of 768 entries, so a count that took the keys for the queries would be off."""
    aten, (n, heads, d) = torch.ops.aten, (2, 4, 16)

    def count(op, *args) -> int:
        with common.flop_counter() as counter:
            op(*args)
        return counter.get_total_flops()

    for t, s in [(64, 64), (16, 48), (48, 16)]:
        q = torch.empty(n, heads, t, d, device="meta", dtype=torch.float16)
        k = torch.empty(n, heads, s, d, device="meta", dtype=torch.float16)  # keys and values
        matmul = 2 * n * heads * t * s * d  # one T x S x d product, all heads and batch
        for causal, entries in [(False, t * s), (True, int(torch.ones(t, s).tril().sum()))]:
            forwards = [
                (aten._scaled_dot_product_flash_attention, q, k, k, 0.0, causal),
                (aten._scaled_dot_product_flash_attention.quantized, q, k, k, None, None, None, 0.0, causal),
                (aten._scaled_dot_product_efficient_attention, q, k, k, None, True, 0.0, causal),
                (aten._scaled_dot_product_cudnn_attention, q, k, k, None, True, 0.0, causal),
                (aten._scaled_dot_product_flash_attention_for_cpu, q, k, k, 0.0, causal),
            ]
            flash, _, efficient, cudnn, cpu = (op(*args) for op, *args in forwards)
            backwards = [  # the forward's outputs (out, logsumexp, sequence offsets, RNG state) as the backward takes
                (aten._scaled_dot_product_flash_attention_backward, q, q, k, k, *flash[:6], 0.0, causal, *flash[6:8]),
                (aten._scaled_dot_product_efficient_attention_backward, q, q, k, k, None, *efficient,
                 0.0, [True, True, True, False], causal),
                (aten._scaled_dot_product_cudnn_attention_backward, q, q, k, k, *cudnn[:2], *cudnn[6:8], None,
                 *cudnn[2:6], 0.0, causal),
                (aten._scaled_dot_product_flash_attention_for_cpu_backward, q, q, k, k, *cpu, 0.0, causal),
            ]  # fmt: skip
            share = matmul * entries // (t * s)  # one product over the counted entries
            assert [count(*call) for call in forwards] == [2 * share] * 5, (t, s, causal)  # q kᵀ, weights x v
            assert [count(*call) for call in backwards] == [5 * share] * 4, (t, s, causal)  # q kᵀ again, 4 grads


def grouped_attention_step(q, k, v, is_causal: bool) -> None:
    """Forward and backward of grouped-query attention: key and value have fewer heads than the query."""
    F.scaled_dot_product_attention(q, k, v, is_causal=is_causal, enable_gqa=True).sum().backward()


def test_causal_sdpa_with_fewer_key_value_heads_counts_every_query_head_over_the_lower_triangle():
    """Grouped-query attention as a CPU runs it (F.scaled_dot_product_attention(enable_gqa=True): 4 query heads share
    2 key/value heads, into the CPU's flash kernel), forward and backward, T queries against S keys both ways: each
    query head does its own T x S products, so 7 of them (2 forward, 5 backward) for 4 heads, over the top-left lower
    triangle when causal (136 or 648 of 768 entries), whole when not."""
    n, heads, kv_heads, d = 2, 4, 2, 16
    for t, s in [(16, 48), (48, 16)]:
        q = torch.randn(n, heads, t, d, requires_grad=True)
        k, v = (torch.randn(n, kv_heads, s, d, requires_grad=True) for _ in range(2))
        per_entry = 7 * 2 * n * heads * d  # 7 products, every query head and batch, one score entry
        for causal, entries in [(False, t * s), (True, int(torch.ones(t, s).tril().sum()))]:
            flops = training_flops(functools.partial(grouped_attention_step, q, k, v, causal))
            assert flops == per_entry * entries, (t, s, causal)
