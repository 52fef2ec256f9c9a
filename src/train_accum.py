"""Gradient accumulation: train_DDP.py + K micro-batches per optimizer step, DDP's all-reduce once per step (no_sync).

The batch you want runs as K micro-batches of --batch-size: each backward adds into .grad (the loss divided by K)
and the optimizer steps once every K (global batch: batch x K x world size). `model.no_sync()` on the first K-1
makes the ranks all-reduce once per step (--all-reduce-every-micro-batch shows what that saves).

    torchrun --nproc-per-node 2 src/train_accum.py --device cpu --workers 1 --batch-size 32 --accum-steps 4
    torchrun --nproc-per-node auto src/train_accum.py --model resnet18 --batch-size 64 --accum-steps 4 --lr 2e-3
    diff src/train_DDP.py src/train_accum.py                        # only the lines marked `# new #`

More: docs/techniques/train_accum.md
"""

import contextlib  # new #
import itertools
import os  # new #

import torch
import torch.distributed as dist  # new #
import torch.nn as nn
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks  # new #
from torch.nn.parallel import DistributedDataParallel as DDP  # new #
from torch.utils.data import DataLoader
from torch.utils.data.distributed import DistributedSampler  # new #

import common

parser = common.get_parser(__doc__)
parser.add_argument(  # new #
    "--sync-bn", action="store_true", help="BatchNorm statistics over the global batch (CUDA only)"
)
parser.add_argument(  # new #
    "--accum-steps", type=common.positive_int, default=4, help="micro-batches of --batch-size per optimizer step"
)
parser.add_argument(  # new #
    "--all-reduce-every-micro-batch", action="store_true", help="for comparison: no no_sync, so K all-reduces a step"
)
args = common.parse_args(parser)
# new # begin: torchrun sets these; the same script runs on 1 or 1000 processes
script = os.path.basename(__file__)  # this file's name, in its messages
if "LOCAL_RANK" not in os.environ:
    common.die(f"launch with torchrun, e.g. `torchrun --nproc-per-node 2 src/{script} --device cpu` (no RANK set)")
local_rank, rank, world_size = int(os.environ["LOCAL_RANK"]), int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
master = rank == 0  # only rank 0 prints, writes metrics and checkpoints
# new # end
generator = common.seed_everything(args.seed, args.deterministic)
device = common.get_device(args.device)
# new # begin: one device per process, then the process group
if device.type == "cuda":
    if local_rank >= torch.cuda.device_count():
        common.die(f"local rank {local_rank} has no GPU: {torch.cuda.device_count()} visible; lower --nproc-per-node")
    device = torch.device("cuda", local_rank)
    torch.cuda.set_device(device)  # before the process group, so NCCL binds this GPU and not GPU 0
else:
    torch.set_num_threads(max(1, os.cpu_count() // int(os.environ.get("LOCAL_WORLD_SIZE", "1"))))  # share the cores
dist.init_process_group("nccl" if device.type == "cuda" else "gloo")  # rendezvous at torchrun's MASTER_ADDR:MASTER_PORT
# new # end

# -- data: Fashion-MNIST tensors behind torch's DataLoader, or one synthetic batch already on the device ----------
sampler = None  # new # synthetic data: every rank makes its own batch
if args.dataset == "synthetic":
    train_loader, test_loader = common.synthetic_data(args, device, seed=rank)  # new # another batch on each rank
else:
    train_set, test_set = common.load_data(args)
    # new # begin: each rank trains on its own 1/world_size of the shuffled indices and tests on its own shard
    sampler = DistributedSampler(train_set, num_replicas=world_size, rank=rank, shuffle=True, seed=args.seed)
    test_set = torch.utils.data.Subset(test_set, range(rank, len(test_set), world_size))  # no padding: each image once
    # new # end
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
# new # begin: wrap the model; DDP broadcasts rank 0's weights, then all-reduces gradients during backward
if args.sync_bn and device.type == "cuda":
    model = nn.SyncBatchNorm.convert_sync_batchnorm(model)  # batch statistics over the global batch
elif args.sync_bn and master:
    print(f"{script}: --sync-bn needs CUDA (SyncBatchNorm has no CPU kernel); BatchNorm per process", flush=True)
model = DDP(model, device_ids=[local_rank] if device.type == "cuda" else None)
# new # end
# new # begin: count DDP's gradient all-reduces (one per bucket per synchronised backward), to show what no_sync saves
allreduces = 0


def count_allreduces(state, bucket):
    global allreduces
    allreduces += 1
    return default_hooks.allreduce_hook(state, bucket)  # what DDP does without a hook: average over the ranks


model.register_comm_hook(None, count_allreduces)
# new # end
criterion = nn.CrossEntropyLoss()
optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=5e-4)
# new # begin: optimizer steps of K micro-batches each; an epoch's last len % K micro-batches are dropped (drop_last)
if len(train_loader) < args.accum_steps:
    common.die(f"--accum-steps {args.accum_steps} is more than the {len(train_loader)} micro-batches of an epoch")
steps_per_epoch = len(train_loader) // args.accum_steps
total_steps = args.epochs * steps_per_epoch
# new # end
if args.max_steps:
    total_steps = min(total_steps, args.max_steps)

start_epoch, step, epochs = 0, 0, []  # epochs: the per-epoch records, which checkpoints keep and a resume restores
checkpoint = args.checkpoint_dir / "last.pt" if args.checkpoint_dir else None
if args.resume and checkpoint.exists():
    state = common.load_checkpoint(checkpoint, args, model.module, optimizer, device)  # new # every rank loads it
    start_epoch, step, epochs = state["epoch"], state["step"], state["epochs"]
    if master:  # new #
        print(f"resumed from {checkpoint}: {start_epoch} epochs and {step} steps done", flush=True)
    common.exit_if_finished(checkpoint, step, total_steps)  # re-running a finished run: one line, exit 0
# one-cycle schedule over this run's steps; on resume it continues at step `step` (last_epoch counts from -1)
scheduler = torch.optim.lr_scheduler.OneCycleLR(optimizer, max_lr=args.lr, total_steps=total_steps, last_epoch=step - 1)

# -- training -----------------------------------------------------------------------------------------------------
meter = common.Meter(device, args.warmup_steps, target=common.target_probe(args, model))
preemption = common.Preemption(args.run)  # SIGTERM: stop at the next step boundary, save, exit 143
test_images = None  # new # counted over the ranks at each evaluation (none before the first)
if master:  # new #
    print(f"training {args.model} on {args.dataset} ({device}), {total_steps} steps of {args.batch_size}", flush=True)
for epoch in range(start_epoch, args.epochs):
    model.train()
    meter.resume()
    if sampler is not None:  # new # the epoch's shuffle (seed + epoch), the same permutation on every rank
        sampler.set_epoch(epoch)  # new #
    done = max(0, step - epoch * steps_per_epoch)  # new # optimizer steps (K micro-batches) a preempted run took
    loss_sum = torch.zeros((), device=device)  # summed on the device: no sync per step
    epoch_steps = 0
    # new # whole groups of K only, after the done steps' micro-batches (loaded, dropped)
    micro_batches = itertools.islice(train_loader, done * args.accum_steps, steps_per_epoch * args.accum_steps)  # new #
    for micro, (images, labels) in enumerate(meter.loader(micro_batches), start=1):  # new # count the micro-batches
        if (micro - 1) % args.accum_steps == 0 and preemption.requested(step):  # new # between optimizer steps only
            break
        images = images.to(device, non_blocking=True)
        labels = labels.to(device, non_blocking=True)
        sync = micro % args.accum_steps == 0 or args.all_reduce_every_micro_batch  # new # all-reduce at the K-th
        with contextlib.nullcontext() if sync else model.no_sync():  # new # no_sync: no all-reduce in this backward
            logits = model(images)
            loss = criterion(logits, labels)
            (loss / args.accum_steps).backward()  # new # the K gradients add up to the gradient of their mean loss
        loss_sum += loss.detach() / args.accum_steps  # new # moved up: each micro-batch adds its share of the step's
        if micro % args.accum_steps:  # new #
            continue  # new # the gradients accumulate in .grad until the K-th micro-batch
        if args.clip_grad_norm:
            nn.utils.clip_grad_norm_(model.parameters(), args.clip_grad_norm)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)  # new # moved after the step: backward adds to .grad, so clear it here
        scheduler.step()
        step += 1
        epoch_steps += 1
        meter.step(images.size(0) * args.accum_steps)  # new # K micro-batches per optimizer step
        if master and step % args.log_every == 0:  # new #
            print(f"epoch {epoch + 1} step {step}/{total_steps} loss {loss.item():.4f}, {meter.progress()}", flush=True)
        if step == total_steps:
            break
    meter.pause()  # synchronises: evaluation is not training time
    if preemption.stopped_at is not None:  # preempted: save this step boundary, skip the evaluation
        if checkpoint and master:  # new # every rank stops at this step; rank 0 writes
            common.save_checkpoint(checkpoint, args, model.module, optimizer, epoch, step, epochs)  # new # as below
        break

    # new # begin: BatchNorm's running statistics differ per rank by the last step's batch (DDP broadcasts rank 0's
    # before each forward, then every rank updates its own): evaluate rank 0's, the model the checkpoint holds
    for buffer in model.module.buffers():  # (timm's distribute_bn does this, or averages them)
        dist.broadcast(buffer, src=0)
    # new # end
    val_loss, val_acc = common.evaluate(model.module, test_loader, device)  # new # the bare model: no DDP hooks
    # new # begin: each rank scored its own shard and trained on its own batches: sum over ranks for global figures
    n = len(test_loader.dataset)
    totals = torch.tensor([val_loss * n, val_acc * n, n], dtype=torch.float64, device=device)
    dist.all_reduce(totals)  # sum over ranks
    val_loss, val_acc, test_images = (totals[0] / totals[2]).item(), (totals[1] / totals[2]).item(), int(totals[2])
    dist.all_reduce(loss_sum)  # the epoch's train loss over the global batch, as train.py's over its one batch
    loss_sum /= world_size
    # new # end
    epochs.append(
        common.epoch_record(epoch + 1, step, loss_sum / max(epoch_steps, 1), val_loss, val_acc, meter, logits)
    )
    if master:  # new #
        print(common.epoch_line(epochs[-1]), flush=True)
    if checkpoint and master:  # new # rank 0 writes; every replica is the same
        common.save_checkpoint(checkpoint, args, model.module, optimizer, epoch + 1, step, epochs)  # new # no "module."
    if step == total_steps:
        break

# -- metrics: the closing line, and the metrics JSON with its provenance (--metrics-out) ------------------------
summary = common.gather_summary(meter.summary())  # new # images/s summed over ranks, peak memory the max
if master:  # new #
    common.report(
        args,
        summary,
        epochs,
        precision=common.precision_label(device),
        device=device,
        global_batch=args.batch_size * args.accum_steps * world_size,  # new # the effective batch per step
        accum_steps=args.accum_steps,  # new #
        allreduces_per_step=allreduces / max(meter.steps, 1),  # new # bucket all-reduces per optimizer step
        steps=step,
        params=sum(p.numel() for p in model.parameters()),  # the model's parameters (all of them)
        test_images=test_images,  # new # summed over the ranks' shards
    )
dist.destroy_process_group()  # new # leave the group cleanly before exiting
preemption.exit()  # after SIGTERM: one line, exit 143 (after a failed checkpoint write: exit 1)
