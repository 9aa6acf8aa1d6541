"""The one loss every model here trains on: cross-entropy of logits against target ids.

    L = -(1/N) Σ_n log softmax(z_n)[y_n]      over the N targets that are not ``ignore_index``

Computed in fp32 whatever the autocast dtype (a bf16 log-softmax over a large vocabulary
loses digits), for next tokens (B, T, V) against (B, T) as well as classes (B, V) against (B,).
"""

from __future__ import annotations

import torch.nn.functional as F
from torch import Tensor

__all__ = ["cross_entropy"]


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
