"""Selective activation checkpointing: train_activation_checkpointing.py + keep what the matmuls return.

Full checkpointing recomputes a block whole: its matmuls, nearly all of its FLOPs, and the cheap ops between them
(LayerNorm, GELU, the adds), whose outputs are much of what it keeps. Selective AC (SAC) decides per op: what the
matmuls, convolutions and attention return is kept, only the cheap ops run again in backward. It saves less memory
than full AC and recomputes no matmul. Needs torch >= 2.15.

    python src/train_selective_AC.py --model gpt                                      # 3 of the GPT's 4 blocks
    python src/train_selective_AC.py --model resnet18 --recompute-every 2
    python src/train_selective_AC.py --model gpt2 --dataset synthetic --batch-size 16 --device cuda   # GPU
    diff src/train_activation_checkpointing.py src/train_selective_AC.py            # only the lines marked `# new #`

More: docs/techniques/train_selective_AC.md
"""

import contextlib  # new #
import functools  # new #
import itertools

import torch
import torch.nn as nn
import torch.utils.checkpoint  # new # (not `from ... import checkpoint`: train.py's `checkpoint` is the last.pt path)
import torchvision  # new #
from torch.utils.data import DataLoader

import common

parser = common.get_parser(__doc__)
parser.add_argument(  # new #
    "--recompute-every", type=common.positive_int, default=1, help="checkpoint every N-th block (never the last one)"
)
args = common.parse_args(parser)
# new # begin: torch >= 2.15, whose checkpoint shows what SAC keeps to saved-tensor hooks (the meter, save_on_cpu)
common.env.require_torch("2.15", "selective activation checkpointing (checkpoint's respect_saved_tensors_hooks)")
# new # end
generator = common.seed_everything(args.seed, args.deterministic)
device = common.get_device(args.device)

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
# new # begin: selective AC: in a checkpointed block, what these ops return is kept for backward and served to the
# recompute, so only the cheap ops between them run again (torchtitan's op-level selective AC keeps mm and SDPA
# outputs but every second mm's); each op named with its overload (.default): the list refuses a bare aten.mm
KEPT_OPS = [
    torch.ops.aten.mm.default,  # nn.Linear without bias
    torch.ops.aten.addmm.default,  # nn.Linear with bias (its input flattened to 2-D)
    torch.ops.aten.bmm.default,
    torch.ops.aten.convolution.default,
    torch.ops.aten._scaled_dot_product_flash_attention_for_cpu.default,  # SDPA's kernels, by backend
    torch.ops.aten._scaled_dot_product_flash_attention.default,
    torch.ops.aten._scaled_dot_product_efficient_attention.default,
    torch.ops.aten._scaled_dot_product_cudnn_attention.default,
]
# new # end
# new # begin: the blocks whose activations are recomputed in backward instead of kept


@contextlib.contextmanager
def recomputing(block, replay):  # new #
    """Around a block's recompute in backward: its buffers (BatchNorm's running statistics) put back as they were
    before it, so BatchNorm updates them once a step, as without checkpointing, not twice."""
    saved = [(buffer, buffer.clone()) for buffer in block.buffers()]
    try:
        with replay:  # new # SAC's mode that serves the kept outputs
            yield
    finally:
        for buffer, value in saved:
            buffer.copy_(value)


def recompute_contexts(block):
    """checkpoint's context_fn, called at each checkpointed call: (around the forward, around the recompute)."""
    forward, replay = torch.utils.checkpoint.create_selective_checkpoint_contexts(KEPT_OPS)  # new # fresh each call
    return forward, recomputing(block, replay)  # new #


if isinstance(model, (common.ViT, common.GPT)):
    blocks = model.blocks  # EncoderBlock: attention + MLP, (N, tokens, width) in and out
elif isinstance(model, torchvision.models.ResNet):
    blocks = [*model.layer1, *model.layer2, *model.layer3, *model.layer4]  # the residual blocks
else:
    blocks = []
    print(f"{args.model} has no repeated blocks to checkpoint: it trains as train.py does", flush=True)
checkpointed = blocks[:-1][:: args.recompute_every]  # never the last block: recomputing it saves nothing
for block in checkpointed:  # block(x) now calls checkpoint(original forward, x); the state dict keeps its keys
    block.forward = functools.partial(
        torch.utils.checkpoint.checkpoint,
        block.forward,
        use_reentrant=False,  # the non-reentrant implementation: works under DDP, keeps every gradient
        context_fn=functools.partial(recompute_contexts, block),
        respect_saved_tensors_hooks=True,  # new # the meter (and save_on_cpu) see what SAC keeps
    )
which = ", ".join(str(i) for i, block in enumerate(blocks) if block in checkpointed)  # the blocks by position
print(f"activation checkpointing (selective): {len(checkpointed)} of {len(blocks)} blocks ({which})", flush=True)
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
meter = common.Meter(device, args.warmup_steps, target=common.target_probe(args, model))
preemption = common.Preemption(args.run)  # SIGTERM: stop at the next step boundary, save, exit 143
print(f"training {args.model} on {args.dataset} ({device}), {total_steps} steps of {args.batch_size}", flush=True)
for epoch in range(start_epoch, args.epochs):
    model.train()
    meter.resume()
    generator.manual_seed(args.seed + epoch)  # the epoch's order depends on seed and epoch only: a resume repeats it
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
        if step % args.log_every == 0:  # .item() waits for the device: once every --log-every steps only
            print(f"epoch {epoch + 1} step {step}/{total_steps} loss {loss.item():.4f}, {meter.progress()}", flush=True)
        if step == total_steps:
            break
    meter.pause()  # synchronises: evaluation is not training time
    if preemption.stopped_at is not None:  # preempted: save this step boundary, skip the evaluation
        if checkpoint:
            common.save_checkpoint(checkpoint, args, model, optimizer, epoch, step, epochs)  # `epoch` epochs finished
        break

    val_loss, val_acc = common.evaluate(model, test_loader, device)
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
    checkpointed_blocks=len(checkpointed),  # new #
    ac_mode="selective",  # new # matmul, convolution and attention outputs kept
    steps=step,
    params=sum(p.numel() for p in model.parameters()),  # the model's parameters (all of them)
    test_images=len(test_loader.dataset),  # evaluate() counts every one of them
)
if args.model in common.TEXT_MODELS and args.sample_chars and preemption.stopped_at is None:  # what the GPT learned
    sample = common.generate(model, device, args.sample_chars, context=args.seq_len)
    print(f"generated after a fixed prompt:\n{sample}", flush=True)
preemption.exit()  # after SIGTERM: one line, exit 143 (after a failed checkpoint write: exit 1)
