r"""Compiled optimizer: train.py + torch.compile of AdamW's step, its learning rate and betas held in tensors.

AdamW's step is a handful of elementwise passes over every parameter tensor (the two moments, the decay, the update),
each reading and writing the whole tensor; under torch.compile, Inductor fuses them (on a CPU, into one loop per
parameter: PyTorch's recipe "Compiling the optimizer with torch.compile"). The model stays eager: the lesson is the
optimizer alone, on train.py, so the diff shows it and nothing of the model's compile (train_compile.py). A compiled
function is specialized on the Python numbers it reads, and the one-cycle schedule changes the rate and beta1 at every
step: as floats, each step would compile again until Dynamo's limit of 8, then run eagerly (one warning in the log). So
they live in tensors the schedule fills in place (OneCycleLR writes beta1 back as a float: it goes into its tensor too).
The compile is kept out of images/s and reported, with any recompile (compile_s, graphs_compiled, recompiled_steps).

    python src/train_compiled_optimizer.py --model gpt                 # the GPT, AdamW's step compiled
    python src/train_compiled_optimizer.py --device cpu --subset 4096 --epochs 1
    TORCH_LOGS=recompiles python src/train_compiled_optimizer.py --model gpt --max-steps 50   # what would recompile
    diff src/train.py src/train_compiled_optimizer.py                  # only the lines marked `# new #`

More: docs/techniques/train_compiled_optimizer.md
"""

import itertools
import os  # new #
import shutil  # new #

import torch
import torch.nn as nn
from torch._dynamo.utils import counters  # new # what Dynamo compiled: graphs, frames
from torch.utils.data import DataLoader

import common

parser = common.get_parser(__doc__)
args = common.parse_args(parser)
generator = common.seed_everything(args.seed, args.deterministic)
device = common.get_device(args.device)
# new # begin: on a CPU, Inductor compiles C++: check for a compiler now rather than after the first batch
if device.type == "cpu" and shutil.which(os.environ.get("CXX", "g++")) is None:
    common.die(
        f"torch.compile on CPU needs a C++ compiler: {os.environ.get('CXX', 'g++')} not found (apt-get install g++)"
    )
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
criterion = nn.CrossEntropyLoss()
# new # begin: the rate and betas in tensors the schedule fills in place: the compiled step reads them as inputs; as
# floats it would be specialized on each value and recompiled at every step. capturable: on CUDA, a step that runs
# eagerly (the meter's FLOP-counted step) keeps the tensor rate on the GPU
lr, beta1, beta2 = (torch.tensor(v, device=device) for v in (args.lr, 0.9, 0.999))
optimizer = torch.optim.AdamW(
    model.parameters(), lr=lr, betas=(beta1, beta2), weight_decay=5e-4, capturable=device.type == "cuda"
)


def tensors_back() -> None:
    """OneCycleLR writes beta1 back as a Python float, and a resume replaces each group whole (the saved tensors, the
    saved capturable flag): put each value into the script's tensors, on the device (no sync: a GPU tensor is copied,
    never read back with float()), and those tensors back into the group. One group here; with several, each needs
    tensors of its own."""
    for group in optimizer.param_groups:
        for mine, value in zip((lr, beta1, beta2), (group["lr"], *group["betas"]), strict=True):
            if isinstance(value, torch.Tensor):
                mine.copy_(value)  # the same tensor (the schedule fills the rate in place) or a loaded one
            else:
                mine.fill_(value)  # the schedule's float beta1
        group["lr"], group["betas"], group["capturable"] = lr, (beta1, beta2), device.type == "cuda"


@torch.compile(fullgraph=False)
def optimizer_step() -> None:
    optimizer.step()


# new # end
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
tensors_back()  # new # OneCycleLR set beta1 (0.95 at the start) as a float

# -- training -----------------------------------------------------------------------------------------------------
meter = common.Meter(device, args.warmup_steps, target=common.target_probe(args, model))
graphs = counters["stats"]["unique_graphs"]  # new # graphs compiled before training (0); a private API of Dynamo
compile_steps = 0  # new # steps that compiled a graph: the first one, then any recompile
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
        optimizer_step()  # new # compiles at the first call (a warm-up step), then replays it
        scheduler.step()
        tensors_back()  # new # the new beta1, into its tensor
        step += 1
        epoch_steps += 1
        loss_sum += loss.detach()
        recompiled = counters["stats"]["unique_graphs"] > graphs  # new # this step compiled a graph
        graphs = counters["stats"]["unique_graphs"]  # new #
        compile_steps += recompiled  # new #
        meter.step(images.size(0), measured=not recompiled)  # new # the compile stays out of images/s
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
print(  # new #
    f"torch.compile: the optimizer step in {graphs} graph(s), {max(0, compile_steps - 1)} later step(s) recompiled "
    "(kept out of images/s; TORCH_LOGS=recompiles says why; past 8, Dynamo runs the step eagerly)"
)
common.report(
    args,
    summary,
    epochs,
    precision=common.precision_label(device),
    device=device,
    steps=step,
    params=sum(p.numel() for p in model.parameters()),  # the model's parameters (all of them)
    compile_s=summary["first_step_s"],  # new # the first step, where the compile happens
    graphs_compiled=graphs,  # new # the optimizer step's graphs (more than 1: graph breaks)
    recompiled_steps=max(0, compile_steps - 1),  # new # later steps that compiled (kept out of images/s): 0
    test_images=len(test_loader.dataset),  # evaluate() counts every one of them
)
if args.model in common.TEXT_MODELS and args.sample_chars and preemption.stopped_at is None:  # what the GPT learned
    sample = common.generate(model, device, args.sample_chars, context=args.seq_len)
    print(f"generated after a fixed prompt:\n{sample}", flush=True)
preemption.exit()  # after SIGTERM: one line, exit 143 (after a failed checkpoint write: exit 1)
