"""torch.profiler: train.py + a profile of a few steps, a Chrome/Perfetto trace and the top-15 ops table.

The profiler says where the time goes, and so which rung applies. The step is labelled with record_function (data,
forward, backward, optimizer); after --profile-wait steps it records --profile-active and prints the 15 ops with the
most self time; --trace-dir writes a Chrome trace for ui.perfetto.dev. The recorded steps run slower.

    python src/train_profile.py --device cpu --subset 4096 --epochs 1 --trace-dir traces   # then open the JSON
    python src/train_profile.py --model resnet50 --dataset synthetic --batch-size 128 --max-steps 30 --trace-dir traces
    diff src/train.py src/train_profile.py                          # only the lines marked `# new #`

More: docs/techniques/train_profile.md
"""

import itertools
import os  # new #
from pathlib import Path  # new #

import torch
import torch.nn as nn
from torch.utils.data import DataLoader

import common

parser = common.get_parser(__doc__)
parser.add_argument(  # new #
    "--profile-wait", type=common.non_negative_int, default=10, help="steps before the profiler records (warm-up)"
)
parser.add_argument(  # new #
    "--profile-active", type=common.positive_int, default=5, help="steps the profiler records"
)
parser.add_argument(  # new #
    "--trace-dir", type=Path, default=None, help="write the recorded steps here as a Chrome / Perfetto trace (JSON)"
)
args = common.parse_args(parser)
if args.profile_wait < 2:  # new # the first two steps are not typical: the meter counts activations and FLOPs there
    parser.error("--profile-wait must be 2 or more")  # new #
if args.trace_dir is not None and (problem := common.output_problem(args.trace_dir, is_folder=True)):  # new #
    common.die(f"--trace-dir {args.trace_dir} {problem}")  # new #
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


# new # begin: the profiler: skip --profile-wait steps, warm up one, record --profile-active, then stop
def save_trace(prof) -> None:
    """on_trace_ready: the recorded steps as a Chrome trace, written whole (a temporary file, then a rename)."""
    path = args.trace_dir / f"trace-{args.model}-step{prof.step_num}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    prof.export_chrome_trace(str(tmp))
    os.replace(tmp, path)
    print(f"profiler: trace of {args.profile_active} steps -> {path} (open it in ui.perfetto.dev)", flush=True)


activities = [torch.profiler.ProfilerActivity.CPU]
if device.type == "cuda":
    activities.append(torch.profiler.ProfilerActivity.CUDA)  # the kernels, on the GPU's own clock
profiler = torch.profiler.profile(
    activities=activities,
    schedule=torch.profiler.schedule(wait=args.profile_wait, warmup=1, active=args.profile_active, repeat=1),
    on_trace_ready=save_trace if args.trace_dir else None,
    record_shapes=True,  # input shapes per op: which convolution is slow
)
profiler.start()
# new # end
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
        with torch.profiler.record_function("data"):  # new # the copy to the device (the wait is in `next`)
            images = images.to(device, non_blocking=True)
            labels = labels.to(device, non_blocking=True)
        with torch.profiler.record_function("forward"):  # new #
            logits = model(images)
            loss = criterion(logits, labels)
        with torch.profiler.record_function("backward"):  # new #
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
        with torch.profiler.record_function("optimizer"):  # new #
            if args.clip_grad_norm:
                nn.utils.clip_grad_norm_(model.parameters(), args.clip_grad_norm)
            optimizer.step()
            scheduler.step()
        step += 1
        epoch_steps += 1
        loss_sum += loss.detach()
        meter.step(images.size(0))
        profiler.step()  # new # the schedule counts steps
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

# new # begin: the ops with the most self time, on the device where there is one
profiler.stop()
if profiler.step_num > args.profile_wait + 1:
    sort = "self_device_time_total" if device.type == "cuda" else "self_cpu_time_total"
    print(profiler.key_averages().table(sort_by=sort, row_limit=15), flush=True)
else:
    print(f"profiler: {step} steps, none recorded (--profile-wait {args.profile_wait}); lower it", flush=True)
# new # end
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
)
if args.model in common.TEXT_MODELS and args.sample_chars and preemption.stopped_at is None:  # what the GPT learned
    sample = common.generate(model, device, args.sample_chars, context=args.seq_len)
    print(f"generated after a fixed prompt:\n{sample}", flush=True)
preemption.exit()  # after SIGTERM: one line, exit 143 (after a failed checkpoint write: exit 1)
