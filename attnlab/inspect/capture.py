"""Attention maps and layer representations, read through the models' named hook points
(:mod:`attnlab.hooks`): the one mechanism for every family."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

from torch import Tensor

from ..hooks import ActivationCache, HookedModule

PATTERN = "hook_pattern"


class AttentionRecord:
    """The attention weights a forward pass produced, read from an activation cache."""

    def __init__(self, cache: ActivationCache):
        self.cache = cache

    def maps(self) -> dict[str, Tensor]:
        """Attention module name -> its weights (B, H, Tq, Tk), first layer first (an RNN's
        single-head alignment is (B, 1, T, S), its decoding steps joined)."""
        return {name[: -len(PATTERN) - 1]: w for name, w in self.cache.items()}

    def layers(self) -> list[Tensor]:
        """The weights (B, H, Tq, Tk) of every attention module, first layer first."""
        return list(self.cache.values())


@contextlib.contextmanager
def capture_attention(model: HookedModule, include: str | None = None) -> Iterator[AttentionRecord]:
    """``with capture_attention(model) as rec: model(x)`` then ``rec.maps()``: every
    ``*.hook_pattern`` point, or those whose name contains ``include`` (e.g. "cross_attn").
    Hooked attention forms its weights explicitly (the reference path)."""
    names = lambda n: n.endswith("." + PATTERN) and (include is None or include in n)  # noqa: E731
    with model.caching(names) as cache:
        yield AttentionRecord(cache)


@contextlib.contextmanager
def capture_features(model: HookedModule) -> Iterator[ActivationCache]:
    """``with capture_features(model) as feats: model(x)`` -> each layer's output, first layer first:
    the hook points the model names in ``representation_hooks`` (a Transformer's block outputs, a
    CNN's stage outputs)."""
    pattern = getattr(type(model), "representation_hooks", None)
    if pattern is None:
        raise ValueError(f"{type(model).__name__} names no representation layers (representation_hooks)")
    with model.caching(pattern) as cache:
        yield cache
