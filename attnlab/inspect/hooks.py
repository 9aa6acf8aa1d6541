"""One hook mechanism for every attnlab model: switch each MultiHeadAttention to
recording mode and collect its per-head weights (B, H, Tq, Tk) after a forward."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

from torch import Tensor, nn

from ..attention import MultiHeadAttention


class AttentionRecord:
    def __init__(self, modules: dict[str, MultiHeadAttention]):
        self.modules = modules

    def maps(self) -> dict[str, Tensor]:
        """Module name -> its last attention weights (B, H, Tq, Tk)."""
        return {n: m.last_weights for n, m in self.modules.items() if m.last_weights is not None}


@contextlib.contextmanager
def capture_attention(model: nn.Module, include: str | None = None) -> Iterator[AttentionRecord]:
    """``with capture_attention(model) as rec: model(x)`` then ``rec.maps()``.

    Recording uses the reference attention path (the weights are formed explicitly).
    ``include`` keeps only modules whose name contains that string (e.g. "cross").
    """
    mods = {
        n: m for n, m in model.named_modules()
        if isinstance(m, MultiHeadAttention) and (include is None or include in n)
    }
    for m in mods.values():
        m.record_weights, m.last_weights = True, None
    try:
        yield AttentionRecord(mods)
    finally:
        for m in mods.values():
            m.record_weights = False
