"""Pipeline parallelism: train_model_parallel.py + each stage in its own process, scheduled by torch.distributed.pipelining.

train_model_parallel.py cuts the model in two stages and runs both from one process; here each stage is a process
of its own (one per GPU, or 2 sharing a CPU's cores with gloo), started by torchrun, and
`torch.distributed.pipelining` moves the micro-batches' activations forward and their gradients backward between them
(point-to-point sends). Every rank builds the whole model from the same seed and finds the same cut (--balance, as the
base does); it trains its stage (its weights, gradients and AdamW state: `params_per_rank` counts the larger stage),
a `PipelineStage` over the stage's blocks driven by a schedule over --micro-batches pieces of each batch. The first
rank then drops the other stage's blocks (to the meta device); the last rank keeps a copy of the first stage's
weights, refreshed for evaluation and last.pt (a model too large for one device would build only its stage). GPipe
(--schedule gpipe) runs every micro-batch's forward, then every backward: each stage keeps the activations of all
m micro-batches. 1F1B (--schedule 1f1b) starts the backward of micro-batch i as soon as the last stage has its loss
and then alternates one forward and one backward: a stage keeps at most p micro-batches' activations (p stages),
for the same bubble (activation_mib counts the storages saved in the first step, reused addresses once, so it is not
that peak and does not show the difference). The bubble: at the start a stage waits for its first input, at the end for its last gradient;
in theory each stage is idle (p - 1) / (m + p - 1) of a step (GPipe, Huang et al. 2019), so more micro-batches mean
a smaller bubble but smaller, less efficient matmuls. The script measures it: forward and backward hooks time what
each stage computes in a step (a backward from its output's gradient to the last gradient it accumulates), and one
minus that over the step's time is the stage's measured idle share (bubble_measured, per rank, beside
bubble_theory in the metrics). On CUDA each hook synchronises the device (kernels run asynchronously), which
serialises what it times: there the bubble and images/s are those of a slowed schedule. The loss is a mean per micro-batch, and the schedule divides the summed gradients by
m (scale_grads=True), so a step trains what train.py's step on the whole batch trains (tests/test_equivalence.py).
Clipping adds the stages' squared gradient norms over the ranks (an all-reduce), as the whole model's norm. The last
stage reports (it has the loss) and says where a SIGTERM left the run; for evaluation and last.pt the first stage
sends its weights to it: it evaluates the whole model on the test set and writes last.pt, whose "model" loads into
train.py's model
(schedule.eval would need test batches split like the training batch: a stage fixes its buffers' shapes at its first
step). Two stages: the base's cut; more would need a p-way cut. Needs torch >= 2.15 (tested on it: pipelining on gloo,
whose batch_isend_irecv hang was fixed in pytorch/pytorch#152938).

    torchrun --nproc-per-node 2 src/train_pipeline.py --device cpu --model vit --micro-batches 4   # 2 processes, gloo
    torchrun --nproc-per-node 2 src/train_pipeline.py --device cpu --model vit --schedule 1f1b --micro-batches 8
    torchrun --nproc-per-node 2 src/train_pipeline.py --model resnet50 --dataset synthetic --batch-size 256 --max-steps 50
    diff src/train_model_parallel.py src/train_pipeline.py                     # only the lines marked `# new #`
"""

import itertools
import os  # new #
import statistics  # new #
import time  # new #

import torch
import torch.distributed as dist  # new #
import torch.nn as nn
import torchvision  # new #
from torch.distributed.pipelining import PipelineStage, Schedule1F1B, ScheduleGPipe  # new #
from torch.utils.data import DataLoader
from torch.utils.flop_counter import FlopCounterMode  # new #

import common

parser = common.get_parser(__doc__)
parser.add_argument(  # new #
    "--micro-batches", type=common.positive_int, default=4, help="pieces each batch is cut into for the pipeline"
)
parser.add_argument(  # new #
    "--balance",
    choices=["params", "flops"],
    default="params",
    help="cut where the stages' parameters (memory) or forward FLOPs (time) are most even",
)
parser.add_argument(  # new #
    "--schedule", choices=["gpipe", "1f1b"], default="gpipe", help="all forwards then all backwards, or interleaved"
)
args = common.parse_args(parser)
if args.batch_size % args.micro_batches:  # new #
    parser.error(f"--micro-batches {args.micro_batches} must divide --batch-size {args.batch_size}")  # new #
common.env.require_torch("2.15", "train_pipeline.py (torch.distributed.pipelining on gloo)")  # new #
# new # begin: torchrun starts one process per stage
if "LOCAL_RANK" not in os.environ:
    common.die("launch with torchrun: `torchrun --nproc-per-node 2 src/train_pipeline.py --device cpu --model vit`")
local_rank, rank, world_size = int(os.environ["LOCAL_RANK"]), int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
if world_size != 2:
    common.die(f"train_pipeline.py runs 2 stages, one per process: --nproc-per-node 2, not {world_size} processes")
if args.schedule == "1f1b" and args.micro_batches < world_size:
    parser.error(f"--schedule 1f1b needs at least {world_size} micro-batches (one per stage), not {args.micro_batches}")
first, last = rank == 0, rank == world_size - 1  # the first stage gets the images, the last the labels
master = last  # the last stage has the loss: it prints, evaluates, writes metrics and checkpoints
# new # end
generator = common.seed_everything(args.seed, args.deterministic)
device = common.get_device(args.device)
# new # begin: one device per stage, then the process group
if device.type == "cuda":
    if local_rank >= torch.cuda.device_count():
        common.die(f"local rank {local_rank} has no GPU: {torch.cuda.device_count()} visible; lower --nproc-per-node")
    device = torch.device("cuda", local_rank)
    torch.cuda.set_device(device)  # before the process group, so NCCL binds this GPU and not GPU 0
else:
    torch.set_num_threads(max(1, os.cpu_count() // int(os.environ.get("LOCAL_WORLD_SIZE", "1"))))  # share the cores
dist.init_process_group("nccl" if device.type == "cuda" else "gloo")  # rendezvous through MASTER_ADDR/MASTER_PORT
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
        worker_init_fn=common.seed_worker,
    )
    test_loader = DataLoader(test_set, batch_size=1000)

# -- model, loss, optimizer, and the state of an earlier run to resume -------------------------------------------
model = common.build_model(args.model, *common.input_shape(args)).to(device)


# new # begin: the model as blocks that run one after another, cut where --balance makes the two stages most even
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
    with FlopCounterMode(display=False) as counter:
        x = block(x)
    flops.append(counter.get_total_flops())  # forward FLOPs of one image (a multiply-add counts 2)
if not torch.allclose(x, model(image)):  # a forward that does more than its blocks in a row cannot be cut so
    common.die(f"{args.model}'s blocks, run one after another, do not compute its forward; list them as it runs")
cost = params if args.balance == "params" else flops
cut = min(range(1, len(blocks)), key=lambda i: max(sum(cost[:i]), sum(cost[i:])))
stage_blocks = [blocks[:cut], blocks[cut:]]  # every rank knows both stages; it trains its own
stage_params = [sum(params[:cut]), sum(params[cut:])]
stage_gflops = [sum(flops[:cut]) / 1e9, sum(flops[cut:]) / 1e9]
# new # end
if master:  # new #
    for i, (first_block, last_block) in enumerate([(0, cut - 1), (cut, len(blocks) - 1)]):  # new #
        print(
            f"stage {i} on rank {i}: blocks {first_block}-{last_block} of {len(blocks)}, {stage_params[i]:,} "  # new #
            f"parameters, {stage_gflops[i]:.3g} forward GFLOPs per image (--balance {args.balance})",  # new #
            flush=True,
        )


# new # begin: this rank's stage, and the schedule that runs the micro-batches through all of them
model.train()
stage_module = nn.Sequential(*stage_blocks[rank])  # shares the blocks' parameters with `model`
stage = PipelineStage(stage_module, stage_index=rank, num_stages=world_size, device=device)


def sync_whole_model() -> None:  # the first stage broadcasts its weights and buffers: the last rank has them all
    for owner, owned in enumerate(stage_blocks[:-1]):
        for block in owned:
            for tensor in block.state_dict().values():  # they share storage with the block's own tensors
                dist.broadcast(tensor, src=owner)


class StageClock:
    """Seconds this stage computes in a step: each forward between its module's pre- and post-hooks; each backward
    from its output's gradient (the first thing it computes) to the last gradient accumulated into a parameter. On
    CUDA every hook synchronises the device (kernels run asynchronously), which serialises the work it times."""

    def __init__(self, module: nn.Module):
        self.busy, self.start, self.end = 0.0, None, None
        module.register_forward_pre_hook(lambda *_: self.begin())
        module.register_forward_hook(self.forward_done)
        for p in module.parameters():
            p.register_post_accumulate_grad_hook(lambda _: setattr(self, "end", self.now()))

    def now(self) -> float:
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        return time.perf_counter()

    def begin(self, *_) -> None:  # a forward or a backward starts: the backward before it ended at its last gradient
        if self.start is not None and self.end is not None:
            self.busy += self.end - self.start
        self.start, self.end = self.now(), None

    def forward_done(self, module, inputs, output) -> None:
        self.busy += self.now() - self.start
        self.start = None
        if output.requires_grad:  # its gradient arrives when this stage's backward of the micro-batch starts
            output.register_hook(self.begin)

    def step_busy(self) -> float:  # the step's compute seconds; the clock starts again at 0
        self.begin()
        busy, self.busy, self.start = self.busy, 0.0, None
        return busy


clock = StageClock(stage_module)
idle = []  # per step: 1 - compute / the step's time, on this stage
# new # end
criterion = nn.CrossEntropyLoss()
# new # begin: the schedule computes each micro-batch's loss (its mean) on the last stage and divides the summed
# gradients by m (scale_grads): the gradient of the batch's mean loss, as train.py's
Schedule = ScheduleGPipe if args.schedule == "gpipe" else Schedule1F1B
schedule = Schedule(stage, n_microbatches=args.micro_batches, loss_fn=criterion, scale_grads=True)
# new # end
optimizer = torch.optim.AdamW(stage_module.parameters(), lr=args.lr, weight_decay=5e-4)  # new # this stage's
total_steps = args.epochs * len(train_loader)
if args.max_steps:
    total_steps = min(total_steps, args.max_steps)

start_epoch, step = 0, 0
checkpoint = args.checkpoint_dir / "last.pt" if args.checkpoint_dir else None
if args.resume and checkpoint.exists():
    state = common.load_checkpoint(checkpoint, args, model, None, device)  # new # the whole model, every rank
    # new # this stage's AdamW state: one line, not a traceback, when it does not fit (a damaged file)
    common.load_part(checkpoint, optimizer, state, "stage_optimizers", rank)  # new #
    start_epoch, step = state["epoch"], state["step"]
    if master:  # new #
        print(f"resumed from {checkpoint}: {start_epoch} epochs and {step} steps done", flush=True)
    common.exit_if_finished(checkpoint, step, total_steps, master)  # new # every rank exits; the last says so
# one-cycle schedule over this run's steps; on resume it continues at step `step` (last_epoch counts from -1)
scheduler = torch.optim.lr_scheduler.OneCycleLR(optimizer, max_lr=args.lr, total_steps=total_steps, last_epoch=step - 1)
if not master:  # new # the first rank keeps only its stage: the other blocks' memory is freed (meta: shapes only)
    for block in stage_blocks[1]:  # new #
        block.to("meta")  # new #
if master:  # new #
    micro = args.batch_size // args.micro_batches  # new #
    print(f"pipeline: {type(schedule).__name__}, {args.micro_batches} micro-batches of {micro}", flush=True)  # new #


def save_whole(epochs_done: int) -> None:  # new # collectives: every rank calls it, the last one writes
    sync_whole_model()  # new #
    stage_optimizers = [None] * world_size  # new # each stage's AdamW state, by rank
    dist.all_gather_object(stage_optimizers, optimizer.state_dict())  # new #
    if master:  # new #
        common.save_checkpoint(  # new #
            checkpoint,
            args,
            model,
            None,
            epochs_done,
            step,
            stage_optimizers=stage_optimizers,  # new #
        )  # new #


# -- training -----------------------------------------------------------------------------------------------------
meter = common.Meter(device, args.warmup_steps)  # new # this process's device
preemption = common.Preemption(master)  # new # SIGTERM: stop at the step boundary; the last rank says where it saved
epochs = []
if master:  # new #
    print(f"training {args.model} on {args.dataset} ({device}), {total_steps} steps of {args.batch_size}", flush=True)
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
        # new # the gradients are zeroed before the schedule: it runs the backward passes
        optimizer.zero_grad(set_to_none=True)
        # new # begin: the first stage feeds the images, the last gets the labels and returns the logits and losses
        started, losses = clock.now(), []
        if first:
            schedule.step(images.to(device, non_blocking=True))
        else:
            logits = schedule.step(target=labels.to(device, non_blocking=True), losses=losses)
            loss = torch.stack(losses).mean()  # the micro-batches' mean losses: the batch's mean
        idle.append(1 - clock.step_busy() / (clock.now() - started))
        # new # end
        if args.clip_grad_norm:
            # new # begin: the whole model's gradient norm: the stages' squared norms summed over the ranks
            square = sum(p.grad.pow(2).sum() for p in stage_module.parameters() if p.grad is not None)
            dist.all_reduce(square)
            nn.utils.clip_grads_with_norm_(stage_module.parameters(), args.clip_grad_norm, square.sqrt())
            # new # end
        optimizer.step()
        scheduler.step()
        step += 1
        epoch_steps += 1
        if last:  # new #
            loss_sum += loss.detach()
        meter.step(images.size(0))
        if master and step % args.log_every == 0:  # new #
            print(f"epoch {epoch + 1} step {step}/{total_steps} loss {loss.item():.4f}, {meter.progress()}", flush=True)
        if step == total_steps:
            break
    meter.pause()  # synchronises: evaluation is not training time
    if preemption.stopped_at is not None:  # preempted: save this step boundary, skip the evaluation
        if checkpoint:
            save_whole(epoch)  # new # `epoch` epochs finished
        break

    sync_whole_model()  # new # the last rank evaluates the whole model
    if master:  # new #
        val_loss, val_acc = common.evaluate(model, test_loader, device)  # new #
        epochs.append(
            common.epoch_record(epoch + 1, step, loss_sum / max(epoch_steps, 1), val_loss, val_acc, meter, logits)
        )
        print(common.epoch_line(epochs[-1]), flush=True)
    model.train()  # new # evaluate() left the shared blocks in eval mode
    if checkpoint:
        save_whole(epoch + 1)  # new #
    if step == total_steps:
        break

# -- metrics: the closing line, and the metrics JSON with its provenance (--metrics-out) ------------------------
summary = common.gather_summary(meter.summary())  # new # peak memory the max over ranks
rates = summary["images_per_s_per_rank"]  # new # every stage saw every image: the slowest rate is the model's
summary["images_per_s"] = min(rates) if None not in rates else None  # new # not their sum
# new # begin: the bubble, measured after the warm-up on every stage, against (p - 1) / (m + p - 1)
bubble = [None] * world_size
dist.all_gather_object(bubble, statistics.median(idle[args.warmup_steps :] or idle) if idle else None)
flops_per_image = [None] * world_size  # each stage counted its own: the whole model's is their sum
dist.all_gather_object(flops_per_image, summary["flops_per_image"])
summary["flops_per_image"] = sum(flops_per_image) if None not in flops_per_image else None
# new # end
if master:  # new #
    common.report(
        args,
        summary,
        epochs,
        precision=common.precision_label(device),
        device=device,
        world_size=world_size,  # new #
        global_batch=args.batch_size,  # new # every stage saw the whole batch
        gpus=world_size if device.type == "cuda" else 0,  # new # one GPU per stage
        micro_batches=args.micro_batches,  # new #
        balance=args.balance,  # new #
        schedule=args.schedule,  # new #
        bubble_measured=bubble,  # new # per stage: idle share of a step (median over steps)
        bubble_theory=(world_size - 1) / (args.micro_batches + world_size - 1),  # new #
        stage_params=stage_params,  # new # parameters per stage
        stage_gflops=stage_gflops,  # new # forward GFLOPs per image per stage
        params_per_rank=max(stage_params),  # new # what the larger stage's process trains
        steps=step,
        params=sum(p.numel() for p in model.parameters()),  # the model's parameters (all of them)
        test_images=len(test_loader.dataset),  # evaluate() counts every one of them
    )
dist.destroy_process_group()  # new # leave the group cleanly before exiting
preemption.exit()  # after SIGTERM: one line, exit 143 (after a failed checkpoint write: exit 1)
