"""Baseline: train one model on one device in fp32, fed by torch's DataLoader.

Every train_*.py is this file plus the lines it marks as new, so `diff src/train.py src/train_X.py` is one technique.

    python src/train.py                                      # small CNN on Fashion-MNIST, 2 epochs, GPU if present
    python src/train.py --device cpu --subset 4096 --epochs 1   # a quick look on a laptop
    python src/train.py --model resnet18 --epochs 8 --batch-size 256 --workers 8 --target-acc 0.93
    python src/train.py --dataset synthetic --model resnet50 --batch-size 256 --max-steps 100   # compute ceiling
    python src/train.py --checkpoint-dir ckpt --epochs 1 && python src/train.py --checkpoint-dir ckpt --resume
"""

import torch
import torch.nn as nn
from torch.utils.data import DataLoader

import common

parser = common.get_parser(__doc__.splitlines()[0])
args = common.parse_args(parser)
generator = common.seed_everything(args.seed, args.deterministic)
device = common.get_device(args.device)

# -- data: Fashion-MNIST tensors behind torch's DataLoader, or one synthetic batch already on the device ----------
if args.dataset == "synthetic":
    train_loader, test_loader = common.synthetic_data(args, device)
else:
    train_set, test_set = common.load_data(args)
    train_loader = DataLoader(
        train_set,
        batch_size=args.batch_size,
        shuffle=True,
        drop_last=True,  # every step sees a full batch, so step times compare
        num_workers=args.workers,
        pin_memory=device.type == "cuda",  # page-locked host memory: faster, asynchronous copies to the GPU
        persistent_workers=args.workers > 0,  # keep workers between epochs instead of forking new ones
        worker_init_fn=common.seed_worker,
        generator=generator,
    )
    test_loader = DataLoader(test_set, batch_size=1000)

# -- model, loss, optimizer, and the state of an earlier run to resume -------------------------------------------
model = common.build_model(args.model, *common.input_shape(args)).to(device)
criterion = nn.CrossEntropyLoss()
optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=5e-4)
total_steps = args.epochs * len(train_loader)
if args.max_steps:
    total_steps = min(total_steps, args.max_steps)

start_epoch, step = 0, 0
checkpoint = args.checkpoint_dir / "last.pt" if args.checkpoint_dir else None
if args.resume and checkpoint.exists():
    state = common.load_checkpoint(checkpoint, model, optimizer, device)
    start_epoch, step = state["epoch"], state["step"]
    print(f"resumed from {checkpoint}: {start_epoch} epochs and {step} steps done", flush=True)
# one-cycle schedule over this run's steps; on resume it continues at step `step` (last_epoch counts from -1)
scheduler = torch.optim.lr_scheduler.OneCycleLR(optimizer, max_lr=args.lr, total_steps=total_steps, last_epoch=step - 1)

# -- training -----------------------------------------------------------------------------------------------------
meter = common.Meter(device, args.warmup_steps)
epochs, time_to_target = [], None
test_images = len(test_loader.dataset)  # evaluate() counts every one of them
print(f"training {args.model} on {args.dataset} ({device}), batch {args.batch_size}, {total_steps} steps", flush=True)
for epoch in range(start_epoch, args.epochs):
    model.train()
    meter.resume()
    loss_sum = torch.zeros((), device=device)  # summed on the device: no sync per step
    epoch_steps = 0
    for images, labels in meter.loader(train_loader):
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
        if step % args.log_every == 0:
            print(f"epoch {epoch + 1} step {step}/{total_steps} loss {loss.item():.4f}", flush=True)  # .item() syncs
        if step == total_steps:
            break
    meter.pause()  # synchronises: evaluation is not training time

    val_loss, val_acc = common.evaluate(model, test_loader, device)
    epochs.append(
        {
            "epoch": epoch + 1,
            "step": step,
            "train_loss": loss_sum.item() / max(epoch_steps, 1),
            "val_loss": val_loss,
            "val_acc": val_acc,
            "train_s": meter.train_s,
            "logits_dtype": str(logits.dtype),  # what the model really computed in
        }
    )
    print(
        f"epoch {epoch + 1}: train loss {epochs[-1]['train_loss']:.4f}, test loss {val_loss:.4f}, "
        f"test acc {100 * val_acc:.2f} %, {meter.train_s:.1f} s of training",
        flush=True,
    )
    if args.target_acc and time_to_target is None and val_acc >= args.target_acc:
        time_to_target = meter.train_s
    if checkpoint:
        common.save_checkpoint(checkpoint, model, optimizer, epoch + 1, step)
    if step == total_steps:
        break

# -- metrics ------------------------------------------------------------------------------------------------------
summary = meter.summary()
print(
    f"{summary['images_per_s'] or 0:.1f} images/s, data-wait {100 * (summary['data_wait_frac'] or 0):.1f} %, "
    f"peak host RSS {summary['peak_host_rss_gib']:.2f} GiB",
    flush=True,
)
common.write_metrics(
    args.metrics_out,
    script="train.py",
    technique="baseline",
    world_size=1,
    gpus=int(device.type == "cuda"),
    batch_size=args.batch_size,
    global_batch=args.batch_size,
    precision=common.precision_label(device),
    model=args.model,
    dataset=args.dataset,
    device=str(device),
    **summary,
    epochs=epochs,
    steps=step,
    test_acc=epochs[-1]["val_acc"] if epochs else None,
    test_images=test_images,
    target_acc=args.target_acc,
    time_to_target_s=time_to_target,
    status="ok",
)
