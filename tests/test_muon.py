"""train_muon.py against train.py: Muon takes the blocks' 2-D weight matrices, AdamW everything else, and three steps
of the script land where three steps written out here from Muon's definition land.

The written-out steps are independent of the script: the split by parameter name (a block's 2-D weight, not the
embeddings, the head, norms or biases), Muon's update as Keller Jordan's reference implementation defines it
(momentum as an exponential average, the Nesterov look-ahead, five Newton-Schulz iterations in bfloat16 with the
quintic's coefficients, the step scaled by sqrt(max(1, fan-out / fan-in)), decoupled weight decay) and its learning
rate on train.py's one-cycle schedule with its momentum held at 0.95; AdamW and the schedule are torch's, as in
train.py. One step cannot tell momentum from none (the first update is the orthogonalized gradient either way), so
three: the second and third show the momentum, the schedule's second and third rates, and the Nesterov term.
"""

import copy
import json
import math
import os
import platform
import signal

import pytest
import torch
import torch.nn as nn
from conftest import WITHOUT_BF16, cpu_has_native_bfloat16, run
from test_equivalence import SAME, train, weights
from test_preemption import finish, state, terminate_after

import common

# 16 blocks of 32 characters and a batch of 16: one step an epoch, whose batch is the same 16 blocks every epoch (a
# mean over the batch, so the order the sampler gives does not matter), 3 epochs, so 3 steps and a checkpoint after.
# Rates a tenth of the defaults: AdamW's first steps move a parameter whose gradient is near zero by a whole step, so
# at the default rate float32's rounding of such gradients shows in the weights; a tenth keeps the rest within 1e-3
LR, MUON_LR, WEIGHT_DECAY, MOMENTUM, CLIP = 6e-4, 0.002, 5e-4, 0.95, 1.0
MUON = ["--model", "gpt", "--subset", "16", "--test-subset", "16", "--seq-len", "32", "--batch-size", "16",
        "--epochs", "3", "--sample-chars", "0", "--lr", str(LR), "--muon-lr", str(MUON_LR)]  # fmt: skip


def newton_schulz(update: torch.Tensor, steps: int = 5, eps: float = 1e-7) -> torch.Tensor:
    """The orthogonalized `update` (2-D): the quintic Newton-Schulz iteration that torch.optim.Muon documents (Keller
    Jordan's, github.com/KellerJordan/Muon), computed in float64; float32 out. torch, like Keller's reference, runs it
    in bfloat16: on these gradients that moves the update by up to a tenth of its norm (measured: 9.3 %)."""
    a, b, c = 3.4445, -4.7750, 2.0315
    x = update.double()
    tall = x.size(0) > x.size(1)
    if tall:
        x = x.T
    x = x / x.norm().clamp(min=eps)  # spectral norm at most 1
    for _ in range(steps):
        gram = x @ x.T
        x = a * x + (b * gram + c * gram @ gram) @ x
    return (x.T if tall else x).float()


def schedule(peak: float, steps: int) -> list[float]:
    """The learning rate of each step under train.py's one-cycle schedule with this peak."""
    dummy = torch.optim.SGD([nn.Parameter(torch.zeros(1))], lr=peak)
    sched = torch.optim.lr_scheduler.OneCycleLR(dummy, max_lr=peak, total_steps=steps, cycle_momentum=False)
    rates = []
    for _ in range(steps):
        rates.append(dummy.param_groups[0]["lr"])
        dummy.step()
        sched.step()
    return rates


def written_out(steps: int = 3) -> tuple[dict, dict]:
    """The model's state and Muon's momentum buffers (by parameter name) after `steps` steps written out here."""
    common.seed_everything(0)
    model = common.build_model("gpt", 84, 32)
    train_set, _ = common.text.shakespeare(32)
    inputs, targets = (t[:16] for t in train_set.tensors)
    named = dict(model.named_parameters())
    matrices = {n: p for n, p in named.items() if n.startswith("block") and p.ndim == 2}  # q, k, v, out, fc1, fc2
    adamw = torch.optim.AdamW([p for n, p in named.items() if n not in matrices], lr=LR, weight_decay=WEIGHT_DECAY)
    adamw_schedule = torch.optim.lr_scheduler.OneCycleLR(adamw, max_lr=LR, total_steps=steps)
    rates = schedule(MUON_LR, steps)
    momentum = {n: torch.zeros_like(p) for n, p in matrices.items()}
    for step in range(steps):
        model.zero_grad(set_to_none=True)
        nn.functional.cross_entropy(model(inputs), targets).backward()
        nn.utils.clip_grad_norm_(model.parameters(), CLIP)
        adamw.step()
        with torch.no_grad():
            for name, p in matrices.items():
                momentum[name] = MOMENTUM * momentum[name] + (1 - MOMENTUM) * p.grad  # an average of the gradients
                nesterov = (1 - MOMENTUM) * p.grad + MOMENTUM * momentum[name]  # a look-ahead along it
                fan_out, fan_in = p.shape
                p.mul_(1 - rates[step] * WEIGHT_DECAY)
                p.add_(newton_schulz(nesterov), alpha=-rates[step] * math.sqrt(max(1.0, fan_out / fan_in)))
        adamw_schedule.step()
    return {k: v.detach().clone() for k, v in model.state_dict().items()}, momentum


def test_muon_takes_the_block_matrices_and_three_steps_match_muon_written_out(tmp_path):
    """The checkpoint after 3 steps: Muon's momentum buffers are the 24 block matrices' (4 blocks x q, k, v, out,
    fc1, fc2) and equal the written-out ones within 1 % (a momentum left out, another value, or one the schedule
    cycles changes them by half or more); Muon's momentum is 0.95 with Nesterov; AdamW's state holds every other
    parameter, the embeddings and the head among them; every weight is the written-out run's: the matrices within 20 %
    of what the 3 steps moved them (torch's bfloat16 Newton-Schulz against float64 here: 9.3 % measured; a wrong rate,
    its scaling by the matrix's shape or a raw gradient for an update are off by 2x or more), the rest within 1e-3."""
    result = train(tmp_path / "muon", "src/train_muon.py", *MUON)
    state = result["state"]
    expected, momentum = written_out()
    muon = state["muon"]
    group = muon["param_groups"][0]
    assert [g["momentum"] for g in muon["param_groups"]] == [MOMENTUM] and group["nesterov"]
    assert (group["weight_decay"], group["max_lr"]) == (WEIGHT_DECAY, MUON_LR)  # AdamW's decay; its own peak
    buffers = [s["momentum_buffer"] for s in muon["state"].values()]
    assert [tuple(b.shape) for b in buffers] == [tuple(m.shape) for m in momentum.values()]  # 24, in block order
    for got, (name, want) in zip(buffers, momentum.items(), strict=True):
        assert (got - want).norm() <= 1e-2 * want.norm(), name
    adamw_shapes = [tuple(s["exp_avg"].shape) for s in state["optimizer"]["state"].values()]
    assert [s for s in adamw_shapes if len(s) == 2] == [(84, 128), (32, 128), (84, 128)]  # token, position, head
    assert len(adamw_shapes) + len(buffers) == len(expected)  # every parameter on exactly one optimizer

    common.seed_everything(0)
    start = common.build_model("gpt", 84, 32).state_dict()
    got = weights(result)
    for name, value in expected.items():
        moved = (value - start[name]).norm()
        error = (got[name] - value).norm()
        limit = 0.2 if name.startswith("block") and value.ndim == 2 else 1e-3
        assert error <= limit * moved + 1e-6, f"{name}: {error:.3g} off, the steps moved it {moved:.3g}"


def test_muon_refuses_a_model_without_block_matrices_in_one_line():
    proc = run("src/train_muon.py", *SAME, "--model", "cnn")
    assert proc.returncode == 2 and proc.stderr.strip().splitlines()[-1].endswith("--model gpt, gpt2 or vit, not cnn")


def test_a_sigterm_and_resume_end_with_the_uninterrupted_run_s_weights_and_muon_s_momentum(tmp_path):
    """SIGTERM after step 1 of the 3, then --resume: the weights and Muon's momentum buffers are the uninterrupted
    run's, bit for bit (a resume that left Muon's state out of last.pt, or restarted its schedule, would differ); and
    a resume with another --muon-lr is refused in one line (the schedule would keep the saved peak)."""
    flags = [*SAME, *MUON, "--deterministic", "--log-every", "1"]
    full = finish(["src/train_muon.py", *flags, "--checkpoint-dir", tmp_path / "full"])
    assert full.returncode == 0, full.stderr
    argv = ["src/train_muon.py", *flags, "--checkpoint-dir", tmp_path / "cut"]
    cut = terminate_after(argv, 1, lambda job: job.send_signal(signal.SIGTERM))
    assert cut.returncode == 143, cut.stderr
    resumed = finish([*argv, "--resume"])
    assert resumed.returncode == 0 and "resumed from" in resumed.stdout, resumed.stderr
    a, b = state(tmp_path / "cut" / "last.pt"), state(tmp_path / "full" / "last.pt")
    assert a["step"] == b["step"] == 3
    for key in b["model"]:
        assert torch.equal(a["model"][key], b["model"][key]), key
    for i, s in b["muon"]["state"].items():
        assert torch.equal(a["muon"]["state"][i]["momentum_buffer"], s["momentum_buffer"]), i
    other = finish([*argv[: argv.index("--muon-lr") + 1], "0.01", *argv[argv.index("--muon-lr") + 2 :], "--resume"])
    assert other.returncode == 2 and "Muon's peak learning rate (--muon-lr) 0.002 there, 0.01 here" in other.stderr


def test_train_fast_s_gpt_takes_train_muon_s_optimizers_and_steps(tmp_path):
    """train_fast.py's GPT (Muon stacked on compile, fused AdamW and batches cut from memory) against train_muon.py,
    the lesson whose steps the test above writes out: 3 steps of each, train_fast.py in float32 (--amp-dtype float32,
    so that only the rung's own changes differ). Muon holds the same 24 matrices with the same momentum, Nesterov,
    decay and peak, and last.pt keeps its state (a resume needs it); Muon's momentum buffers are train_muon.py's within
    1 %, its matrices within 5 % of what the 3 steps moved them (measured: 1.6 %; compiled kernels sum in another order,
    and Newton-Schulz in bfloat16 rounds some elements of the nearly equal updates the other way), every other
    parameter within 1e-3 of its movement + 1e-5 (measured: 2e-4; the keys' biases get no gradient, since the softmax
    ignores a shift shared by all keys, and move by float noise alone). A Muon never stepped, a schedule that does not
    move its rate, or a matrix left to AdamW is off by half its movement or more."""
    fast = train(tmp_path / "fast", "src/train_fast.py", *MUON, "--amp-dtype", "float32")
    muon = train(tmp_path / "muon", "src/train_muon.py", *MUON)
    a, b = fast["state"], muon["state"]
    group, base = a["muon"]["param_groups"][0], b["muon"]["param_groups"][0]
    keys = ("momentum", "nesterov", "weight_decay", "max_lr")
    assert [group[k] for k in keys] == [base[k] for k in keys] == [MOMENTUM, True, WEIGHT_DECAY, MUON_LR]
    assert a["optimizer"]["param_groups"][0]["fused"] is True  # the rest on fused AdamW
    assert len(a["optimizer"]["state"]) == len(b["optimizer"]["state"])  # the same split
    pairs = zip(a["muon"]["state"].values(), b["muon"]["state"].values(), strict=True)
    for got, want in pairs:
        got, want = got["momentum_buffer"], want["momentum_buffer"]
        assert got.shape == want.shape and (got - want).norm() <= 1e-2 * want.norm()
    common.seed_everything(0)
    start = common.build_model("gpt", 84, 32).state_dict()
    got, want = weights(fast), weights(muon)
    for name, value in want.items():
        moved, error = (value - start[name]).norm(), (got[name] - value).norm()
        matrix = name.startswith("block") and value.ndim == 2
        print(f"{name}: off by {error / moved:.1e} of its movement")
        assert error <= (0.05 * moved if matrix else 1e-3 * moved + 1e-5), f"{name}: {error:.3g} off, moved {moved:.3g}"
    assert fast["metrics"]["muon_lr"] == MUON_LR and fast["metrics"]["technique"] == "Everything stacked"
    assert fast["metrics"]["args"]["max_steps"] == 1200  # the GPT's recipe, where the command line leaves it out
    assert muon["metrics"]["args"]["max_steps"] == common.models.DEFAULTS["gpt"]["max_steps"]  # train.py's AdamW one


# -- the precision of Newton-Schulz: bfloat16 where the device multiplies it natively, float32 where it would emulate it


def test_common_muon_in_bfloat16_is_torch_s_bit_for_bit_and_in_float32_is_newton_schulz_written_out():
    """common.Muon is torch.optim.Muon with one choice added, the precision of its Newton-Schulz iterations.
    Compared: with ns_dtype=bfloat16, a tall and a wide matrix and their momentum buffers after 3 steps of random
    gradients against torch.optim.Muon's, bit for bit (the same operations in the same order: it changes nothing where
    bfloat16 is native); each loads the other's state dict. And common.optim.newton_schulz against the quintic written
    out here in float64: in float32 within 1e-5 relative (float32's rounding over 5 iterations, measured 1.4e-6), in
    bfloat16 off by more than 5e-3 (measured 1.1e-2 to 1.4e-2): a float32 request that ran in bfloat16 fails."""
    torch.manual_seed(0)
    ours = [nn.Parameter(torch.randn(64, 32)), nn.Parameter(torch.randn(32, 96))]
    theirs = [nn.Parameter(p.detach().clone()) for p in ours]
    a = common.Muon(ours, lr=MUON_LR, weight_decay=WEIGHT_DECAY, ns_dtype=torch.bfloat16)
    b = torch.optim.Muon(theirs, lr=MUON_LR, weight_decay=WEIGHT_DECAY)
    for _ in range(3):
        for p, q in zip(ours, theirs, strict=True):
            p.grad = torch.randn_like(p)
            q.grad = p.grad.clone()
        a.step()
        b.step()
    assert all(torch.equal(p, q) for p, q in zip(ours, theirs, strict=True))
    for p, q in zip(ours, theirs, strict=True):
        assert torch.equal(a.state[p]["momentum_buffer"], b.state[q]["momentum_buffer"])
    a.load_state_dict(b.state_dict())
    b.load_state_dict(a.state_dict())
    copied = copy.deepcopy(a)  # torch's Optimizer pickles defaults, state and groups only: the dtype must go too
    assert copied.ns_dtype == torch.bfloat16 and copied.step() is None

    for shape in ((128, 128), (512, 128), (84, 128)):
        grad = torch.randn(shape)
        want = newton_schulz(grad).double()
        for dtype, low, high in ((torch.float32, 0.0, 1e-5), (torch.bfloat16, 5e-3, 0.05)):
            got = common.optim.newton_schulz(grad, (3.4445, -4.7750, 2.0315), 5, 1e-7, dtype)
            error = ((got.double() - want).norm() / want.norm()).item()
            assert got.dtype == dtype and low <= error < high, f"{shape} in {dtype}: {error:.1e} off"


@pytest.mark.parametrize(
    "onednn, avx512_bf16, amx, limit, native",
    [
        (True, True, False, None, True),  # Zen 4, Cooper Lake: AVX512-BF16
        (True, False, True, None, True),  # Sapphire Rapids: AMX
        (True, False, False, None, False),  # Cascade Lake, Ice Lake: AVX512 without BF16 (oneDNN converts: slower)
        (False, False, False, None, False),  # AVX2 only: torch's scalar loop
        (True, True, False, "AVX2", False),  # kept below its bf16 instructions
        (True, True, False, "AVX512_CORE", False),
        (True, True, False, "avx512_core_bf16", True),
        (True, True, False, "AVX512_CORE_FP16", True),  # oneDNN's name for AVX10.1, which has them
    ],
)
def test_native_bfloat16_is_onednn_s_check_and_the_instructions_and_no_limit_below_them(
    onednn, avx512_bf16, amx, limit, native, monkeypatch
):
    """common.native_bfloat16 on an x86 CPU, over the kinds of CPU torch's own queries tell apart (each query set to
    what that CPU answers): native only where torch hands a bfloat16 matmul to oneDNN, the CPU has bf16 dot products
    (AVX512-BF16 or AMX), and ONEDNN_MAX_CPU_ISA does not keep oneDNN below them. Either of the first two alone is
    not enough: an AVX512 CPU without BF16 passes oneDNN's check and converts to float32, slower than float32."""
    monkeypatch.setattr(common.device.platform, "machine", lambda: "x86_64")
    monkeypatch.setattr(torch.ops.mkldnn, "_is_mkldnn_bf16_supported", lambda: onednn)
    monkeypatch.setattr(torch.cpu, "_is_avx512_bf16_supported", lambda: avx512_bf16)
    monkeypatch.setattr(torch.cpu, "_is_amx_tile_supported", lambda: amx)
    monkeypatch.delenv("DNNL_MAX_CPU_ISA", raising=False)
    if limit is None:
        monkeypatch.delenv("ONEDNN_MAX_CPU_ISA", raising=False)
    else:
        monkeypatch.setenv("ONEDNN_MAX_CPU_ISA", limit)
    assert common.native_bfloat16(torch.device("cpu")) is native
    if not native:
        assert "emulated" in common.device.bfloat16_emulated(torch.device("cpu"))


@pytest.mark.skipif(platform.machine() != "x86_64", reason="ONEDNN_MAX_CPU_ISA=AVX2 names an x86 instruction set")
def test_a_cpu_without_native_bfloat16_gets_float32_newton_schulz_and_train_fast_leaves_autocast_off(tmp_path):
    """On a CPU without bf16 instructions torch emulates bfloat16 matmuls (60x float32's time on an EPYC limited to
    AVX2), so the scripts pick float32 there. WITHOUT_BF16 limits oneDNN, ATen and MKL to AVX2: what such a CPU runs,
    on any x86 CPU. train_muon.py: Newton-Schulz in float32, said in one line and in the metrics, and its 3 steps land
    on the float64 Muon written out above within 1 % of what they moved each matrix (float32's rounding; bfloat16's is
    9.3 %, as the first test measures). train_fast.py's GPT with its defaults: autocast off (float32 logits), the
    AMP line saying why, Newton-Schulz in float32. On the test's own CPU, with no limit: each script's choice is
    bfloat16 where /proc/cpuinfo lists bf16 instructions, else float32."""
    env = {**os.environ, **WITHOUT_BF16}
    muon = train(tmp_path / "muon", "src/train_muon.py", *MUON, env=env)
    assert muon["metrics"]["muon_ns_dtype"] == "float32" and muon["metrics"]["env"]["bf16_native"] is False
    assert "Muon: Newton-Schulz in torch.float32" in muon["stdout"]
    expected, _ = written_out()
    common.seed_everything(0)
    start = common.build_model("gpt", 84, 32).state_dict()
    got = weights(muon)
    for name, value in expected.items():
        if name.startswith("block") and value.ndim == 2:
            moved, error = (value - start[name]).norm(), (got[name] - value).norm()
            assert error <= 0.01 * moved, f"{name}: {error:.3g} off, the steps moved it {moved:.3g}"

    fast = train(tmp_path / "fast", "src/train_fast.py", *MUON, "--max-steps", "1", env=env)
    assert fast["metrics"]["precision"] == "autocast off, fp32" and fast["metrics"]["muon_ns_dtype"] == "float32"
    assert fast["metrics"]["epochs"][-1]["logits_dtype"] == "torch.float32"
    assert "AMP: bfloat16 is emulated here (ONEDNN_MAX_CPU_ISA=AVX2" in fast["stdout"]
    assert "; autocast off, float32" in fast["stdout"]
    amp = train(tmp_path / "amp", "src/train_amp.py", "--model", "cnn", "--subset", "64", "--batch-size", "32",
                "--max-steps", "1", "--test-subset", "64", env=env)  # fmt: skip  # the ladder's first rung: the same
    assert amp["metrics"]["precision"] == "autocast off, fp32" and "; autocast off, float32" in amp["stdout"]

    native = "bfloat16" if cpu_has_native_bfloat16() else "float32"
    plain = run("src/train_muon.py", *SAME, *MUON, "--max-steps", "1", "--metrics-out", tmp_path / "plain.json")
    assert plain.returncode == 0, plain.stderr
    assert json.loads((tmp_path / "plain.json").read_text())["muon_ns_dtype"] == native
