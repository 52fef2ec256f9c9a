"""Tensor parallelism (TP): train.py + every ViT block's Linears split over the ranks by heads and MLP columns.

Data parallelism copies the model and splits the batch; tensor parallelism (Megatron-LM, Shoeybi et al. 2019) splits
each layer's weights and gives every rank the same batch. `parallelize_module` turns a block's Linears into DTensors
on a one-dimensional device mesh ("tp"): q, k, v and the MLP's first Linear are split by output features
(ColwiseParallel: each rank computes heads / tp whole heads and mlp / tp hidden units, no communication), the
attention's output projection and the MLP's second Linear by input features (RowwiseParallel: each rank's partial
sum, then one all-reduce), so a block costs two all-reduces of its (N, T, width) activations forward and four
backward (one per column-parallel Linear's input gradient: q, k, v and fc1; Megatron fuses q, k and v into one).
Each rank holds about 1/tp of every block's weights, gradients and AdamW moments, and keeps 1/tp of what the split
Linears compute (their outputs; the LayerNorm outputs they read are whole on every rank); the patch embedding, the LayerNorms and the head stay whole on every rank
and compute the same thing there. It trains what train.py trains: the same images in the same order at the same
batch, on every rank (tests/test_equivalence.py). Why the base is train.py and not train_DDP.py: TP is a split of the
model, not of the data; combined with data parallelism it is the second dimension of a 2-D mesh (torchtitan's FSDP x
TP), left out here to keep this diff one technique. Why the ViT only: `parallelize_module` needs separate q, k, v and
out Linears (the project's own ViT, src/common/vit.py; torchvision's packs them in one `in_proj_weight`); a CNN's
convolutions are not split here. Not here yet: sequence parallelism (SequenceParallel, Korthikanti et al. 2022:
the LayerNorms and the residual stream split by tokens, the all-reduces turned into a reduce-scatter and an
all-gather); the ViT has 1 + (S / patch)^2 tokens, an odd number, and DTensor's uneven shards of them failed in
gloo's all-gather (a size mismatch) on torch 2.15. Clipping adds the shards' squared norms
over the ranks (DTensor does it when the norm is asked for its full value). Every rank gathers the full model and
optimizer state (`get_state_dict(..., full_state_dict=True)`), rank 0 writes them into last.pt, which train.py's model loads; --resume reads the full
model and optimizer state and shards them again. The metrics carry params (the whole model), params_per_rank and
activation_mib (this rank's). Needs torch >= 2.15 (tested on it: DTensor on a CPU mesh with gloo).

    torchrun --nproc-per-node 2 src/train_TP.py --device cpu --model vit          # 2 processes on a CPU (gloo)
    torchrun --nproc-per-node auto src/train_TP.py --model vit --dataset synthetic --image-size 224 --max-steps 50
    torchrun --nproc-per-node 2 src/train_TP.py --device cpu --model vit --checkpoint-dir ck     # Ctrl-C it, then
    torchrun --nproc-per-node 2 src/train_TP.py --device cpu --model vit --checkpoint-dir ck --resume
    diff src/train.py src/train_TP.py                                                  # only the lines marked `# new #`
"""

import itertools
import os  # new #

import torch
import torch.distributed as dist  # new #
import torch.nn as nn
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_state_dict, set_state_dict  # new #
from torch.distributed.device_mesh import init_device_mesh  # new #
from torch.distributed.tensor import DTensor  # new #
from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module  # new #
from torch.utils.data import DataLoader

import common

parser = common.get_parser(__doc__)
args = common.parse_args(parser)
common.env.require_torch("2.15", "train_TP.py (DTensor on a CPU mesh with gloo)")  # new #
if args.model not in ("vit", "gpt", "gpt2"):  # new # the split is by heads and MLP columns: a transformer's Linears
    parser.error(f"train_TP.py splits attention and MLP: --model vit, gpt or gpt2, not {args.model}")  # new #
# new # begin: torchrun sets these; every rank runs the same script on the same batch
if "LOCAL_RANK" not in os.environ:
    common.die("launch with torchrun, e.g. `torchrun --nproc-per-node 2 src/train_TP.py --device cpu --model vit`")
local_rank, rank, world_size = int(os.environ["LOCAL_RANK"]), int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
master = rank == 0  # only rank 0 prints, writes metrics and checkpoints
# new # end
generator = common.seed_everything(args.seed, args.deterministic)
device = common.get_device(args.device)
# new # begin: one device per process, then the process group and the one-dimensional "tp" mesh over it
if device.type == "cuda":
    if local_rank >= torch.cuda.device_count():
        common.die(f"local rank {local_rank} has no GPU: {torch.cuda.device_count()} visible; lower --nproc-per-node")
    device = torch.device("cuda", local_rank)
    torch.cuda.set_device(device)  # before the process group, so NCCL binds this GPU and not GPU 0
else:
    torch.set_num_threads(max(1, os.cpu_count() // int(os.environ.get("LOCAL_WORLD_SIZE", "1"))))  # share the cores
dist.init_process_group("nccl" if device.type == "cuda" else "gloo")  # before the mesh, which uses this group
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
        worker_init_fn=common.seed_worker,
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

start_epoch, step = 0, 0
checkpoint = args.checkpoint_dir / "last.pt" if args.checkpoint_dir else None
if args.resume and checkpoint.exists():
    # new # begin: last.pt holds the full model and optimizer state; every rank reads it and keeps its shards
    state = common.load_checkpoint(checkpoint, args, None, None, "cpu")  # checks only: the shards are loaded below
    # a schedule gives the param groups the keys (initial_lr, max_lr...) the saved ones have, as on a fresh start
    torch.optim.lr_scheduler.OneCycleLR(optimizer, max_lr=args.lr, total_steps=total_steps)
    full = StateDictOptions(full_state_dict=True)  # whole tensors in, each rank's shard of them kept
    set_state_dict(model, optimizer, model_state_dict=state["model"], optim_state_dict=state["full_optimizer"],
                   options=full)  # fmt: skip
    # new # end
    start_epoch, step = state["epoch"], state["step"]
    if master:  # new #
        print(f"resumed from {checkpoint}: {start_epoch} epochs and {step} steps done", flush=True)
    common.exit_if_finished(checkpoint, step, total_steps, master)  # new # every rank exits; rank 0 says so
# one-cycle schedule over this run's steps; on resume it continues at step `step` (last_epoch counts from -1)
scheduler = torch.optim.lr_scheduler.OneCycleLR(optimizer, max_lr=args.lr, total_steps=total_steps, last_epoch=step - 1)


def save_full(epochs_done: int) -> None:  # new # every rank gathers (a collective), rank 0 writes
    options = StateDictOptions(full_state_dict=True, cpu_offload=True)  # new # whole tensors on rank 0's host
    model_state, optimizer_state = get_state_dict(model, optimizer, options=options)  # new #
    if master:  # new # the model as train.py saves it; the optimizer's state by parameter name
        common.save_checkpoint(  # new #
            checkpoint,
            args,
            model_state,
            None,
            epochs_done,
            step,
            full_optimizer=optimizer_state,  # new #
        )  # new #


# -- training -----------------------------------------------------------------------------------------------------
meter = common.Meter(device, args.warmup_steps)
preemption = common.Preemption()  # SIGTERM: stop at the next step boundary, save, exit 143
epochs = []
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
            save_full(epoch)  # new # `epoch` epochs finished
        break

    # new # every rank evaluates: the model's forward is collective
    val_loss, val_acc = common.evaluate(model, test_loader, device)
    epochs.append(
        common.epoch_record(epoch + 1, step, loss_sum / max(epoch_steps, 1), val_loss, val_acc, meter, logits)
    )
    if master:  # new #
        print(common.epoch_line(epochs[-1]), flush=True)
    if checkpoint:
        save_full(epoch + 1)  # new # a collective: every rank gathers, rank 0 writes
    if step == total_steps:
        break

# -- metrics: the closing line, and the metrics JSON with its provenance (--metrics-out) ------------------------
summary = common.gather_summary(meter.summary())  # new # peak memory the max over ranks, activations this rank's
rates = summary["images_per_s_per_rank"]  # new # every rank trained the same images: the slowest is the model's
summary["images_per_s"] = min(rates) if None not in rates else None  # new # not their sum
if master:  # new #
    common.report(
        args,
        summary,
        epochs,
        precision=common.precision_label(device),
        device=device,
        world_size=world_size,  # new #
        global_batch=args.batch_size,  # new # every rank trained on the same batch
        gpus=world_size if device.type == "cuda" else 0,  # new # one GPU per process
        steps=step,
        params=params,  # new # the whole model's
        params_per_rank=params_per_rank,  # new # what rank 0 holds of it
        test_images=len(test_loader.dataset),  # evaluate() counts every one of them
    )
# new # (no sample text: the model is split over the ranks; train.py shows what the GPT learned)
dist.destroy_process_group()  # new # leave the group cleanly before exiting
preemption.exit()  # after SIGTERM: one line, exit 143 (after a failed checkpoint write: exit 1)
