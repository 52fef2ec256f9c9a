"""The meter: images/s, step time, data-wait, activation memory, FLOPs per image and peak memory of a training run.

FLOPs are counted by `flop_counter()`, the one counter of the project (the Meter, bench/peak.py, the model-parallel
scripts' cuts): torch.utils.flop_counter's formulas for the ops as they ran (a recompute counts), except that causal
`F.scaled_dot_product_attention` (is_causal=True) is counted over the lower triangle of its scores, diagonal included:
FlashAttention-2's counting convention for causal attention (the useful FLOPs), not the whole T x T product torch's
formulas credit it with, and not what every kernel computes (torch's CPU kernel computes about the whole product up
to T = 512: see `flop_counter`). The tables' "of peak" (achieved FLOP/s over the measured matmul peak) uses this
count. PaLM's MFU is defined on another count, the model's 6 N + 12 L d T FLOPs per token (whole T x T attention, no
recompute): `flops_per_token_palm` in a GPT's metrics (common/metrics.py's `text_flops`), never the tables' of-peak.
"""

from __future__ import annotations

import contextlib
import os
import resource
import statistics
import sys
import time

import torch
import torch.distributed as dist
from torch.utils.flop_counter import FlopCounterMode, sdpa_backward_flop_count, sdpa_flop_count

GIB = 1024**3
PROBE_STEP = 2  # the meter's probe step: the second (the first is where torch.compile compiles)


class _TotalOnly:
    """FlopCounterMode's module tracker without its hooks: the meter reads only the total ("Global"). The tracker's
    global forward hooks make a torch.compile'd model warn that they fire twice, and its backward hooks fail inside
    torch.autograd.grad (a zero-bubble pipeline's split backward: "A leaf node was passed to
    _will_engine_execute_node")."""

    parents = {"Global"}

    def __enter__(self):
        return self

    def __exit__(self, *args) -> None:
        pass


def causal_entries(rows: int, cols: int) -> int:
    """How many of a (rows x cols) attention matrix's score entries causal attention uses, the count FlashAttention-2's
    convention credits (a tiled kernel may compute more): row i (a query) sees keys 0 ... i, min(i + 1, cols) of them,
    torch's `is_causal` (the top-left lower triangle, `ones(L, S).tril()`).
    rows = cols = T: T (T + 1) / 2 of the T^2, the diagonal included. An int, a count of entries (no unit)."""
    side = min(rows, cols)
    return side * (side + 1) // 2 + max(0, rows - cols) * cols


def causal_share(flops: int, rows: int, cols: int, is_causal: bool) -> int:
    """`flops` (an attention op's FLOPs, every term of which is a product over all rows x cols score entries, as
    torch's sdpa formulas are) scaled to the causal entries (`causal_entries`) when `is_causal`, else unchanged.
    Exact in integers: each term of torch's count is a multiple of rows x cols."""
    return flops * causal_entries(rows, cols) // (rows * cols) if is_causal else flops


def _arguments(packet, args: tuple, kwargs: dict) -> dict:
    """The op's arguments by name, from its schema. Only _scaled_dot_product_flash_attention has a second overload,
    `quantized` (float8 descales after `value`): the call whose 4th argument is a tensor (its shape here) or None is
    that one; the default's 4th is dropout_p, a float."""
    overload = packet.default
    if "quantized" in packet.overloads() and len(args) > 3 and not isinstance(args[3], (int, float)):
        overload = packet.quantized
    return {**dict(zip((a.name for a in overload._schema.arguments), args)), **kwargs}


def _causal_forward(packet):
    """The FLOP formula of one of SDPA's forward aten ops: torch's (sdpa_flop_count: q kᵀ and the weights times v,
    2 FLOPs a multiply-add, heads and batch included), over the lower triangle when the call's is_causal is true."""

    def formula(query, key, value, *args, out_shape=None, **kwargs) -> int:  # the tensors' shapes, (N, heads, T, d)
        causal = bool(_arguments(packet, (query, key, value, *args), kwargs).get("is_causal", False))
        return causal_share(sdpa_flop_count(query, key, value), query[-2], key[-2], causal)

    return formula


def _causal_backward(packet):
    """The FLOP formula of one of SDPA's backward aten ops: torch's (sdpa_backward_flop_count: 5 matmuls over the
    scores: q kᵀ recomputed, dP = dO vᵀ, dV = Pᵀ dO, dQ = dS k, dK = dSᵀ q), over the lower triangle when causal."""

    def formula(grad_out, query, key, value, *args, out_shape=None, **kwargs) -> int:
        causal = bool(_arguments(packet, (grad_out, query, key, value, *args), kwargs).get("is_causal", False))
        return causal_share(sdpa_backward_flop_count(grad_out, query, key, value), query[-2], key[-2], causal)

    return formula


_aten = torch.ops.aten
# The aten ops F.scaled_dot_product_attention dispatches to (flash and efficient on CUDA, cuDNN, the CPU's flash) and
# their backwards: the ops FlopCounterMode sees it as, under which the lower-level kernels' ops never show.
_SDPA_OPS = ("flash_attention", "efficient_attention", "cudnn_attention", "flash_attention_for_cpu")
CAUSAL_ATTENTION_FLOPS = {
    **{op: _causal_forward(op) for op in (getattr(_aten, f"_scaled_dot_product_{name}") for name in _SDPA_OPS)},
    **{op: _causal_backward(op) for op in (getattr(_aten, f"_scaled_dot_product_{n}_backward") for n in _SDPA_OPS)},
}


def flop_counter() -> FlopCounterMode:
    """The project's FLOP counter: a FlopCounterMode (display off, no per-module labels: read its total,
    `get_total_flops()`, an int of FLOPs, a multiply-add counting 2) with torch's formulas, except causal attention.

    torch's formulas for SDPA ignore the mask (its source: "NB: We aren't accounting for causal attention here"): they
    count a causal call as the whole T x T product of q kᵀ and of the weights times v, forward and backward. Here the
    SDPA aten ops called with is_causal=True (CAUSAL_ATTENTION_FLOPS) count the lower triangle: `causal_entries(T, S)`
    of the T x S scores, T (T + 1) / 2 for self-attention; forward 2 matmuls (4 d FLOPs an entry and head), backward
    5 (torch's count, q kᵀ recomputed). That is FlashAttention-2's counting convention for causal attention (Dao 2023,
    section 4.1, and the benchmark script of the flash-attention repository: forward 4 T^2 d heads FLOPs, halved when
    causal, backward 2.5 x forward), the useful FLOPs; here the diagonal counts too, T (T + 1) / 2 and not T^2 / 2
    (1 / (2 T) more: 0.1 % at T = 512).

    A convention, not what every kernel computes: kernels work in tiles. torch's CPU flash kernel computes each query
    block's keys in tiles of 512, in full, then masks, so up to T = 512 it computes about the whole T x T product
    (measured, forward, causal over non-causal time: 0.96 at T = 256, 1.01 at 512, 0.61 at 2048); FlashAttention-2 on
    a GPU skips the tiles above the diagonal but computes those across it in full. So on a CPU at short contexts the
    TFLOP/s and "of peak" of a causal SDPA under-read the work done there.

    Counted whole, as torch counts them: SDPA with an explicit attn_mask (the mask is data, and no kernel skips what
    it hides), SDPA's math backend (plain matmuls, then the mask), and attention written out
    (`softmax(q kᵀ / √d + mask) v`, train_sdpa.py --attention written-out), whose matmuls compute every score before
    the mask sets the upper triangle to -inf. So on one causal GPT, the written-out attention counts its 6 T x T
    matmuls whole (2 forward, 2 x 2 backward) and SDPA 7 (its backward recomputes q kᵀ) over the triangle:
    written-out minus 6 strict upper triangles plus 1 lower one."""
    counter = FlopCounterMode(display=False, custom_mapping=CAUSAL_ATTENTION_FLOPS)
    counter.mod_tracker = _TotalOnly()
    return counter


class Meter:
    """Times training steps on the host, with device synchronisation only at the edges of the measured window.

    `device` is the device the steps run on, or a list of them (model parallelism): every one is synchronised.
    Use: `for batch in meter.loader(train_loader): ...; meter.step(n_images)`; `meter.pause()` before evaluation and
    `meter.resume()` after it (both synchronise), `meter.summary()` at the end.
    - images/s: images of the steps after the first `warmup_steps`, divided by the seconds of the window(s) they
      ran in. Each window starts and ends with `torch.cuda.synchronize()`, so queued GPU work is counted in full.
      Multiply by the world size (or sum over ranks, `gather_summary`) for a global figure. A run with no step after
      the warm-up has no window: images/s is None and `images_per_s_note` says why ("not measured", never 0).
    - tokens/s: a language model's batch is (N, T) int64 tokens (noticed in `loader`): a sample is a sequence, and
      `tokens_per_sample` (T) turns samples/s into tokens/s, in the progress line and in the metrics (`report`).
      Samples of varying length, padded per batch: `step(..., tokens=real tokens)`, and tokens_per_sample is the
      window's mean of real tokens per sample, and the progress line counts real tokens too.
    - step time p50/p90 (ms): host time between consecutive `step()` calls inside the window. Between the edges
      nothing synchronises, so on a GPU this is the rate at which the host can queue steps (equal to the GPU's rate
      once its queue is full); on CPU it is the step time itself.
    - blocked step time (ms), `step_ms_blocked`: the measured steps cut into `BLOCKS` consecutive blocks, each block's
      mean step time, and the median of those means (torch.utils.benchmark's blocked_autorange reports the median
      of blocks the same way). A block's mean keeps what recurs every few steps (a DataLoader worker's refill), and
      the median over blocks drops what a few seconds of another program's load did to one or two blocks: the
      bench's pair ratios use it. `step_blocks_spread`: (slowest block - fastest block) / the median block, how
      much the run's steps scattered (the bench re-runs a pair whose run scattered far beyond its siblings).
    - data-wait fraction: seconds blocked in `next(loader)` inside the window / window seconds (every `next()`
      between two steps counts, so K micro-batches per step are all counted).
    - first step (s): host seconds from the start of training to the end of the first step: where torch.compile
      compiles, cuDNN autotunes and DataLoader workers start.
    - the probe step (the second step, PROBE_STEP): the instrument's own step, never a timed one. It runs eagerly
      (`torch.compiler.set_stance("force_eager")`: torch.compile's frames are not entered, so Dynamo never sees
      the counters, and the timed steps run the very frames a run without the probe runs, compiled at the first
      step; on torch 2.11 a frame first reached under a dispatch mode runs eagerly for good, pytorch#190286), and
      is kept out of images/s and step times (`excluded_steps` counts it once the window is open). It is the
      script's own step (its autocast, its optimizer, its micro-batches), on the run's model and batch: the same
      training, the compiled rungs' step 2 in eager arithmetic (float rounding apart, as their equivalence tests
      allow). A script that compiles nothing has not imported Dynamo, and its probe step sets no stance. Whatever
      ends the step early (SIGTERM, an exception) closes what it opened and counts nothing. METER_PROBE=0 in the
      environment runs without it (no FLOPs, no activations).
    - activation memory (MiB): what autograd keeps for backward, measured, not estimated, on the probe step's first
      batch (one micro-batch under gradient accumulation): from that batch's arrival to the next `next()`, `step()`
      or `pause()`, a `torch.autograd.graph.saved_tensors_hooks` pack hook records the storage of every tensor saved
      for backward, except parameters and views of them (leaves that require grad, e.g. the `weight.t()` nn.Linear
      saves; autocast's low-precision copies of them do count), and the distinct storages' bytes are summed. All of
      them are alive together at the end of the forward. Under activation checkpointing, torch.utils.checkpoint
      saves a block's inputs here and the tensors of its recompute under its own inner hooks, which are not counted:
      they live only during that block's backward. The probe step is eager: a compiled model's partitioner may keep
      fewer tensors than its eager model (peak memory shows it), the figure is the model's as written.
    - training FLOPs per image: `flop_counter()` (torch.utils.flop_counter's FlopCounterMode) over the probe step,
      from its batch's arrival to `step()` (all its micro-batches), divided by its images: forward and backward
      matmuls, convolutions and attention as they ran (a multiply-add counts 2; elementwise ops, the loss and AdamW's
      update are not counted; Muon's Newton-Schulz matmuls are, as an activation-checkpointing recompute is: the
      FLOPs that ran, not the model's), causal SDPA over the lower triangle of its T x T scores whatever its kernel
      computed (FlashAttention-2's counting convention; the written-out attention computes them all and counts them
      all: see `flop_counter`).
      Batches of varying length (`step(..., tokens=)`): the step's FLOPs per real token, pads' work included, times the
      window's real tokens per sample (the counted batch's width stands for the window's: attention's share is
      approximate). DataParallel's replicas run their forward in threads the counter does not see (train_DP.py reports
      none on 2+ GPUs). A run of one step has no probe step: no FLOPs, no activations.
    """

    def __init__(self, device: torch.device | list[torch.device], warmup_steps: int = 10, schedule=None, target=None):
        self.devices = list(device) if isinstance(device, (list, tuple)) else [device]  # all are synchronised
        self.device, self.warmup_steps = self.devices[0], warmup_steps
        self.clock = StageClock(schedule, self.device) if schedule is not None else None  # a pipeline's bubble
        self.target = target  # --target-loss's probe (common.target_probe), run at the end of every K-th step
        self.steps = 0  # all steps, warm-up included
        self.images = 0  # images inside the window(s)
        self.windows = 0  # windows opened: more than one means epoch edges (or evaluations) fall between them
        self.excluded_steps = 0  # steps after the warm-up kept out of the window: step(..., measured=False)
        self.window_s = self.wait_s = 0.0
        self.step_s: list[float] = []  # each measured step's host seconds, in order
        self.first_step_s = None
        self._t_start = self._t_last = None  # start of the open window, end of the previous step
        self._wait = 0.0
        self.train_s = 0.0  # all training seconds between resume() and pause(), warm-up included
        self._t_train = None
        self.started_unix = self.stopped_unix = None  # wall clock at the first resume() and the last pause()
        self._progress = (time.perf_counter(), 0, 0, 0)  # (time, steps, images, tokens) at the last progress() call
        self._all_images = 0
        self.activation_bytes = None  # measured on the first batch
        self._saved_hooks, self._storages = None, {}
        self.flops_per_image = None  # counted on the probe step
        self.probe = os.environ.get("METER_PROBE", "1") != "0"  # 0: no probe step (tests compare runs without it)
        self.probed = False  # the probe step has begun
        self._probe_stack = None  # what the probe step opened (stance, counter, hooks), while it runs
        self.tokens_per_sample = None  # a language model's batch: (N, T) int64 tokens, T of them per sample
        self.window_tokens = 0  # real tokens inside the window(s), when step() is given them
        self._all_tokens = 0  # real tokens of all steps, when step() is given them (the progress line)
        self._flops_per_token = None  # the counted step's FLOPs per real token, when step() is given tokens
        self._flop_counter = None
        for d in self.devices:
            if d.type == "cuda":
                torch.cuda.reset_peak_memory_stats(d)

    def _sync(self) -> float:
        for d in self.devices:
            if d.type == "cuda":
                torch.cuda.synchronize(d)
        return time.perf_counter()

    def _pack(self, tensor: torch.Tensor) -> torch.Tensor:
        """The pack hook: record the storage of a tensor saved for backward, unless it is a parameter or a view of
        one (nn.Linear saves `weight.t()`), and keep the tensor. A DTensor counts its local shard: what this rank
        keeps."""
        base = tensor._base if tensor._base is not None else tensor
        if not (tensor.is_leaf and tensor.requires_grad) and not (base.is_leaf and base.requires_grad):
            local = getattr(tensor, "_local_tensor", tensor)  # a DTensor (tensor parallelism): this rank's shard
            try:
                storage = local.untyped_storage()
            except (RuntimeError, NotImplementedError):  # a sparse tensor or a subclass without one storage
                return tensor
            self._storages[(storage.data_ptr(), str(tensor.device))] = storage.nbytes()
        return tensor

    def _stop_counting(self) -> None:
        """The end of the probe step's first micro-batch: the saved-tensor hooks off, their storages summed."""
        if self._saved_hooks is not None:
            self._saved_hooks.close()  # (the ExitStack closes it too, if the step never got this far)
            self._saved_hooks = None
            self.activation_bytes = sum(self._storages.values())

    def _end_probe(self, finished: bool = True) -> int | None:
        """Close what the probe step opened (the hooks, the counter, the eager stance; in reverse order, whatever
        happened inside the step); its FLOPs, or None when no probe step was open or it did not finish (`finished`
        False: the loop left it, by SIGTERM or an exception, and its counts would be partial)."""
        if self._probe_stack is None:
            return None
        if finished:
            self._stop_counting()
        stack, counter, self._probe_stack, self._saved_hooks, self._flop_counter = (
            self._probe_stack,
            self._flop_counter,
            None,
            None,
            None,
        )
        stack.close()
        return counter.get_total_flops() if finished else None

    def _begin_probe(self) -> None:
        """Open the probe step: torch.compile's frames bypassed (the force_eager stance, where Dynamo was imported
        at all: else nothing was compiled and nothing needs bypassing), the FLOP counter until `step()` (every
        micro-batch of the step), the saved-tensor hooks until the next `next()` (its first micro-batch)."""
        self.probed = True
        stack = contextlib.ExitStack()
        if "torch._dynamo" in sys.modules and hasattr(torch.compiler, "set_stance"):
            stack.enter_context(torch.compiler.set_stance("force_eager"))
        self._flop_counter = stack.enter_context(flop_counter())
        hooks = torch.autograd.graph.saved_tensors_hooks(self._pack, lambda tensor: tensor)
        self._saved_hooks = contextlib.ExitStack()
        self._saved_hooks.enter_context(hooks)
        stack.push(self._saved_hooks)  # closed first, if the step ends before its first micro-batch's end
        self._probe_stack = stack

    def loader(self, iterable):
        """Yield from `iterable`, timing how long each `next()` blocks (the data-wait); while the consumer works on
        the first batch, count the tensors autograd saves for backward (the activation memory)."""
        iterator = iter(iterable)
        try:
            yield from self._batches(iterator)
        finally:  # the loop left (break, an exception, the generator closed): nothing the probe opened stays open
            self._end_probe(finished=False)

    def _batches(self, iterator):
        while True:
            self._stop_counting()
            t0 = time.perf_counter()
            try:
                batch = next(iterator)
            except StopIteration:
                return
            self._wait += time.perf_counter() - t0
            inputs = batch[0] if isinstance(batch, (tuple, list)) else None
            if isinstance(inputs, torch.Tensor) and inputs.dim() == 2 and not inputs.is_floating_point():
                self.tokens_per_sample = inputs.size(1)  # text: throughput in tokens/s, as language models count
            if self.steps == PROBE_STEP - 1 and self.probe and not self.probed:
                self._begin_probe()  # the probe step: eager (torch.compile's frames are not entered), counted
            yield batch

    def step(self, n_images: int, measured: bool = True, tokens: int | None = None) -> None:
        """Record the end of one optimizer step over `n_images` images (per process); `tokens`: the real (non-pad)
        tokens of a text batch whose samples differ in length (train_varlen.py), so that tokens/s counts those and
        not the padded (N, T) shape: the summary's tokens_per_sample is then the window's tokens / its samples.
        `measured=False` keeps a step after the warm-up out of images/s, step times and data-wait (train_compile.py:
        a step in which torch.compile recompiled): the window closes at the previous step's end and a new one opens
        at this step's end. On a GPU, work the previous steps left queued finishes inside that step and is left out
        too (at most a few steps' worth against the seconds of a compile); `excluded_steps` in the summary counts such
        steps. With a `target` probe (--target-loss), every K-th step ends with it, the clock stopped."""
        self._step(n_images, measured, tokens)
        if self.target is not None:
            self.target.after_step(self)

    def _step(self, n_images: int, measured: bool, tokens: int | None) -> None:
        flops = self._end_probe()
        if flops is not None:  # this was the probe step: eager, so it stays out of images/s however long it took
            self.flops_per_image = flops / n_images if flops else 0.0
            self._flops_per_token = flops / tokens if tokens and flops else None  # varying lengths: see summary()
            measured = False
            for d in self.devices:  # and out of the peak: an eager step holds what a compiled one never does
                if d.type == "cuda":
                    torch.cuda.reset_peak_memory_stats(d)
        self.steps += 1
        self._all_images += n_images
        self._all_tokens += tokens or 0
        if self.first_step_s is None and self._t_train is not None:
            self.first_step_s = self.train_s + time.perf_counter() - self._t_train
        wait, self._wait = self._wait, 0.0
        if self._t_start is None:
            if self.steps >= self.warmup_steps:
                self.resume()  # the window opens after the last warm-up step
            return
        if not measured:  # close the window at the previous step's end, open the next one now
            self.window_s += self._t_last - self._t_start
            self._t_start = self._t_last = self._sync()
            self.windows += 1
            self.excluded_steps += 1
            return
        now = time.perf_counter()
        self.step_s.append(now - self._t_last)
        self.images += n_images
        if tokens is not None:
            self.window_tokens += tokens
        self.wait_s += wait
        self._t_last = now

    def progress(self) -> str:
        """ "X images/s, Y ms/step" since the previous call (host clock; call it right after a synchronising
        `loss.item()`, so the GPU's queued work is counted)."""
        now = time.perf_counter()
        t, steps, images, tokens = self._progress
        self._progress = (now, self.steps, self._all_images, self._all_tokens)
        if self.steps == steps or now == t:
            return "no step since the last line"
        rate, unit = (self._all_images - images) / (now - t), "images/s"
        if self._all_tokens > tokens:  # real tokens counted by step(): batches of varying length
            rate, unit = (self._all_tokens - tokens) / (now - t), "tokens/s"
        elif self.tokens_per_sample:
            rate, unit = rate * self.tokens_per_sample, "tokens/s"
        return f"{rate:.0f} {unit}, {1e3 * (now - t) / (self.steps - steps):.1f} ms/step"

    def pause(self) -> None:
        """Stop the training clock and close the open window, synchronising the device (e.g. before evaluation)."""
        self._end_probe(finished=False)  # the loop left before the probe step's end (SIGTERM): nothing counted
        now = self._sync()
        if self._t_start is not None:
            self.window_s += now - self._t_start
            self._t_start = None
        if self._t_train is not None:
            self.train_s += now - self._t_train
            self._t_train = None
            self.stopped_unix = time.time()

    def resume(self) -> None:
        """Start the training clock and, once the warm-up steps are done, open a window (synchronising the device)."""
        if self._t_train is None:
            self._t_train = self._sync()
            self.started_unix = self.started_unix or time.time()
            self._progress = (self._t_train, self.steps, self._all_images, self._all_tokens)
        if self.steps >= self.warmup_steps and self._t_start is None:
            self._t_start = self._t_last = self._sync()
            self._wait = 0.0
            self.windows += 1

    def _flops_per_sample(self) -> float | None:
        """The counted step's FLOPs per sample; for batches of varying length (step() given tokens), its FLOPs per
        real token (the pads' work included) times the window's real tokens per sample, so that FLOPs per sample x
        samples/s is the work of the window's batches, not of the one counted."""
        if self._flops_per_token and self.window_tokens:
            return self._flops_per_token * self.window_tokens / self.images
        return self.flops_per_image

    def summary(self) -> dict:
        """Per-process figures: images_per_s (None and a note when not measured), step_ms_p50/p90, step_ms_blocked and
        step_blocks_spread (`blocked`), data_wait_frac,
        measured_steps, windows, first_step_s, train_s (s), activation_mib (MiB) and flops_per_image (None when
        the run had no probe step: one step, or METER_PROBE=0), peak memory (GiB, `memory_stats`: on a GPU from the
        probe step's end on, whose eager step can hold what the compiled steps never do, e.g. a flex_attention's
        scores), and
        train_started_unix / train_stopped_unix (the wall clock, s since the epoch, at the first `resume()` and the
        last `pause()`: the bench splits a run's time outside training into start-up and what follows)."""
        self.pause()
        measured = len(self.step_s)
        quantiles = statistics.quantiles(self.step_s, n=10, method="inclusive") if measured >= 2 else [None] * 9
        note = None
        blocked_ms, blocks_spread = blocked(self.step_s)
        if not measured:
            note = (
                f"not measured: the run's {self.steps} steps are all within --warmup-steps {self.warmup_steps}; "
                "run more steps or lower --warmup-steps"
            )
        return {
            "images_per_s": self.images / self.window_s if measured else None,
            # None for images; tokens/s = images_per_s x this (batches of varying length: the window's real tokens)
            "tokens_per_sample": self.window_tokens / self.images if self.window_tokens else self.tokens_per_sample,
            "images_per_s_note": note,
            "step_ms_p50": 1e3 * statistics.median(self.step_s) if measured else None,
            "step_ms_p90": 1e3 * quantiles[8] if measured >= 2 else None,
            "step_ms_blocked": blocked_ms,
            "step_blocks_spread": blocks_spread,
            "data_wait_frac": self.wait_s / self.window_s if measured else None,
            "measured_steps": measured,
            "measured_s": self.window_s,
            "windows": self.windows,
            "excluded_steps": self.excluded_steps,
            "first_step_s": self.first_step_s,
            "train_s": self.train_s,
            "train_started_unix": self.started_unix,
            "train_stopped_unix": self.stopped_unix,
            "activation_mib": self.activation_bytes / 2**20 if self.activation_bytes is not None else None,
            "flops_per_image": self._flops_per_sample() or None,
            **memory_stats(),
            **({"bubble_measured": self.clock.idle_share(self.warmup_steps)} if self.clock else {}),
            **({"target": self.target.record()} if self.target is not None else {}),  # report() turns it into metrics
        }


class StageClock:
    """A pipeline rank's bubble: the share of each step in which none of its stages computed. It wraps the
    schedule's `step` (a step's seconds) and each of this rank's stages' compute calls (`forward_one_chunk`,
    `backward_one_chunk`, and the weight half of a split backward, `backward_weight_one_chunk`: what the schedule runs
    between its sends and receives) to add up their seconds. `idle_share(warmup_steps)`: the median over the steps
    after the warm-up of 1 - computing seconds / the step's seconds (a fraction; None without a step). `schedule`: a
    torch.distributed.pipelining schedule (its stages: `_stage` for one per rank, `_stages` for several). On CUDA
    every call synchronises `device` (kernels run asynchronously), which serialises the work it times: there the
    bubble is that of a slowed schedule. `Meter(..., schedule=)` makes one and reports `bubble_measured`."""

    def __init__(self, schedule, device: torch.device):
        self.device, self.idle = device, []  # idle: per step, 1 - computing / the step's seconds
        self.busy, self.step_start = 0.0, None
        stages = getattr(schedule, "_stages", None) or [schedule._stage]
        for stage in stages:  # torch.distributed.pipelining.PipelineStage objects
            for name in ("forward_one_chunk", "backward_one_chunk", "backward_weight_one_chunk"):
                setattr(stage, name, self._timed(getattr(stage, name)))
        step = schedule.step

        def timed_step(*args, **kwargs):
            self.begin_step()
            try:
                return step(*args, **kwargs)
            finally:
                self.end_step()

        schedule.step = timed_step

    def _now(self) -> float:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        return time.perf_counter()

    def _timed(self, compute):
        def timed(*args, **kwargs):
            start = self._now()
            try:
                return compute(*args, **kwargs)
            finally:
                self.busy += self._now() - start

        return timed

    def begin_step(self) -> None:
        self.busy, self.step_start = 0.0, self._now()

    def end_step(self) -> None:
        self.idle.append(1 - self.busy / (self._now() - self.step_start))

    def idle_share(self, warmup_steps: int) -> float | None:
        return statistics.median(self.idle[warmup_steps:] or self.idle) if self.idle else None


BLOCKS = 5  # blocks of the measured steps for step_ms_blocked: 30 steps make blocks of 6


def blocked(step_s: list[float], blocks: int = BLOCKS) -> tuple[float | None, float | None]:
    """(median block mean, spread) of step times `step_s` (seconds, in order): the steps cut into `blocks`
    consecutive blocks of nearly equal length (fewer steps than blocks: a block per step), the median of the blocks'
    mean step times, in ms, and (max - min) / median of those means (None with one block). (None, None) without a
    step."""
    n = len(step_s)
    if not n:
        return None, None
    k = min(blocks, n)
    edges = [round(i * n / k) for i in range(k + 1)]
    means = [statistics.fmean(step_s[a:b]) for a, b in zip(edges, edges[1:])]
    middle = statistics.median(means)
    return 1e3 * middle, ((max(means) - min(means)) / middle if k > 1 and middle > 0 else None)


def memory_stats() -> dict:
    """Peak memory so far: per CUDA device allocated / reserved (GiB, since the last reset) and host RSS (GiB).

    Host RSS is `getrusage(RUSAGE_SELF).ru_maxrss` (KiB on Linux): this process only, not DataLoader workers.
    """
    devices = [
        {
            "index": i,
            "name": torch.cuda.get_device_name(i),
            "peak_allocated_gib": torch.cuda.max_memory_allocated(i) / GIB,
            "peak_reserved_gib": torch.cuda.max_memory_reserved(i) / GIB,
        }
        for i in range(torch.cuda.device_count())
        if torch.cuda.is_initialized()
    ]
    rss_kib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return {
        "peak_mem_allocated_gib": max((d["peak_allocated_gib"] for d in devices), default=None),
        "peak_mem_reserved_gib": max((d["peak_reserved_gib"] for d in devices), default=None),
        "peak_mem_per_device": devices,
        "peak_host_rss_gib": rss_kib * 1024 / GIB,
    }


def gather_summary(summary: dict, same_images: bool = False) -> dict:
    """A `Meter.summary()` made global over the ranks of the default process group (every rank must call it):
    images/s summed (each rank measured its own share; with `same_images`, where every rank trains on every image of
    the batch, as in tensor and pipeline parallelism, the slowest rank's), peak memory the maximum over ranks,
    `peak_mem_per_device` every rank's devices (with their rank), data-wait, step times, activation_mib and
    flops_per_image those of this rank. images_per_s_per_rank keeps each rank's. A pipeline's (a Meter given the
    schedule): `bubble_measured` becomes the list of every rank's, and flops_per_image the sum of the ranks' (each
    counted its own stages: the whole model's; None if a rank counted none)."""
    per_rank = [None] * dist.get_world_size()
    dist.all_gather_object(per_rank, summary)
    merged = dict(summary)
    rates = [r["images_per_s"] for r in per_rank]
    merged["images_per_s"] = (min if same_images else sum)(rates) if None not in rates else None
    merged["images_per_s_per_rank"] = rates
    for key in ["peak_mem_allocated_gib", "peak_mem_reserved_gib", "peak_host_rss_gib"]:
        merged[key] = max((r[key] for r in per_rank if r[key] is not None), default=None)
    merged["peak_mem_per_device"] = [
        {**d, "rank": i} for i, r in enumerate(per_rank) for d in r["peak_mem_per_device"] if d["peak_reserved_gib"]
    ]
    if "bubble_measured" in summary:  # pipeline stages: each rank ran its own part of the model on every image
        merged["bubble_measured"] = [r["bubble_measured"] for r in per_rank]
        flops = [r["flops_per_image"] for r in per_rank]
        merged["flops_per_image"] = sum(flops) if None not in flops else None
    return merged
