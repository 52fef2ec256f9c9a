"""Why did train_compile.py run slower than train_amp.py on GPT-2's shape (results/gpu-h200-2026-11-26-gpt)?

One process, GPT-2 small's shape (common.build_model("gpt2")), 8 x 1,024 random tokens already on the GPU, the step
of train_amp.py / train_compile.py (autocast, GradScaler for float16, clip to norm 1.0, AdamW, OneCycleLR). For each
configuration: 15 warm-up steps, then 40 timed steps (host clock, device synchronised at the edges only), then 5 steps
under torch.profiler: the device's kernel time per step against the step's wall time says whether the GPU or the host
sets the pace. Run: python results/gpu-compile-probe-2026-11-26/probe.py OUT_DIR
"""

import json
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "src"))
import torch  # noqa: E402
from torch import nn  # noqa: E402
from torch.profiler import ProfilerActivity, profile  # noqa: E402

import common  # noqa: E402

out = Path(sys.argv[1])
out.mkdir(parents=True, exist_ok=True)
device = torch.device("cuda")


def run(name, dtype, compiled):
    torch.manual_seed(0)
    model = common.build_model("gpt2", 84, 1024).to(device)
    step_model = torch.compile(model, dynamic=False) if compiled else model
    optimizer = torch.optim.AdamW(model.parameters(), lr=6e-4, weight_decay=5e-4)
    scheduler = torch.optim.lr_scheduler.OneCycleLR(optimizer, max_lr=6e-4, total_steps=1000)
    scaler = torch.amp.GradScaler("cuda", enabled=dtype == torch.float16)
    criterion = nn.CrossEntropyLoss()
    tokens = torch.randint(0, 84, (8, 1025), device=device)
    x, y = tokens[:, :-1], tokens[:, 1:]

    def step():
        with torch.autocast("cuda", dtype=dtype):
            loss = criterion(step_model(x), y)
        optimizer.zero_grad(set_to_none=True)
        scaler.scale(loss).backward()
        scaler.unscale_(optimizer)
        nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        scaler.step(optimizer)
        scaler.update()
        scheduler.step()
        return loss

    t0 = time.perf_counter()
    step()
    torch.cuda.synchronize()
    first_s = time.perf_counter() - t0
    for _ in range(14):
        step()
    torch.cuda.synchronize()
    times = []
    for _ in range(40):
        t = time.perf_counter()
        step()
        times.append(time.perf_counter() - t)
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        torch.cuda.synchronize()
        t = time.perf_counter()
        for _ in range(5):
            step()
        torch.cuda.synchronize()
        prof_wall = (time.perf_counter() - t) / 5
    events = prof.key_averages()
    kernel_us = sum(e.self_device_time_total for e in events if e.device_type == torch.autograd.DeviceType.CUDA)
    kernels = sum(e.count for e in events if e.device_type == torch.autograd.DeviceType.CUDA)
    launches = sum(e.count for e in events if e.key in ("cudaLaunchKernel", "cuLaunchKernel", "cudaLaunchKernelExC"))
    syncs = {e.key: e.count for e in events if "Synchronize" in e.key or e.key in ("aten::item", "aten::_local_scalar_dense")}
    (out / f"{name}-top.txt").write_text(
        events.table(sort_by="self_device_time_total", row_limit=25)
        + "\n\n"
        + events.table(sort_by="self_cpu_time_total", row_limit=25)
    )
    if name in ("eager-fp16", "compile-fp16"):  # a timeline of each, for the gaps between kernels
        prof.export_chrome_trace(str(out / f"{name}-trace.json"))
    row = {
        "config": name,
        "first_step_s": round(first_s, 2),
        "step_ms_median": round(1e3 * statistics.median(times), 2),
        "step_ms_min": round(1e3 * min(times), 2),
        "step_ms_max": round(1e3 * max(times), 2),
        "profiled_step_ms": round(1e3 * prof_wall, 2),
        "kernel_ms_per_step": round(kernel_us / 5 / 1e3, 2),
        "kernels_per_step": kernels / 5,
        "launch_calls_per_step": launches / 5,
        "sync_calls_per_5_steps": syncs,
        "tokens_per_s": round(8 * 1024 / statistics.median(times)),
    }
    print(json.dumps(row), flush=True)
    del model, step_model, optimizer
    torch.cuda.empty_cache()
    return row


rows = []
for name, dtype, compiled in [
    ("eager-fp16", torch.float16, False),
    ("compile-fp16", torch.float16, True),
    ("eager-bf16", torch.bfloat16, False),
    ("compile-bf16", torch.bfloat16, True),
    ("eager-fp16-again", torch.float16, False),
    ("compile-fp16-again", torch.float16, True),
]:
    rows.append(run(name, dtype, compiled))
    (out / "probe.json").write_text(json.dumps(rows, indent=1))
