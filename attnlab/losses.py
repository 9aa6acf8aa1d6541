"""The one loss every model here trains on: cross-entropy of logits against target ids.

    L = -(1/N) Σ_n log softmax(z_n)[y_n]      over the N targets that are not ``ignore_index``

Computed in fp32 whatever the autocast dtype (a bf16 log-softmax over a large vocabulary
loses digits), for next tokens (B, T, V) against (B, T) as well as classes (B, V) against (B,).
:func:`chunked_cross_entropy` computes the same from the hidden states, a block of tokens at a time,
so that the (tokens × vocabulary) fp32 logits never exist all at once.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import Tensor
from torch.utils.checkpoint import checkpoint

__all__ = ["cross_entropy", "chunked_cross_entropy"]


def cross_entropy(
    logits: Tensor, targets: Tensor, *, ignore_index: int = -100, label_smoothing: float = 0.0, reduction: str = "mean"
) -> Tensor:
    """logits (..., V), targets (...) int -> the mean (or ``reduction="sum"``) cross-entropy."""
    return F.cross_entropy(
        logits.float().reshape(-1, logits.shape[-1]),
        targets.reshape(-1),
        ignore_index=ignore_index,
        label_smoothing=label_smoothing,
        reduction=reduction,
    )


def chunked_cross_entropy(
    hidden: Tensor, head: Callable[[Tensor], Tensor], targets: Tensor, chunk: int, *, ignore_index: int = -100
) -> Tensor:
    """The mean cross-entropy of ``head(hidden)`` against ``targets``, ``chunk`` tokens at a time:
    hidden (..., D), targets (...) -> a 0-dim fp32 loss equal to
    ``cross_entropy(head(hidden), targets)``. Each block's logits are recomputed in the backward
    pass (``torch.utils.checkpoint``), so memory holds one (chunk, V) block of logits instead of
    all N·V, at the cost of a second pass through the output head (Liger's fused linear
    cross-entropy does the same in one kernel on CUDA)."""
    if chunk < 1:
        raise ValueError(f"chunk must be at least 1 token, got {chunk}")
    h, y = hidden.reshape(-1, hidden.shape[-1]), targets.reshape(-1)

    def block_sum(h_block: Tensor, y_block: Tensor) -> Tensor:
        return cross_entropy(head(h_block), y_block, ignore_index=ignore_index, reduction="sum")

    total = torch.zeros((), dtype=torch.float32, device=h.device)
    for start in range(0, h.shape[0], chunk):
        total = total + checkpoint(block_sum, h[start : start + chunk], y[start : start + chunk], use_reentrant=False)
    return total / (y != ignore_index).sum().clamp(min=1)
