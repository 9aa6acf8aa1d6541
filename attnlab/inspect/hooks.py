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
        """Module name -> its last attention weights (B, H, Tq, Tk), in the model's module order
        (for a stack of blocks: input side first)."""
        return {n: m.last_weights for n, m in self.modules.items() if m.last_weights is not None}

    def layers(self) -> list[Tensor]:
        """The weights (B, H, Tq, Tk) of every recorded module, first layer first."""
        return list(self.maps().values())


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


def representation_layers(model: nn.Module) -> dict[str, nn.Module]:
    """The layers whose outputs are a model's successive representations (blocks or stages)."""
    for attr in ("encoder.blocks", "blocks", "stages", "decoder.blocks"):
        obj = model
        try:
            for part in attr.split("."):
                obj = getattr(obj, part)
        except AttributeError:
            continue
        if isinstance(obj, nn.ModuleList):
            return {f"{attr}.{i}": m for i, m in enumerate(obj)}
    raise ValueError(f"{type(model).__name__} has no blocks or stages to inspect")


@contextlib.contextmanager
def capture_features(model: nn.Module, layers: dict[str, nn.Module] | None = None) -> Iterator[dict[str, Tensor]]:
    """``with capture_features(model) as feats: model(x)`` -> feats[name] is that layer's output."""
    layers = layers if layers is not None else representation_layers(model)
    feats: dict[str, Tensor] = {}
    handles = [m.register_forward_hook(lambda _m, _i, out, n=n: feats.__setitem__(n, out.detach()))
               for n, m in layers.items()]
    try:
        yield feats
    finally:
        for h in handles:
            h.remove()
