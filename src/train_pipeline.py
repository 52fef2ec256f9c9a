r"""Pipeline parallelism: train_model_parallel.py + one process per stage, run by torch.distributed.pipelining.

The base's cut into p x v stages: torchrun starts p processes holding v stages each, and a schedule (GPipe, 1F1B,
interleaved 1F1B, zero-bubble, ZB-V) moves activations forward and gradients back. The bubble is measured beside its
theory (bubble_measured, bubble_theory). It trains what train.py trains; last.pt loads into train.py's model.
Needs torch >= 2.15.

    torchrun --nproc-per-node 2 src/train_pipeline.py --device cpu --model vit --micro-batches 4   # 2 processes, gloo
    torchrun --nproc-per-node 2 src/train_pipeline.py --device cpu --model vit --schedule 1f1b --micro-batches 8
    torchrun --nproc-per-node 2 src/train_pipeline.py --device cpu --model vit --schedule interleaved1f1b   # 4 stages
    torchrun --nproc-per-node 2 src/train_pipeline.py --device cpu --model vit --schedule zbvzerobubble
    torchrun --nproc-per-node 2 src/train_pipeline.py --model resnet50 --dataset synthetic --batch-size 256 \
        --max-steps 50
    diff src/train_model_parallel.py src/train_pipeline.py                     # only the lines marked `# new #`

More: docs/techniques/train_pipeline.md
"""

import itertools

import torch
import torch.distributed as dist  # new #
import torch.nn as nn
import torchvision  # new #
from torch.distributed.pipelining import PipelineStage, schedules  # new #
from torch.utils.data import DataLoader

import common

parser = common.get_parser(__doc__)
parser.add_argument(  # new #
    "--micro-batches", type=common.positive_int, default=4, help="pieces each batch is cut into for the pipeline"
)
parser.add_argument(  # new #
    "--balance", choices=["params", "flops"], default="params", help="stages of even memory (params) or time (flops)"
)
parser.add_argument(  # new # torch's schedule names (any case): one stage per process, then several
    "--schedule", choices=["gpipe", "1f1b", "interleaved1f1b", "interleavedzerobubble", "zbvzerobubble"],
    default="gpipe", type=str.lower, help="how the micro-batches move through the stages"
)  # fmt: skip
parser.add_argument("--stages-per-rank", type=common.positive_int, help="default: 1 for gpipe, 1f1b; else 2")  # new #
args = common.parse_args(parser)
if args.batch_size % args.micro_batches:  # new #
    parser.error(f"--micro-batches {args.micro_batches} must divide --batch-size {args.batch_size}")  # new #
Schedule = schedules.get_schedule_class(args.schedule)  # new #
single = issubclass(Schedule, schedules.PipelineScheduleSingle)  # new # GPipe and 1F1B: one stage per process
args.stages_per_rank = args.stages_per_rank or (1 if single else 2)  # new # ZB-V: 2 (down the ranks and back up)
if (single and args.stages_per_rank != 1) or (args.schedule == "zbvzerobubble" and args.stages_per_rank != 2):  # new #
    parser.error(f"--schedule {args.schedule} runs {2 - single} stages per rank, not {args.stages_per_rank}")  # new #
generator = common.seed_everything(args.seed, args.deterministic)
device = common.get_device(args.device)
# new # begin: one process per stage under torchrun (train_DDP.py's set-up)
device, rank, world_size = common.distributed.setup(device, min_world_size=2)  # stages in 2+ processes
stages = world_size * args.stages_per_rank  # looped: stage s on rank s % p; the V: rank r runs r and 2p - 1 - r
owner = [min(s, stages - 1 - s) if args.schedule == "zbvzerobubble" else s % world_size for s in range(stages)]
master = owner[-1] == rank  # the last stage has the loss: it prints, evaluates, writes metrics and checkpoints
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


# new # begin: the model as blocks that run one after another, cut where --balance makes the stages most even
if isinstance(model, torchvision.models.ResNet):  # ResNet.forward's steps, its residual blocks one by one
    blocks = [model.conv1, model.bn1, model.relu, model.maxpool, *model.layer1, *model.layer2, *model.layer3]
    blocks += [*model.layer4, model.avgpool, nn.Flatten(1), model.fc]  # forward flattens before fc: a layer here
else:  # the small CNN, the MLP and the ViT (embed, block0 ... head) are Sequentials
    blocks = list(model.children())
params = [sum(p.numel() for p in block.parameters()) for block in blocks]
channels, side = common.input_shape(args)
image = torch.randn(1, channels, side, side, generator=torch.Generator().manual_seed(0)).to(device)  # one image
if args.model in common.TEXT_MODELS:  # or one sequence of tokens
    image = torch.randint(0, channels, (1, side), generator=torch.Generator().manual_seed(0)).to(device)
flops, x = [], image
model.eval()  # one image through every block: BatchNorm must not update its running statistics here
for block in blocks:  # with autograd on, as in training (no inference-only fused kernels)
    with common.flop_counter() as counter:  # torch's FlopCounterMode, causal attention as its lower triangle
        x = block(x)
    flops.append(counter.get_total_flops())  # forward FLOPs of one image (a multiply-add counts 2)
if not torch.allclose(x, model(image)):  # a forward that does more than its blocks in a row cannot be cut so
    common.die(f"{args.model}'s blocks, run one after another, do not compute its forward; list them as it runs")
if len(blocks) < stages:
    common.die(f"{args.model} has {len(blocks)} blocks in a row: too few for {stages} stages")
cost = params if args.balance == "params" else flops


def parts(cuts: tuple[int, ...]) -> list[tuple[int, int]]:
    """Each stage's (first block, last block + 1) when the blocks are cut before each index in `cuts`."""
    return list(zip((0, *cuts), (*cuts, len(blocks))))


def heaviest(cuts: tuple[int, ...]) -> float:
    """The cost of the costliest stage: the cut that makes it least is the most even."""
    return max(sum(cost[a:b]) for a, b in parts(cuts))


cuts = min(itertools.combinations(range(1, len(blocks)), stages - 1), key=heaviest)  # every cut, tried
stage_blocks = [blocks[a:b] for a, b in parts(cuts)]
stage_params = [sum(params[a:b]) for a, b in parts(cuts)]
stage_gflops = [sum(flops[a:b]) / 1e9 for a, b in parts(cuts)]
# new # end
if master:  # new # the last stage's rank prints
    for i, (a, b) in enumerate(parts(cuts)):
        print(f"stage {i} on rank {owner[i]}: blocks {a}-{b - 1} of {len(blocks)}, "  # new #
              f"{stage_params[i]:,} parameters, {stage_gflops[i]:.3g} forward GFLOPs per image "
              f"(--balance {args.balance})", flush=True)  # fmt: skip


# new # begin: this rank's stage, and the schedule that runs the micro-batches through all of them
mine = [s for s in range(stages) if owner[s] == rank]  # this rank's stages, in the model's order
stage_module = nn.ModuleList(nn.Sequential(*stage_blocks[s]) for s in mine)  # shares the parameters with `model`
pipe = [PipelineStage(stage_module[i], stage_index=s, num_stages=stages, device=device) for i, s in enumerate(mine)]
# new # end
criterion = nn.CrossEntropyLoss()
# new # begin: each micro-batch's mean loss on the last stage, the summed gradients / m (scale_grads): train.py's
try:  # a single-stage schedule takes the stage, the others the list
    schedule = Schedule(pipe[0] if single else pipe, args.micro_batches, loss_fn=criterion, scale_grads=True)
except ValueError as error:  # torch's own check of the micro-batches against the stages and ranks
    common.die(f"--schedule {args.schedule} with {args.micro_batches} micro-batches: {error}")
# new # end
optimizer = torch.optim.AdamW(stage_module.parameters(), lr=args.lr, weight_decay=5e-4)  # new # this stage's
total_steps = args.epochs * len(train_loader)
if args.max_steps:
    total_steps = min(total_steps, args.max_steps)

start_epoch, step, epochs = 0, 0, []  # epochs: the per-epoch records, which checkpoints keep and a resume restores
checkpoint = args.checkpoint_dir / "last.pt" if args.checkpoint_dir else None
if args.resume and checkpoint.exists():
    state = common.load_checkpoint(checkpoint, args, model, None, device)  # new # the whole model, every rank
    common.load_part(checkpoint, optimizer, state, "stage_optimizers", rank)  # new # this stage's AdamW state
    start_epoch, step, epochs = state["epoch"], state["step"], state["epochs"]
    if master:  # new #
        print(f"resumed from {checkpoint}: {start_epoch} epochs and {step} steps done", flush=True)
    common.exit_if_finished(checkpoint, step, total_steps, master)  # new # every rank exits; the last says so
# one-cycle schedule over this run's steps; on resume it continues at step `step` (last_epoch counts from -1)
scheduler = torch.optim.lr_scheduler.OneCycleLR(optimizer, max_lr=args.lr, total_steps=total_steps, last_epoch=step - 1)
if not master:  # new # the other ranks keep only their stages: the others' memory is freed (meta: shapes only)
    nn.ModuleList(block for s in range(stages) if s not in mine for block in stage_blocks[s]).to("meta")  # new #


# -- training -----------------------------------------------------------------------------------------------------
meter = common.Meter(device, args.warmup_steps, schedule, target=common.target_probe(args, model))  # new # its bubble
preemption = common.Preemption(args.run, master)  # new # SIGTERM: the last rank says where it saved
if master:  # new #
    print(f"training {args.model} on {args.dataset} ({device}), {total_steps} steps of {args.batch_size}", flush=True)
    print(f"pipeline: {type(schedule).__name__}, {args.micro_batches} micro-batches "  # new #
          f"of {args.batch_size // args.micro_batches}", flush=True)  # fmt: skip
for epoch in range(start_epoch, args.epochs):
    model.train()
    meter.resume()
    generator.manual_seed(args.seed + epoch)  # the epoch's order depends on seed and epoch only: a resume repeats it
    done = max(0, step - epoch * len(train_loader))  # steps of this epoch a preempted run took already (else 0)
    loss_sum = torch.zeros((), device=device)  # new # on the last stage: no sync per step
    epoch_steps = 0
    for images, labels in meter.loader(itertools.islice(train_loader, done, None)):  # their batches: loaded, dropped
        if preemption.requested(step):  # SIGTERM: the step in flight is done, the next one does not start
            break
        images, labels = images.to(device, non_blocking=True), labels.to(device, non_blocking=True)  # new #
        optimizer.zero_grad(set_to_none=True)
        losses = []  # new # the last stage's: each micro-batch's mean loss (the first stage reads the images)
        logits = schedule.step(images, target=labels, losses=losses)  # new # None but on the last stage
        loss = torch.stack(losses).mean() if master else None  # new # the micro-batches' mean: the batch's mean
        if args.clip_grad_norm:
            square = sum(p.grad.pow(2).sum() for p in stage_module.parameters() if p.grad is not None)  # new #
            dist.all_reduce(square)  # new # the whole model's squared gradient norm: the stages' summed over ranks
            nn.utils.clip_grads_with_norm_(stage_module.parameters(), args.clip_grad_norm, square.sqrt())  # new #
        optimizer.step()
        scheduler.step()
        step += 1
        epoch_steps += 1
        if master:  # new #
            loss_sum += loss.detach()
        meter.step(images.size(0))
        if master and step % args.log_every == 0:  # new #
            print(f"epoch {epoch + 1} step {step}/{total_steps} loss {loss.item():.4f}, {meter.progress()}", flush=True)
        if step == total_steps:
            break
    meter.pause()  # synchronises: evaluation is not training time
    if preemption.stopped_at is not None:  # preempted: save this step boundary, skip the evaluation
        if checkpoint:
            common.save_stages(checkpoint, args, model, optimizer, epoch, step, epochs, stage_blocks, owner)  # new #
        break

    common.sync_stages(stage_blocks, owner)  # new # the last stage's rank gets every stage: it evaluates
    if master:  # new #
        val_loss, val_acc = common.evaluate(model, test_loader, device)  # new #
        epochs.append(
            common.epoch_record(epoch + 1, step, loss_sum / max(epoch_steps, 1), val_loss, val_acc, meter, logits)
        )
        print(common.epoch_line(epochs[-1]), flush=True)
    if checkpoint:
        common.save_stages(checkpoint, args, model, optimizer, epoch + 1, step, epochs, stage_blocks, owner)  # new #
    if step == total_steps:
        break

# -- metrics: the closing line, and the metrics JSON with its provenance (--metrics-out) ------------------------
summary = common.gather_summary(meter.summary(), same_images=True)  # new # the slowest stage's, every rank's bubble
# new # begin: the bubble's theory with v stages per rank: (p - 1) / (v m + p - 1); a zero-bubble schedule fills it
units = 3 if "zerobubble" in args.schedule else 1  # with weight gradients: F, I and W one unit each, not F and B
theory = (world_size - 1) / (units * args.stages_per_rank * args.micro_batches + world_size - 1)
# new # end
if master:  # new #
    common.report(
        args,
        summary,
        epochs,
        precision=common.precision_label(device),
        device=device,
        global_batch=args.batch_size,  # new # every stage saw the whole batch
                        schedule=args.schedule,  # new #
        bubble_theory=theory,  # new #
        stages_per_rank=args.stages_per_rank,  # new #
        stage_params=stage_params,  # new # parameters per stage
        stage_gflops=stage_gflops,  # new # forward GFLOPs per image per stage
        stage_ranks=owner,  # new # the rank that ran each stage
        params_per_rank=max(sum(stage_params[s] for s in range(stages) if owner[s] == r) for r in set(owner)),  # new #
        steps=step,
        params=sum(p.numel() for p in model.parameters()),  # the model's parameters (all of them)
        test_images=len(test_loader.dataset),  # evaluate() counts every one of them
    )
dist.destroy_process_group()  # new # leave the group cleanly before exiting
preemption.exit()  # after SIGTERM: one line, exit 143 (after a failed checkpoint write: exit 1)
