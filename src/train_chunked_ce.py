r"""Chunked cross-entropy: train.py + the head and the loss over chunks of tokens, the logits never held whole.

A language model's last Linear maps every token's hidden vector (width d) to a score per vocabulary entry (V): GPT-2's
head on 8 x 1,024 tokens makes 8,192 x 50,257 float32 logits, 1.6 GB; training keeps them, the loss's log-softmax
(saved for backward) as large, and their gradient in backward: about 4.9 GB, more than GPT-2 small's weights,
gradients and AdamW's moments (124 M parameters: 2.0 GB). Here the head (`model.head.fc`) and the loss run over
`--ce-chunk` tokens at a time: each chunk's logits exist only while its loss is taken, and torch.utils.checkpoint
recomputes them, one chunk at a time, in backward (the head's matmul runs twice: a third more of its FLOPs). The loss
is the same mean over the batch's targets: each chunk's summed loss divided by the count of targets of the whole
batch (a token whose target is -100, nn.CrossEntropyLoss's ignore_index, counts in neither), so every gradient equals
train.py's up to float rounding. Liger-Kernel's fused linear cross-entropy (a Triton kernel, GPU) computes each
chunk's gradients in the forward instead, while its logits exist, and recomputes nothing. The tokens stay
characters: --vocab-size 50257 gives the head and the loss GPT-2's size, which is where the memory goes (and
--test-subset keeps the evaluation's logits, 1,000 blocks a batch, from taking as much).

    python src/train_chunked_ce.py --model gpt                      # the GPT on Shakespeare, 84 characters
    python src/train_chunked_ce.py --model gpt2 --vocab-size 50257 --seq-len 256 --batch-size 4 --max-steps 8 \
        --test-subset 8
    python src/train.py --model gpt2 --vocab-size 50257 --seq-len 256 --batch-size 4 --max-steps 8 --test-subset 8
    diff src/train.py src/train_chunked_ce.py                       # only the lines marked `# new #`

More: docs/techniques/train_chunked_ce.md
"""

import itertools

import torch
import torch.nn as nn
import torch.utils.checkpoint  # new #
from torch.utils.data import DataLoader

import common

parser = common.get_parser(__doc__)
parser.add_argument(  # new #
    "--ce-chunk", type=common.positive_int, default=1024, help="tokens whose logits exist at once (default 1024)"
)
args = common.parse_args(parser)
if args.model not in common.TEXT_MODELS:  # new # a vocabulary's head: a language model's
    parser.error(f"train_chunked_ce.py chunks a vocabulary's head: a GPT (--model gpt), not {args.model}")  # new #
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
body = nn.Sequential(*list(model)[:-1])  # new # the same modules but the head: (N, T) tokens -> (N, T, d)
# new # no criterion: chunked_cross_entropy below takes the loss, chunk by chunk


# new # begin the loss over chunks of tokens: one chunk's logits at a time, forward and backward
def chunked_cross_entropy(hidden, fc, targets, chunk):
    """nn.CrossEntropyLoss()(fc(hidden), targets) without its (N T, V) logits: hidden (N, T, d) float, fc the head's
    Linear (d -> V), targets (N, T) int64 (-100: ignored). Each chunk's summed loss is checkpointed: backward
    recomputes its logits, so at most one chunk's (chunk, V) logits and their gradient exist at once."""
    hidden, targets = hidden.flatten(0, 1), targets.flatten()  # (N T, d), (N T,)

    def summed_loss(h, y):  # one chunk: its (chunk, V) logits, then their summed loss
        return nn.functional.cross_entropy(fc(h), y, reduction="sum")

    total = hidden.new_zeros((), dtype=torch.float32)
    for h, y in zip(hidden.split(chunk), targets.split(chunk)):  # backward recomputes each chunk's logits
        total = total + torch.utils.checkpoint.checkpoint(
            summed_loss, h, y, use_reentrant=False, preserve_rng_state=False
        )
    return total / (targets != -100).sum()  # the mean over the batch's targets, as train.py's loss takes it


# new # end
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
        hidden = model.head.norm(body(images))  # new # the final norm's output: (N, T, d)
        loss = chunked_cross_entropy(hidden, model.head.fc, labels, args.ce_chunk)  # new # no (N, V, T) logits
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
        common.epoch_record(epoch + 1, step, loss_sum / max(epoch_steps, 1), val_loss, val_acc, meter, hidden)  # new #
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
    steps=step,
    params=sum(p.numel() for p in model.parameters()),  # the model's parameters (all of them)
    test_images=len(test_loader.dataset),  # evaluate() counts every one of them
    ce_chunk=args.ce_chunk,  # new #
    vocab_size=common.input_shape(args)[0],  # new # the head's outputs
)
if args.model in common.TEXT_MODELS and args.sample_chars and preemption.stopped_at is None:  # what the GPT learned
    sample = common.generate(model, device, args.sample_chars, context=args.seq_len)
    print(f"generated after a fixed prompt:\n{sample}", flush=True)
preemption.exit()  # after SIGTERM: one line, exit 143 (after a failed checkpoint write: exit 1)
