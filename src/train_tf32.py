"""TF32: train.py + float32 matmuls and convolutions on TF32 tensor cores, through torch's fp32_precision settings.

On a GPU of compute capability 8.0 or newer (Ampere, Ada, Hopper) a float32 matmul can run on the tensor cores as TF32:
each input rounded to 10 bits of mantissa (float16's precision, float32's range), the products summed in float32. The
model, its weights, its gradients, the optimizer state and every activation stay float32: only the multiplications
are rounded. torch runs float32 convolutions in TF32 by default and float32 matmuls in full float32 ("ieee"); this
rung sets both to "tf32" with the current API (`torch.backends.cuda.matmul.allow_tf32` is the deprecated one). A
CUDA setting: on a CPU it changes nothing, says so once, and trains train.py's steps bit for bit.

    python src/train_tf32.py --device cpu --subset 4096 --epochs 1          # a CPU: train.py's steps, bit for bit
    python src/train_tf32.py --model gpt2 --seq-len 1024 --batch-size 16 --max-steps 100   # on a GPU: GPT-2's matmuls
    python src/train_tf32.py --dataset synthetic --model resnet50 --batch-size 256 --max-steps 100   # on a GPU
    diff src/train.py src/train_tf32.py                                      # only the lines marked `# new #`

More: docs/techniques/train_tf32.md
"""

import itertools

import torch
import torch.nn as nn
from torch.utils.data import DataLoader

import common

parser = common.get_parser(__doc__)
args = common.parse_args(parser)
generator = common.seed_everything(args.seed, args.deterministic)
device = common.get_device(args.device)
# new # begin: float32 products on TF32 tensor cores; every tensor stays float32
torch.backends.cuda.matmul.fp32_precision = "tf32"  # torch's default for float32 matmuls: "ieee", full float32
torch.backends.cudnn.conv.fp32_precision = "tf32"  # cuDNN's default already: set here so the lesson says both
if device.type != "cuda" or torch.cuda.get_device_capability(device) < (8, 0):  # no TF32 here: train.py's float32
    print(f"TF32: tensor cores of compute capability 8.0+ only; on this {device.type} float32 as train.py", flush=True)
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
model = common.build_model(args.model, *common.input_shape(args)).to(device)
criterion = nn.CrossEntropyLoss()
optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=5e-4)
total_steps = args.epochs * len(train_loader)
if args.max_steps:
    total_steps = min(total_steps, args.max_steps)

start_epoch, step, epochs = 0, 0, []  # epochs: the per-epoch records, which checkpoints keep and a resume restores
checkpoint = args.checkpoint_dir / "last.pt" if args.checkpoint_dir else None
if args.resume and checkpoint.exists():
    state = common.load_checkpoint(checkpoint, args, model, optimizer, device)
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
        images = images.to(device, non_blocking=True)
        labels = labels.to(device, non_blocking=True)
        logits = model(images)
        loss = criterion(logits, labels)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        if args.clip_grad_norm:
            nn.utils.clip_grad_norm_(model.parameters(), args.clip_grad_norm)
        optimizer.step()
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
            common.save_checkpoint(checkpoint, args, model, optimizer, epoch, step, epochs)  # `epoch` epochs finished
        break

    val_loss, val_acc = common.evaluate(model, test_loader, device)
    epochs.append(
        common.epoch_record(epoch + 1, step, loss_sum / max(epoch_steps, 1), val_loss, val_acc, meter, logits)
    )
    print(common.epoch_line(epochs[-1]), flush=True)
    if checkpoint:
        common.save_checkpoint(checkpoint, args, model, optimizer, epoch + 1, step, epochs)
    if step == total_steps:
        break

# -- metrics: the closing line, and the metrics JSON with its provenance (--metrics-out) ------------------------
summary = meter.summary()
common.report(
    args,
    summary,
    epochs,
    precision=common.precision_label(device),
    device=device,
    steps=step,
    params=sum(p.numel() for p in model.parameters()),  # the model's parameters (all of them)
    test_images=len(test_loader.dataset),  # evaluate() counts every one of them
)
if args.model in common.TEXT_MODELS and args.sample_chars and preemption.stopped_at is None:  # what the GPT learned
    sample = common.generate(model, device, args.sample_chars, context=args.seq_len)
    print(f"generated after a fixed prompt:\n{sample}", flush=True)
preemption.exit()  # after SIGTERM: one line, exit 143 (after a failed checkpoint write: exit 1)
