"""Compile cache: train_compile.py + torch's compile artifacts saved after a run and loaded at the next start.

`torch.compile` pays its compile at the first step: Dynamo traces the model, AOTAutograd derives its backward and
Inductor generates and builds kernels (C++ with g++ on a CPU, Triton on a GPU), tens of seconds before any training.
Inductor keeps what it built in a folder of this machine (TORCHINDUCTOR_CACHE_DIR, by default
/tmp/torchinductor_$USER), so a second run here starts warm; a fresh container, a new cloud machine, a CI job or the
other nodes of a job start cold. This script carries the compile in one file, torch's "Mega-Cache": at the end of
training `torch.compiler.save_cache_artifacts()` packs what this run compiled into bytes, a file in the folder
--compile-cache; the next run loads it with `torch.compiler.load_cache_artifacts()` before its first compile. On a GPU
the file holds the graphs with their Triton kernels built (torch bundles them in, by its documentation; not measured
here). On a CPU it holds the graphs and their C++ source, not the built libraries: g++ builds each kernel again, most
of a CPU's cold start, and there the folder itself is what to keep (docs/techniques/train_compile_cache.md measures
both). Dynamo traces in every run. The file's name holds what torch's cache keys leave out: the torch version, the
device and its vector instructions, the model, its input's shape and the flags that shape its graph.

    python src/train_compile_cache.py --model gpt                      # cold: compiles, then writes the cache file
    python src/train_compile_cache.py --model gpt                      # warm: Inductor's folder and the file
    TORCHINDUCTOR_CACHE_DIR=$(mktemp -d) python src/train_compile_cache.py --model gpt   # the file alone, no folder
    python src/train_compile_cache.py --model vit --compile-regions --compile-cache ckpt/compile-cache
    diff src/train_compile.py src/train_compile_cache.py           # only the lines marked `# new #`

More: docs/techniques/train_compile_cache.md
"""

import itertools
import logging  # new #
import os  # new #
import shutil  # new #
import warnings  # new #
from pathlib import Path  # new #

import torch
import torch.nn as nn
from torch._dynamo.utils import counters  # new # what Dynamo compiled: graphs, frames
from torch.utils.data import DataLoader

import common

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
    "--compile-cache",
    type=Path,
    default=Path(".cache/compile"),
    help="the folder of compile caches: one file per model, input shape, batch, flags, device, instruction set and "
    "torch version, loaded at the start if it exists and written at the end of training",
)
args = common.parse_args(parser)
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
# new # begin: one file per set of graphs a run compiles (model, input shape, batch, flags), named by what torch's keys
# leave out: they hash the graph and Inductor's settings, not the CPU's vector instructions (a kernel compiled for
# AVX512 crashed a run kept at AVX2). `pick_vec_isa()`, a private module of Inductor, names what it compiles for
from torch._inductor.cpu_vec_isa import pick_vec_isa

machine = torch.cuda.get_device_name(device) if device.type == "cuda" else str(pick_vec_isa())  # "avx512 avx512_vnni"
shape = "x".join(map(str, common.input_shape(args)))  # (channels, side) of an image, (vocabulary, tokens) of text
key = f"{args.model}-{shape}-b{args.batch_size}-{args.compile_mode}{'-regions' * args.compile_regions}"
key = f"{key}-{str(amp_dtype).removeprefix('torch.')}-{device.type}-{machine}-torch{torch.__version__}"
key = "".join(c if c.isalnum() or c in "+.-" else "_" for c in key)  # a GPU's name: spaces, maybe a slash
problem = common.output_problem(args.compile_cache, is_folder=True)  # one that cannot be written: said now
if problem:
    common.die(f"--compile-cache {args.compile_cache} {problem}")
cache_file = args.compile_cache / f"{key}.bin"
logging.getLogger("torch.compiler._cache").setLevel(logging.CRITICAL)  # a bad file: our one line, not a traceback
loaded = None
if cache_file.exists():  # the file holds pickles and code Inductor runs: load only a file you would run
    try:
        loaded = torch.compiler.load_cache_artifacts(cache_file.read_bytes())  # into Inductor's folders
    except OSError as error:  # a folder by that name, a file you cannot read, an Inductor folder you cannot write
        print(f"compile cache: {cache_file}: {error.strerror or error}: compiling cold", flush=True)
    else:  # None: not torch's format, or cut short: compile cold, and overwrite it at the end
        found = f"{sum(map(len, loaded.artifacts.values()))} artifacts loaded from" if loaded else "could not read"
        print(f"compile cache: {found} {cache_file}" + ("" if loaded else ": compiling cold"), flush=True)
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

    val_loss, val_acc = common.evaluate(model, test_loader, device)
    epochs.append(
        common.epoch_record(epoch + 1, step, loss_sum / max(epoch_steps, 1), val_loss, val_acc, meter, logits)
    )
    print(common.epoch_line(epochs[-1]), flush=True)
    if checkpoint:
        common.save_checkpoint(checkpoint, args, model, optimizer, epoch + 1, step, epochs, scaler=scaler)  # new #
    if step == total_steps:
        break

# new # begin: what this run compiled or found in the cache, packed by torch into bytes, written whole or not at all
if graphs:  # (a run that took no step compiled nothing)
    saved = torch.compiler.save_cache_artifacts()  # (bytes, what it holds) or None
    try:
        if saved is None:
            raise common.errors.WriteFailed(cache_file, "torch packed no artifact")
        common.io.atomic_write(cache_file, lambda f: f.write(saved[0]))
        print(f"compile cache: {sum(map(len, saved[1].artifacts.values()))} artifacts written to {cache_file} "
              f"({len(saved[0]) / 2**20:.1f} MiB)", flush=True)  # fmt: skip
    except common.errors.WriteFailed as error:  # a cache is optional: the run's metrics and its exit code come first
        print(f"compile cache: not written ({error}): the next run compiles cold", flush=True)
# new # end
# -- metrics: the closing line, and the metrics JSON with its provenance (--metrics-out) ------------------------
summary = meter.summary()
cache_hits = counters["inductor"]["fxgraph_cache_hit"]  # new # Inductor's graphs found in its cache
cache_misses = counters["inductor"]["fxgraph_cache_miss"]  # new # graphs Inductor compiled in this run
print(  # new #
    f"torch.compile: {graphs} graph(s) compiled, {max(0, compile_steps - 1)} later step(s) recompiled "
    "(kept out of images/s; TORCH_LOGS=recompiles says why)"
)
common.report(
    args,
    summary,
    epochs,
    precision=f"{precision} + channels_last" if memory_format == torch.channels_last else precision,  # new #
    device=device,
    steps=step,
    params=sum(p.numel() for p in model.parameters()),  # the model's parameters (all of them)
    compile_s=summary["first_step_s"],  # new # the first step, where the compile happens
    graphs_compiled=graphs,  # new # 1: compiled once, at the first step; more: graph breaks or recompiles
    recompiled_steps=max(0, compile_steps - 1),  # new # later steps that compiled (kept out of images/s)
    compile_mode=args.compile_mode,  # new #
    compiled_blocks=sum(r is not m for r, m in zip(compiled, model)) if args.compile_regions else None,  # new #
    cache_file_loaded=loaded is not None,  # new # a file read at the start
    compile_cache="warm" if cache_hits and not cache_misses else "partly warm" if cache_hits else "cold",  # new #
    cache_hits=cache_hits,  # new #
    cache_misses=cache_misses,  # new #
    test_images=len(test_loader.dataset),  # evaluate() counts every one of them
)
if args.model in common.TEXT_MODELS and args.sample_chars and preemption.stopped_at is None:  # what the GPT learned
    sample = common.generate(model, device, args.sample_chars, context=args.seq_len)
    print(f"generated after a fixed prompt:\n{sample}", flush=True)
preemption.exit()  # after SIGTERM: one line, exit 143 (after a failed checkpoint write: exit 1)
