"""Will a run fit? An estimate of the memory a training step needs, made before any step, so that
a batch that cannot fit is refused in one line instead of swapping the machine to a halt.

The activations a step keeps for its backward pass are measured, not modelled: one example goes
through the model and the task's loss under ``torch.autograd.graph.saved_tensors_hooks``, which
sees every tensor autograd saves (the weights it saves are left out: they are counted once); a
batch keeps that many bytes per example. The weights, their gradients and the optimizer's two
moments (AdamW; Muon keeps one for its matrices) come on top.
"""

from __future__ import annotations

import os
from pathlib import Path

import torch
from torch import nn

from ..errors import OptionError
from ..hooks import in_mode

# a run is refused only when even the optimistic reading (bf16 activations, half of fp32's)
# does not fit: the estimate must never turn away a run that would have trained
OPTIMISM = 0.5


def activation_bytes_per_example(model: nn.Module, task) -> int:
    """Bytes autograd keeps for the backward pass of one training example (fp32)."""
    weights = {p.data_ptr() for p in model.parameters()}
    seen: set[tuple[int, int]] = set()
    total = 0

    def pack(t: torch.Tensor):
        nonlocal total
        key = (t.data_ptr(), t.numel())
        if t.data_ptr() not in weights and key not in seen:
            seen.add(key)
            total += t.numel() * t.element_size()
        return t

    batch = task.batch("train", 1, torch.Generator().manual_seed(0))
    with in_mode(model, training=True), torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        task.loss(model, batch)
    return total


def available_bytes(device: torch.device) -> int | None:
    """Memory free for this run: the GPU's free memory, or the system's available memory (Linux
    ``MemAvailable``); None where it cannot be told."""
    if device.type == "cuda":
        try:
            return torch.cuda.mem_get_info(device)[0]
        except RuntimeError:
            return None
    meminfo = Path("/proc/meminfo")
    if meminfo.is_file():
        for line in meminfo.read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    try:
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):
        return None


def check_fits(model: nn.Module, task, batch_size: int, device: torch.device, ema: bool = False) -> dict:
    """Refuse (OptionError) a run whose step cannot fit in ``device``'s free memory; returns the
    estimate {"per_example", "activations", "state", "available"} in bytes."""
    params = sum(p.numel() * p.element_size() for p in model.parameters())
    state = params * (4 + (1 if ema else 0))  # weights, gradients, two optimizer moments (+ an average)
    per_example = activation_bytes_per_example(model, task)
    activations = per_example * batch_size
    available = available_bytes(device)
    estimate = {"per_example": per_example, "activations": activations, "state": state, "available": available}
    if available is None or per_example == 0:
        return estimate
    if OPTIMISM * activations + state > available:
        fits = max(0, int((available - state) / (OPTIMISM * per_example)))
        where = "this GPU has" if device.type == "cuda" else "this machine has"
        raise OptionError(
            f"--batch-size {batch_size:,} needs about {_gb(OPTIMISM * activations + state)} for a training step "
            f"({_gb(per_example)} of activations per example, {_gb(state)} of weights and optimizer state); "
            f"{where} {_gb(available)} free: give --batch-size {max(1, fits):,} or less"
            + (" (with --grad-accum to keep the batch)" if fits >= 1 else ", or a smaller model or --context")
        )
    return estimate


def check_cache_fits(model, rows: int) -> None:
    """Refuse a generation whose KV cache cannot fit: ``rows`` sequences × the context (the window
    slides, so the cache never grows past it) × layers × keys and values × width."""
    c = model.config
    per_row = c.context * c.layers * 2 * c.dim * next(model.parameters()).element_size()
    need = rows * per_row
    free = available_bytes(model.device)
    if free is not None and need > free:
        fits = max(1, free // per_row)
        raise OptionError(
            f"{rows:,} sequences at once need a {need / 1e9:,.1f} GB KV cache ({c.layers} layers x {c.context} "
            f"positions x {c.dim} wide); {free / 1e9:,.1f} GB is free: give batch_size={fits:,} or less"
        )


def _gb(n: float) -> str:
    return f"{n / 1e9:,.2f} GB" if n >= 1e8 else f"{n / 1e6:,.1f} MB"
