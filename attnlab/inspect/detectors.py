"""Head detectors: how much of each head's attention follows a known pattern, with the
definitions of TransformerLens's ``head_detector`` (Olsson et al. 2022 for induction).

For a pattern A (T, T) of one head and a detection mask M (T, T) of 0/1:

    score = Σ (A ⊙ M) / Σ A      (each row of A sums to 1, so Σ A = T)

* previous token: M[i, i−1] = 1;
* duplicate token: M[i, j] = 1 for j < i with token_j = token_i;
* induction: M[i, j] = 1 for j ≤ i with token_{j−1} = token_i (attend to what followed the
  earlier occurrence of the current token).

Any other pattern can be scored too (``patterns={"name": M}``, M (T, T) or (B, T, T)), the
first column (``exclude_bos``) and the diagonal (``exclude_current_token``) can be left out of the
comparison, and ``error_measure="abs"`` scores 1 − Σ|A − M| / T instead, TransformerLens's
``detect_head`` options. Scores are averaged over the batch. On a random sequence written twice, a perfect induction head
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


ERROR_MEASURES = ("mul", "abs")


def score(
    pattern: Tensor,
    mask: Tensor,
    *,
    exclude_bos: bool = False,
    exclude_current_token: bool = False,
    error_measure: str = "mul",
) -> Tensor:
    """pattern (..., T, T), mask (T, T) -> (...): the share of all attention on the mask's cells
    (``"mul"``), or 1 − Σ|A − M| / T (``"abs"``: 1 when the pattern is the mask); with
    ``exclude_bos`` / ``exclude_current_token`` the first column / the diagonal are left out."""
    if error_measure not in ERROR_MEASURES:
        raise ValueError(f"error_measure {error_measure!r}: choose mul or abs")
    t = pattern.shape[-1]
    keep = torch.ones(t, t, dtype=torch.bool, device=pattern.device)
    if exclude_bos:
        keep[:, 0] = False
    if exclude_current_token:
        keep.fill_diagonal_(False)
    mask = mask.to(pattern)
    if error_measure == "abs":
        return 1 - ((pattern - mask).abs() * keep).sum((-2, -1)) / t
    kept = pattern * keep
    return (kept * mask).sum((-2, -1)) / kept.sum((-2, -1))


@torch.no_grad()
def head_scores(model, idx: Tensor, kinds=DETECTORS, **options) -> dict[str, Tensor]:
    """idx (B, T) token ids -> {kind: (L, H) scores}, averaged over the batch; ``options``: those of
    :func:`pattern_scores` (custom ``patterns``, ``exclude_bos``, ``exclude_current_token``,
    ``error_measure``)."""
    from .patching import block_prefix

    _, cache = model.run_with_cache(idx, names=f"{block_prefix(model)}.*.attn.hook_pattern")
    return pattern_scores(torch.stack(cache.layers("attn.hook_pattern")), idx, kinds, **options)


def pattern_scores(
    patterns: Tensor,
    idx: Tensor,
    kinds=DETECTORS,
    *,
    custom: dict[str, Tensor] | None = None,
    exclude_bos: bool = False,
    exclude_current_token: bool = False,
    error_measure: str = "mul",
) -> dict[str, Tensor]:
    """Cached patterns (L, B, H, T, T) of the tokens idx (B, T) -> {kind: (L, H) scores}, averaged
    over the batch (for a caller that already ran the model). ``custom``: more detectors, name ->
    their 0/1 (or weighted) pattern (T, T), or one per row (B, T, T)."""
    masks = {kind: [detection_mask(idx[b].cpu(), kind) for b in range(idx.shape[0])] for kind in kinds}
    for name, pattern in (custom or {}).items():
        t = idx.shape[1]
        if pattern.shape[-2:] != (t, t) or pattern.dim() not in (2, 3):
            raise ValueError(
                f"detection pattern {name!r} must be ({t}, {t}) or (B, {t}, {t}), got {tuple(pattern.shape)}"
            )
        masks[name] = [(pattern if pattern.dim() == 2 else pattern[b]).float().cpu() for b in range(idx.shape[0])]
    options = dict(exclude_bos=exclude_bos, exclude_current_token=exclude_current_token, error_measure=error_measure)
    return {
        name: torch.stack([score(patterns[:, b].float().cpu(), m, **options) for b, m in enumerate(rows)]).mean(0)
        for name, rows in masks.items()
    }


def repeated_random_tokens(batch: int, half: int, vocab: int, generator: torch.Generator | None = None) -> Tensor:
    """(batch, 2·half) random tokens whose second half repeats the first: where induction shows."""
    first = torch.randint(vocab, (batch, half), generator=generator)
    return torch.cat([first, first], dim=1)
