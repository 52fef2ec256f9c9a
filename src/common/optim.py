"""Muon with its Newton-Schulz iterations in a precision of the caller's choice (torch.optim.Muon's are bfloat16)."""

from __future__ import annotations

import torch
from torch.optim._muon import _adjust_lr
from torch.optim.optimizer import _to_scalar


def newton_schulz(
    update: torch.Tensor, coefficients: tuple[float, float, float], steps: int, eps: float, dtype: torch.dtype
) -> torch.Tensor:
    """The orthogonalized `update` (2-D, any float dtype), in `dtype`: `steps` quintic Newton-Schulz iterations.

    The same operations, in the same order, as torch.optim.Muon's `_zeropower_via_newtonschulz` (Keller Jordan's
    reference, github.com/KellerJordan/Muon): the matrix turned wide, scaled to a Frobenius norm of 1 (so its spectral
    norm is at most 1), then X <- aX + (bA + cA^2)X with A = XX^T. torch computes them in bfloat16, always; with
    `dtype=torch.bfloat16` this is torch's, bit for bit, and with float32 the same iteration rounded less.
    Raises ValueError for a tensor that is not 2-D."""
    if update.ndim != 2:
        raise ValueError(f"Newton-Schulz orthogonalizes a 2-D matrix, not a tensor of shape {tuple(update.shape)}")
    if steps >= 100 or len(coefficients) != 3:  # torch's own checks
        raise ValueError(f"Newton-Schulz takes fewer than 100 steps and 3 coefficients, not {steps} and {coefficients}")
    a, b, c = coefficients
    x = update.to(dtype=dtype, copy=True)
    tall = update.size(0) > update.size(1)
    if tall:
        x = x.T
    x.div_(x.norm().clamp(min=eps))
    for _ in range(steps):
        gram = x @ x.T
        x = torch.addmm(x, torch.addmm(gram, gram, gram, beta=b, alpha=c), x, beta=a)
    return x.T if tall else x


class Muon(torch.optim.Muon):
    """torch.optim.Muon (its arguments, defaults, parameter groups and state: a `momentum_buffer` per matrix, so the
    two load each other's state dicts) with the Newton-Schulz iterations in `ns_dtype` rather than always bfloat16.

    bfloat16 halves the matmuls' cost where the hardware multiplies it natively (a GPU of compute capability 8.0+, a
    CPU with AVX512-BF16 or AMX); a CPU without those instructions emulates it, and each step costs many times what
    float32 costs (`common.device.native_bfloat16` says which). Each step: the momentum as an average of the gradients
    (`lerp`), the Nesterov look-ahead along it, the orthogonalized update, decoupled weight decay, and the rate scaled
    by sqrt(max(1, fan-out / fan-in)) (torch's `adjust_lr_fn`). With `ns_dtype=torch.bfloat16` its steps are
    torch.optim.Muon's, bit for bit (tests/test_muon.py). Raises ValueError / RuntimeError where torch's would (not
    2-D, 100 or more steps, complex parameters, sparse gradients)."""

    def __init__(self, params, *, ns_dtype: torch.dtype = torch.bfloat16, **kwargs) -> None:
        super().__init__(params, **kwargs)
        self.ns_dtype = ns_dtype

    def __getstate__(self) -> dict:  # Optimizer's keeps defaults, state and groups only: a deepcopy keeps the dtype too
        return {**super().__getstate__(), "ns_dtype": self.ns_dtype}

    @torch.no_grad()
    def step(self, closure=None):
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for group in self.param_groups:
            lr, momentum = _to_scalar(group["lr"]), group["momentum"]  # a tensor lr, as torch's takes it
            for p in group["params"]:
                if p.grad is None:
                    continue
                if torch.is_complex(p) or p.grad.is_sparse:
                    raise RuntimeError("Muon supports neither complex parameters nor sparse gradients")
                state = self.state[p]
                if "momentum_buffer" not in state:
                    state["momentum_buffer"] = torch.zeros_like(p.grad, memory_format=torch.preserve_format)
                buf = state["momentum_buffer"]
                buf.lerp_(p.grad, 1 - momentum)
                update = p.grad.lerp(buf, momentum) if group["nesterov"] else buf
                update = newton_schulz(update, group["ns_coefficients"], group["ns_steps"], group["eps"], self.ns_dtype)
                p.mul_(1 - lr * group["weight_decay"])
                p.add_(update, alpha=-_adjust_lr(lr, group["adjust_lr_fn"], p.shape))
        return loss
