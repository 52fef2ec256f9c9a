"""Tensor parallelism: train.py + every transformer block's Linears split over the ranks (DTensor, parallelize_module).

Every rank trains on the same batch and holds about 1/tp of each block's weights: q, k, v and the MLP's first Linear
split by output features (ColwiseParallel), the attention's output and the MLP's second Linear by input features
(RowwiseParallel: partial sums, then one all-reduce). The ViT and the GPT; it trains what train.py trains, and
last.pt loads into train.py's model.

    torchrun --nproc-per-node 2 src/train_TP.py --device cpu --model vit          # 2 processes on a CPU (gloo)
    torchrun --nproc-per-node auto src/train_TP.py --model vit --dataset synthetic --image-size 224 --max-steps 50
    torchrun --nproc-per-node 2 src/train_TP.py --device cpu --model vit --checkpoint-dir ck     # Ctrl-C it, then
    torchrun --nproc-per-node 2 src/train_TP.py --device cpu --model vit --checkpoint-dir ck --resume
    diff src/train.py src/train_TP.py                                                  # only the lines marked `# new #`

More: docs/techniques/train_TP.md
"""

import itertools

import torch
import torch.distributed as dist  # new #
import torch.nn as nn
from torch.distributed.device_mesh import init_device_mesh  # new #
from torch.distributed.tensor import DTensor  # new #
from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module  # new #
from torch.utils.data import DataLoader

import common

parser = common.get_parser(__doc__)
args = common.parse_args(parser)
if args.model not in ("vit", "gpt", "gpt2"):  # new # the split is by heads and MLP columns: a transformer's Linears
    parser.error(f"train_TP.py splits attention and MLP: --model vit, gpt or gpt2, not {args.model}")  # new #
generator = common.seed_everything(args.seed, args.deterministic)
device = common.get_device(args.device)
# new # begin: one process per device under torchrun (train_DDP.py's set-up), then the one-dimensional "tp" mesh
device, rank, world_size = common.distributed.setup(device)  # every rank runs this script
master = rank == 0  # only rank 0 prints, writes metrics and checkpoints
mesh = init_device_mesh(device.type, (world_size,), mesh_dim_names=("tp",))
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
# new # begin: split every block's Linears over the "tp" ranks; every rank built the same weights from the same seed
heads = model.blocks[0].attn.q.out_features // model.blocks[0].attn.head_dim
if heads % world_size:  # a head is never split: each rank runs heads / world_size whole heads
    common.die(f"the {args.model} has {heads} heads, which {world_size} ranks cannot share evenly; use a divisor")
for block in model.blocks:
    plan = {
        "attn.q": ColwiseParallel(),  # weight split by output features: heads / tp heads per rank
        "attn.k": ColwiseParallel(),
        "attn.v": ColwiseParallel(),
        "attn.out": RowwiseParallel(),  # weight split by input features: partial sums, then an all-reduce
        "mlp.fc1": ColwiseParallel(),  # mlp / tp hidden units per rank
        "mlp.fc2": RowwiseParallel(),
    }  # the block's output is whole on every rank again: the LayerNorms and the residual adds run unsplit
    parallelize_module(block, mesh, plan)
params = sum(p.numel() for p in model.parameters())  # DTensors: numel() is the whole parameter's
params_per_rank = sum(p.to_local().numel() if isinstance(p, DTensor) else p.numel() for p in model.parameters())
if master:
    print(f"TP: {len(model.blocks)} blocks over {world_size} ranks ({heads // world_size} heads each), "
          f"{params_per_rank:,} of {params:,} parameters on rank 0", flush=True)  # fmt: skip
# new # end
criterion = nn.CrossEntropyLoss()
optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=5e-4)
total_steps = args.epochs * len(train_loader)
if args.max_steps:
    total_steps = min(total_steps, args.max_steps)

start_epoch, step, epochs = 0, 0, []  # epochs: the per-epoch records, which checkpoints keep and a resume restores
checkpoint = args.checkpoint_dir / "last.pt" if args.checkpoint_dir else None
if args.resume and checkpoint.exists():
    state = common.load_checkpoint(checkpoint, args, None, None, "cpu")  # new # checks only: shards loaded next
    common.distributed.load_full_state(state, model, optimizer, args.lr, total_steps)  # new # whole in, shards kept
    start_epoch, step, epochs = state["epoch"], state["step"], state["epochs"]
    if master:  # new #
        print(f"resumed from {checkpoint}: {start_epoch} epochs and {step} steps done", flush=True)
    common.exit_if_finished(checkpoint, step, total_steps)  # re-running a finished run: one line, exit 0
# one-cycle schedule over this run's steps; on resume it continues at step `step` (last_epoch counts from -1)
scheduler = torch.optim.lr_scheduler.OneCycleLR(optimizer, max_lr=args.lr, total_steps=total_steps, last_epoch=step - 1)

# -- training -----------------------------------------------------------------------------------------------------
meter = common.Meter(device, args.warmup_steps, target=common.target_probe(args, model))
preemption = common.Preemption(args.run)  # SIGTERM: stop at the next step boundary, save, exit 143
if master:  # new #
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
            # new # begin: the norm of every gradient, sharded or not (a shard's norm is a partial one until
            # full_tensor() adds the squares over the ranks); one tensor at a time: foreach kernels refuse a mix of
            # DTensors and plain tensors
            norms = [torch.linalg.vector_norm(p.grad) for p in model.parameters() if p.grad is not None]
            norms = [n.full_tensor() if isinstance(n, DTensor) else n for n in norms]
            total_norm = torch.linalg.vector_norm(torch.stack(norms))
            nn.utils.clip_grads_with_norm_(model.parameters(), args.clip_grad_norm, total_norm, foreach=False)
            # new # end
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
        if checkpoint:
            common.distributed.save_full_state(checkpoint, args, model, optimizer, epoch, step, epochs)  # new # gathers
        break

    # new # every rank evaluates: the model's forward is collective
    val_loss, val_acc = common.evaluate(model, test_loader, device)
    epochs.append(
        common.epoch_record(epoch + 1, step, loss_sum / max(epoch_steps, 1), val_loss, val_acc, meter, logits)
    )
    if master:  # new #
        print(common.epoch_line(epochs[-1]), flush=True)
    if checkpoint:
        common.distributed.save_full_state(checkpoint, args, model, optimizer, epoch + 1, step, epochs)  # new # gathers
    if step == total_steps:
        break

# -- metrics: the closing line, and the metrics JSON with its provenance (--metrics-out) ------------------------
summary = common.gather_summary(meter.summary(), same_images=True)  # new # the slowest rank's images/s
if master:  # new #
    common.report(
        args,
        summary,
        epochs,
        precision=common.precision_label(device),
        device=device,
        global_batch=args.batch_size,  # new # every rank trained on the same batch
        steps=step,
        params=sum(p.numel() for p in model.parameters()),  # the model's parameters (all of them)
        params_per_rank=params_per_rank,  # new # what rank 0 holds of it
        test_images=len(test_loader.dataset),  # evaluate() counts every one of them
    )
# new # (no sample text: the model is split over the ranks; train.py shows what the GPT learned)
dist.destroy_process_group()  # new # leave the group cleanly before exiting
preemption.exit()  # after SIGTERM: one line, exit 143 (after a failed checkpoint write: exit 1)
