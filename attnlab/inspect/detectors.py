"""Head detectors: how much of each head's attention follows a known pattern, with the
definitions of TransformerLens's ``head_detector`` (Olsson et al. 2022 for induction).

For a pattern A (T, T) of one head and a detection mask M (T, T) of 0/1:

    score = Σ (A ⊙ M) / Σ A      (each row of A sums to 1, so Σ A = T)

* previous token: M[i, i−1] = 1;
* duplicate token: M[i, j] = 1 for j < i with token_j = token_i;
* induction: M[i, j] = 1 for j ≤ i with token_{j−1} = token_i (attend to what followed the
  earlier occurrence of the current token).

Scores are averaged over the batch. On a random sequence written twice, a perfect induction head
scores 0.5 (only the second copy has an earlier occurrence to attend to; the first copy's rows
score 0) and other heads near 0.
"""

from __future__ import annotations

import torch
from torch import Tensor

DETECTORS = ("previous_token", "duplicate_token", "induction")


def detection_mask(tokens: Tensor, kind: str) -> Tensor:
    """tokens (T,) -> the 0/1 mask (T, T) of ``kind`` (see the module docstring)."""
    t = tokens.shape[0]
    i, j = torch.arange(t)[:, None], torch.arange(t)[None, :]
    if kind == "previous_token":
        return (j == i - 1).float()
    if kind == "duplicate_token":
        return ((tokens[None, :] == tokens[:, None]) & (j < i)).float()
    if kind == "induction":
        before = torch.cat([tokens.new_full((1,), -1), tokens[:-1]])  # token_{j-1}
        return ((before[None, :] == tokens[:, None]) & (j <= i) & (j >= 1)).float()
    raise ValueError(f"unknown detector {kind!r}; choose one of {', '.join(DETECTORS)}")


def score(pattern: Tensor, mask: Tensor) -> Tensor:
    """pattern (..., T, T), mask (T, T) -> (...): the share of all attention on the mask's cells."""
    return (pattern * mask).sum((-2, -1)) / pattern.sum((-2, -1))


@torch.no_grad()
def head_scores(model, idx: Tensor, kinds=DETECTORS) -> dict[str, Tensor]:
    """idx (B, T) token ids -> {kind: (L, H) scores}, averaged over the batch."""
    from .patching import block_prefix

    _, cache = model.run_with_cache(idx, names=f"{block_prefix(model)}.*.attn.hook_pattern")
    return pattern_scores(torch.stack(cache.layers("attn.hook_pattern")), idx, kinds)


def pattern_scores(patterns: Tensor, idx: Tensor, kinds=DETECTORS) -> dict[str, Tensor]:
    """Cached patterns (L, B, H, T, T) of the tokens idx (B, T) -> {kind: (L, H) scores}, averaged
    over the batch (for a caller that already ran the model)."""
    out = {}
    for kind in kinds:
        per_row = torch.stack(
            [score(patterns[:, b].float().cpu(), detection_mask(idx[b].cpu(), kind)) for b in range(idx.shape[0])]
        )  # (B, L, H)
        out[kind] = per_row.mean(0)
    return out


def repeated_random_tokens(batch: int, half: int, vocab: int, generator: torch.Generator | None = None) -> Tensor:
    """(batch, 2·half) random tokens whose second half repeats the first: where induction shows."""
    first = torch.randint(vocab, (batch, half), generator=generator)
    return torch.cat([first, first], dim=1)
