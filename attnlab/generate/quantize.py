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
* ``int4`` (weight-only, :class:`Int4Linear`): 4-bit weights, a scale and a zero per 32 along a row,
  in ATen's ``_weight_int4pack_mm_for_cpu`` with bf16 activations; a GGUF file's Q4_0, Q4_1 and Q4_K
  weights are kept as the file stores them, and the layers it stores finer go int8 (not rounded
  further). Layers whose input width is not a multiple of 32 stay.

Both quantise the model's Linear layers (the output head included; embeddings stay as they are,
they are read one row per token). A third choice rounds nothing:

* ``packed``: each Linear layer's fp32 or bf16 weight is also stored once in the layout the
  CPU's GEMM library reads fastest (MKL's packed format for fp32, oneDNN's blocked one for bf16,
  the reorder inductor's weight prepacking does), so a one-row step streams it at close to
  the memory's bandwidth where the plain layout reaches about half of it here (a 151,936 × 896
  bf16 head: 25 against 13 GB/s on 2 cores). Same weights; the sums may round differently.
"""

from __future__ import annotations

import warnings

import torch
from torch import Tensor, nn

from ..errors import Note
from ..options import QUANTIZE_CHOICES

__all__ = [
    "Int4Linear",
    "Int8Linear",
    "PackedLinear",
    "quantize",
    "quantized_copy",
    "QUANTIZE_CHOICES",
    "compiles",
    "why_not_compiled",
    "why_not_packed",
]


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


INT4_GROUP = 32  # weights per scale and zero along a row: GGUF's Q4_0, Q4_1 and Q4_K blocks (and sub-blocks)


class Int4Linear(nn.Module):
    """A Linear layer with 4-bit weights, a scale and a zero per group of :data:`INT4_GROUP` weights
    along each row: W[n, k] = (q[n, k] − 8)·scale[k // G, n] + zero[k // G, n], q in 0..15. GGUF's
    Q4_0 (zero 0), Q4_1 (zero = min + 8·scale) and Q4_K (each 32-weight sub-block its own scale and
    min) are this form, so ``--quantize int4`` keeps a GGUF file's 4-bit numbers as they are stored
    (:func:`attnlab.interop.gguf_file.load_gguf`) and rounds any other model's weights to it
    (:meth:`from_linear`). The product runs in ATen's ``_weight_int4pack_mm_for_cpu`` (the CPU
    kernel torchao's int4 layout uses) with bf16 activations, scales and zeros: it reads an eighth of
    fp32's bytes per token (its float32 variant is a slow reference, about 25x slower here). The
    scales in bf16 round a GGUF file's float16 ones (by at most 2⁻⁹ of each). ``weight`` is the
    dequantised weight (float32, computed when read): what a hook or an analysis that reads a weight
    sees.

    x (..., in) -> (..., out) in x's dtype."""

    def __init__(self, q: Tensor, scale: Tensor, zero: Tensor, bias: Tensor | None = None) -> None:
        """``q`` (out, in) integers 0..15; ``scale``, ``zero`` (out, in / G); ``bias`` (out,) or None."""
        super().__init__()
        out_features, in_features = q.shape
        if in_features % INT4_GROUP or scale.shape != (out_features, in_features // INT4_GROUP):
            raise ValueError(f"int4 weights take rows of whole groups of {INT4_GROUP} with one scale each")
        self.in_features, self.out_features = in_features, out_features
        # (the kernel takes whole tiles of 16 rows: a vocabulary of another size gets rows of zeros, cut off again)
        pad = -out_features % 16
        q, scale, zero = (torch.nn.functional.pad(t, (0, 0, 0, pad)) for t in (q.to(torch.int32), scale, zero))
        self.register_buffer("weight_int4", torch.ops.aten._convert_weight_to_int4pack_for_cpu(q, 1))
        # (in / G, rows, 2): the kernel's layout of the scales and zeros
        sz = torch.stack([scale.float().T, zero.float().T], -1).contiguous()
        self.register_buffer("scales_and_zeros", sz.to(torch.bfloat16))
        self.register_buffer("bias", None if bias is None else bias.detach().float().clone())

    @classmethod
    def from_linear(cls, linear: nn.Linear) -> Int4Linear:
        """``linear`` rounded to 4 bits, each group of G weights of a row on its own 16 levels from its
        smallest to its largest weight (asymmetric, as torchao's int4 weight-only quantisation)."""
        w = linear.weight.detach().float()
        groups = w.reshape(w.shape[0], -1, INT4_GROUP)  # (out, in / G, G)
        low, high = groups.amin(-1), groups.amax(-1)
        scale = ((high - low) / 15).clamp(min=1e-12)
        q = torch.round((groups - low[..., None]) / scale[..., None]).clamp(0, 15).reshape(w.shape)
        return cls(q, scale, low + 8 * scale, linear.bias)

    @classmethod
    def concatenated(cls, layers: list[Int4Linear]) -> Int4Linear:
        """One layer whose output is the ``layers``' outputs side by side (their rows stacked): the same
        4-bit numbers, one product where there were several. (Without biases.)"""
        parts = [(layer.levels() + 8, *layer.scales_and_zeros.float().unbind(-1)) for layer in layers]
        q = torch.cat([p[0] for p in parts])
        scale = torch.cat([p[1].T[: layer.out_features] for p, layer in zip(parts, layers)])
        zero = torch.cat([p[2].T[: layer.out_features] for p, layer in zip(parts, layers)])
        return cls(q, scale, zero)

    def levels(self) -> Tensor:
        """q − 8 of every weight, (out, in) float32: the kernel on the identity's rows with scale 1 and
        zero 0 (exact in bf16)."""
        scale, zero = self.scales_and_zeros.unbind(-1)
        eye = torch.eye(self.in_features, dtype=torch.bfloat16)
        unit = torch.stack([torch.ones_like(scale), torch.zeros_like(zero)], -1)
        levels = torch.ops.aten._weight_int4pack_mm_for_cpu(eye, self.weight_int4, INT4_GROUP, unit)
        return levels[:, : self.out_features].float().T

    def product(self, rows: Tensor) -> Tensor:
        """rows (M, in) -> (M, out), bf16."""
        y = torch.ops.aten._weight_int4pack_mm_for_cpu(
            rows.to(torch.bfloat16), self.weight_int4, INT4_GROUP, self.scales_and_zeros
        )
        return y[:, : self.out_features] if y.shape[1] != self.out_features else y

    def dequantized(self) -> Tensor:
        """The weight these 4-bit numbers stand for, (out, in) float32 (the scales and zeros applied in
        float32 to :meth:`levels`)."""
        scale, zero = self.scales_and_zeros.float().unbind(-1)  # (in / G, rows) each
        s = scale.T.repeat_interleave(INT4_GROUP, 1)[: self.out_features]
        z = zero.T.repeat_interleave(INT4_GROUP, 1)[: self.out_features]
        return self.levels() * s + z

    @property
    def weight(self) -> Tensor:
        return self.dequantized()

    def forward(self, x: Tensor) -> Tensor:
        y = self.product(x.reshape(-1, self.in_features))
        y = y if self.bias is None else y + self.bias.to(y.dtype)
        return y.reshape(*x.shape[:-1], self.out_features).to(x.dtype)

    def extra_repr(self) -> str:
        return (
            f"in_features={self.in_features}, out_features={self.out_features}, int4 weights in groups of {INT4_GROUP}"
        )


def why_not_packed(dtype: torch.dtype) -> str | None:
    """Why this PyTorch build or CPU cannot pack weights of ``dtype``, or None when it can."""
    if dtype == torch.float32:
        return None if torch.backends.mkl.is_available() else "this PyTorch has no MKL (x86 builds do)"
    if dtype == torch.bfloat16:
        if not torch.backends.mkldnn.is_available():
            return "this PyTorch has no oneDNN"
        if not torch.ops.mkldnn._is_mkldnn_bf16_supported():
            return "this CPU has no bf16 instructions oneDNN uses (AVX512-BF16, AMX); sample in fp32"
        return None
    return f"{dtype} weights (fp32 and bf16 pack)"


def packed_bf16_product(x: Tensor, packed: Tensor, bias: Tensor | None) -> Tensor:
    """x (..., in) times a bf16 weight in oneDNN's packed layout (``packed``, reordered from (out, in)),
    plus ``bias``: (..., out), in bf16. (oneDNN takes the leading dims as they are, with the same bits
    as flattened rows: no reshape either way, which decoding would pay twice per layer and token.)"""
    return torch.ops.mkldnn._linear_pointwise(
        x if x.dtype == torch.bfloat16 else x.to(torch.bfloat16), packed, bias, "none", [], ""
    )


class PackedLinear(nn.Linear):
    """A Linear layer whose weight is also held in the CPU GEMM library's packed layout, reordered
    once (fp32: MKL's ``_mkl_linear``; bf16: oneDNN's ``_linear_pointwise``). ``weight`` and
    ``bias`` stay the layer's own, so names, hooks and exports see the same model; a weight
    changed afterwards is not repacked (a copy for decoding, as the int8 ones are).

    x (..., in) -> (..., out), in the weight's dtype."""

    def __init__(self, linear: nn.Linear) -> None:
        nn.Module.__init__(self)
        self.in_features, self.out_features = linear.in_features, linear.out_features
        self.weight, self.bias = linear.weight, linear.bias
        w = linear.weight.detach()
        why = why_not_packed(w.dtype)
        if why is not None:
            raise ValueError(f"--quantize packed: {why}")
        self.bf16 = w.dtype == torch.bfloat16
        # (laid out for one row at a time, what a decoding step multiplies; other row counts work too)
        self.packed = (
            torch.ops.mkldnn._reorder_linear_weight(w, 1)
            if self.bf16
            else torch.ops.mkl._mkl_reorder_linear_weight(w, 1)
        )

    def forward(self, x: Tensor) -> Tensor:
        if self.bf16:
            return packed_bf16_product(x, self.packed, self.bias)
        rows = x.reshape(-1, self.in_features).to(self.weight.dtype)
        y = torch.ops.mkl._mkl_linear(rows, self.packed, self.weight, self.bias, 1)
        return y.reshape(*x.shape[:-1], self.out_features)

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, packed {self.weight.dtype} weights"


class PackedConcat(nn.Module):
    """Linear layers of one input read as one bf16 product in oneDNN's packed layout,
    [x W₁ᵀ + b₁ | x W₂ᵀ + b₂ | …]: a gated MLP's gate and up projections, one call where a decoding
    step would make two. Only the packed copy is held (the layers keep their own weights), so it
    adds no parameter and no name.

    x (..., in) -> (..., Σ out)."""

    def __init__(self, linears: list[nn.Linear]) -> None:
        super().__init__()
        weight = torch.cat([layer.weight.detach() for layer in linears])  # (Σ out, in)
        self.in_features, self.out_features = weight.shape[1], weight.shape[0]
        self.packed = torch.ops.mkldnn._reorder_linear_weight(weight, 1)
        biases = [layer.bias for layer in linears]
        self.bias = None if biases[0] is None else torch.cat([b.detach() for b in biases])

    @staticmethod
    def fits(linears: list[nn.Linear]) -> bool:
        """Whether these layers pack as one: bf16 (fp32's MKL path keeps the plain weight beside its
        packed one, which would double them), one input width, all with biases or none."""
        first = linears[0]
        return (
            why_not_packed(torch.bfloat16) is None
            and all(
                type(layer) is nn.Linear
                and layer.weight.dtype == torch.bfloat16
                and layer.in_features == first.in_features
                for layer in linears
            )
            and len({layer.bias is None for layer in linears}) == 1
        )

    def forward(self, x: Tensor) -> Tensor:
        return packed_bf16_product(x, self.packed, self.bias)

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, packed bf16 weights"


def quantize(model: nn.Module, how: str) -> nn.Module:
    """``model`` with its Linear layers in int8 or packed (``how``: one of ``QUANTIZE_CHOICES``), for
    inference on a CPU. The model is changed in place and returned; train nothing after this."""
    if how not in QUANTIZE_CHOICES:
        raise ValueError(f"unknown quantization {how!r}; choose one of {QUANTIZE_CHOICES}")
    if any(p.device.type != "cpu" for p in model.parameters()):
        raise ValueError(f"--quantize {how} runs on the CPU; load the model with --device cpu")
    model.eval()
    if how == "int4":
        # a GGUF file's 4-bit layers as it stores them (interop.gguf_file.load_gguf keeps their numbers);
        # the layers it stores finer (Q8_0, Q6_K, F16: often the embedding and output head) in int8, not
        # rounded further; any other model's layers rounded to 4 bits
        stored = getattr(model, "gguf_int4", None)
        for name, layer in list(model.named_modules()):
            if type(layer) is nn.Linear and layer.in_features % INT4_GROUP == 0:  # (others stay as they are)
                parent, _, child = name.rpartition(".")
                if stored is None:
                    replaced: nn.Module = Int4Linear.from_linear(layer)
                elif name in stored:
                    replaced = Int4Linear(*stored[name], layer.bias)
                else:
                    replaced = Int8Linear(layer)
                setattr(model.get_submodule(parent) if parent else model, child, replaced)
        for mlp in list(model.modules()):  # a gated MLP's gate and up: one product (they stay too)
            pair = [getattr(mlp, "gate", None), getattr(mlp, "fc", None)]
            if getattr(mlp, "gate_up", False) is None and all(
                isinstance(p, Int4Linear) and p.bias is None for p in pair
            ):
                mlp.gate_up = Int4Linear.concatenated(pair)
        return model
    if how == "dynamic-int8":
        from torch.ao.quantization import quantize_dynamic

        with warnings.catch_warnings():  # (torch.ao's eager quantization announces its move to torchao)
            warnings.simplefilter("ignore")
            return quantize_dynamic(model, {nn.Linear}, dtype=torch.qint8, inplace=True)
    paired = getattr(model, "gate_up", False) is None  # a gated MLP, not yet packed
    if how == "packed" and paired and PackedConcat.fits([model.gate, model.fc]):
        model.gate_up = PackedConcat([model.gate, model.fc])  # (its gate and up stay plain layers)
        if not isinstance(model.proj, PackedLinear):
            model.proj = PackedLinear(model.proj)
        return model
    for name, child in list(model.named_children()):
        if isinstance(child, nn.Linear) and not isinstance(child, PackedLinear):
            setattr(model, name, PackedLinear(child) if how == "packed" else Int8Linear(child))
        else:
            quantize(child, how)
    return model


def quantized_copy(model: nn.Module, how: str) -> nn.Module:
    """A copy of ``model`` with its Linear layers ``how`` (:func:`quantize`); ``model`` itself stays
    as it is (what ``eval --quantize`` and ``generate(quantize=)`` run on a loaded model)."""
    import copy

    return quantize(copy.deepcopy(model), how)


def compiles(model: nn.Module, compile: bool) -> bool:
    """``compile``, or False with a one-line :class:`~attnlab.errors.Note` when the compiled decode
    step cannot take ``model``'s layers (:func:`why_not_compiled`): the same tokens, decoded eager."""
    why = why_not_compiled(model) if compile else None
    if why is not None:
        warnings.warn(f"{why}: this decode runs eager", Note)
    return bool(compile) and why is None


def why_not_compiled(model: nn.Module) -> str | None:
    """Why the compiled decode step cannot take ``model``'s layers (None when it can): the packed
    layers call the GEMM library's own operators, and ``torch.ao``'s dynamically quantised Linear
    a packed-parameter object, neither of which the compiler traces; fp32, bf16 and int8
    (:class:`Int8Linear`) layers compile."""
    for module in model.modules():
        if isinstance(module, (PackedLinear, PackedConcat)):
            return "--compile does not trace the packed layers of --quantize packed"
        if type(module).__module__.startswith("torch.ao.nn.quantized"):
            return "--compile does not trace the dynamically quantised layers of --quantize dynamic-int8"
    return None
