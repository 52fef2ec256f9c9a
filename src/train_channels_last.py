"""channels_last: train_amp.py + NHWC memory format for the model's weights and the input batch.

cuDNN's fastest float16 / bfloat16 convolutions read NHWC; fed NCHW, it transposes every activation in and out.
`memory_format=torch.channels_last` changes only the strides, not the shape (N, C, H, W), so no other line changes;
a forward pre-hook checks once that every convolution's input really is NHWC.

    python src/train_channels_last.py                         # float16 + NHWC on CUDA; a CPU: bfloat16 where native
    python src/train_channels_last.py --dataset synthetic --model resnet50 --batch-size 256 --max-steps 100
    diff src/train_amp.py src/train_channels_last.py          # only the lines marked `# new #`

More: docs/techniques/train_channels_last.md
"""

import itertools
import warnings  # new #

import torch
import torch.nn as nn
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
            logits = model(images)
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
        meter.step(images.size(0))
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

# -- metrics: the closing line, and the metrics JSON with its provenance (--metrics-out) ------------------------
summary = meter.summary()
common.report(
    args,
    summary,
    epochs,
    precision=f"{precision} + channels_last" if memory_format == torch.channels_last else precision,  # new #
    device=device,
    steps=step,
    params=sum(p.numel() for p in model.parameters()),  # the model's parameters (all of them)
    test_images=len(test_loader.dataset),  # evaluate() counts every one of them
)
if args.model in common.TEXT_MODELS and args.sample_chars and preemption.stopped_at is None:  # what the GPT learned
    sample = common.generate(model, device, args.sample_chars, context=args.seq_len)
    print(f"generated after a fixed prompt:\n{sample}", flush=True)
preemption.exit()  # after SIGTERM: one line, exit 143 (after a failed checkpoint write: exit 1)
