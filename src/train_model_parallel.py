"""Model parallelism: train.py + the model cut into two stages on two devices, micro-batches pipelined through them.

The model's first blocks on cuda:0 and the rest on cuda:1, cut where --balance makes the stages even (`params`,
for memory, or `flops`, for speed); each batch runs as --micro-batches pieces pipelined through the stages (GPipe).
With fewer than 2 GPUs both stages run on one device (said in one line): the same code, no overlap.

    python src/train_model_parallel.py --micro-batches 4                    # cuda:0 + cuda:1, or one device
    python src/train_model_parallel.py --model resnet50 --dataset synthetic --batch-size 256 --micro-batches 8
    python src/train_model_parallel.py --model resnet18 --balance flops    # stages of equal compute, for speed
    diff src/train.py src/train_model_parallel.py                           # only the lines marked `# new #`

More: docs/techniques/train_model_parallel.md
"""

import itertools

import torch
import torch.nn as nn
import torchvision  # new #
from torch.utils.data import DataLoader

import common

parser = common.get_parser(__doc__)
parser.add_argument(  # new #
    "--micro-batches", type=common.positive_int, default=4, help="pieces each batch is cut into for the pipeline"
)
parser.add_argument(  # new #
    "--balance", choices=["params", "flops"], default="params", help="stages of even memory (params) or time (flops)"
)
args = common.parse_args(parser)
if args.batch_size % args.micro_batches:  # new #
    parser.error(f"--micro-batches {args.micro_batches} must divide --batch-size {args.batch_size}")  # new #
generator = common.seed_everything(args.seed, args.deterministic)
device = common.get_device(args.device)
# new # begin: one device per stage; with fewer than 2 GPUs both stages share one (and say so)
if device.type == "cuda" and torch.cuda.device_count() >= 2:
    devices = [torch.device("cuda", 0), torch.device("cuda", 1)]
else:
    devices = [device, device]
    print(f"model parallelism needs 2 GPUs, {torch.cuda.device_count()} visible: both stages on {device}", flush=True)
stages = len(devices)
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
for i, (a, b) in enumerate(parts(cuts)):
    print(f"stage {i} on {devices[i]}: blocks {a}-{b - 1} of {len(blocks)}, "
          f"{stage_params[i]:,} parameters, {stage_gflops[i]:.3g} forward GFLOPs per image "
          f"(--balance {args.balance})", flush=True)  # fmt: skip


class Pipeline(nn.Module):
    """The two stages as one module: (N, C, H, W) on devices[0] -> (N, classes) logits on devices[1]."""

    def __init__(self, stages, micro_batches: int):
        super().__init__()
        self.stages, self.micro_batches = nn.ModuleList(stages), micro_batches

    def forward(self, images):
        chunks = iter(images.split(images.size(0) // self.micro_batches))
        outputs, moved = [], self.stages[0](next(chunks)).to(devices[1])  # the first micro-batch fills the pipeline
        for chunk in chunks:
            outputs.append(self.stages[1](moved))  # stage 1 on micro-batch i (queued on devices[1]) ...
            moved = self.stages[0](chunk).to(devices[1])  # ... while stage 0 runs micro-batch i + 1 on devices[0]
        outputs.append(self.stages[1](moved))
        return torch.cat(outputs)


on_devices = [nn.Sequential(*part).to(d) for part, d in zip(stage_blocks, devices)]  # stage i on devices[i]
pipeline = Pipeline(on_devices, args.micro_batches)  # `model` keeps its own keys: checkpoints load into train.py
# new # end
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
meter = common.Meter(devices, args.warmup_steps, target=common.target_probe(args, model))  # new # both stages' devices
preemption = common.Preemption(args.run)  # SIGTERM: stop at the next step boundary, save, exit 143
print(f"training {args.model} on {args.dataset} ({device}), {total_steps} steps of {args.batch_size}", flush=True)
for epoch in range(start_epoch, args.epochs):
    model.train()
    meter.resume()
    generator.manual_seed(args.seed + epoch)  # the epoch's order depends on seed and epoch only: a resume repeats it
    done = max(0, step - epoch * len(train_loader))  # steps of this epoch a preempted run took already (else 0)
    loss_sum = torch.zeros((), device=devices[1])  # new # summed where the loss is: no sync per step
    epoch_steps = 0
    for images, labels in meter.loader(itertools.islice(train_loader, done, None)):  # their batches: loaded, dropped
        if preemption.requested(step):  # SIGTERM: the step in flight is done, the next one does not start
            break
        images = images.to(devices[0], non_blocking=True)  # new # the first stage's device
        labels = labels.to(devices[1], non_blocking=True)  # new # where the logits come out
        logits = pipeline(images)  # new #
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

    val_loss, val_acc = common.evaluate(pipeline, test_loader, devices[0])  # new #
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
    gpus=len(set(devices)) if device.type == "cuda" else 0,  # new #
            stage_params=stage_params,  # new # parameters per stage
    stage_gflops=stage_gflops,  # new # forward GFLOPs per image per stage
    stages=[str(d) for d in devices],  # new #
    steps=step,
    params=sum(p.numel() for p in model.parameters()),  # the model's parameters (all of them)
    test_images=len(test_loader.dataset),  # evaluate() counts every one of them
)
if args.model in common.TEXT_MODELS and args.sample_chars and preemption.stopped_at is None:  # what the GPT learned
    sample = common.generate(model, device, args.sample_chars, context=args.seq_len)
    print(f"generated after a fixed prompt:\n{sample}", flush=True)
preemption.exit()  # after SIGTERM: one line, exit 143 (after a failed checkpoint write: exit 1)
