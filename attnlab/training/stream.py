"""The training batches, drawn one ahead of the step that uses them.

A GPU runs what the host queued; while it does, the host can build the next batch. So each
micro-step takes the batch drawn before it and, once its forward and backward are queued, draws
the next one: on CUDA into pinned (page-locked) memory, copied with ``non_blocking=True``, which
overlaps the copy with the running kernels (on pageable memory ``non_blocking`` does nothing).
On a CPU it changes only the order of the same work.

Exact resume needs to know where the data stream stood before the batch of the next step, not
before the batch drawn ahead: every drawn batch keeps the generator state from before its draw.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import Tensor


@dataclass
class DrawnBatch:
    """One micro-batch on the device, its weight in an accumulated step (the task's
    ``batch_weight``, counted on the host before the copy: no device sync), and the data
    generator's state from before it was drawn."""

    tensors: list[Tensor]
    weight: float | None
    state_before: Tensor


class BatchStream:
    """``draw()`` -> a host batch (a sequence of tensors) from ``generator``; ``to_device`` moves it
    (and slices it for this rank). :meth:`take` returns the next batch, :meth:`prefetch` draws it
    ahead; :meth:`rewind` forgets what was drawn ahead and puts the generator at ``state``."""

    def __init__(
        self,
        draw: Callable[[], list[Tensor]],
        generator: torch.Generator,
        device: torch.device,
        prepare: Callable[[list[Tensor]], list[Tensor]] = list,
        weigh: Callable[[list[Tensor]], float] | None = None,
    ) -> None:
        self.draw, self.generator, self.device = draw, generator, device
        self.prepare, self.weigh = prepare, weigh
        self.pin = device.type == "cuda"
        self.ahead: DrawnBatch | None = None

    def _draw(self) -> DrawnBatch:
        state = self.generator.get_state()
        batch = self.prepare(list(self.draw()))
        weight = float(self.weigh(batch)) if self.weigh is not None else None
        if self.pin:
            batch = [t.pin_memory() for t in batch]
        tensors = [t.to(self.device, non_blocking=self.pin) for t in batch]
        return DrawnBatch(tensors, weight, state)

    def take(self) -> DrawnBatch:
        drawn = self.ahead if self.ahead is not None else self._draw()
        self.ahead = None
        return drawn

    def prefetch(self) -> None:
        if self.ahead is None:
            self.ahead = self._draw()

    def next_state(self) -> Tensor:
        """The generator state from before the next batch :meth:`take` will return."""
        return self.ahead.state_before if self.ahead is not None else self.generator.get_state()

    def rewind(self, state: Tensor) -> None:
        self.ahead = None
        self.generator.set_state(state)
