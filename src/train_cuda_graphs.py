r"""CUDA graphs: train_fast.py + one step's forward, loss and backward captured as a CUDA graph and replayed every step.

A step of a small model launches hundreds of kernels, each costing the host a few microseconds; when the GPU finishes
them faster than the host queues them, the step waits on the host. A CUDA graph records the step's kernels once and
replays them with one launch. Its price is fixed addresses: the graph reads its input from, and writes the gradients
into, the tensors it saw at capture, so each batch is copied into a buffer allocated once, and the gradients are
the graph's own (`zero_grad` only before the capture). The first steps run eagerly on a side stream (torch.compile
compiles, cuDNN autotunes, lazy state is made), as torch's CUDA-graphs notes prescribe. The optimizer step stays
outside the graph: fused AdamW takes its learning rate and beta1 (Muon, for a transformer's blocks, its learning
rate) as numbers that the one-cycle schedule changes every step, and a graph would replay the numbers of its
capture. Torch's automatic way, `--compile-mode reduce-overhead` of train_fast.py, does the same inside
torch.compile. Needs an NVIDIA GPU; on a CPU it stops in one line.

    python src/train_cuda_graphs.py --model cnn --batch-size 128 --max-steps 400         # on a GPU: launch-bound
    python src/train_cuda_graphs.py --model gpt --batch-size 32 --max-steps 400          # on a GPU: a small GPT
    python src/train_cuda_graphs.py --model gpt2 --seq-len 1024 --batch-size 16 --max-steps 100   # GPU-bound: on a GPU
    diff src/train_fast.py src/train_cuda_graphs.py                      # only the lines marked `# new #`

More: docs/techniques/train_cuda_graphs.md
"""

import itertools
import os  # new #
import shutil  # new #
import warnings  # new #

import torch
import torch.nn as nn
from torch._dynamo.utils import counters  # new # what Dynamo compiled: graphs, frames
from torch.utils.data import DataLoader

import common

# new # begin: the GPT's recipe under Muon, where the command line leaves them out: swept for the time to 1.70 nats per
# character (results/fast-gpt-sweep-cpu-2core-avx512bf16-2026-11-28); train.py's 2,800 steps are AdamW's. `--without
# muon` keeps it: the ablation takes Muon out and nothing else
RECIPE = {"gpt": {"max_steps": 1200}}
# new # end
parser = common.get_parser(__doc__, datasets=("fashion-mnist", "synthetic", "imagefolder"))  # new #
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
    "--threads", type=common.positive_int, default=None, help="DALI CPU threads (default: --workers, at least 1)"
)
parser.add_argument(  # new #
    "--muon-lr", type=float, default=None, help="Muon's peak learning rate (default per model: vit 0.01, the GPTs 0.02)"
)
common.cli.add_without(parser, "device-data", "fused-adamw", "cudnn-benchmark", "muon")  # new # the ablation rows
args = common.parse_args(parser, recipe=RECIPE)  # new # the GPT's Muon recipe where the command line is silent
# new # begin: two of torch.compile's modes capture CUDA graphs of their own, which cannot nest in this one
if args.compile_mode in ("reduce-overhead", "max-autotune"):
    parser.error(f"--compile-mode {args.compile_mode} captures CUDA graphs of its own: use default")
# new # end
# new # begin: only Fashion-MNIST has a DataLoader to leave out
if "device-data" in args.without and args.dataset != "fashion-mnist":
    parser.error("--without device-data applies to --dataset fashion-mnist (the other inputs have no DataLoader here)")
# new # end
# new # begin: Muon where a model has transformer blocks (their 2-D matrices), at the rate train_muon.py's sweeps led
use_muon = (args.model in common.TEXT_MODELS or args.model == "vit") and "muon" not in args.without
if args.muon_lr is not None and not use_muon:
    parser.error(f"--muon-lr sets Muon's rate: this run has none (--model {args.model}, --without {args.without})")
if use_muon and args.muon_lr is None:
    args.muon_lr = 0.01 if args.model == "vit" else 0.02
if not use_muon and "muon" not in args.without:
    print(f"Muon: --model {args.model} has no transformer blocks: AdamW for every parameter", flush=True)
# new # end
generator = common.seed_everything(args.seed, args.deterministic)
device = common.get_device(args.device)
# new # begin: a CUDA graph replays kernels queued on a GPU: a CPU has nothing to capture
if device.type != "cuda":
    common.die("CUDA graphs need an NVIDIA GPU; on a CPU, train_fast.py (its base) is the nearest equivalent")
# new # end
# new # begin: one process, one device; cuDNN times its convolution algorithms for the fixed input shape
if int(os.environ.get("WORLD_SIZE", "1")) > 1:
    common.die("train_fast.py is a single-process script; for several GPUs under torchrun, see train_DDP.py")
torch.backends.cudnn.benchmark = not args.deterministic and "cudnn-benchmark" not in args.without
if device.type == "cpu":  # what it cannot do here, for the input it was given (the AMP block says the dtype)
    where = {
        "imagefolder": "; DALI's CPU-only mode, no 'mixed' JPEG decoding",
        "fashion-mnist": "; the data in host memory",
    }
    print(f"train_fast.py: no GPU: no float16 tensor cores{where.get(args.dataset, '')}", flush=True)
# new # end
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


# new # begin: Fashion-MNIST held on the device whole; a DataLoader over the indices alone picks each batch
class DeviceLoader:
    """Batches of a TensorDataset held on `device`: images float32 (N, C, H, W) in channels_last, labels int64 (N,).

    `loader` is the base's DataLoader over that dataset; its batch sampler picks the indices (the very same batches,
    in the same order), and a DataLoader over the indices alone collates them. Only each batch's int64 indices cross
    to the device, from pinned memory, asynchronously: no worker, no image copy, no synchronisation.
    """

    def __init__(self, loader: DataLoader, device: torch.device):
        images, labels = loader.dataset.tensors
        self.images = images.to(device).contiguous(memory_format=memory_format)
        self.labels, self.dataset = labels.to(device), loader.dataset
        pin = device.type == "cuda"
        self.indices = DataLoader(range(len(labels)), batch_sampler=loader.batch_sampler, pin_memory=pin)

    def __len__(self) -> int:
        return len(self.indices)

    def __iter__(self):
        for index in self.indices:
            index = index.to(self.labels.device, non_blocking=True)
            yield self.images[index], self.labels[index]


num_classes = 10  # Fashion-MNIST's and the synthetic batch's; an ImageFolder has its own
# new # end
# new # begin: NHWC for images; a language model's (N, T) tokens have no channels to reorder
memory_format = torch.contiguous_format if args.model in common.TEXT_MODELS else torch.channels_last
if args.model in common.TEXT_MODELS:
    print(f"channels_last: --model {args.model} has no 4-D tensor to reorder (as train_amp.py)", flush=True)
# new # end
# -- data: one synthetic batch on the device, JPEG files through DALI, or Fashion-MNIST held on the device  # new #
if args.dataset == "synthetic":
    train_loader, test_loader = common.synthetic_data(args, device)
# new # begin: JPEG files: loader_DALI.py's graph (common/dali.py), 'mixed' decoding into channels_last batches
elif args.dataset == "imagefolder":
    train_dir, val_dir, classes = common.image_folders(args.data_dir, args.batch_size)
    num_classes, threads = len(classes), args.threads or max(1, args.workers)
    knobs = dict(
        batch_size=args.batch_size,
        image_size=common.input_shape(args)[1],
        threads=threads,
        device=device,
        seed=args.seed,
        dtype=torch.float16 if use_amp else torch.float32,  # float16: half the bytes; autocast computes in 16 bits
        channels_last=True,  # HWC batches, permuted to (N, C, H, W) in channels_last without a copy
    )
    train_loader = common.DALILoader(train_dir, training=True, **knobs)
    test_loader = common.DALILoader(val_dir, training=False, **knobs)
# new # end
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
    if "device-data" not in args.without:  # new # the same batches, picked from the images already on the device
        train_loader, test_loader = DeviceLoader(train_loader, device), DeviceLoader(test_loader, device)  # new #

# -- model, loss, optimizer, and the state of an earlier run to resume -------------------------------------------
model = common.build_model(args.model, *common.input_shape(args), num_classes)  # new # an ImageFolder's own classes
model = model.to(device, memory_format=torch.channels_last)  # new #
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
fused = "fused-adamw" not in args.without  # new #
# new # begin: the blocks' 2-D weights to Muon (momentum, then an orthogonalized update); the rest to fused AdamW
matrices = [p for block in model.blocks for p in block.parameters() if p.ndim == 2] if use_muon else []
in_muon = {id(p) for p in matrices}
ns_dtype = torch.bfloat16 if native_bf16 else torch.float32  # train_muon.py's: what this device runs natively
muon = (
    common.Muon(matrices, lr=args.muon_lr, momentum=0.95, nesterov=True, weight_decay=5e-4, ns_dtype=ns_dtype)
    if use_muon
    else None
)
if use_muon:
    print(f"Muon: Newton-Schulz in {ns_dtype}, native on this {device.type}", flush=True)
optimizer = torch.optim.AdamW(
    [p for p in model.parameters() if id(p) not in in_muon], lr=args.lr, weight_decay=5e-4, fused=fused
)  # fused: fewer kernels
# new # end
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
    state = common.load_checkpoint(checkpoint, args, model, optimizer, device, scaler=scaler, muon=muon)  # new #
    start_epoch, step, epochs = state["epoch"], state["step"], state["epochs"]
    print(f"resumed from {checkpoint}: {start_epoch} epochs and {step} steps done", flush=True)
    common.exit_if_finished(checkpoint, step, total_steps)  # re-running a finished run: one line, exit 0
# one-cycle schedule over this run's steps; on resume it continues at step `step` (last_epoch counts from -1)
scheduler = torch.optim.lr_scheduler.OneCycleLR(optimizer, max_lr=args.lr, total_steps=total_steps, last_epoch=step - 1)
# new # begin: the same schedule around Muon's peak; its momentum stays 0.95 (OneCycleLR would cycle it)
if use_muon:
    muon_scheduler = torch.optim.lr_scheduler.OneCycleLR(
        muon, max_lr=args.muon_lr, total_steps=total_steps, last_epoch=step - 1, cycle_momentum=False
    )
# new # end


# new # begin: what the graph captures: forward, loss and the scaled backward (autocast keeps no cast cache in a graph)
def forward_backward(images: torch.Tensor, labels: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """One step's logits and loss, its gradients accumulated into .grad; the same kernels eager or captured."""
    with torch.autocast(device.type, dtype=amp_dtype, enabled=use_amp, cache_enabled=False):
        logits = compiled(images)
        loss = criterion(logits, labels)
    scaler.scale(loss).backward()  # scaled loss: small fp16 gradients do not flush to zero
    return logits, loss


eager_steps, warmup_stream = 3, torch.cuda.Stream()  # eager steps before the capture (torch's notes: 3), aside
graph = static_images = static_labels = static_logits = static_loss = None
replays = 0  # the steps the graph ran
# new # end

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
        captured = graph is None and eager_steps == 0  # new # this step captures the graph
        if graph is None:  # new # eager steps and the capture only: a replay overwrites the gradients its graph made
            model.zero_grad(set_to_none=True)  # new # both optimizers' parameters
        # new # begin: eager steps on the side stream, then the capture, then a copy into the buffers and a replay
        if graph is None and not captured:  # compiles at the first call, autotunes, makes lazy state
            warmup_stream.wait_stream(torch.cuda.current_stream())  # the batch is ready on the side stream too
            with torch.cuda.stream(warmup_stream):
                logits, loss = forward_backward(images, labels)
            torch.cuda.current_stream().wait_stream(warmup_stream)
            eager_steps -= 1
        else:
            if captured:  # the graph records the kernels (runs none); .grad become its own output buffers
                static_images, static_labels = images.clone(), labels.clone()
                graph = torch.cuda.CUDAGraph()
                with torch.cuda.graph(graph):
                    static_logits, static_loss = forward_backward(static_images, static_labels)
            static_images.copy_(images)  # the graph reads the addresses it captured: the batch goes there
            static_labels.copy_(labels)
            graph.replay()  # every kernel of forward, loss and backward, in one launch
            logits, loss, replays = static_logits, static_loss, replays + 1
        # new # end
        if args.clip_grad_norm:
            scaler.unscale_(optimizer)  # new # clip the true gradients, not the scaled ones
            if use_muon:  # new #
                scaler.unscale_(muon)  # new #
            nn.utils.clip_grad_norm_(model.parameters(), args.clip_grad_norm)
        scaler.step(optimizer)  # new # unscales, and skips the step if a gradient is inf/nan
        if use_muon:  # new #
            scaler.step(muon)  # new # each optimizer skips its step if one of its own gradients is inf/nan
        scaler.update()  # new # lower the scale after an overflow, raise it after a run of good steps
        scheduler.step()
        if use_muon:  # new #
            muon_scheduler.step()  # new #
        step += 1
        epoch_steps += 1
        loss_sum += loss.detach()
        recompiled = counters["stats"]["unique_graphs"] > graphs  # new # this step compiled a graph
        graphs = counters["stats"]["unique_graphs"]  # new #
        compile_steps += recompiled  # new #
        meter.step(images.size(0), measured=not (recompiled or captured))  # new # nor does the capture
        if step % args.log_every == 0:  # .item() waits for the device: once every --log-every steps only
            print(f"epoch {epoch + 1} step {step}/{total_steps} loss {loss.item():.4f}, {meter.progress()}", flush=True)
        if step == total_steps:
            break
    meter.pause()  # synchronises: evaluation is not training time
    if preemption.stopped_at is not None:  # preempted: save this step boundary, skip the evaluation
        if checkpoint:
            common.save_checkpoint(
                checkpoint, args, model, optimizer, epoch, step, epochs, scaler=scaler, muon=muon
            )  # new #
        break

    with torch.autocast(device.type, dtype=amp_dtype, enabled=use_amp and args.dataset == "imagefolder"):  # new # DALI
        val_loss, val_acc = common.evaluate(model, test_loader, device)
    epochs.append(
        common.epoch_record(epoch + 1, step, loss_sum / max(epoch_steps, 1), val_loss, val_acc, meter, logits)
    )
    print(common.epoch_line(epochs[-1]), flush=True)
    if checkpoint:
        common.save_checkpoint(
            checkpoint, args, model, optimizer, epoch + 1, step, epochs, scaler=scaler, muon=muon
        )  # new #
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
    precision=f"{precision} + channels_last" if memory_format == torch.channels_last else precision,  # new #
    device=device,
    steps=step,
    params=sum(p.numel() for p in model.parameters()),  # the model's parameters (all of them)
    compile_s=summary["first_step_s"],  # new # the first step, where the compile happens
    graph_replays=replays,  # new # the steps the CUDA graph ran
    graphs_compiled=graphs,  # new # 1: compiled once, at the first step; more: graph breaks or recompiles
    recompiled_steps=max(0, compile_steps - 1),  # new # later steps that compiled (kept out of images/s)
    compile_mode=args.compile_mode,  # new #
    muon_lr=args.muon_lr,  # new # None: AdamW for every parameter
    muon_ns_dtype=str(ns_dtype).removeprefix("torch.") if use_muon else None,  # new # the precision of Newton-Schulz
    compiled_blocks=sum(r is not m for r, m in zip(compiled, model)) if args.compile_regions else None,  # new #
    loader=f"DALI {'mixed' if device.type == 'cuda' else 'cpu'}" if args.dataset == "imagefolder" else None,  # new #
    workers=args.threads or max(1, args.workers) if args.dataset == "imagefolder" else None,  # new # DALI threads
    image_size=common.input_shape(args)[1] if args.dataset == "imagefolder" else None,  # new # the crop side
    test_images=len(test_loader.dataset),  # evaluate() counts every one of them
)
if args.model in common.TEXT_MODELS and args.sample_chars and preemption.stopped_at is None:  # what the GPT learned
    sample = common.generate(model, device, args.sample_chars, context=args.seq_len)
    print(f"generated after a fixed prompt:\n{sample}", flush=True)
preemption.exit()  # after SIGTERM: one line, exit 143 (after a failed checkpoint write: exit 1)
