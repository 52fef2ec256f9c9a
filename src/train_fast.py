# new # begin: this script's own docstring
"""Everything stacked: train_compile.py + DALI or device-resident input, fused AdamW, cuDNN autotuning, no host syncs.

The last rung of the ladder train.py -> train_amp.py -> train_channels_last.py -> train_compile.py -> this file. Its
base already runs the model in float16 / bfloat16 (autocast) with NHWC tensors, compiled; this file removes what is
left between the GPU and its peak:
- input: JPEG files (`--dataset imagefolder --data-dir ROOT`, an ImageFolder with train/ and val/) go through the
  DALI graph of loader_DALI.py, with `mixed` decoding on the GPU, sharded by rank, and `crop_mirror_normalize`
  writing float16 NHWC, which a permute turns into the channels_last batch the model wants without a copy;
  Fashion-MNIST (47 MB) is held on the device whole, shuffled with a device permutation and flipped at random there,
  with no DataLoader, worker or host-to-device copy at all;
- `torch.optim.AdamW(..., fused=True)`: one kernel updates every parameter instead of a loop of small ones;
- `cudnn.benchmark`: cuDNN times its convolution algorithms once for the fixed input shape and keeps the fastest;
  TF32 for the float32 matmuls left outside autocast;
- no host synchronisation inside the step (losses summed on the device, the GradScaler's checks on the device, the
  fused optimizer reading its found-inf flag there), so the CPU queues steps ahead of the GPU.
--batch-size: the largest that fits is fastest; the bench keeps the other rungs' batch so that the rows compare.
On a CPU it runs too (DALI's CPU-only mode, Inductor's C++ kernels, bfloat16) and says in one line what it cannot do.

    python src/train_fast.py --model resnet18 --epochs 8 --batch-size 256 --lr 2e-3 --target-acc 0.93   # Fashion-MNIST
    python src/train_fast.py --dataset imagefolder --data-dir data/imagenet-synthetic --image-size 224 \
        --model resnet50 --batch-size 256 --threads 16 --lr 2e-3      # ResNet-50 from JPEG files, end to end
    python src/train_fast.py --dataset synthetic --model resnet50 --batch-size 256 --max-steps 100   # the ceiling
    diff src/train_compile.py src/train_fast.py                       # only the lines marked `# new #`
"""
# new # end

import os  # new #
import shutil  # new #

import torch
import torch.nn as nn

# new # no DataLoader: the batches come from DALI or straight from device memory
import common

parser = common.get_parser(__doc__, datasets=("fashion-mnist", "synthetic", "imagefolder"))  # new #
parser.add_argument(  # new #
    "--amp-dtype", choices=["float16", "bfloat16"], default=None, help="default: float16 on CUDA, bfloat16 on CPU"
)
parser.add_argument(  # new #
    "--compile-mode",
    choices=["default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs"],
    default="default",
    help="torch.compile's mode: reduce-overhead adds CUDA graphs, max-autotune benchmarks kernels (slower to compile)",
)
parser.add_argument(  # new #
    "--threads", type=common.positive_int, default=None, help="DALI CPU threads (default: --workers, at least 1)"
)
args = common.parse_args(parser)
generator = common.seed_everything(args.seed, args.deterministic)
device = common.get_device(args.device)
# new # begin: let cuDNN time its convolution algorithms for the fixed input shape; TF32 for fp32 matmuls left over
torch.backends.cudnn.benchmark = not args.deterministic
torch.backends.cuda.matmul.allow_tf32 = True
if device.type == "cpu":
    print("train_fast.py: no GPU: no 'mixed' JPEG decoding, no float16 tensor cores; DALI CPU-only mode, bfloat16")
# new # end
# new # begin: float16 where tensor cores make it fast, bfloat16 where float16 is missing (the nearest honest equivalent)
amp_dtype = args.amp_dtype or ("float16" if device.type == "cuda" else "bfloat16")
if amp_dtype == "float16" and device.type == "cpu":
    print("AMP: float16 autocast has no fast kernels on CPU; running bfloat16 instead", flush=True)
    amp_dtype = "bfloat16"
if amp_dtype == "bfloat16" and device.type == "cuda" and not torch.cuda.is_bf16_supported():
    print("AMP: this GPU has no bfloat16 (needs compute capability 8.0+); running float16 instead", flush=True)
    amp_dtype = "float16"
amp_dtype = getattr(torch, amp_dtype)
# new # end
# new # begin: on a CPU, Inductor compiles C++: check for a compiler now rather than after the first batch
if device.type == "cpu" and shutil.which(os.environ.get("CXX", "g++")) is None:
    common.die(
        f"torch.compile on CPU needs a C++ compiler: {os.environ.get('CXX', 'g++')} not found (apt-get install g++)"
    )
# new # end


# new # begin: Fashion-MNIST without a DataLoader: the whole set on the device, batches cut from it there
class DeviceLoader:
    """Batches of a TensorDataset held on `device`: images (N, C, H, W) in channels_last, labels int64 (N,).

    Training order is a device permutation per pass, each image flipped left-right with probability 1/2 (on the
    device); evaluation order is the stored one. No worker, no host-to-device copy, no synchronisation.
    """

    def __init__(self, dataset, batch_size: int, device: torch.device, train: bool):
        images, labels = dataset.tensors
        self.images = images.to(device).contiguous(memory_format=torch.channels_last)
        self.labels, self.batch_size, self.train, self.dataset = labels.to(device), batch_size, train, dataset

    def __len__(self) -> int:
        n = len(self.labels)
        return n // self.batch_size if self.train else -(-n // self.batch_size)  # training drops the partial batch

    def __iter__(self):
        n = len(self.labels)
        order = (
            torch.randperm(n, device=self.labels.device) if self.train else torch.arange(n, device=self.labels.device)
        )
        for i in range(len(self)):
            index = order[i * self.batch_size : (i + 1) * self.batch_size]
            images = self.images[index]
            if self.train:  # RandomHorizontalFlip, as a device op
                flip = torch.rand(len(index), 1, 1, 1, device=images.device) < 0.5
                images = torch.where(flip, images.flip(3), images)
            yield images, self.labels[index]


num_classes = 10  # Fashion-MNIST's and the synthetic batch's; an ImageFolder has its own
# new # end
# -- data: one synthetic batch on the device, JPEG files through DALI, or Fashion-MNIST held on the device  # new #
if args.dataset == "synthetic":
    train_loader, test_loader = common.synthetic_data(args, device)
# new # begin: JPEG files: loader_DALI.py's graph, decoding on the GPU ('mixed') straight into float16 NHWC batches
elif args.dataset == "imagefolder":
    try:
        from nvidia.dali import fn, pipeline_def, types
        from nvidia.dali.plugin.pytorch import DALIGenericIterator, LastBatchPolicy
    except ImportError:
        common.die("--dataset imagefolder needs NVIDIA DALI: pip install nvidia-dali-cuda120 (Linux x86_64)")
    train_dir, val_dir, classes = common.image_folders(args.data_dir, args.batch_size)
    num_classes, side = len(classes), common.input_shape(args)[1]
    rank, world_size = int(os.environ.get("RANK", "0")), int(os.environ.get("WORLD_SIZE", "1"))
    gpu, threads = device.type == "cuda", args.threads or max(1, args.workers)

    @pipeline_def(batch_size=args.batch_size, num_threads=threads, device_id=device.index or 0 if gpu else None)
    def jpeg_pipeline(root, training):
        files, labels = fn.readers.file(
            file_root=root, shard_id=rank, num_shards=world_size, random_shuffle=training, seed=args.seed, name="Reader"
        )
        decoder = "mixed" if gpu else "cpu"  # mixed: Huffman decoding on the CPU, the rest on the GPU (nvJPEG)
        if training:  # RandomResizedCrop: decode only the random 8-100 % area, 3/4-4/3 aspect, then resize it
            images = fn.decoders.image_random_crop(files, device=decoder, output_type=types.RGB, seed=args.seed + rank)
            images = fn.resize(images, resize_x=side, resize_y=side)
            mirror = fn.random.coin_flip(probability=0.5, seed=args.seed + rank)  # RandomHorizontalFlip
        else:  # shorter side to side / 0.875, then the centre crop
            images = fn.decoders.image(files, device=decoder, output_type=types.RGB)
            images = fn.resize(images, resize_shorter=round(side / 0.875))
            mirror = 0
        images = fn.crop_mirror_normalize(
            images,
            dtype=types.FLOAT16,  # half the bytes of float32; autocast computes in float16 / bfloat16 anyway
            output_layout="HWC",  # NHWC batches: channels_last once permuted to (N, C, H, W), without a copy
            crop=(side, side),
            mean=[255 * m for m in common.IMAGENET_MEAN],
            std=[255 * s for s in common.IMAGENET_STD],
            mirror=mirror,
        )
        return images, labels.gpu() if gpu else labels

    class DALILoader:
        """(images, labels) per batch: float16 (N, 3, S, S) in channels_last, int64 (N,), on the pipeline's device."""

        def __init__(self, pipeline, last_batch_policy):
            self.iterator = DALIGenericIterator(
                pipeline,
                ["images", "labels"],
                reader_name="Reader",
                last_batch_policy=last_batch_policy,
                auto_reset=True,
                prepare_first_batch=False,  # a corrupt first file fails in the loop, where it is named, not here
            )
            self.dataset = range(pipeline.epoch_size("Reader"))  # so that len(loader.dataset) counts the files

        def __len__(self):
            return len(self.iterator)

        def __iter__(self):
            try:
                for batch in self.iterator:
                    yield batch[0]["images"].permute(0, 3, 1, 2), batch[0]["labels"].squeeze(-1).long()
            except RuntimeError as error:  # a corrupt file: one line that names it
                named = [line.strip() for line in str(error).splitlines() if "Failed to decode" in line]
                culprit = named[0] if named else f"{common.find_non_image(args.data_dir) or 'a file'} is not an image"
                common.die(f"DALI cannot decode a file under {args.data_dir}: {culprit}; remove or replace it")

    train_loader = DALILoader(jpeg_pipeline(train_dir, training=True), LastBatchPolicy.DROP)
    test_loader = DALILoader(jpeg_pipeline(val_dir, training=False), LastBatchPolicy.PARTIAL)
# new # end
else:
    train_set, test_set = common.load_data(args)
    train_loader = DeviceLoader(train_set, args.batch_size, device, train=True)  # new #
    test_loader = DeviceLoader(test_set, 1000, device, train=False)  # new #

# -- model, loss, optimizer, and the state of an earlier run to resume -------------------------------------------
model = common.build_model(args.model, *common.input_shape(args), num_classes)  # new # an ImageFolder's own classes
model = model.to(device, memory_format=torch.channels_last)  # new #
# new # begin: a permute or .view in the model would silently turn activations back to NCHW: check every conv once
inputs = []
hooks = [
    m.register_forward_pre_hook(lambda m, args: inputs.append(args[0]))
    for m in model.modules()
    if isinstance(m, nn.Conv2d)
]
channels, side = common.input_shape(args)
with torch.no_grad(), torch.autocast(device.type, dtype=amp_dtype):
    model.eval()(torch.zeros(2, channels, side, side, device=device).to(memory_format=torch.channels_last))
for hook in hooks:
    hook.remove()
if not all(x.is_contiguous(memory_format=torch.channels_last) for x in inputs):
    common.die("a convolution's input is not channels_last: a permute or .view in the model turned it back to NCHW")
# new # end
compiled = torch.compile(model, mode=args.compile_mode, dynamic=False)  # new # `model` stays eager: eval, checkpoints
criterion = nn.CrossEntropyLoss()
optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=5e-4, fused=True)  # new # one kernel
scaler = torch.amp.GradScaler(device.type, enabled=amp_dtype == torch.float16)  # new # bf16 needs no loss scaling
total_steps = args.epochs * len(train_loader)
if args.max_steps:
    total_steps = min(total_steps, args.max_steps)

start_epoch, step = 0, 0
checkpoint = args.checkpoint_dir / "last.pt" if args.checkpoint_dir else None
if args.resume and checkpoint.exists():
    state = common.load_checkpoint(checkpoint, args, model, optimizer, device, scaler=scaler)  # new # + loss scale
    start_epoch, step = state["epoch"], state["step"]
    print(f"resumed from {checkpoint}: {start_epoch} epochs and {step} steps done", flush=True)
# one-cycle schedule over this run's steps; on resume it continues at step `step` (last_epoch counts from -1)
scheduler = torch.optim.lr_scheduler.OneCycleLR(optimizer, max_lr=args.lr, total_steps=total_steps, last_epoch=step - 1)

# -- training -----------------------------------------------------------------------------------------------------
meter = common.Meter(device, args.warmup_steps)
epochs = []
print(f"training {args.model} on {args.dataset} ({device}), {total_steps} steps of {args.batch_size}", flush=True)
for epoch in range(start_epoch, args.epochs):
    model.train()
    meter.resume()
    loss_sum = torch.zeros((), device=device)  # summed on the device: no sync per step
    epoch_steps = 0
    for images, labels in meter.loader(train_loader):
        images = images.to(device, non_blocking=True, memory_format=torch.channels_last)  # new # NHWC, like the weights
        labels = labels.to(device, non_blocking=True)
        with torch.autocast(device.type, dtype=amp_dtype):  # new # convs/matmuls in low precision, reductions in fp32
            logits = compiled(images)  # new # compiles at the first call (a warm-up step)
            loss = criterion(logits, labels)
        optimizer.zero_grad(set_to_none=True)
        scaler.scale(loss).backward()  # new # scaled loss: small fp16 gradients do not flush to zero
        if args.clip_grad_norm:
            scaler.unscale_(optimizer)  # new # clip the true gradients, not the scaled ones
            nn.utils.clip_grad_norm_(model.parameters(), args.clip_grad_norm)
        scaler.step(optimizer)  # new # unscales, and skips the step if a gradient is inf/nan
        scaler.update()  # new # lower the scale after an overflow, raise it after a run of good steps
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

    with torch.autocast(device.type, dtype=amp_dtype):  # new # DALI's batches are float16: evaluate in autocast too
        val_loss, val_acc = common.evaluate(model, test_loader, device)
    epochs.append(
        common.epoch_record(epoch + 1, step, loss_sum / max(epoch_steps, 1), val_loss, val_acc, meter, logits)
    )
    print(common.epoch_line(epochs[-1]), flush=True)
    if checkpoint:
        common.save_checkpoint(checkpoint, args, model, optimizer, epoch + 1, step, scaler=scaler)  # new #
    if step == total_steps:
        break

# -- metrics: the closing line, and the metrics JSON with its provenance (--metrics-out) ------------------------
summary = meter.summary()
common.report(
    args,
    summary,
    epochs,
    script="train_fast.py",  # new #
    technique="everything stacked",  # new #
    precision=f"amp {str(amp_dtype).removeprefix('torch.')} + channels_last",  # new #
    device=device,
    steps=step,
    compile_s=summary["first_step_s"],  # new # the first step, where the compile happens
    compile_mode=args.compile_mode,  # new #
    loader=f"DALI {'mixed' if device.type == 'cuda' else 'cpu'}" if args.dataset == "imagefolder" else None,  # new #
    workers=args.threads or max(1, args.workers) if args.dataset == "imagefolder" else None,  # new # DALI threads
    image_size=common.input_shape(args)[1] if args.dataset == "imagefolder" else None,  # new # the crop side
    test_images=len(test_loader.dataset),  # evaluate() counts every one of them
)
