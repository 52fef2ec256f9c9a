"""float8 training: train_compile.py + torchao's Float8Linear for the transformer's Linear layers, in bfloat16 autocast.

Each converted layer scales its input, its weight and (in backward) its output's gradient into float8 and multiplies
on float8 tensor cores (torch._scaled_mm), at twice bfloat16's datasheet rate on an H100; the weights stay float32 for
the optimizer, the rest of the model runs in bfloat16 under autocast, and torch.compile fuses the scaling into the
neighbouring kernels (without it the casts cost more than the matmuls save). --float8-recipe: tensorwise (torchao's
default: one scale per tensor, e5m2 for gradients) or rowwise (a scale per row, a power of 2; more accurate, slower).
Which layers: by default those torchao's own filter for the recipe expects to pay (its H100 tables: at GPT-2's width
only the MLP's first Linear with tensorwise, none with rowwise; at width 2,048 all six of a block with tensorwise);
--float8-all-layers converts every Linear whose dimensions are multiples of 16; the head stays in bfloat16 either way.
The run prints what it converted and why it kept the rest. Needs torchao and an NVIDIA GPU of compute capability 8.9+
(Ada, Hopper, Blackwell); elsewhere it lists the layers and stops in one line. `--float8-emulate` runs torchao's
emulation instead: values rounded to float8 and scaled, then multiplied in ordinary float32 matmuls, no speed-up; it
checks the lesson's code path on a machine without float8 tensor cores, not the `torch._scaled_mm` path a GPU runs,
and on a CPU Float8Linear does not cast its input to bfloat16 (it checks CUDA's autocast only), so there the
emulation scales float32 activations.

    python src/train_float8.py --model gpt2 --seq-len 1024 --batch-size 16 --max-steps 100   # on a GPU (8.9+)
    python src/train_float8.py --model gpt-wide --seq-len 1024 --batch-size 8 --max-steps 100   # on a GPU: width 2048
    python src/train_float8.py --device cpu --model gpt2 --float8-recipe rowwise --max-steps 1   # a CPU: which layers
    TORCH_LOGS=graph_breaks,recompiles python src/train_float8.py --device cpu --model gpt --float8-emulate \
        --float8-all-layers --max-steps 4   # on a CPU: torchao's emulation, float32 matmuls, no _scaled_mm
    diff src/train_compile.py src/train_float8.py                        # only the lines marked `# new #`

More: docs/techniques/train_float8.md
"""

import dataclasses  # new #
import itertools
import os  # new #
import re  # new #
import shutil  # new #
import warnings  # new #

import torch
import torch.nn as nn
from torch._dynamo.utils import counters  # new # what Dynamo compiled: graphs, frames
from torch.utils.data import DataLoader

import common

# new # begin: torchao's float8 training (requirements.txt); a missing package is one line, not a traceback
try:
    from torchao.float8 import Float8LinearConfig, _auto_filter_for_recipe, convert_to_float8_training
except ImportError:
    common.die("train_float8.py needs torchao 0.18 or newer: pip install 'torchao>=0.18' (requirements.txt has it)")
# new # end

parser = common.get_parser(__doc__)
parser.add_argument(  # new #
    "--amp-dtype",
    choices=["float16", "bfloat16", "float32"],
    default=None,
    help="default: float16 on CUDA, bfloat16 on a CPU with AVX512-BF16 or AMX, else float32; float32: autocast off "
    "and no GradScaler (the rest of the lesson without mixed precision: what a CPU that would emulate bfloat16 runs)",
)
parser.add_argument(  # new #
    "--compile-mode",
    choices=["default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs"],
    default="default",
    help="torch.compile's mode: reduce-overhead adds CUDA graphs, max-autotune benchmarks kernels (slower to compile)",
)
parser.add_argument(  # new #
    "--compile-regions",
    action="store_true",
    help="regional compile: each transformer block (ViT, GPT) compiled on its own, not the whole model; Dynamo reuses "
    "the first block's graph for the others",
)
parser.add_argument(  # new #
    "--float8-recipe",
    choices=["tensorwise", "rowwise"],
    default="tensorwise",
    help="torchao's recipe: tensorwise, one scale per tensor (torchao's default, the fastest); rowwise, one scale per "
    "row, rounded to a power of 2 (more accurate, slower; torchtitan offers both)",
)
parser.add_argument(  # new #
    "--float8-all-layers",
    action="store_true",
    help="convert every Linear float8 can run (dimensions multiples of 16, the head excepted), not only those "
    "torchao's filter for the recipe expects to pay (larger than its thresholds, measured on an H100)",
)
parser.add_argument(  # new #
    "--float8-emulate",
    action="store_true",
    help="torchao's emulation (Float8LinearConfig(emulate=True)): values rounded to float8 and scaled, then multiplied "
    "in ordinary float32 matmuls instead of torch._scaled_mm, to check the lesson's code path on a machine without "
    "float8 tensor cores; no speed-up, not a benchmark, and not the _scaled_mm path a GPU runs (on a CPU the layers "
    "also scale float32 activations: Float8Linear casts its input to bfloat16 under CUDA's autocast only)",
)
args = common.parse_args(parser)
# new # begin: torchao's recipe runs what is not float8 in bfloat16; float8 pays on a transformer's large Linears
if args.amp_dtype not in (None, "bfloat16"):
    parser.error("train_float8.py keeps the ops outside float8 in bfloat16 (torchao's recipe): --amp-dtype bfloat16")
args.amp_dtype = "bfloat16"
if args.model not in ("vit", *common.TEXT_MODELS):
    parser.error(f"float8 converts a transformer's Linear layers (vit, gpt, gpt2, gpt-wide), not --model {args.model}")
# new # end
generator = common.seed_everything(args.seed, args.deterministic)
device = common.get_device(args.device)
# new # begin: the low precision this device multiplies natively: float16 on CUDA's tensor cores, bfloat16 on a CPU
# with AVX512-BF16 or AMX; a CPU without them emulates both, slower than float32, so autocast stays off there
native_bf16 = common.native_bfloat16(device)
amp_dtype = args.amp_dtype or ("float16" if device.type == "cuda" else "bfloat16" if native_bf16 else "float32")
if device.type == "cpu" and not native_bf16 and amp_dtype != "float16":  # which, and why, in one line
    chosen = "bfloat16 as asked, emulated" if amp_dtype == "bfloat16" else "autocast off, float32"
    print(f"AMP: {common.device.bfloat16_emulated(device)}; {chosen}", flush=True)
if amp_dtype == "float16" and device.type == "cpu":  # asked for: GradScaler's lesson runs, at emulated speed
    print("AMP: float16 on a CPU is emulated unless it has AVX512-FP16 / AMX-FP16: slower than float32", flush=True)
if amp_dtype == "bfloat16" and device.type == "cuda" and not native_bf16:
    print("AMP: this GPU has no native bfloat16 (compute capability 8.0+; older ones emulate it): float16", flush=True)
    amp_dtype = "float16"
amp_dtype = getattr(torch, amp_dtype)
use_amp = amp_dtype != torch.float32  # --amp-dtype float32: autocast off (and no GradScaler)
precision = (
    f"amp {str(amp_dtype).removeprefix('torch.')}" if use_amp else f"autocast off, {common.precision_label(device)}"
)
# new # end
# new # begin: on a CPU, Inductor compiles C++: check for a compiler now rather than after the first batch
if device.type == "cpu" and shutil.which(os.environ.get("CXX", "g++")) is None:
    common.die(
        f"torch.compile on CPU needs a C++ compiler: {os.environ.get('CXX', 'g++')} not found (apt-get install g++)"
    )
# new # end

# new # begin: NHWC for images; a language model's (N, T) tokens have no channels to reorder
memory_format = torch.contiguous_format if args.model in common.TEXT_MODELS else torch.channels_last
if args.model in common.TEXT_MODELS:
    print(f"channels_last: --model {args.model} has no 4-D tensor to reorder (as train_amp.py)", flush=True)
# new # end
# -- data: Fashion-MNIST tensors behind torch's DataLoader, or one synthetic batch already on the device ----------
if args.dataset == "synthetic":
    train_loader, test_loader = common.synthetic_data(args, device)
else:
    train_set, test_set = common.load_data(args)
    sampler = torch.utils.data.RandomSampler(train_set, generator=generator)  # the shuffle, reseeded every epoch
    train_loader = DataLoader(
        train_set,
        batch_size=args.batch_size,
        sampler=sampler,
        drop_last=True,  # every step sees a full batch, so step times compare
        num_workers=args.workers,
        pin_memory=device.type == "cuda",  # page-locked host memory: faster, asynchronous copies to the GPU
        persistent_workers=args.workers > 0,  # keep workers between epochs instead of forking new ones
        worker_init_fn=common.init_worker,
    )
    test_loader = DataLoader(test_set, batch_size=1000)

# -- model, loss, optimizer, and the state of an earlier run to resume -------------------------------------------
model = common.build_model(args.model, *common.input_shape(args)).to(device, memory_format=torch.channels_last)  # new #
# new # begin: .contiguous(), .reshape or a permute in the model can turn activations back to NCHW: check each conv once
inputs = []
hooks = [
    m.register_forward_pre_hook(lambda m, args: inputs.append(args[0]))
    for m in model.modules()
    if isinstance(m, nn.Conv2d)
]
channels, side = common.input_shape(args)
if hooks:  # a model with convolutions
    with torch.no_grad(), torch.autocast(device.type, dtype=amp_dtype, enabled=use_amp):
        model.eval()(torch.zeros(2, channels, side, side, device=device).to(memory_format=torch.channels_last))
for hook in hooks:
    hook.remove()
if not all(x.is_contiguous(memory_format=torch.channels_last) for x in inputs):
    common.die("a convolution's input is not channels_last: a .contiguous() or .reshape turned it back to NCHW")
# new # end


# new # begin: the Linear layers float8 can run, and pays on, become torchao's Float8Linear (same weights and names)
# torchao's filter for the recipe (torchtitan's auto_filter_small_kn), from its H100 tables: a weight (N, K) stays in
# bfloat16 when float8's casts would cost more than its matmul saves: tensorwise when K <= 4096 and N <= 1024;
# rowwise when N <= 2048, K <= 1024, or N <= 4096 and K <= 2048. At GPT-2's width (768) that leaves the MLP's first
# Linear (3072 x 768) to tensorwise, and nothing to rowwise.
pays = _auto_filter_for_recipe(args.float8_recipe, filter_fqns=[])  # (the head: float8_kept_why's own rule)


def float8_kept_why(module: nn.Module, name: str) -> str | None:
    """None to convert the Linear layer `name`, else why it stays in bfloat16: the head whatever its size (the last
    projection is the most sensitive to rounding; torchtitan leaves its `output` out too), a weight whose dimensions
    are not multiples of 16 (torch._scaled_mm's rule), and, unless --float8-all-layers, one torchao's filter leaves."""
    n, k = module.weight.shape
    if name.startswith("head"):
        return "the head"
    if n % 16 or k % 16:
        return f"out {n}, in {k}: not multiples of 16"
    if not args.float8_all_layers and not pays(module, name):
        return f"out {n}, in {k}: under torchao's {args.float8_recipe} threshold"
    return None


linears = {name: m for name, m in model.named_modules() if isinstance(m, nn.Linear)}
kept = {name: why for name, m in linears.items() if (why := float8_kept_why(m, name))}
# pad_inner_dim: torch._scaled_mm wants K and N of its (M x K) @ (K x N) multiples of 16 (M is free), and the weight's
# gradient multiplies over the batch's tokens (a ViT's 197 a sample): torchao zero-pads the inner dimension, which
# adds nothing (off by default: a padded copy, more memory)
config = Float8LinearConfig.from_recipe_name(args.float8_recipe)
config = dataclasses.replace(config, pad_inner_dim=True, emulate=args.float8_emulate)
convert_to_float8_training(model, config=config, module_filter_fn=lambda m, name: name not in kept)
converted = [name for name, m in model.named_modules() if type(m).__name__ == "Float8Linear"]
# read back from the converted layers, not from the flags: the recipe, the rounding of scales, emulation, padding
configs = {model.get_submodule(name).config for name in converted}
float8 = {
    "scaling": sorted({c.cast_config_input.scaling_granularity.value for c in configs}),  # axiswise: per row
    "scales_power_of_2": sorted({c.round_scales_to_power_of_2 for c in configs}),
    "gradient_dtype": sorted({str(c.cast_config_grad_output.target_dtype).removeprefix("torch.") for c in configs}),
    "emulated": sorted({c.emulate for c in configs}),
    "pad_inner_dim": sorted({c.pad_inner_dim for c in configs}),
}


def blocks(names) -> str:
    """Layer names with block0 ... block11 written once, as block*: "block*.mlp.fc1, head.fc"."""
    return ", ".join(dict.fromkeys(re.sub(r"^block\d+", "block*", name) for name in names))


print(f"float8 ({args.float8_recipe}): {len(converted)} of {len(linears)} Linear layers: {blocks(converted) or 'no'}")
for why in dict.fromkeys(kept.values()):  # each reason once, with its layers (block0 ... block11 as block*)
    print(f"float8: kept in bfloat16 ({why}): {blocks(n for n, w in kept.items() if w == why)}", flush=True)
if not converted:  # torchao's filter left every layer: the run is train_compile.py's in bfloat16
    print("float8: no layer converted: this run is train_compile.py's bfloat16 (--float8-all-layers converts them)")
if args.float8_emulate:  # float8 rounding and scales, float32 matmuls, no _scaled_mm: the code path, not a speed
    print("float8: emulated (--float8-emulate): float8-rounded values multiplied in float32, no float8 kernel")
elif device.type != "cuda" or torch.cuda.get_device_capability(device) < (8, 9):  # float8 tensor cores: Ada, Hopper
    common.die(f"float8 matmuls need an NVIDIA GPU of compute capability 8.9+ (Ada, Hopper); this run's is a {device}")
# new # end
# new # begin: the compiled model for the training step; `model` stays eager for evaluation and checkpoints
if not args.compile_regions:
    compiled = torch.compile(model, mode=args.compile_mode, dynamic=False)
else:  # regional: the blocks run the same code on tensors of the same shapes, so Dynamo's guards pass for every block
    # and its first compile serves all: the compile no longer grows with the depth (torchtitan compiles per block)
    if args.model not in ("vit", "gpt", "gpt2"):
        common.die(f"--compile-regions compiles repeated transformer blocks (vit, gpt, gpt2), not {args.model}")
    regions = [torch.compile(m, mode=args.compile_mode, dynamic=False) if m in model.blocks else m for m in model]
    compiled = nn.Sequential(*regions)  # the model's own children and parameters: ViT and GPT are Sequentials
# new # end
criterion = nn.CrossEntropyLoss()
optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=5e-4)
scaler = torch.amp.GradScaler(device.type, enabled=amp_dtype == torch.float16)  # new # bf16 needs no loss scaling
# new # begin: GradScaler skips a step whose float16 gradients overflowed, often the first one (its initial scale,
# 2^16, is calibrated down over the first steps); the schedule still advances every iteration, as in train.py: a
# handful of skipped steps at the start barely moves a one-cycle schedule. torch looks only at the first iteration
# and warns "Detected call of `lr_scheduler.step()` before `optimizer.step()`": expected here, so silenced.
warnings.filterwarnings("ignore", message="Detected call of `lr_scheduler.step", category=UserWarning)
# new # end
total_steps = args.epochs * len(train_loader)
if args.max_steps:
    total_steps = min(total_steps, args.max_steps)

start_epoch, step, epochs = 0, 0, []  # epochs: the per-epoch records, which checkpoints keep and a resume restores
checkpoint = args.checkpoint_dir / "last.pt" if args.checkpoint_dir else None
if args.resume and checkpoint.exists():
    state = common.load_checkpoint(checkpoint, args, model, optimizer, device, scaler=scaler)  # new # + loss scale
    start_epoch, step, epochs = state["epoch"], state["step"], state["epochs"]
    print(f"resumed from {checkpoint}: {start_epoch} epochs and {step} steps done", flush=True)
    common.exit_if_finished(checkpoint, step, total_steps)  # re-running a finished run: one line, exit 0
# one-cycle schedule over this run's steps; on resume it continues at step `step` (last_epoch counts from -1)
scheduler = torch.optim.lr_scheduler.OneCycleLR(optimizer, max_lr=args.lr, total_steps=total_steps, last_epoch=step - 1)

# -- training -----------------------------------------------------------------------------------------------------
meter = common.Meter(device, args.warmup_steps, target=common.target_probe(args, model))
graphs = counters["stats"]["unique_graphs"]  # new # graphs compiled before training (0); a private API of Dynamo
compile_steps = 0  # new # steps that compiled a graph: the first one, then any recompile
preemption = common.Preemption(args.run)  # SIGTERM: stop at the next step boundary, save, exit 143
print(f"training {args.model} on {args.dataset} ({device}), {total_steps} steps of {args.batch_size}", flush=True)
for epoch in range(start_epoch, args.epochs):
    model.train()
    meter.resume()
    generator.manual_seed(args.seed + epoch)  # the epoch's order depends on seed and epoch only: a resume repeats it
    done = max(0, step - epoch * len(train_loader))  # steps of this epoch a preempted run took already (else 0)
    loss_sum = torch.zeros((), device=device)  # summed on the device: no sync per step
    epoch_steps = 0
    for images, labels in meter.loader(itertools.islice(train_loader, done, None)):  # their batches: loaded, dropped
        if preemption.requested(step):  # SIGTERM: the step in flight is done, the next one does not start
            break
        images = images.to(device, non_blocking=True, memory_format=memory_format)  # new # NHWC, like the weights
        labels = labels.to(device, non_blocking=True)
        # new # convs/matmuls in low precision, reductions in fp32 (--amp-dtype float32: autocast off)
        with torch.autocast(device.type, dtype=amp_dtype, enabled=use_amp):  # new #
            logits = compiled(images)  # new # compiles at the first call (a warm-up step)
            loss = criterion(logits, labels)
        optimizer.zero_grad(set_to_none=True)
        scaler.scale(loss).backward()  # new # scaled loss: small fp16 gradients do not flush to zero
        if args.clip_grad_norm:
            scaler.unscale_(optimizer)  # new # clip the true gradients, not the scaled ones
            nn.utils.clip_grad_norm_(model.parameters(), args.clip_grad_norm)
        scaler.step(optimizer)  # new # unscales, and skips the step if a gradient is inf/nan
        scaler.update()  # new # lower the scale after an overflow, raise it after a run of good steps
        scheduler.step()
        step += 1
        epoch_steps += 1
        loss_sum += loss.detach()
        recompiled = counters["stats"]["unique_graphs"] > graphs  # new # this step compiled a graph
        graphs = counters["stats"]["unique_graphs"]  # new #
        compile_steps += recompiled  # new #
        meter.step(images.size(0), measured=not recompiled)  # new # a (re)compile stays out of images/s
        if step % args.log_every == 0:  # .item() waits for the device: once every --log-every steps only
            print(f"epoch {epoch + 1} step {step}/{total_steps} loss {loss.item():.4f}, {meter.progress()}", flush=True)
        if step == total_steps:
            break
    meter.pause()  # synchronises: evaluation is not training time
    if preemption.stopped_at is not None:  # preempted: save this step boundary, skip the evaluation
        if checkpoint:
            common.save_checkpoint(checkpoint, args, model, optimizer, epoch, step, epochs, scaler=scaler)  # new #
        break

    with torch.autocast(device.type, dtype=amp_dtype):  # new # evaluated as it trains: float8 layers in bfloat16
        val_loss, val_acc = common.evaluate(model, test_loader, device)
    epochs.append(
        common.epoch_record(epoch + 1, step, loss_sum / max(epoch_steps, 1), val_loss, val_acc, meter, logits)
    )
    print(common.epoch_line(epochs[-1]), flush=True)
    if checkpoint:
        common.save_checkpoint(checkpoint, args, model, optimizer, epoch + 1, step, epochs, scaler=scaler)  # new #
    if step == total_steps:
        break

# -- metrics: the closing line, and the metrics JSON with its provenance (--metrics-out) ------------------------
summary = meter.summary()
print(  # new #
    f"torch.compile: {graphs} graph(s) compiled, {max(0, compile_steps - 1)} later step(s) recompiled "
    "(kept out of images/s; TORCH_LOGS=recompiles says why)"
)
common.report(
    args,
    summary,
    epochs,
    precision=(f"{precision} + channels_last" if memory_format == torch.channels_last else precision)  # new #
    + (" + float8 emulated" if float8["emulated"] == [True] else " + float8 matmuls" if converted else ""),  # new #
    device=device,
    steps=step,
    params=sum(p.numel() for p in model.parameters()),  # the model's parameters (all of them)
    compile_s=summary["first_step_s"],  # new # the first step, where the compile happens
    graphs_compiled=graphs,  # new # 1: compiled once, at the first step; more: graph breaks or recompiles
    recompiled_steps=max(0, compile_steps - 1),  # new # later steps that compiled (kept out of images/s)
    compile_mode=args.compile_mode,  # new #
    compiled_blocks=sum(r is not m for r, m in zip(compiled, model)) if args.compile_regions else None,  # new #
    float8_recipe=args.float8_recipe,  # new #
    float8_layers=len(converted),  # new # Linear layers that run in float8
    float8_config=float8,  # new # as the converted layers hold it (empty lists: none converted)
    float8_filter="every layer" if args.float8_all_layers else "torchao's",  # new #
    test_images=len(test_loader.dataset),  # evaluate() counts every one of them
)
if args.model in common.TEXT_MODELS and args.sample_chars and preemption.stopped_at is None:  # what the GPT learned
    sample = common.generate(model, device, args.sample_chars, context=args.seq_len)
    print(f"generated after a fixed prompt:\n{sample}", flush=True)
preemption.exit()  # after SIGTERM: one line, exit 143 (after a failed checkpoint write: exit 1)
