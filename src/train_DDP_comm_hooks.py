r"""DDP communication hooks: train_DDP.py + register_comm_hook, gradients compressed before they are all-reduced.

A communication hook replaces DDP's float32 all-reduce of each gradient bucket: bf16 / fp16 compression sends half
the bytes (the gradients rounded), PowerSGD two rank-r factors of each gradient matrix, with error feedback.
It pays where the network, not the GPU, sets the step time: many nodes, no NVLink.

    torchrun --nproc-per-node 2 src/train_DDP_comm_hooks.py --device cpu --workers 1            # bfloat16, gloo
    torchrun --nproc-per-node 2 src/train_DDP_comm_hooks.py --device cpu --comm-hook powersgd --powersgd-rank 2
    torchrun --nproc-per-node auto src/train_DDP_comm_hooks.py --comm-hook fp16 --model resnet18   # one per GPU
    diff src/train_DDP.py src/train_DDP_comm_hooks.py                              # only the lines marked `# new #`

More: docs/techniques/train_DDP_comm_hooks.md
"""

import itertools
import os  # new #

import torch
import torch.distributed as dist  # new #
import torch.nn as nn
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks, powerSGD_hook  # new #
from torch.nn.parallel import DistributedDataParallel as DDP  # new #
from torch.utils.data import DataLoader
from torch.utils.data.distributed import DistributedSampler  # new #

import common

parser = common.get_parser(__doc__)
parser.add_argument(  # new #
    "--sync-bn", action="store_true", help="BatchNorm statistics over the global batch (CUDA only)"
)
# new # begin: what each gradient bucket becomes on the wire, and the buckets
parser.add_argument(
    "--comm-hook",
    choices=["allreduce", "bf16", "fp16", "powersgd"],
    default="bf16",
    help="allreduce: DDP's own, float32; bf16 / fp16: the bucket in 16 bits; powersgd: low-rank factors",
)
parser.add_argument("--powersgd-rank", type=common.positive_int, default=2, help="PowerSGD: rank of each factor")
parser.add_argument(
    "--powersgd-start-iter", type=common.positive_int, default=10, help="PowerSGD: plain all-reduces first (warm-up)"
)
parser.add_argument(
    "--static-graph", action="store_true", help="DDP's static_graph: the same graph and parameters at every step"
)
parser.add_argument("--bucket-cap-mb", type=common.cli.positive_float, default=25.0, help="DDP's bucket size (MiB)")
# new # end
args = common.parse_args(parser)
if args.comm_hook == "powersgd" and args.powersgd_start_iter < 2:  # new # PowerSGDState refuses 1 (a traceback)
    parser.error("--powersgd-start-iter must be 2 or more: its error feedback starts from a plain all-reduce")  # new #
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
model = DDP(
    model,
    device_ids=[local_rank] if device.type == "cuda" else None,
    bucket_cap_mb=args.bucket_cap_mb,  # new #
    gradient_as_bucket_view=True,  # new # each .grad a view into its bucket: no copy between them
    static_graph=args.static_graph,  # new # needed by reentrant checkpointing or parameters a step may not use
)  # new #
# new # end
# new # begin: the hook that replaces DDP's float32 all-reduce of each bucket (state None: the default group)
powersgd = None
if args.comm_hook in ("bf16", "fp16"):
    model.register_comm_hook(None, getattr(default_hooks, f"{args.comm_hook}_compress_hook"))
elif args.comm_hook == "powersgd":
    powersgd = powerSGD_hook.PowerSGDState(
        None, matrix_approximation_rank=args.powersgd_rank, start_powerSGD_iter=args.powersgd_start_iter
    )  # its error feedback is this rank's own: not in the checkpoint, so a resume starts it (and the warm-up) again
    model.register_comm_hook(powersgd, powerSGD_hook.powerSGD_hook)
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
        optimizer.zero_grad(set_to_none=False)  # new # zeroed in place: .grad stays its bucket's view (None: a copy)
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
# new # begin: what one step all-reduces, from the gradients' sizes: 4 bytes an element in float32, 2 in bf16 / fp16,
# PowerSGD's factors as it counted them (its compression rate: elements before over elements after)
grad_elements = sum(p.numel() for p in model.parameters() if p.requires_grad)
element_bytes = {"allreduce": 4, "bf16": 2, "fp16": 2, "powersgd": 4}[args.comm_hook]
rate = powersgd.compression_stats()[0] if powersgd is not None else 1  # 0: the run ended inside the warm-up
allreduce_mib = grad_elements * element_bytes / rate / 2**20 if rate else None
# PowerSGD's error feedback: per bucket, what this rank's gradient held that the step did not apply (what compression
# left out, and this rank's difference from the average), added to its next gradient: a float32 copy of every
# gradient, per rank. Without it (use_error_feedback=False) the dict stays empty and what compression drops is lost.
# Summed over the ranks, each rank's difference from the average cancels: what is left is what compression dropped
# from the averaged gradient at the last step (0 for the tensors sent whole, the biases).
residuals = list(powersgd.error_dict.values()) if powersgd is not None else []
error_feedback_mib = sum(t.numel() * t.element_size() for t in residuals) / 2**20 if powersgd is not None else None
error_feedback_norm = None
if residuals:
    dropped = torch.cat(residuals)
    dist.all_reduce(dropped)
    error_feedback_norm = float(torch.linalg.vector_norm(dropped / world_size))
# new # end
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
        comm_hook=args.comm_hook,  # new #
        allreduce_mib_per_step=allreduce_mib,  # new # per rank, after the warm-up
        error_feedback_mib=error_feedback_mib,  # new # PowerSGD's residuals, per rank
        error_feedback_norm=error_feedback_norm,  # new # L2 of what compression dropped, averaged over ranks
    )
# new # (no sample text: every rank would print it; train.py shows what the GPT learned)
dist.destroy_process_group()  # new # leave the group cleanly before exiting
preemption.exit()  # after SIGTERM: one line, exit 143 (after a failed checkpoint write: exit 1)
