r"""Input-pipeline baseline: JPEG files -> decode -> RandomResizedCrop -> flip -> normalise, in torch's DataLoader.

Each DataLoader worker decodes and augments whole images on a CPU core with PIL; the GPU waits if they fall behind.
`python bench/prepare/prepare_data.py` writes the ImageFolders it reads (data/fashion-mnist-jpeg,
data/imagenet-synthetic).

    python src/loader.py                                               # small CNN on 32 px crops of Fashion-MNIST JPEGs
    python src/loader.py --loader-only --data-dir data/imagenet-synthetic --image-size 224 --workers 8   # pipeline only
    python src/loader.py --data-dir data/imagenet-synthetic --image-size 224 --model resnet50 --batch-size 256 \
        --workers 16 --amp-dtype float16 --channels-last              # end to end on a GPU
    python src/loader.py --data-dir /datasets/imagenet --image-size 224 --model resnet50   # any ImageFolder

More: docs/techniques/loader.md
"""

import itertools

import torch
import torch.nn as nn
from torch.utils.data import DataLoader
from torchvision import datasets, transforms

import common

parser = common.get_image_folder_parser(__doc__)
args = common.parse_args(parser)
generator = common.seed_everything(args.seed, args.deterministic)
device = common.get_device(args.device)
amp_dtype = getattr(torch, args.amp_dtype) if args.amp_dtype else None  # None: float32, no autocast

# -- data: an ImageFolder of image files, decoded and augmented on CPU cores by the DataLoader's workers -----------
train_dir, val_dir, classes = common.image_folders(args.data_dir, args.batch_size)
train_set = datasets.ImageFolder(
    train_dir,
    transforms.Compose(
        [
            transforms.RandomResizedCrop(args.image_size),  # a random 8-100 % area, 3/4-4/3 aspect, resized
            transforms.RandomHorizontalFlip(),
            transforms.ToTensor(),  # uint8 HWC -> float32 CHW in [0, 1]
            transforms.Normalize(common.IMAGENET_MEAN, common.IMAGENET_STD),
        ]
    ),
    loader=common.load_rgb,  # RGB even for greyscale files; a corrupt file is one clear error
)
val_set = datasets.ImageFolder(
    val_dir,
    transforms.Compose(
        [
            transforms.Resize(round(args.image_size / 0.875)),  # shorter side to 256 for 224 crops, as for ImageNet
            transforms.CenterCrop(args.image_size),
            transforms.ToTensor(),
            transforms.Normalize(common.IMAGENET_MEAN, common.IMAGENET_STD),
        ]
    ),
    loader=common.load_rgb,
)
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
val_loader = DataLoader(
    val_set,
    batch_size=args.batch_size,
    num_workers=args.workers,
    pin_memory=device.type == "cuda",
    worker_init_fn=common.init_worker,  # seeds, and a SIGTERM to every process of the job must not kill them
)

# -- model, loss, optimizer, and the state of an earlier run to resume -------------------------------------------
memory_format = torch.channels_last if args.channels_last else torch.contiguous_format
model = common.build_model(args.model, 3, args.image_size, len(classes)).to(device, memory_format=memory_format)
criterion = nn.CrossEntropyLoss()
optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=5e-4)
scaler = torch.amp.GradScaler(device.type, enabled=amp_dtype == torch.float16)  # loss scaling for float16 only
total_steps = args.epochs * len(train_loader)
if args.max_steps:
    total_steps = min(total_steps, args.max_steps)

start_epoch, step, epochs = 0, 0, []  # epochs: the per-epoch records, which checkpoints keep and a resume restores
checkpoint = args.checkpoint_dir / "last.pt" if args.checkpoint_dir else None
if args.resume and checkpoint.exists():
    state = common.load_checkpoint(checkpoint, args, model, optimizer, device, scaler=scaler)
    start_epoch, step, epochs = state["epoch"], state["step"], state["epochs"]
    print(f"resumed from {checkpoint}: {start_epoch} epochs and {step} steps done", flush=True)
    common.exit_if_finished(checkpoint, step, total_steps)  # re-running a finished run: one line, exit 0
scheduler = torch.optim.lr_scheduler.OneCycleLR(optimizer, max_lr=args.lr, total_steps=total_steps, last_epoch=step - 1)

# -- training (or, with --loader-only, just the input pipeline) ---------------------------------------------------
meter = common.Meter(device, args.warmup_steps)
preemption = common.Preemption(args.run)  # SIGTERM: stop at the next step boundary, save, exit 143
mode = "loader only" if args.loader_only else f"training {args.model}"
print(f"{mode} on {args.data_dir} ({device}), {total_steps} steps of {args.batch_size}", flush=True)
for epoch in range(start_epoch, args.epochs):
    model.train()
    meter.resume()
    generator.manual_seed(args.seed + epoch)  # the epoch's order depends on seed and epoch only: a resume repeats it
    done = max(0, step - epoch * len(train_loader))  # steps of this epoch a preempted run took already (else 0)
    loss_sum = torch.zeros((), device=device)  # summed on the device: no sync per step
    label_counts = torch.zeros(len(classes), dtype=torch.long, device=device)  # what the loader delivered
    epoch_steps = 0
    for images, labels in meter.loader(itertools.islice(train_loader, done, None)):  # their batches: loaded, dropped
        if preemption.requested(step):  # SIGTERM: the step in flight is done, the next one does not start
            break
        images = images.to(device, non_blocking=True, memory_format=memory_format)
        labels = labels.to(device, non_blocking=True)
        label_counts.index_add_(0, labels, torch.ones_like(labels))  # no sync, unlike bincount on a GPU
        if not args.loader_only:
            with torch.autocast(device.type, dtype=amp_dtype or torch.float32, enabled=amp_dtype is not None):
                loss = criterion(model(images), labels)
            optimizer.zero_grad(set_to_none=True)
            scaler.scale(loss).backward()
            scaler.step(optimizer)
            scaler.update()
            scheduler.step()
            loss_sum += loss.detach()
        step += 1
        epoch_steps += 1
        meter.step(images.size(0))
        if step % args.log_every == 0:  # int() waits for the device: once every --log-every steps only
            seen = int(label_counts.sum())
            print(f"epoch {epoch + 1} step {step}/{total_steps}, {seen} images, {meter.progress()}", flush=True)
        if step == total_steps:
            break
    meter.pause()  # synchronises: evaluation is not training time
    if preemption.stopped_at is not None:  # preempted: save this step boundary, skip the evaluation
        if checkpoint:
            common.save_checkpoint(  # `epoch` epochs finished
                checkpoint, args, model, optimizer, epoch, step, epochs, scaler=scaler
            )
        break

    val_loss, val_acc = (None, None) if args.loader_only else common.evaluate(model, val_loader, device)
    train_loss = None if args.loader_only else loss_sum / max(epoch_steps, 1)
    counts = label_counts.tolist()
    epochs.append(
        common.epoch_record(
            epoch + 1, step, train_loss, val_loss, val_acc, meter, None, images=sum(counts), label_counts=counts
        )
    )
    print(common.epoch_line(epochs[-1]), flush=True)
    if checkpoint:
        common.save_checkpoint(checkpoint, args, model, optimizer, epoch + 1, step, epochs, scaler=scaler)
    if step == total_steps:
        break

# -- metrics: the closing line, and the metrics JSON with its provenance (--metrics-out) ------------------------
summary = meter.summary()
common.report(
    args,
    summary,
    epochs,
    loader="torch DataLoader",
    workers=args.workers,
    loader_only=args.loader_only,
    precision=(f"amp {args.amp_dtype}" if amp_dtype else common.precision_label(device))
    + (" + channels_last" if args.channels_last else ""),
    model="none (loader only)" if args.loader_only else args.model,
    dataset=args.data_dir.name,
    image_size=args.image_size,
    device=device,
    steps=step,
    params=None if args.loader_only else sum(p.numel() for p in model.parameters()),  # the model's parameters
    test_images=len(val_set),
)
preemption.exit()  # after SIGTERM: one line, exit 143 (after a failed checkpoint write: exit 1)
