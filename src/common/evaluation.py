"""Test loss and accuracy over a whole loader."""

from __future__ import annotations

import torch
import torch.nn as nn


@torch.no_grad()
def evaluate(model: nn.Module, loader, device: torch.device) -> tuple[float, float]:
    """Mean cross-entropy and top-1 accuracy (a fraction in [0, 1]) over every sample `loader` yields.

    Images go to `device`; the labels follow the logits (which may come out on another device, as in model
    parallelism). Counts the samples it sees, so for Fashion-MNIST's test set it averages over exactly 10,000 images.
    Leaves the model in eval mode; the caller switches back with `model.train()`.
    """
    model.eval()
    loss_sum = torch.zeros((), device=device)
    correct = torch.zeros((), device=device, dtype=torch.long)
    seen = 0
    for images, labels in loader:
        logits = model(images.to(device, non_blocking=True))
        labels = labels.to(logits.device, non_blocking=True)
        loss_sum += nn.functional.cross_entropy(logits.float(), labels, reduction="sum").to(device)
        correct += (logits.argmax(1) == labels).sum().to(device)
        seen += labels.numel()
    return loss_sum.item() / seen, correct.item() / seen
