"""Optimizer and learning-rate schedule shared by every model."""

from __future__ import annotations

import inspect
import math

import torch
from torch import nn


def decay_groups(
    model: nn.Module, skip: set[str] | tuple | None = None
) -> tuple[list[nn.Parameter], list[nn.Parameter]]:
    """(decayed, not decayed) parameters, one rule for every family:

    * matrices (Linear and Embedding weights, conv kernels: ``dim >= 2``) decay;
    * biases and norm gains (``dim < 2``) do not;
    * nor do the parameters a model names in ``no_weight_decay()`` (timm's convention): ViT's
      class token and position embeddings, as in timm and DeiT. GPT keeps nanoGPT's rule, under
      which its token and position embeddings decay.
    Tied weights appear once. ``skip`` replaces the model's ``no_weight_decay()`` (``()``: attnlab
    0.1's rule, under which every matrix decayed)."""
    if skip is None:
        skip = model.no_weight_decay() if hasattr(model, "no_weight_decay") else ()
    skip = set(skip)
    seen, decay, no_decay = set(), [], []
    for name, p in model.named_parameters():
        if not p.requires_grad or id(p) in seen:
            continue
        seen.add(id(p))
        (decay if p.dim() >= 2 and name not in skip else no_decay).append(p)
    return decay, no_decay


def adamw(model: nn.Module, lr: float, weight_decay: float, betas=(0.9, 0.95), device_type: str = "cpu"):
    """AdamW with the two groups of ``decay_groups``; fused (one kernel over every parameter
    instead of a dozen small ops per parameter) on CUDA and CPU. On a CPU the default
    per-parameter loop shows in a small model's step: GPT 4/4/128, batch 12, 2 cores: 45.8 ms
    per step with the loop, 43.4 ms fused (median of 5 interleaved timings); the weights agree
    to rounding (tested)."""
    decay, no_decay = decay_groups(model)
    groups = [
        {"params": decay, "weight_decay": weight_decay},
        {"params": no_decay, "weight_decay": 0.0},
    ]
    extra = {}
    if "fused" in inspect.signature(torch.optim.AdamW).parameters and device_type in ("cuda", "cpu"):
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
