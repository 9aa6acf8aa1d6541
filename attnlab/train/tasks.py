"""Tasks: a dataset plus an objective, in the shape the trainer wants."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ..data.text import TokenData


class LanguageModelTask:
    """Next-token prediction on random windows of a token stream (teacher forcing on every
    position at once: the causal mask lets one forward pass predict all T next tokens)."""

    def __init__(self, data: TokenData, block_size: int, batch_size: int):
        self.data, self.block_size = data, block_size
        self.items_per_batch = block_size * batch_size
        for split in ("train", "val"):
            if len(getattr(data, split)) < block_size + 2:
                from ..errors import DataError

                raise DataError(
                    f"the corpus is too short: its {split} split has {len(getattr(data, split))} tokens, "
                    f"less than one block of {block_size} + 1; use more text or a smaller --block-size"
                )

    def batch(self, split: str, batch_size: int, generator: torch.Generator) -> tuple[Tensor, Tensor]:
        return self.data.batch(split, batch_size, self.block_size, generator)

    def loss(self, model: nn.Module, batch) -> Tensor:
        x, y = batch
        logits = model(x)  # (B, T, V)
        return F.cross_entropy(logits.float().flatten(0, 1), y.flatten())

    def meta(self) -> dict:
        return {"tokenizer": self.data.tokenizer.to_dict(), "data": self.data.name}
