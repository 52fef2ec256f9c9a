"""FlexAttention: train_varlen.py + speeches packed into full blocks, each attending only to itself (a document mask).

train_varlen.py batches speeches three ways: padded (mostly padding), bucketed (little padding, short rows) and packed
(full blocks of --seq-len, where a speech attends to the end of the one before it). --batching documents, the default
here, trains the packed blocks with neither: each position attends to the earlier positions of its own speech only (a
document-causal mask, the mask_mod below), and its position embedding counts from its speech's first character, so
each speech's logits are those it would get alone (tests/test_flex_attention.py checks it), within its block: a
speech the block cuts starts again in the next, without what came before. A speech starts at the last newline of a
blank line, and each block starts one; evaluation and --target-loss run under the same mask. On a GPU the mask is a
BlockMask (create_block_mask): for every 128 x 128 tile of the scores it says whether the tile is all masked
(skipped), all visible or partly masked, and a compiled flex_attention generates one fused kernel that skips what the
mask hides (torchtitan's flex attention with its block_causal mask; modded-nanogpt's document masks over long packed
rows). FlexAttention has no backward on a CPU (torch 2.15 raises NotImplementedError), so there the same mask_mod is
made into a dense (N, 1, T, T) boolean mask (create_mask) for F.scaled_dot_product_attention: the same model and the
same masks, none of the skipped tiles.

    python src/train_flex_attention.py --model gpt                        # CPU: the document mask through SDPA
    python src/train_flex_attention.py --model gpt --batching pack       # train_varlen.py's packed blocks, for a pair
    python src/train_flex_attention.py --model gpt2 --device cuda --seq-len 1024 --batch-size 32   # GPU: FlexAttention
    diff src/train_varlen.py src/train_flex_attention.py                  # only the lines marked `# new #`

More: docs/techniques/train_flex_attention.md
"""

import functools  # new #
import itertools

import torch
import torch.nn as nn
import torch.nn.functional as F  # new #
from torch.nn.attention.flex_attention import create_block_mask, create_mask, flex_attention  # new #
from torch.utils.data import DataLoader

import common

parser = common.get_parser(__doc__, datasets=("shakespeare",))  # new # speeches are text: no synthetic batch
parser.add_argument(  # new #
    "--batching",
    choices=["pad", "bucket", "pack", "documents"],  # new #
    default="documents",  # new #
    help="pad: random batches of speeches, each padded to its longest; bucket: speeches of similar length batched "
    "together; pack: full blocks of text, as train.py; "  # new #
    "documents: pack's blocks, each speech attending to itself only (default)",  # new #
)
args = common.parse_args(parser)
if args.model not in common.TEXT_MODELS:  # new # a language model's samples are text of varying length
    common.die(f"train_flex_attention.py trains a language model (gpt, gpt2) on text, not {args.model}")  # new #
generator = common.seed_everything(args.seed, args.deterministic)
device = common.get_device(args.device)

# -- data: Shakespeare's speeches padded per batch (or train.py's blocks) behind torch's DataLoader  # new #
train_set, test_set = common.load_data(args)
sampler = torch.utils.data.RandomSampler(train_set, generator=generator)  # the shuffle, reseeded every epoch
# new # begin: samples of different lengths, a collate_fn that pads them, a BatchSampler that buckets them
PAD = -100  # the target of a padded position: nn.CrossEntropyLoss's ignore_index


def speeches(blocks, longest):
    """The text train.py's (inputs, targets) blocks cover, cut after each blank line: a list of int64 1-D tensors of
    2 to `longest` tokens. A speech starts with the last newline of the blank line before it (so its first character
    is a target too) and ends with its own blank line; a longer one is cut in pieces. Consecutive samples share one
    token, as consecutive blocks do: every character of the text but the first is a target exactly once."""
    inputs, targets = blocks.tensors
    tokens = torch.cat([inputs.flatten(), targets[-1, -1:]])
    newline = common.text.vocabulary().index("\n")
    blank = (tokens[:-2] == newline) & (tokens[1:-1] == newline) & (tokens[2:] != newline)
    cuts = (blank.nonzero().flatten() + 2).tolist()  # where a speech starts: after a blank line
    pieces = []
    for start, end in zip([0, *(cut - 1 for cut in cuts)], [*cuts, len(tokens)]):
        pieces += [tokens[i : min(i + longest, end)] for i in range(start, end - 1, longest - 1)]
    return pieces


def pad_batch(samples):
    """The collate_fn: B samples of n_i tokens -> (inputs, targets), int64 (B, max n_i - 1). inputs[b, t] is token t
    of sample b and targets[b, t] token t + 1; past a sample's end, inputs hold token 0 and targets PAD. Padded on the
    right: under causal attention no real token sees a later position, so the pads change none of their logits."""
    inputs = nn.utils.rnn.pad_sequence([s[:-1] for s in samples], batch_first=True, padding_value=0)
    targets = nn.utils.rnn.pad_sequence([s[1:] for s in samples], batch_first=True, padding_value=PAD)
    return inputs, targets


class BucketBatchSampler(torch.utils.data.Sampler):
    """Batches (lists of B sample indices) of similar length, in a random order: each epoch the indices are shuffled,
    cut into pools of `pool` batches, each pool sorted by length and cut into batches, and all batches shuffled (the
    pools keep the order random; Hugging Face's group_by_length and detection's aspect-ratio grouping do the same).
    Every sample is in one batch an epoch but the last pool's remainder (< B, as drop_last)."""

    def __init__(self, lengths, batch_size, generator, pool=100):
        self.lengths, self.batch_size, self.generator, self.pool = lengths, batch_size, generator, pool

    def __len__(self):
        return len(self.lengths) // self.batch_size

    def __iter__(self):
        order = torch.randperm(len(self.lengths), generator=self.generator).tolist()
        size, batches = self.pool * self.batch_size, []
        for start in range(0, len(order), size):
            pool = sorted(order[start : start + size], key=self.lengths.__getitem__)
            cuts = range(0, len(pool) - self.batch_size + 1, self.batch_size)  # the pool's remainder < B: left out
            batches += [pool[i : i + self.batch_size] for i in cuts]
        for i in torch.randperm(len(batches), generator=self.generator).tolist():
            yield batches[i]


if args.batching not in ("pack", "documents"):  # new # pack, documents: train.py's blocks, as they are
    train_set = speeches(train_set, args.seq_len + 1)
    if len(train_set) < args.batch_size:
        common.die(f"--batch-size {args.batch_size} is larger than the {len(train_set)} speeches of this text")
    sampler = torch.utils.data.RandomSampler(train_set, generator=generator)
if args.batching == "bucket":
    batches = BucketBatchSampler([len(s) for s in train_set], args.batch_size, generator)
else:  # B random indices at a time (what DataLoader builds inside from batch_size, sampler and drop_last)
    batches = torch.utils.data.BatchSampler(sampler, args.batch_size, drop_last=True)
print(f"--batching {args.batching}: {len(train_set)} samples", flush=True)
# new # end
train_loader = DataLoader(
    train_set,
    batch_sampler=batches,  # new # every step sees a full batch of B samples (the BatchSampler drops the remainder)
    collate_fn=pad_batch if args.batching in ("pad", "bucket") else None,  # new # pack, documents: blocks as they are
    num_workers=args.workers,
    pin_memory=device.type == "cuda",  # page-locked host memory: faster, asynchronous copies to the GPU
    persistent_workers=args.workers > 0,  # keep workers between epochs instead of forking new ones
    worker_init_fn=common.init_worker,
)
test_loader = DataLoader(test_set, batch_size=1000)

# -- model, loss, optimizer, and the state of an earlier run to resume -------------------------------------------
model = common.build_model(args.model, *common.input_shape(args)).to(device)


attention_kind = "sdpa, causal"  # new # pad, bucket, pack: train_varlen.py's attention


# new # begin: packed speeches, each attending to itself only: a document-causal mask, positions from its start
def documents(tokens):
    """(N, T) int64 tokens -> (speech, offset), both (N, T) int64: the index of the speech each position belongs to
    in its row (0, 1, ...), and the position's offset from that speech's first token. A speech starts at the last
    newline of a blank line (two or more newlines: where train_varlen.py's speeches() starts one; a row's last
    position counts its unseen next character as no newline) and at each row's first position (a speech the block
    cut starts again there, without the characters before)."""
    newline = tokens == common.text.vocabulary().index("\n")
    none = torch.zeros_like(newline[:, :1])
    before, after = torch.cat([none, newline[:, :-1]], 1), torch.cat([newline[:, 1:], none], 1)
    starts = before & newline & ~after
    index = torch.arange(tokens.size(1), device=tokens.device).expand_as(tokens)
    first = torch.where(starts, index, 0).cummax(1).values  # where each position's speech starts
    return starts.cumsum(1), index - first


def document_causal(speech):
    """The mask_mod of a batch whose speeches are `speech` (N, T): query position q of row b sees key position k
    when k <= q and both are in one speech. FlexAttention calls it with index tensors (b, h, q, k)."""

    def mask_mod(b, h, q, k):
        return (k <= q) & (speech[b, q] == speech[b, k])

    return mask_mod


class DocumentEmbedding(nn.Module):
    """model.embed for packed speeches: (N, T) tokens -> (N, T, width), each token's embedding plus that of its offset
    in its speech (positions restart at every speech, as they would for the speech alone). It also makes the batch's
    mask, `self.mask`, which every attention layer reads (torchtitan sets its FlexAttention's mask per batch too).
    `make_mask(mask_mod, N, T, device)`: a BlockMask (GPU) or an (N, 1, T, T) bool tensor (CPU)."""

    def __init__(self, token, position, make_mask):
        super().__init__()
        self.token, self.position = token, position  # train_varlen.py's modules: its state dict's names
        self.make_mask, self.mask = make_mask, None

    def forward(self, tokens):
        speech, offset = documents(tokens)
        self.mask = self.make_mask(document_causal(speech), tokens.size(0), tokens.size(1), tokens.device)
        return self.token(tokens) + self.position(offset)


def masked(q, k, v, is_causal, embed, attention):  # an attention layer's `attend`: the batch's mask, not is_causal
    return attention(q, k, v, embed.mask)


def use_document_masks(model, make_mask, attention):
    """Give `model` (a GPT) the document mask: its embedding becomes a DocumentEmbedding and every attention layer
    calls attention(q, k, v, mask) with the batch's mask, q, k, v (N, heads, T, head_dim), in place of the causal
    SDPA. The weights and their names stay train_varlen.py's. A partial, not a closure: a deepcopy of the model (an
    EMA, AveragedModel) then reads its own embedding's mask."""
    model.embed = DocumentEmbedding(model.embed.token, model.embed.position, make_mask)
    for block in model.blocks:
        block.attn.attend = functools.partial(masked, embed=model.embed, attention=attention)


def dense_mask(mask_mod, n, t, device):  # a CPU: the mask as (N, 1, T, T) booleans, every tile computed
    return create_mask(mask_mod, n, None, t, t, device=device)


def dense_attention(q, k, v, mask):  # SDPA with a boolean mask: True where a query may attend
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask)


compiled_block_mask = torch.compile(create_block_mask)  # made anew for every batch: its own speeches
compiled_flex = torch.compile(flex_attention)  # eager flex_attention is a slow reference: it forms all the scores


def block_mask(mask_mod, n, t, device):  # a GPU: per 128 x 128 tile, masked (skipped), visible or partly masked
    return compiled_block_mask(mask_mod, n, None, t, t, device=device)


def flex(q, k, v, mask):  # one kernel generated for the mask_mod, skipping the tiles it masks whole
    return compiled_flex(q, k, v, block_mask=mask)


if args.batching == "documents" and device.type == "cuda":
    use_document_masks(model, block_mask, flex)
    attention_kind = "flex_attention"
    print("attention: flex_attention (compiled) with a document-causal BlockMask", flush=True)
elif args.batching == "documents":  # FlexAttention has no backward on a CPU: the same mask_mod, dense, in SDPA
    use_document_masks(model, dense_mask, dense_attention)
    attention_kind = "sdpa, dense document mask"
    print(
        f"attention: FlexAttention has no backward on {device.type} (torch {torch.__version__}): the same document "
        "mask made dense by create_mask, through scaled_dot_product_attention (no skipped tiles)",
        flush=True,
    )
# new # end
criterion = nn.CrossEntropyLoss(ignore_index=PAD)  # new # the mean over real tokens: padded targets left out
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
real_tokens = padded_tokens = 0  # new # the run's tokens: real ones, and all the batches held (pads included)
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
        real = int((labels != PAD).sum())  # new # counted on the host: no device sync
        real_tokens, padded_tokens = real_tokens + real, padded_tokens + labels.numel()  # new #
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
        meter.step(images.size(0), tokens=real)  # new # tokens/s: the real tokens
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
    steps=step,
    batching=args.batching,  # new #
    attention=attention_kind,  # new # which kernel attended
    pad_share=1 - real_tokens / padded_tokens if padded_tokens else None,  # new # the batches' tokens that were pads
    params=sum(p.numel() for p in model.parameters()),  # the model's parameters (all of them)
    test_images=len(test_loader.dataset),  # evaluate() counts every one of them
)
if args.model in common.TEXT_MODELS and args.sample_chars and preemption.stopped_at is None:  # what the GPT learned
    sample = common.generate(model, device, args.sample_chars, context=args.seq_len)
    print(f"generated after a fixed prompt:\n{sample}", flush=True)
preemption.exit()  # after SIGTERM: one line, exit 143 (after a failed checkpoint write: exit 1)
