r"""NVIDIA DALI: loader.py + its input pipeline as a DALI graph, decoding on the GPU ('mixed'), sharded by rank.

The same steps as loader.py (read, decode, RandomResizedCrop, flip, normalise) as one DALI graph, run by a pool of
--threads C++ threads instead of Python worker processes. On a GPU the `mixed` decoder splits each JPEG between the
CPU (Huffman decoding) and the GPU (nvJPEG), so resizing, cropping and normalising run on the GPU and the batches
arrive already on the device. Without a GPU, DALI runs its CPU-only mode (device_id=None) and says so in one line.
Under torchrun with --loader-only each rank reads its own shard of the files. Needs `pip install nvidia-dali-cuda120`.

    python src/loader_DALI.py                                          # small CNN on 32 px crops of Fashion-MNIST JPEGs
    python src/loader_DALI.py --loader-only --data-dir data/imagenet-synthetic --image-size 224 --threads 8
    python src/loader_DALI.py --data-dir data/imagenet-synthetic --image-size 224 --model resnet50 --batch-size 256 \
        --threads 16 --amp-dtype float16 --channels-last              # end to end on a GPU
    torchrun --nproc-per-node 2 src/loader_DALI.py --loader-only --device cpu   # 2 shards, disjoint files
    diff src/loader.py src/loader_DALI.py                              # only the lines marked `# new #`

More: docs/techniques/loader_DALI.md
"""

import itertools
import os  # new #

import torch
import torch.distributed as dist  # new #
import torch.nn as nn

# new # no DataLoader, no torchvision transforms: DALI does both below
import common

parser = common.get_image_folder_parser(__doc__)
parser.add_argument(  # new #
    "--threads", type=common.positive_int, default=None, help="DALI CPU threads (default: --workers, at least 1)"
)
args = common.parse_args(parser)
generator = common.seed_everything(args.seed, args.deterministic)
device = common.get_device(args.device)
amp_dtype = getattr(torch, args.amp_dtype) if args.amp_dtype else None  # None: float32, no autocast
# new # begin: one shard per rank under torchrun (RANK / WORLD_SIZE); one process reads everything
rank, world_size = int(os.environ.get("RANK", "0")), int(os.environ.get("WORLD_SIZE", "1"))
if world_size > 1:
    if not args.loader_only:
        common.die("under torchrun, add --loader-only: training on shards is train_DDP.py's lesson, not this one's")
    if device.type == "cuda":
        device = torch.device("cuda", int(os.environ["LOCAL_RANK"]))
    dist.init_process_group("gloo")  # only to sum images/s and the label counts over the ranks at the end
threads = args.threads or max(1, args.workers)
gpu = device.type == "cuda"
if not gpu and rank == 0:
    print("loader_DALI.py: no GPU: DALI's CPU-only mode (device_id=None), decoding on the CPU, not 'mixed'", flush=True)
# new # end

# -- data: an ImageFolder of image files, decoded and augmented by a DALI pipeline  # new #
train_dir, val_dir, classes = common.image_folders(args.data_dir, args.batch_size)
# new # begin: the same steps as one DALI graph (its operators: common/dali.py), run by `threads` C++ threads
knobs = dict(
    batch_size=args.batch_size,
    image_size=args.image_size,
    threads=threads,
    device=device,  # a GPU: 'mixed' decoding, batches on the device; a CPU: DALI's CPU-only mode
    seed=args.seed + rank,  # the random crops and flips
    shard_id=rank,  # this rank's part of each epoch's permutation of the files
    num_shards=world_size,
    dtype=torch.float32,  # float32 CHW, like ToTensor
)
train_loader = common.DALILoader(train_dir, training=True, **knobs)  # full batches only, like drop_last=True
val_loader = common.DALILoader(val_dir, training=False, **knobs)  # the last partial batch too: every image once
# new # end

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
if rank == 0:  # new #
    print(f"{mode} on {args.data_dir} ({device}), {total_steps} steps of {args.batch_size}", flush=True)
for epoch in range(start_epoch, args.epochs):
    model.train()
    meter.resume()
    # new # DALI's reader shuffles with its own generator, started afresh in each process: a resumed epoch skips as
    # new # many batches as were done, but of another order (train.py's resume repeats the order)
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
        if rank == 0 and step % args.log_every == 0:  # new # one rank prints
            seen = int(label_counts.sum())
            print(f"epoch {epoch + 1} step {step}/{total_steps}, {seen} images, {meter.progress()}", flush=True)
        if step == total_steps:
            break
    meter.pause()  # synchronises: evaluation is not training time
    if preemption.stopped_at is not None:  # preempted: save this step boundary, skip the evaluation
        if checkpoint and rank == 0:  # new # every rank stops at this step; rank 0 writes
            common.save_checkpoint(  # `epoch` epochs finished
                checkpoint, args, model, optimizer, epoch, step, epochs, scaler=scaler
            )
        break

    val_loss, val_acc = (None, None) if args.loader_only else common.evaluate(model, val_loader, device)
    train_loss = None if args.loader_only else loss_sum / max(epoch_steps, 1)
    counts = common.distributed.sum_over_ranks(label_counts).tolist()  # new # each rank counted its own shard: the sum
    epochs.append(
        common.epoch_record(
            epoch + 1, step, train_loss, val_loss, val_acc, meter, None, images=sum(counts), label_counts=counts
        )
    )
    if rank == 0:  # new #
        print(common.epoch_line(epochs[-1]), flush=True)
    if checkpoint and rank == 0:  # new # rank 0 writes (every rank steps the same model)
        common.save_checkpoint(checkpoint, args, model, optimizer, epoch + 1, step, epochs, scaler=scaler)
    if step == total_steps:
        break

# -- metrics: the closing line, and the metrics JSON with its provenance (--metrics-out) ------------------------
summary = common.gather_summary(meter.summary()) if world_size > 1 else meter.summary()  # new # summed over ranks
if rank == 0:  # new # only rank 0 writes
    common.report(
        args,
        summary,
        epochs,
        loader=f"DALI {'mixed' if gpu else 'cpu'}",  # new #
        workers=threads,  # new #
        loader_only=args.loader_only,
        precision=(f"amp {args.amp_dtype}" if amp_dtype else common.precision_label(device))
        + (" + channels_last" if args.channels_last else ""),
        model="none (loader only)" if args.loader_only else args.model,
        dataset=args.data_dir.name,
        image_size=args.image_size,
        device=device,
        steps=step,
        params=None if args.loader_only else sum(p.numel() for p in model.parameters()),  # the model's parameters
        test_images=len(val_loader.dataset),  # new # files in val/, all shards
    )
preemption.exit()  # after SIGTERM: one line, exit 143 (after a failed checkpoint write: exit 1)
