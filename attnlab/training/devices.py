"""Where and in which precision a run computes: the device, and the dtype ``--dtype auto`` picks
for this model on this machine (bf16 where it is faster, measured; fp32 otherwise)."""

from __future__ import annotations

import contextlib
import os

import torch
from torch import nn

from ..options import device_name


def pick_device(name: str = "auto") -> torch.device:
    device_name(name)
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name.startswith("cuda") and not torch.cuda.is_available():
        raise ValueError(f"--device {name} was asked for, but no CUDA GPU is available; use --device cpu or auto")
    if name.startswith("cuda:") and int(name[5:]) >= torch.cuda.device_count():
        n = torch.cuda.device_count()
        raise ValueError(
            f"--device {name}: this machine has {n} GPU{'s' * (n != 1)} (cuda:0 … cuda:{n - 1}); give one of those"
        )
    return torch.device(name)


def cpu_has_fast_bf16() -> bool:
    """bf16 matmuls can only be faster than fp32 on CPUs with AVX512-BF16 or AMX.

    ``ATTNLAB_FAST_BF16=1`` / ``=0`` overrides the detection (the tests use it to run both
    branches of ``--dtype auto`` on every machine)."""
    forced = os.environ.get("ATTNLAB_FAST_BF16")
    if forced in ("0", "1"):
        return forced == "1"
    checks = ("_is_amx_tile_supported", "_is_avx512_bf16_supported")
    return any(getattr(torch.cpu, c, lambda: False)() for c in checks)


# Narrowest matrix width at which bf16 autocast can beat fp32 on a CPU with AVX512-BF16. Measured
# with benchmarks/cpu_dtype.py (table in benchmarks/README.md): below it the casts around each
# small matmul cost more than the faster matmul saves (GPT 4/4/128: 1.00x; ViT digits, 64 wide:
# 0.38x). At or above it the answer depends on more than width (GPT 4/4/256: 1.46x, but the
# 256-wide seq2seq Transformer on 20-token sentences: 0.89x), so the trainer times both.
CPU_BF16_MIN_WIDTH = 192
# bf16 must be at least this much faster in the start-up timing to be chosen: near a tie, fp32
# (exact, and the same on every machine) wins, and the choice does not flip from run to run.
CPU_BF16_MIN_SPEEDUP = 1.1


def model_width(model: nn.Module) -> int:
    """The model's working width: the largest ``min(out, in)`` over its Linear layers."""
    widths = [min(m.weight.shape) for m in model.modules() if isinstance(m, nn.Linear)]
    return max(widths, default=0)


def auto_cpu_dtype(model: nn.Module | None, fast_bf16: bool) -> tuple[torch.dtype | None, str]:
    """What ``--dtype auto`` runs on a CPU and why; ``None`` when only timing both can tell."""
    if not fast_bf16:
        return torch.float32, "this CPU has no fast bf16 (AVX512-BF16/AMX)"
    width = model_width(model) if model is not None else CPU_BF16_MIN_WIDTH
    if width < CPU_BF16_MIN_WIDTH:
        return torch.float32, (
            f"CPU has fast bf16, but at width {width} (< {CPU_BF16_MIN_WIDTH}) bf16 autocast "
            "is slower than fp32 (benchmarks/cpu_dtype.py)"
        )
    return None, f"CPU has fast bf16 and the model is {width} wide: timing both"


def pick_dtype(name: str, device: torch.device, model: nn.Module | None = None) -> tuple[torch.dtype | None, str]:
    """(dtype, reason): ``fp32`` / ``bf16`` as asked; ``auto`` picks what is faster for this
    model on this device: bf16 on GPUs that support it, on CPUs by ``auto_cpu_dtype`` (None:
    the trainer times a few steps of each, ``Trainer.choose_by_timing``)."""
    if name == "fp32":
        return torch.float32, "asked for (--dtype fp32)"
    if name == "bf16":
        return torch.bfloat16, "asked for (--dtype bf16)"
    if name != "auto":
        raise ValueError(f"unknown dtype {name!r}; choose auto, fp32 or bf16")
    if device.type == "cuda":
        if torch.cuda.is_bf16_supported():
            return torch.bfloat16, "GPU supports bf16"
        return torch.float32, "GPU has no bf16"
    return auto_cpu_dtype(model, cpu_has_fast_bf16())


def autocast(device: torch.device, dtype: torch.dtype | None):
    """bf16 autocast on ``device`` when ``dtype`` is bf16; otherwise nothing (fp32)."""
    if dtype == torch.bfloat16:
        return torch.autocast(device.type, dtype=torch.bfloat16)
    return contextlib.nullcontext()


def use_tf32() -> None:
    """fp32 matmuls and convolutions on CUDA tensor cores in TF32 (10-bit mantissa inputs, fp32
    accumulation): several times the fp32 throughput on Ampere and later, the precision
    nanoGPT and timm train fp32 in. A no-op where there are no tensor cores."""
    torch.backends.cuda.matmul.allow_tf32 = True
    torch.backends.cudnn.allow_tf32 = True
