"""Muon: train.py + the Muon optimizer for the blocks' weight matrices, AdamW for every other parameter.

Muon (Keller Jordan, 2024; torch.optim.Muon) takes SGD with Nesterov momentum and replaces each weight matrix's
update by the nearest orthogonal matrix to it, found by five Newton-Schulz iterations: every direction of the
update moves by the same amount, so the few directions a raw gradient is dominated by no longer crowd out the rest.
It is defined for 2-D matrices: the blocks' q, k, v, output and MLP weights. The embeddings, the head (a lookup and a
classifier, not hidden transforms), the norms and the biases stay on AdamW, as Muon's authors and modded-nanogpt
split them. Each optimizer has its own learning rate (--muon-lr, --lr) and the one-cycle schedule of train.py.
What it buys is fewer steps to a loss, not faster steps: measure it with --target-loss.

    python src/train_muon.py --model gpt                            # the GPT on Shakespeare, Muon for its blocks
    python src/train_muon.py --model gpt --target-loss 1.70          # steps and seconds to 1.70 nats per character
    python src/train_muon.py --model vit --epochs 2                   # the small ViT on Fashion-MNIST
    diff src/train.py src/train_muon.py                               # only the lines marked `# new #`

More: docs/techniques/train_muon.md
"""

import itertools

import torch
import torch.nn as nn
from torch.utils.data import DataLoader

import common

parser = common.get_parser(__doc__)
parser.add_argument(  # new #
    "--muon-lr", type=float, default=None, help="Muon's peak learning rate (default per model: vit 0.01, the GPTs 0.02)"
)
args = common.parse_args(parser)
if args.model not in ("gpt", "gpt2", "vit"):  # new # Muon's matrices: a transformer's blocks
    parser.error(f"train_muon.py orthogonalizes 2-D block weights: --model gpt, gpt2 or vit, not {args.model}")  # new #
if args.muon_lr is None:  # new # the values that led the sweeps (docs/techniques/train_muon.md)
    args.muon_lr = 0.01 if args.model == "vit" else 0.02  # new #
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
criterion = nn.CrossEntropyLoss()
# new # begin: the blocks' 2-D weights to Muon; embeddings, head, norms and biases to AdamW
matrices = [p for block in model.blocks for p in block.parameters() if p.ndim == 2]
in_muon = {id(p) for p in matrices}
# torch.optim.Muon's Newton-Schulz runs in bfloat16, always: half float32's cost where the hardware has it, many times
# float32's where a CPU emulates it (no AVX512-BF16 or AMX). common.Muon is torch's, in the precision this device runs
ns_dtype = torch.bfloat16 if common.native_bfloat16(device) else torch.float32
print(f"Muon: Newton-Schulz in {ns_dtype}, native on this {device.type}", flush=True)
muon = common.Muon(matrices, lr=args.muon_lr, momentum=0.95, nesterov=True, weight_decay=5e-4, ns_dtype=ns_dtype)
# new # end
optimizer = torch.optim.AdamW(  # new # AdamW for the rest only
    [p for p in model.parameters() if id(p) not in in_muon], lr=args.lr, weight_decay=5e-4
)
total_steps = args.epochs * len(train_loader)
if args.max_steps:
    total_steps = min(total_steps, args.max_steps)

start_epoch, step, epochs = 0, 0, []  # epochs: the per-epoch records, which checkpoints keep and a resume restores
checkpoint = args.checkpoint_dir / "last.pt" if args.checkpoint_dir else None
if args.resume and checkpoint.exists():
    state = common.load_checkpoint(checkpoint, args, model, optimizer, device, muon=muon)  # new # + Muon's momentum
    start_epoch, step, epochs = state["epoch"], state["step"], state["epochs"]
    print(f"resumed from {checkpoint}: {start_epoch} epochs and {step} steps done", flush=True)
    common.exit_if_finished(checkpoint, step, total_steps)  # re-running a finished run: one line, exit 0
# one-cycle schedule over this run's steps; on resume it continues at step `step` (last_epoch counts from -1)
scheduler = torch.optim.lr_scheduler.OneCycleLR(optimizer, max_lr=args.lr, total_steps=total_steps, last_epoch=step - 1)
muon_scheduler = torch.optim.lr_scheduler.OneCycleLR(  # new # the same schedule around Muon's peak; its momentum
    muon,
    max_lr=args.muon_lr,
    total_steps=total_steps,
    last_epoch=step - 1,
    cycle_momentum=False,  # new # stays 0.95
)

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
        model.zero_grad(set_to_none=True)  # new # both optimizers' parameters
        loss.backward()
        if args.clip_grad_norm:
            nn.utils.clip_grad_norm_(model.parameters(), args.clip_grad_norm)
        optimizer.step()
        muon.step()  # new # momentum, then its orthogonalized update, for the matrices
        scheduler.step()
        muon_scheduler.step()  # new #
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
            common.save_checkpoint(checkpoint, args, model, optimizer, epoch, step, epochs, muon=muon)  # new # + Muon
        break

    val_loss, val_acc = common.evaluate(model, test_loader, device)
    epochs.append(
        common.epoch_record(epoch + 1, step, loss_sum / max(epoch_steps, 1), val_loss, val_acc, meter, logits)
    )
    print(common.epoch_line(epochs[-1]), flush=True)
    if checkpoint:
        common.save_checkpoint(checkpoint, args, model, optimizer, epoch + 1, step, epochs, muon=muon)  # new # + Muon
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
    steps=step,
    params=sum(p.numel() for p in model.parameters()),  # the model's parameters (all of them)
    test_images=len(test_loader.dataset),  # evaluate() counts every one of them
    muon_ns_dtype=str(ns_dtype).removeprefix("torch."),  # new # the precision of Newton-Schulz
)
if args.model in common.TEXT_MODELS and args.sample_chars and preemption.stopped_at is None:  # what the GPT learned
    sample = common.generate(model, device, args.sample_chars, context=args.seq_len)
    print(f"generated after a fixed prompt:\n{sample}", flush=True)
preemption.exit()  # after SIGTERM: one line, exit 143 (after a failed checkpoint write: exit 1)
