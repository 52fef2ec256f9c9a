r"""Fault-tolerant DDP: train_DDP.py + mid-epoch checkpoints and a resume that skips done batches at the sampler.

A dead worker fails the group and `torchrun --max-restarts K` starts it again; rank 0 saves last.pt every
--checkpoint-every steps, and --resume skips what the epoch already trained on, so the job sees the same data in the
same order. Launch with TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1, or a restarted group may fail to connect
(pytorch/pytorch#135712).

    TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1 torchrun --nproc-per-node auto --max-restarts 3 src/train_DDP_elastic.py \
        --checkpoint-dir ckpt --checkpoint-every 200 --resume
    TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1 torchrun --nproc-per-node 2 --max-restarts 1 src/train_DDP_elastic.py \
        --device cpu --workers 1 --checkpoint-dir ckpt --checkpoint-every 50 --resume
    diff src/train_DDP.py src/train_DDP_elastic.py                  # only the lines marked `# new #`

Preemption (every script): SIGTERM stops every rank at one step, rank 0 saves last.pt, exit 143. Slurm:
    #SBATCH --signal=TERM@120
    #SBATCH --requeue
    srun torchrun --nnodes $SLURM_NNODES --nproc-per-node auto --rdzv-backend c10d --rdzv-id $SLURM_JOB_ID \
        --rdzv-endpoint $(scontrol show hostnames $SLURM_JOB_NODELIST | head -n 1):29500 --max-restarts 3 \
        src/train_DDP_elastic.py --checkpoint-dir ck --checkpoint-every 200 --resume

More: docs/techniques/train_DDP_elastic.md
"""

import itertools
import os  # new #

import torch
import torch.distributed as dist  # new #
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP  # new #
from torch.utils.data import DataLoader
from torch.utils.data.distributed import DistributedSampler  # new #

import common


# new # begin: a DistributedSampler that can start a pass part-way, so a restart skips done batches as indices
class ResumableSampler(DistributedSampler):
    """DistributedSampler whose next pass starts at position `start` of this rank's shuffled shard (then at 0 again):
    a restarted epoch skips the samples it already trained on without loading them. len() stays the whole shard."""

    start = 0

    def __iter__(self):
        indices = list(super().__iter__())[self.start :]
        self.start = 0
        return iter(indices)


# new # end
parser = common.get_parser(__doc__)
parser.add_argument(  # new #
    "--sync-bn", action="store_true", help="BatchNorm statistics over the global batch (CUDA only)"
)
parser.add_argument(  # new #
    "--checkpoint-every", type=common.positive_int, default=None, help="also save last.pt every N steps (mid-epoch)"
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
    sampler = ResumableSampler(train_set, num_replicas=world_size, rank=rank, shuffle=True, seed=args.seed)  # new #
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
criterion = nn.CrossEntropyLoss()
optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=5e-4)
total_steps = args.epochs * len(train_loader)
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


# new # begin: a checkpoint inside an epoch: the records, and every rank's loss summed so far in the epoch (each rank
# trains on its own batches; a restarted rank goes on from its own sum, so the epoch's record is the uninterrupted one)
def save_mid_epoch(epochs_done: int) -> None:
    loss_sums = [torch.zeros_like(loss_sum) for _ in range(world_size)]
    dist.all_gather(loss_sums, loss_sum)  # a collective: every rank calls this at the same step
    if master:
        common.save_checkpoint(
            checkpoint,
            args,
            model.module,
            optimizer,
            epochs_done,
            step,
            epochs=epochs,
            epoch_loss_sums=torch.stack(loss_sums),
        )


# new # end
test_images = None  # new # counted over the ranks at each evaluation (none before the first)
if master:  # new #
    print(f"training {args.model} on {args.dataset} ({device}), {total_steps} steps of {args.batch_size}", flush=True)
for epoch in range(start_epoch, args.epochs):
    model.train()
    meter.resume()
    done = max(0, step - epoch * len(train_loader))  # new # moved up: the sampler starts after the done steps' samples
    if sampler is not None:  # new # the epoch's shuffle (seed + epoch), the same permutation on every rank
        sampler.set_epoch(epoch)  # new #
        sampler.start = done * args.batch_size  # new # skip the samples of the done steps: none is loaded again
    loss_sum = torch.zeros((), device=device)  # summed on the device: no sync per step
    epoch_steps = 0
    if done:  # new # an epoch resumed mid-way: its loss and steps so far, so its record is the whole epoch's
        loss_sum, epoch_steps = state["epoch_loss_sums"][rank].to(device), done  # new # this rank's own sum
    logits = None  # new # a checkpoint at an epoch's last step leaves no step to run before its evaluation
    # new # the sampler skips the done steps' samples; synthetic data has no sampler: stop after the steps left
    for images, labels in meter.loader(itertools.islice(train_loader, len(train_loader) - done)):  # new #
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
        if master and step % args.log_every == 0:  # new #
            print(f"epoch {epoch + 1} step {step}/{total_steps} loss {loss.item():.4f}, {meter.progress()}", flush=True)
        if step == total_steps:
            break
        # new # begin: a mid-epoch checkpoint, so a restart loses at most N steps; not at the run's last step: a run
        # is finished only once its last evaluation is done and saved below
        if checkpoint and args.checkpoint_every and step % args.checkpoint_every == 0:
            save_mid_epoch(epoch)
            if master:
                print(f"checkpoint: epoch {epoch + 1} step {step} -> {checkpoint}", flush=True)
        # new # end
    meter.pause()  # synchronises: evaluation is not training time
    if preemption.stopped_at is not None:  # preempted: save this step boundary, skip the evaluation
        if checkpoint:  # new # every rank stops at this step and gathers the loss sums; rank 0 writes
            save_mid_epoch(epoch)  # new # with what a restart needs, as the mid-epoch checkpoints
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
        steps=step,
        params=sum(p.numel() for p in model.parameters()),  # the model's parameters (all of them)
        test_images=test_images,  # new # summed over the ranks' shards
    )
dist.destroy_process_group()  # new # leave the group cleanly before exiting
preemption.exit()  # after SIGTERM: one line, exit 143 (after a failed checkpoint write: exit 1)
