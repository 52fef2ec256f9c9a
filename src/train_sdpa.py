"""Fused attention (SDPA): train.py + attention written out as the textbook has it, against the one fused kernel.

Attention written out, softmax(q kᵀ / √d + causal mask) v, keeps the (N, heads, T, T) softmax for backward: memory
that grows with the square of the context. `F.scaled_dot_product_attention` (train.py's and every other script's)
computes the same in one fused kernel and keeps no T x T matrix. --attention picks one.

    python src/train_sdpa.py --model gpt --attention written-out       # the textbook attention
    python src/train_sdpa.py --model gpt --attention sdpa              # the fused kernel (train.py's)
    python src/train_sdpa.py --model gpt --dataset synthetic --seq-len 1024 --batch-size 8 --max-steps 30
    diff src/train.py src/train_sdpa.py                                # only the lines marked `# new #`

More: docs/techniques/train_sdpa.md
"""

import itertools
import math  # new #
import warnings  # new #

import torch
import torch.nn as nn
import torch.nn.functional as F  # new #
from torch.nn.attention import SDPBackend, sdpa_kernel  # new #
from torch.utils.flop_counter import FlopCounterMode  # new #
from torch.utils.data import DataLoader

import common

parser = common.get_parser(__doc__)
parser.add_argument(  # new #
    "--attention", choices=["written-out", "sdpa"], default="sdpa", help="how every block computes attention"
)
args = common.parse_args(parser)
if args.model not in ("gpt", "gpt2", "vit"):  # new # the lesson is attention: a transformer's
    parser.error(f"train_sdpa.py changes attention: --model gpt, gpt2 or vit, not {args.model}")  # new #
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


# new # begin: attention twice, as a function of (q, k, v), each (N, heads, T, head_dim), that Attention calls


def written_out_attention(q, k, v, is_causal=False):
    scores = q @ k.transpose(-2, -1) / math.sqrt(q.size(-1))  # (N, heads, T, T): O(T²) memory
    if is_causal:  # position t may not see t + 1 ...: the upper triangle gets -inf, so weight 0 after the softmax
        future = torch.ones(scores.shape[-2:], dtype=torch.bool, device=scores.device).triu(diagonal=1)
        scores = scores.masked_fill(future, float("-inf"))
    return torch.softmax(scores, dim=-1) @ v  # the softmax's (N, heads, T, T) output is kept for backward


def sdpa(q, k, v, is_causal=False):
    return F.scaled_dot_product_attention(q, k, v, is_causal=is_causal)  # one kernel; no T x T kept


def sdpa_kernels(q, k, v, is_causal):  # the kernel SDPA runs on tensors like these, and why the others refuse
    with FlopCounterMode(display=False) as ops:  # what ran: the aten op SDPA dispatched to (math: plain matmuls)
        F.scaled_dot_product_attention(q, k, v, is_causal=is_causal)
    ran = next((str(op) for op in ops.get_flop_counts()["Global"] if "scaled_dot_product" in str(op)), "math")
    refused = []
    for backend in (SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION, SDPBackend.CUDNN_ATTENTION):
        with warnings.catch_warnings(record=True) as why, sdpa_kernel(backend):  # forced: it runs, or torch says why
            warnings.simplefilter("always")
            try:
                F.scaled_dot_product_attention(q, k, v, is_causal=is_causal)
            except RuntimeError:
                lines = [line for w in why for line in str(w.message).splitlines() if not line.endswith("because:")]
                refused.append(f"{backend.name} ({lines[0].strip() if lines else f'no {q.device.type} kernel'})")
    return ran, refused


# new # end
# -- model, loss, optimizer, and the state of an earlier run to resume -------------------------------------------
model = common.build_model(args.model, *common.input_shape(args)).to(device)
for block in model.blocks:  # new # every block's attention runs the chosen function, with the same weights
    block.attn.attend = written_out_attention if args.attention == "written-out" else sdpa  # new #
# new # begin: q, k, v as the model makes them: (N, T, heads, head_dim) views transposed, with gradients
attn, tokens = model.blocks[0].attn, args.seq_len if args.model in common.TEXT_MODELS else 17  # ViT: 16 patches + 1
q, k, v = (torch.randn(2, tokens, attn.q.out_features // attn.head_dim, attn.head_dim, device=device,
                       requires_grad=True).transpose(1, 2) for _ in range(3))  # fmt: skip
kernel, refused = sdpa_kernels(q, k, v, attn.causal)
print(f"SDPA on {device.type} runs {kernel}; refused when forced: {', '.join(refused) or 'none'}", flush=True)
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
    attention=args.attention,  # new #
    sdpa_kernel=kernel if args.attention == "sdpa" else None,  # new # what F.scaled_dot_product_attention ran
    device=device,
    steps=step,
    params=sum(p.numel() for p in model.parameters()),  # the model's parameters (all of them)
    test_images=len(test_loader.dataset),  # evaluate() counts every one of them
)
if args.model in common.TEXT_MODELS and args.sample_chars and preemption.stopped_at is None:  # what the GPT learned
    sample = common.generate(model, device, args.sample_chars, context=args.seq_len)
    print(f"generated after a fixed prompt:\n{sample}", flush=True)
preemption.exit()  # after SIGTERM: one line, exit 143 (after a failed checkpoint write: exit 1)
