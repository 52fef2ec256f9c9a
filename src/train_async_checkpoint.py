"""Async checkpoints: train_FSDP.py + dcp.async_save, the shards written while training goes on.

A save copies this rank's shards to host memory and returns; a background thread writes them while the next steps
train. last.pt names them only once every rank's shards are on disk, so a crash during the write leaves the previous
checkpoint whole. Before the process ends (the run's end, a SIGTERM) it waits for the write in flight.

    torchrun --nproc-per-node 2 src/train_async_checkpoint.py --device cpu --model vit --workers 1 --checkpoint-dir ck
    torchrun --nproc-per-node 2 src/train_async_checkpoint.py --device cpu --model vit --checkpoint-dir ck --resume
    torchrun --nproc-per-node auto src/train_async_checkpoint.py --model vit --checkpoint-dir ck     # one per GPU
    diff src/train_FSDP.py src/train_async_checkpoint.py                              # only the lines marked `# new #`

More: docs/techniques/train_async_checkpoint.md
"""

import itertools
import os  # new #
import shutil  # new #
import time  # new #

import torch
import torch.distributed as dist  # new #
import torch.distributed.checkpoint as dcp  # new #
import torch.nn as nn
import torchvision  # new #
from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict  # new # sharded state dicts
from torch.distributed.device_mesh import init_device_mesh  # new #
from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard  # new #
from torch.utils.data import DataLoader
from torch.utils.data.distributed import DistributedSampler  # new #

import common

parser = common.get_parser(__doc__)
parser.add_argument(  # new #
    "--sync-bn", action="store_true", help="BatchNorm statistics over the global batch (CUDA only)"
)
parser.add_argument(  # new #
    "--param-dtype", choices=["float32", "bfloat16"], default="float32", help="MixedPrecisionPolicy's param_dtype: "
    "what the blocks are gathered and run in (shards, optimizer, gradient reduction: float32)",
)
args = common.parse_args(parser)
if args.checkpoint_dir is None:  # new # the lesson is the save: without a folder there is none
    parser.error("train_async_checkpoint.py writes checkpoints: give --checkpoint-dir (the folder they go to)")  # new #
if args.param_dtype == "bfloat16" and args.model not in ("vit", "mlp"):  # new #
    parser.error(f"--param-dtype bfloat16 needs a model without BatchNorm (vit, mlp), not {args.model}")  # new #
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
# new # every rank must run as many test batches (FSDP's forward all-gathers): else one line, not a hang
common.distributed.require_same_count(len(test_loader), device, "test batches")  # new #

# -- model, loss, optimizer, and the state of an earlier run to resume -------------------------------------------
model = common.build_model(args.model, *common.input_shape(args)).to(device)
# new # begin: shard each block over the ranks, then the root; every rank built the same weights from the same seed
if args.sync_bn and device.type == "cuda":
    model = nn.SyncBatchNorm.convert_sync_batchnorm(model)  # batch statistics over the global batch
elif args.sync_bn and master:
    print(f"{script}: --sync-bn needs CUDA (SyncBatchNorm has no CPU kernel); BatchNorm per process", flush=True)
mesh = init_device_mesh(device.type, (world_size,))  # 1-D: every parameter split in world_size shards (dim 0)
param_dtype = getattr(torch, args.param_dtype)
mp_policy = MixedPrecisionPolicy(param_dtype=param_dtype, reduce_dtype=torch.float32)  # gradients averaged in float32
root_policy = MixedPrecisionPolicy(param_dtype, torch.float32, output_dtype=torch.float32)  # float32 logits: the loss
if isinstance(model, common.ViT):
    blocks = model.blocks  # EncoderBlock: attention + MLP
elif isinstance(model, torchvision.models.ResNet):
    blocks = [*model.layer1, *model.layer2, *model.layer3, *model.layer4]  # the residual blocks
else:
    blocks = []  # the small CNN and the MLP: the root is the only unit
for block in blocks:  # one unit each: all-gathered before its forward and its backward, freed after them
    fully_shard(block, mesh=mesh, mp_policy=mp_policy)
fully_shard(model, mesh=mesh, mp_policy=root_policy)  # the root: the parameters no block holds (stem, head)
params = sum(p.numel() for p in model.parameters())  # DTensors: numel() is the whole parameter's
params_per_rank = sum(p.to_local().numel() for p in model.parameters())  # this rank's shards
if master:
    print(f"FSDP: {len(blocks)} blocks + root sharded over {world_size} ranks, {params_per_rank:,} of {params:,} "
          f"parameters on rank 0, {args.param_dtype} compute", flush=True)  # fmt: skip
# new # end
criterion = nn.CrossEntropyLoss()
# new # the optimizer comes after fully_shard, so that its state (AdamW's moments) is sharded like the parameters
optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=5e-4)
total_steps = args.epochs * len(train_loader)
if args.max_steps:
    total_steps = min(total_steps, args.max_steps)

start_epoch, step, epochs = 0, 0, []  # epochs: the per-epoch records, which checkpoints keep and a resume restores
checkpoint = args.checkpoint_dir / "last.pt" if args.checkpoint_dir else None
if args.resume and checkpoint.exists():
    # new # begin: last.pt says what made the run and how far it got; every rank reads its shards from the DCP folder
    state = common.load_checkpoint(checkpoint, args, None, None, "cpu")  # checks only: FSDP loads the shards below
    state.pop("model", None)  # the full model it holds is not kept on every rank
    # DCP loads into a template, only the keys it has: a schedule gives the param groups the keys it saved with them
    torch.optim.lr_scheduler.OneCycleLR(optimizer, max_lr=args.lr, total_steps=total_steps)  # initial_lr, max_lr...
    model_state, optimizer_state = get_state_dict(model, optimizer)  # this rank's shards, to be filled in place
    dcp.load({"model": model_state, "optimizer": optimizer_state}, checkpoint_id=args.checkpoint_dir / state["sharded"])
    set_state_dict(model, optimizer, model_state_dict=model_state, optim_state_dict=optimizer_state)
    # new # end
    start_epoch, step, epochs = state["epoch"], state["step"], state["epochs"]
    if master:  # new #
        print(f"resumed from {checkpoint}: {start_epoch} epochs and {step} steps done", flush=True)
    common.exit_if_finished(checkpoint, step, total_steps)  # re-running a finished run: one line, exit 0
# one-cycle schedule over this run's steps; on resume it continues at step `step` (last_epoch counts from -1)
scheduler = torch.optim.lr_scheduler.OneCycleLR(optimizer, max_lr=args.lr, total_steps=total_steps, last_epoch=step - 1)


# new # begin: every rank writes its shards (DCP), then rank 0 the full model and the pointer to them (last.pt)
saved_step = step if step else None  # the step the checkpoint on disk holds (a resumed one's), on every rank
checkpoint_s, saves = 0.0, 0  # the seconds the training loop stood still for checkpoints, and how many


def save_sharded(epochs_done: int) -> None:
    global saved_step, checkpoint_s, saves, pending  # new #
    finish_save()  # new # the save before this one: on disk, and named in last.pt, before another starts
    started = time.perf_counter()
    saved_step, folder, saves = step, f"sharded-step{step}", saves + 1
    for buffer in model.buffers():  # BatchNorm's statistics, unsharded: DCP saves one rank's copy of each, any rank's,
        dist.broadcast(buffer, src=0)  # so all hold rank 0's, which the evaluation reads (mid-epoch they differ)
    model_state, optimizer_state = get_state_dict(model, optimizer)  # this rank's shards, keyed like train.py's
    shards, path = {"model": model_state, "optimizer": optimizer_state}, args.checkpoint_dir / folder
    full = common.distributed.gather_full_state(model)  # last.pt's whole model, on rank 0 (train.py loads it)
    # new # the shards copied to host memory now (in this thread), written by a background thread while training goes on
    writing = dcp.async_save(shards, checkpoint_id=path, process_group=checkpoint_group)  # new #
    pending = (writing, full, epochs_done, step, list(epochs))  # new # last.pt's, once the shards are on disk
    checkpoint_s += time.perf_counter() - started


def write_last(full: dict | None, epochs_done: int, done_step: int, records: list) -> None:
    """Rank 0 writes last.pt, once every rank's shards of step `done_step` are on disk; the older shards go."""
    folder = f"sharded-step{done_step}"
    if common.distributed.write_full_state(checkpoint, args, full, epochs_done, done_step, records, sharded=folder):
        for old in args.checkpoint_dir.glob("sharded-step*"):  # the new one is named in last.pt: the old ones go
            if old.name != folder:
                shutil.rmtree(old, ignore_errors=True)


# new # end
# new # begin: the save in flight, named in last.pt only once on disk (a crash during the write leaves the last whole)
pending = None  # (the writer's future, last.pt's full model, epochs finished, step, the epochs' records)
# the writer thread runs collectives while training runs its own: in one group they could interleave differently on
# each rank and hang; async_save needs the group to have a CPU backend
checkpoint_group = dist.new_group(backend="gloo")


def finish_save() -> None:
    """Wait for the save in flight (every rank's shards and DCP's metadata on disk), then rank 0 writes last.pt."""
    global pending, checkpoint_s
    if pending is None:
        return
    started = time.perf_counter()
    (writing, full, epochs_done, done_step, records), pending = pending, None
    try:  # a full disk, a read-only or vanished folder: DCP gathers every rank's failure and raises it on each
        writing.result()  # raises what the writer thread raised
    except (Exception, dcp.CheckpointException) as error:  # (DCP's is a BaseException)
        folder = args.checkpoint_dir / f"sharded-step{done_step}"  # new #
        common.distributed.sharded_save_failed(folder, error, args.run)  # new # the half-written folder goes; exit 1
    write_last(full, epochs_done, done_step, records)
    checkpoint_s += time.perf_counter() - started


# new # end
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
        if pending and pending[0].done():  # new # a save is on disk: name it in last.pt now, not at the next save
            finish_save()  # new # no collective: each rank may find it done at another step
        if master and step % args.log_every == 0:  # new #
            print(f"epoch {epoch + 1} step {step}/{total_steps} loss {loss.item():.4f}, {meter.progress()}", flush=True)
        if step == total_steps:
            break
    meter.pause()  # synchronises: evaluation is not training time
    if preemption.stopped_at is not None:  # preempted: save this step boundary, skip the evaluation
        # new # every rank writes its shards, unless last.pt's hold this step already (a SIGTERM right after a save)
        if checkpoint and step != saved_step:  # new #
            save_sharded(epoch)  # new # `epoch` epochs finished
        break

    # new # begin: BatchNorm's running statistics differ per rank (FSDP never broadcasts buffers; each rank's follow
    # its own batches): evaluate rank 0's, which DCP and last.pt save, and which equal DDP's rank 0's
    for buffer in model.buffers():
        dist.broadcast(buffer, src=0)
    # new # end
    val_loss, val_acc = common.evaluate(model, test_loader, device)  # new # FSDP's forward: every rank runs it
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
    if checkpoint:  # new # not rank 0 only: every rank writes its shards
        save_sharded(epoch + 1)  # new # every rank writes its shards, rank 0 last.pt
    if step == total_steps:
        break
finish_save()  # new # the save still in flight: on disk and in last.pt before the process ends

# -- metrics: the closing line, and the metrics JSON with its provenance (--metrics-out) ------------------------
summary = common.gather_summary(meter.summary())  # new # images/s summed over ranks, peak memory the max
if master:  # new #
    common.report(
        args,
        summary,
        epochs,
        precision=f"FSDP {args.param_dtype}",  # new # what the blocks were gathered and run in
        device=device,
        steps=step,
        params=sum(p.numel() for p in model.parameters()),  # the model's parameters (all of them)
        params_per_rank=params_per_rank,  # new # what rank 0 holds: about params / world_size
        checkpoints=saves,  # new # sharded saves
        checkpoint_s=checkpoint_s if saves else None,  # new # rank 0's seconds of training lost to them, in all
        test_images=test_images,  # new # summed over the ranks' shards
    )
dist.destroy_process_group()  # new # leave the group cleanly before exiting
preemption.exit()  # after SIGTERM: one line, exit 143 (after a failed checkpoint write: exit 1)
