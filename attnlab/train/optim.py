"""Optimizer and learning-rate schedule shared by every model."""

from __future__ import annotations

import inspect
import math

import torch
from torch import nn


def adamw(model: nn.Module, lr: float, weight_decay: float, betas=(0.9, 0.95), device_type: str = "cpu"):
    """AdamW with two groups: matrices (Linear, Embedding weights) decay; biases and norm gains do not."""
    params = [p for p in model.parameters() if p.requires_grad]
    seen, decay, no_decay = set(), [], []
    for p in params:  # tied weights appear once
        if id(p) in seen:
            continue
        seen.add(id(p))
        (decay if p.dim() >= 2 else no_decay).append(p)
    groups = [
        {"params": decay, "weight_decay": weight_decay},
        {"params": no_decay, "weight_decay": 0.0},
    ]
    extra = {}
    if "fused" in inspect.signature(torch.optim.AdamW).parameters and device_type == "cuda":
        extra["fused"] = True
    return torch.optim.AdamW(groups, lr=lr, betas=betas, **extra)


def warmup_cosine(step: int, *, lr: float, min_lr: float, warmup: int, decay_steps: int) -> float:
    """Linear warmup from 0 to ``lr`` over ``warmup`` steps, then cosine decay to ``min_lr``
    at ``decay_steps``, constant after that (nanoGPT's schedule)."""
    if step < warmup:
        return lr * (step + 1) / (warmup + 1)
    if step >= decay_steps:
        return min_lr
    ratio = (step - warmup) / max(1, decay_steps - warmup)
    return min_lr + 0.5 * (1.0 + math.cos(math.pi * ratio)) * (lr - min_lr)
