"""Where one training step's time goes, eager against torch.compile: the profiler's top ops for each.

    python bench/studies/profile_step.py                                   # small CNN, bf16 + channels_last, CPU
    python bench/studies/profile_step.py --amp-dtype float32 --model vit   # another rung, another model
    python bench/studies/profile_step.py --device cuda --model resnet50 --image-size 224 --batch-size 128   # on a GPU

The step is train_channels_last.py's (autocast, NHWC, AdamW; without its GradScaler and schedule) on one synthetic batch, run eagerly and then through
torch.compile (train_compile.py's rung), each warmed up, timed (images/s over --steps steps) and profiled over 10
steps with `torch.profiler`. Inductor's generated kernels are named in the table (`torch._inductor.config.cpp.
enable_kernel_profile` on a CPU; Triton kernels on a GPU carry their fused ops' names), so the table says which fused
kernels cost more or less than the eager ops they replace (that naming records each kernel call: the compiled
images/s carries this small cost too). docs/techniques/train_compile.md and the README's CPU ladder quote its logs
(results/archive/cpu-2core-avx512bf16-2026-11-24-peak/compile-on-cpu/).
"""

import argparse
import sys
import time
from pathlib import Path

import torch
import torch._inductor.config as inductor_config
from torch import nn
from torch.profiler import ProfilerActivity, profile

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "src"))
import common  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="cnn", choices=["cnn", "mlp", "resnet18", "resnet50", "vit"])
    parser.add_argument("--image-size", type=common.positive_int, default=28)
    parser.add_argument("--batch-size", type=common.positive_int, default=128)
    parser.add_argument("--amp-dtype", choices=["bfloat16", "float16", "float32"], default="bfloat16")
    parser.add_argument("--device", default="cpu", help="cpu or cuda")
    parser.add_argument("--steps", type=common.positive_int, default=40, help="timed steps per configuration")
    args = parser.parse_args()
    device = common.get_device(args.device)
    channels = 1 if args.image_size == 28 else 3  # Fashion-MNIST's shape at 28 px, RGB otherwise
    dtype = getattr(torch, args.amp_dtype)
    inductor_config.cpp.enable_kernel_profile = True  # name Inductor's C++ kernels in the profile
    print(f"{common.env.cpu_info()['cpu_model']}, {torch.get_num_threads()} threads, torch {torch.__version__}")
    print(f"{args.model} {channels}x{args.image_size}x{args.image_size}, batch {args.batch_size}, {args.amp_dtype}")

    for mode in ("eager", "compile"):
        torch.manual_seed(0)
        model = common.build_model(args.model, channels, args.image_size).to(device, memory_format=torch.channels_last)
        forward = torch.compile(model, dynamic=False) if mode == "compile" else model
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
        criterion = nn.CrossEntropyLoss()
        x = torch.randn(args.batch_size, channels, args.image_size, args.image_size, device=device)
        x = x.to(memory_format=torch.channels_last)
        y = torch.randint(0, 10, (args.batch_size,), device=device)

        def step():
            with torch.autocast(device.type, dtype=dtype, enabled=dtype != torch.float32):
                loss = criterion(forward(x), y)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()

        for _ in range(10):  # warm-up: the compile, then steady steps
            step()
        if device.type == "cuda":
            torch.cuda.synchronize()
        start = time.perf_counter()
        for _ in range(args.steps):
            step()
        if device.type == "cuda":
            torch.cuda.synchronize()
        rate = args.steps * args.batch_size / (time.perf_counter() - start)
        activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
        with profile(activities=activities) as prof:
            for _ in range(10):
                step()
        sort = "self_device_time_total" if device.type == "cuda" else "self_cpu_time_total"
        print(f"\n== {mode}: {rate:.0f} images/s; 10 profiled steps, top 15 ops by self time ==")
        print(prof.key_averages().table(sort_by=sort, row_limit=15, max_name_column_width=70))


if __name__ == "__main__":
    common.errors.install_error_hook()
    main()
