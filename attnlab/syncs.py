"""Host syncs: the moments the Python side waits for the device to finish what it queued.

On a GPU every ``loss.item()``, ``float(t)``, ``int(t)``, ``bool(t)`` or copy to the CPU stops
the host until the kernels before it have run, so the next ones are not queued in time and the
GPU idles. The trainer and the decoders read values back in one transfer per logged step or
per generated token (:func:`to_host`); :class:`HostSyncCounter` counts what a block of code did,
so that tests on a CPU can hold the GPU paths to that budget.
"""

from __future__ import annotations

import torch
from torch import Tensor
from torch.utils._python_dispatch import TorchDispatchMode

__all__ = ["HostSyncCounter", "to_host", "to_host_list"]

_aten = torch.ops.aten
_SCALAR_READS = {_aten._local_scalar_dense.default, _aten.item.default}
_COPIES = {_aten._to_copy.default, _aten.copy_.default}
_counters: list[HostSyncCounter] = []  # the counters open now (innermost last)


def to_host(*tensors: Tensor) -> list[float]:
    """The values of 0-dim ``tensors`` as Python floats, in one device-to-host transfer."""
    for c in _counters:
        c.explicit += 1
    if not tensors:
        return []
    return torch.stack([t.detach().float().reshape(()) for t in tensors]).cpu().tolist()


def to_host_list(tensor: Tensor) -> list:
    """``tensor.tolist()``, counted as one transfer (:class:`HostSyncCounter`'s ``explicit``)."""
    for c in _counters:
        c.explicit += 1
    return tensor.tolist()


class HostSyncCounter(TorchDispatchMode):
    """Counts host syncs inside the ``with`` block: ``implicit`` are scalar reads (``.item()``,
    ``float``/``int``/``bool`` of a tensor) and copies from a non-CPU device to the CPU, as the
    dispatcher sees them; ``explicit`` are :func:`to_host` and :func:`to_host_list` calls (one transfer each, also on a
    CPU, where the copy itself is free and would not show). ``total`` is both."""

    def __init__(self) -> None:
        super().__init__()
        self.implicit = 0
        self.explicit = 0

    @property
    def total(self) -> int:
        return self.implicit + self.explicit

    def __enter__(self):
        _counters.append(self)
        return super().__enter__()

    def __exit__(self, *exc):
        _counters.remove(self)
        return super().__exit__(*exc)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func in _SCALAR_READS:
            self.implicit += 1
        elif func in _COPIES and _device_to_cpu(func, args, kwargs):
            self.implicit += 1
        return func(*args, **kwargs)


def _device_to_cpu(func, args, kwargs) -> bool:
    """Whether a copy moves data from a non-CPU device to the CPU."""
    if func is _aten.copy_.default:  # copy_(dst, src)
        dst, src = args[0], args[1]
        return isinstance(src, Tensor) and src.device.type != "cpu" and dst.device.type == "cpu"
    src = args[0]
    target = kwargs.get("device")
    return (
        isinstance(src, Tensor)
        and src.device.type != "cpu"
        and target is not None
        and torch.device(target).type == "cpu"
    )
