"""Int8 linear layers for generation, where a step reads every weight once for one token.

At batch 1 a GPT step is bound by memory traffic, not arithmetic: GPT-2 small reads ~500 MB of
fp32 weights per token. Int8 weights read a quarter of that. Two PyTorch-maintained paths, no
kernel of ours:

* ``int8`` (weight-only): each output row of W is stored as int8 with one scale,
  W ≈ diag(s)·Q, s_i = max_j |W_ij| / 127; y = (x Qᵀ)·s + b runs in ATen's
  ``_weight_int8pack_mm`` kernel (the one torchao and gpt-fast use on CPUs) with bf16
  activations. Only the weights are rounded.
* ``dynamic-int8``: ``torch.ao.quantization.quantize_dynamic``: the activations are quantised
  to int8 too, per call (fbgemm's int8 GEMM); faster on x86 CPUs, rounds more.

Both quantise the model's Linear layers (the output head included; embeddings stay as they are,
they are read one row per token).
"""

from __future__ import annotations

import warnings

import torch
from torch import Tensor, nn

from .options import QUANTIZE_CHOICES

__all__ = ["Int8Linear", "quantize", "QUANTIZE_CHOICES"]


class Int8Linear(nn.Module):
    """A Linear layer with int8 weights and one scale per output feature.

    x (..., in) -> (..., out) in x's dtype; computed with bf16 activations."""

    def __init__(self, linear: nn.Linear) -> None:
        super().__init__()
        w = linear.weight.detach().float()  # (out, in)
        # the kernel takes bf16 scales: round each up (bf16 keeps 8 bits), so that the row's largest
        # weight still fits in ±127 and every weight is off by at most half a step of its row's scale
        scale = (w.abs().amax(dim=1).clamp(min=1e-12) / 127.0 * (1 + 2**-7)).to(torch.bfloat16)  # (out,)
        q = torch.round(w / scale.float()[:, None]).clamp(-127, 127).to(torch.int8)
        self.register_buffer("weight_int8", q)
        self.register_buffer("scale", scale)
        self.register_buffer("bias", None if linear.bias is None else linear.bias.detach().clone())
        self.in_features, self.out_features = linear.in_features, linear.out_features

    def dequantized(self) -> Tensor:
        """The weight these int8 numbers stand for, (out, in) float32."""
        return self.weight_int8.float() * self.scale.float()[:, None]

    def forward(self, x: Tensor) -> Tensor:
        lead = x.shape[:-1]
        y = torch.ops.aten._weight_int8pack_mm(x.reshape(-1, self.in_features).bfloat16(), self.weight_int8, self.scale)
        y = y.reshape(*lead, self.out_features).to(x.dtype)
        return y if self.bias is None else y + self.bias.to(x.dtype)

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, int8 weights"


def quantize(model: nn.Module, how: str) -> nn.Module:
    """``model`` with its Linear layers in int8 (``how``: one of ``QUANTIZE_CHOICES``), for
    inference on a CPU. The model is changed in place and returned; train nothing after this."""
    if how not in QUANTIZE_CHOICES:
        raise ValueError(f"unknown quantization {how!r}; choose one of {QUANTIZE_CHOICES}")
    if any(p.device.type != "cpu" for p in model.parameters()):
        raise ValueError("int8 quantization runs on the CPU; load the model with --device cpu")
    model.eval()
    if how == "dynamic-int8":
        from torch.ao.quantization import quantize_dynamic

        with warnings.catch_warnings():  # (torch.ao's eager quantization announces its move to torchao)
            warnings.simplefilter("ignore")
            return quantize_dynamic(model, {nn.Linear}, dtype=torch.qint8, inplace=True)
    for name, child in list(model.named_children()):
        if isinstance(child, nn.Linear):
            setattr(model, name, Int8Linear(child))
        else:
            quantize(child, how)
    return model
