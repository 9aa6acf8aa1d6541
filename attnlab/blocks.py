"""Transformer blocks assembled from :mod:`attnlab.attention`.

Pre-LN block (default, GPT-2/ViT):  x = x + MHA(LN(x));  x = x + MLP(LN(x))
Post-LN block (Vaswani et al.):     x = LN(x + MHA(x));  x = LN(x + MLP(x))

Hook points of a block (:mod:`attnlab.hooks`), each (B, T, D): ``hook_resid_pre`` (its input),
``hook_attn_out`` (what attention adds), ``hook_resid_mid`` (the stream between the two
sublayers), ``hook_mlp_out`` (what the MLP adds), ``hook_resid_post`` (its output); a decoder
block adds ``hook_cross_out`` and ``hook_resid_cross``. Post-LN blocks hook the normalised stream
as resid_mid and resid_post. Inside: ``attn.hook_*`` (:class:`MultiHeadAttention`) and
``mlp.hook_pre`` / ``mlp.hook_post`` (B, T, hidden), before and after the activation.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.utils.checkpoint import checkpoint

from .attention import KVCache, MultiHeadAttention
from .hooks import HookPoint

__all__ = [
    "HeadWeights",
    "LayerNorm",
    "RMSNorm",
    "MLP",
    "GatedMLP",
    "TransformerBlock",
    "DecoderBlock",
    "Encoder",
    "Decoder",
    "init_gpt2_weights",
]


class HeadWeights:
    """Every attention head's weights under TransformerLens's names (row vectors: q = x W_Q + b_Q),
    stacked over the layers, for any model whose ``attention_blocks()`` lists its transformer
    blocks (GPT, ViT, text encoder: the same names in every family)."""

    def attention_blocks(self) -> list:
        raise NotImplementedError

    def _heads(self, key: str) -> Tensor:
        return torch.stack([block.attn.head_weights()[key] for block in self.attention_blocks()])

    @property
    def W_Q(self) -> Tensor:
        """(L, H, D, d_k): q = x W_Q + b_Q per head (before QK-norm and rotary embeddings)."""
        return self._heads("W_Q")

    @property
    def W_K(self) -> Tensor:
        """(L, H, D, d_k)."""
        return self._heads("W_K")

    @property
    def W_V(self) -> Tensor:
        """(L, H, D, d_v)."""
        return self._heads("W_V")

    @property
    def W_O(self) -> Tensor:
        """(L, H, d_v, D): a head writes z W_O into the residual stream."""
        return self._heads("W_O")

    @property
    def b_Q(self) -> Tensor:
        """(L, H, d_k)."""
        return self._heads("b_Q")

    @property
    def b_K(self) -> Tensor:
        """(L, H, d_k)."""
        return self._heads("b_K")

    @property
    def b_V(self) -> Tensor:
        """(L, H, d_v)."""
        return self._heads("b_V")

    @property
    def b_O(self) -> Tensor:
        """(L, D)."""
        return self._heads("b_O")


class LayerNorm(nn.LayerNorm):
    """``nn.LayerNorm`` with TransformerLens's two hook points: ``hook_scale`` (…, 1), the
    divisor √(var(x) + ε), and ``hook_normalized`` (…, D), (x − mean(x)) / scale, before the
    affine weight and bias. Freezing the scale (patching it with another run's) makes the norm
    linear, as direct logit attribution assumes. Unwatched, it is ``F.layer_norm`` itself."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.hook_scale, self.hook_normalized = HookPoint(), HookPoint()

    def forward(self, x: Tensor) -> Tensor:
        if not (self.hook_scale.watched or self.hook_normalized.watched):
            return super().forward(x)
        centred = x - x.mean(-1, keepdim=True)
        scale = self.hook_scale((centred.pow(2).mean(-1, keepdim=True) + self.eps).sqrt())  # (…, 1)
        out = self.hook_normalized(centred / scale)
        if self.weight is not None:
            out = out * self.weight
        return out + self.bias if self.bias is not None else out


class RMSNorm(nn.Module):
    """RMSNorm (Zhang & Sennrich 2019; Llama, Qwen, Mistral): x / √(mean(x²) + ε) · g, no
    centring and no bias, computed in float32 whatever the input's dtype (as HuggingFace's Llama
    does). The same hook points as :class:`LayerNorm`: ``hook_scale`` (…, 1) the divisor and
    ``hook_normalized`` (…, D) x / scale, before the gain g."""

    def __init__(self, dim: int, eps: float = 1e-6) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))  # g
        self.hook_scale, self.hook_normalized = HookPoint(), HookPoint()

    def forward(self, x: Tensor) -> Tensor:
        dtype = x.dtype
        x = x.float()
        mean_square = x.pow(2).mean(-1, keepdim=True)  # (…, 1)
        if not (self.hook_scale.watched or self.hook_normalized.watched):
            # (multiplied by the reciprocal square root, as HuggingFace's models do: the same bits in bf16)
            return self.weight * (x * torch.rsqrt(mean_square + self.eps)).to(dtype)
        scale = self.hook_scale((mean_square + self.eps).sqrt())  # (…, 1)
        return self.weight * self.hook_normalized(x / scale).to(dtype)


def norm_layer(kind: str, dim: int, eps: float, bias: bool = True) -> nn.Module:
    """The normalisation a config names: ``layer`` (LayerNorm, with a bias when ``bias``) or
    ``rms`` (RMSNorm)."""
    if kind == "rms":
        return RMSNorm(dim, eps)
    if kind == "layer":
        return LayerNorm(dim, eps=eps, bias=bias)
    raise ValueError(f"unknown norm {kind!r}; choose layer or rms")


_ACTIVATIONS = {
    "gelu": lambda x: F.gelu(x),
    "gelu_tanh": lambda x: F.gelu(x, approximate="tanh"),
    "relu": F.relu,
    "relu2": lambda x: F.relu(x).square(),  # ReLU² (So et al., Primer; the modded-nanogpt speedrun)
    "silu": F.silu,  # x·σ(x): SwiGLU's gate in Llama, Qwen and Mistral
}


class MLP(nn.Module):
    """Token-wise feed-forward network: Linear(d, h) -> activation -> Linear(h, d) -> dropout."""

    def __init__(self, dim: int, hidden: int, activation: str = "gelu", dropout: float = 0.0, bias: bool = True):
        super().__init__()
        if activation not in _ACTIVATIONS:
            raise ValueError(f"unknown activation {activation!r}; choose one of {sorted(_ACTIVATIONS)}")
        self.activation = activation
        self.fc = nn.Linear(dim, hidden, bias=bias)
        self.proj = nn.Linear(hidden, dim, bias=bias)
        self.dropout = nn.Dropout(dropout)
        self.hook_pre, self.hook_post = HookPoint(), HookPoint()

    def forward(self, x: Tensor) -> Tensor:
        pre = self.hook_pre(self.fc(x))  # (B, T, hidden)
        return self.dropout(self.proj(self.hook_post(_ACTIVATIONS[self.activation](pre))))


class GatedMLP(nn.Module):
    """Gated feed-forward network (Shazeer 2020; SwiGLU with silu: Llama, Qwen, Mistral):
    (act(x W_gate) ⊙ x W_up) W_down -> dropout. Hook points as TransformerLens names them:
    ``hook_pre`` (B, T, hidden) the gate before the activation, ``hook_pre_linear`` the up
    projection, ``hook_post`` their product."""

    def __init__(self, dim: int, hidden: int, activation: str = "silu", dropout: float = 0.0, bias: bool = False):
        super().__init__()
        if activation not in _ACTIVATIONS:
            raise ValueError(f"unknown activation {activation!r}; choose one of {sorted(_ACTIVATIONS)}")
        self.activation = activation
        self.gate = nn.Linear(dim, hidden, bias=bias)  # W_gate
        self.fc = nn.Linear(dim, hidden, bias=bias)  # W_up
        self.proj = nn.Linear(hidden, dim, bias=bias)  # W_down
        self.dropout = nn.Dropout(dropout)
        self.hook_pre, self.hook_pre_linear, self.hook_post = HookPoint(), HookPoint(), HookPoint()
        # x -> [x W_gate | x W_up] in one product, where attnlab.generate.quantize packed the two as one
        self.gate_up: nn.Module | None = None

    def forward(self, x: Tensor) -> Tensor:
        if self.gate_up is not None:
            gate, up = self.gate_up(x).chunk(2, dim=-1)  # (B, T, hidden) each
        else:
            gate, up = self.gate(x), self.fc(x)
        gate = _ACTIVATIONS[self.activation](self.hook_pre(gate))  # (B, T, hidden)
        return self.dropout(self.proj(self.hook_post(gate * self.hook_pre_linear(up))))


class TransformerBlock(nn.Module):
    """Self-attention + MLP with residuals. (B, T, D) -> (B, T, D).

    ``causal=True`` makes it a decoder-only (GPT) block; ``norm_first=False`` gives
    the original post-LN arrangement.
    """

    def __init__(
        self,
        dim: int,
        n_heads: int,
        *,
        mlp_hidden: int | None = None,
        activation: str = "gelu",
        dropout: float = 0.0,
        attn_dropout: float = 0.0,
        norm_first: bool = True,
        causal: bool = False,
        bias: bool = True,
        qkv_bias: bool | None = None,
        norm_eps: float = 1e-5,
        n_kv_heads: int | None = None,
        rotary: nn.Module | None = None,
        position_bias: nn.Module | None = None,
        mlp: bool = True,
        window: int | None = None,
        qk_norm: bool = False,
        attn_scale: float | None = None,
        tie: str = "none",
        norm: str = "layer",
        gated: bool = False,
        d_k: int | None = None,
        parallel: bool = False,
        sandwich: bool = False,
        attn_softcap: float = 0.0,
    ) -> None:
        """``mlp=False``: attention only (the blocks of the induction-head studies); ``window``:
        restricted attention over the keys within that many positions; ``qk_norm``: RMS-normalise
        each head's queries and keys; ``attn_scale``: the score scale (default 1/√d_k); ``tie``:
        share the query and key (qk) or key and value (kv) projection (:class:`MultiHeadAttention`);
        ``norm``: layer (LayerNorm) or rms (RMSNorm, whose ε the QK-norm shares); ``gated``: a
        :class:`GatedMLP`; ``d_k``: each head's width (default dim / n_heads); ``parallel``:
        attention and MLP both read the block's input, x + Attn(LN1 x) + MLP(LN2 x) (GPT-J,
        GPT-NeoX / Pythia; hook_resid_mid is then x + Attn(LN1 x), which the MLP does not read);
        ``sandwich``: each sublayer's output is normalised too before it joins the stream, x + N(Attn(LN1 x))
        (Gemma 2 and 3; hook_attn_out and hook_mlp_out are after that norm); ``attn_softcap``: the
        scores soft-capped at ± that (Gemma 2)."""
        super().__init__()
        if parallel and not (norm_first and mlp):
            raise ValueError("a parallel block needs pre-LN (norm_first) and an MLP")
        if sandwich and not norm_first:
            raise ValueError("sandwich norms are pre-LN blocks' (norm_first)")
        self.norm_first, self.parallel = norm_first, parallel
        self.ln1 = norm_layer(norm, dim, norm_eps, bias)
        self.attn = MultiHeadAttention(
            dim,
            n_heads,
            d_k=d_k,
            bias=bias,
            qkv_bias=qkv_bias,
            dropout=attn_dropout,
            causal=causal,
            n_kv_heads=n_kv_heads,
            rotary=rotary,
            position_bias=position_bias,
            window=window,
            qk_norm=qk_norm,
            qk_norm_eps=norm_eps if norm == "rms" else None,
            scale=attn_scale,
            tie=tie,
            softcap=attn_softcap,
        )
        self.ln2 = norm_layer(norm, dim, norm_eps, bias) if mlp else None
        # (sandwich: the norms of the sublayers' outputs; identities otherwise)
        self.ln1_post = norm_layer(norm, dim, norm_eps, bias) if sandwich else nn.Identity()
        self.ln2_post = norm_layer(norm, dim, norm_eps, bias) if sandwich and mlp else nn.Identity()
        feed_forward = GatedMLP if gated else MLP
        self.mlp = feed_forward(dim, mlp_hidden or 4 * dim, activation, dropout, bias) if mlp else None
        self.resid_dropout = nn.Dropout(dropout)
        self.checkpoint_activations = False
        self.hook_resid_pre, self.hook_resid_mid, self.hook_resid_post = HookPoint(), HookPoint(), HookPoint()
        self.hook_attn_out, self.hook_mlp_out = HookPoint(), HookPoint()

    def forward(
        self,
        x: Tensor,
        *,
        mask: Tensor | None = None,
        key_mask: Tensor | None = None,
        bias: Tensor | None = None,
        positions: Tensor | None = None,
        cache: KVCache | None = None,
    ) -> Tensor:
        """x (B, T, D) -> (B, T, D); ``mask``, ``key_mask``, ``bias`` (float, added to the scores),
        ``positions`` and ``cache`` go to the attention (:class:`attnlab.attention.MultiHeadAttention`)."""
        kw = dict(mask=mask, key_mask=key_mask, bias=bias, positions=positions, cache=cache)
        if self.checkpoint_activations and self.training and torch.is_grad_enabled() and cache is None:
            # keep only the block's input; recompute its activations during backward
            return checkpoint(self._forward, x, use_reentrant=False, **kw)
        return self._forward(x, **kw)

    def _forward(self, x: Tensor, **kw) -> Tensor:
        x = self.hook_resid_pre(x)
        if self.parallel:  # both sublayers read x
            mid = self.hook_resid_mid(x + self.hook_attn_out(self.resid_dropout(self.attn(self.ln1(x), **kw))))
            return self.hook_resid_post(mid + self.hook_mlp_out(self.mlp(self.ln2(x))))
        if self.norm_first:
            attn_out = self.ln1_post(self.resid_dropout(self.attn(self.ln1(x), **kw)))
            x = self.hook_resid_mid(x + self.hook_attn_out(attn_out))
            if self.mlp is None:
                return self.hook_resid_post(x)
            return self.hook_resid_post(x + self.hook_mlp_out(self.ln2_post(self.mlp(self.ln2(x)))))
        x = self.hook_resid_mid(self.ln1(x + self.hook_attn_out(self.resid_dropout(self.attn(x, **kw)))))
        if self.mlp is None:
            return self.hook_resid_post(x)
        return self.hook_resid_post(self.ln2(x + self.hook_mlp_out(self.mlp(x))))


class DecoderBlock(nn.Module):
    """Masked self-attention, cross-attention to the encoder's memory, MLP; each with a residual."""

    def __init__(
        self,
        dim: int,
        n_heads: int,
        *,
        d_memory: int | None = None,
        mlp_hidden: int | None = None,
        activation: str = "gelu",
        dropout: float = 0.0,
        attn_dropout: float = 0.0,
        norm_first: bool = True,
        bias: bool = True,
        norm_eps: float = 1e-5,
        position_bias: nn.Module | None = None,
    ) -> None:
        """``position_bias``: a score-bias position module for the masked self-attention (relative
        positions); cross-attention gets none."""
        super().__init__()
        self.norm_first = norm_first
        self.ln1 = LayerNorm(dim, eps=norm_eps, bias=bias)
        self.self_attn = MultiHeadAttention(
            dim, n_heads, bias=bias, dropout=attn_dropout, causal=True, position_bias=position_bias
        )
        self.ln2 = LayerNorm(dim, eps=norm_eps, bias=bias)
        self.cross_attn = MultiHeadAttention(
            dim, n_heads, cross=True, d_context=d_memory or dim, bias=bias, dropout=attn_dropout
        )
        self.ln3 = LayerNorm(dim, eps=norm_eps, bias=bias)
        self.mlp = MLP(dim, mlp_hidden or 4 * dim, activation, dropout, bias)
        self.drop1, self.drop2 = nn.Dropout(dropout), nn.Dropout(dropout)
        self.checkpoint_activations = False
        self.hook_resid_pre, self.hook_resid_mid, self.hook_resid_post = HookPoint(), HookPoint(), HookPoint()
        self.hook_resid_cross = HookPoint()
        self.hook_attn_out, self.hook_cross_out, self.hook_mlp_out = HookPoint(), HookPoint(), HookPoint()

    def forward(
        self,
        x: Tensor,
        memory: Tensor,
        *,
        key_mask: Tensor | None = None,
        memory_mask: Tensor | None = None,
        cache: KVCache | None = None,
    ) -> Tensor:
        """x (B, T, D) target tokens; memory (B, S, D_mem); key_mask (B, T) and
        memory_mask (B, S) are True for real tokens."""
        if self.checkpoint_activations and self.training and torch.is_grad_enabled() and cache is None:
            return checkpoint(self._forward, x, memory, key_mask, memory_mask, None, use_reentrant=False)
        return self._forward(x, memory, key_mask, memory_mask, cache)

    def _forward(self, x, memory, key_mask, memory_mask, cache) -> Tensor:
        sa = dict(key_mask=key_mask, cache=cache)
        x = self.hook_resid_pre(x)
        if self.norm_first:
            x = self.hook_resid_mid(x + self.hook_attn_out(self.drop1(self.self_attn(self.ln1(x), **sa))))
            x = self.hook_resid_cross(
                x + self.hook_cross_out(self.drop2(self.cross_attn(self.ln2(x), memory, key_mask=memory_mask)))
            )
            return self.hook_resid_post(x + self.hook_mlp_out(self.mlp(self.ln3(x))))
        x = self.hook_resid_mid(self.ln1(x + self.hook_attn_out(self.drop1(self.self_attn(x, **sa)))))
        x = self.hook_resid_cross(
            self.ln2(x + self.hook_cross_out(self.drop2(self.cross_attn(x, memory, key_mask=memory_mask))))
        )
        return self.hook_resid_post(self.ln3(x + self.hook_mlp_out(self.mlp(x))))


class Encoder(nn.Module):
    """A stack of :class:`TransformerBlock`; pre-LN stacks end with a final LayerNorm, whose
    output passes ``hook_final`` (B, T, D)."""

    def __init__(self, n_layers: int, dim: int, n_heads: int, **block_kw) -> None:
        super().__init__()
        self.blocks = nn.ModuleList(TransformerBlock(dim, n_heads, **block_kw) for _ in range(n_layers))
        norm_first = block_kw.get("norm_first", True)
        self.ln_f = LayerNorm(dim, eps=block_kw.get("norm_eps", 1e-5)) if norm_first else nn.Identity()
        self.hook_final = HookPoint()

    def forward(
        self, x: Tensor, *, key_mask: Tensor | None = None, mask: Tensor | None = None, after_first=None
    ) -> Tensor:
        """x (B, T, D) -> (B, T, D). ``after_first`` (tokens -> tokens) runs between the first
        and second block: where CPVT puts its conditional position encoding (PEG)."""
        for i, block in enumerate(self.blocks):
            x = block(x, key_mask=key_mask, mask=mask)
            if i == 0 and after_first is not None:
                x = after_first(x)
        return self.hook_final(self.ln_f(x))


class Decoder(nn.Module):
    """A stack of :class:`DecoderBlock`; pre-LN stacks end with a final LayerNorm, whose
    output passes ``hook_final`` (B, T, D)."""

    def __init__(self, n_layers: int, dim: int, n_heads: int, **block_kw) -> None:
        super().__init__()
        self.blocks = nn.ModuleList(DecoderBlock(dim, n_heads, **block_kw) for _ in range(n_layers))
        norm_first = block_kw.get("norm_first", True)
        self.ln_f = LayerNorm(dim, eps=block_kw.get("norm_eps", 1e-5)) if norm_first else nn.Identity()
        self.hook_final = HookPoint()

    def forward(self, x, memory, *, key_mask=None, memory_mask=None, caches: list[KVCache] | None = None):
        for i, block in enumerate(self.blocks):
            x = block(
                x, memory, key_mask=key_mask, memory_mask=memory_mask, cache=caches[i] if caches is not None else None
            )
        return self.hook_final(self.ln_f(x))


def init_gpt2_weights(model: nn.Module, n_layers: int, std: float = 0.02) -> None:
    """GPT-2 initialisation: N(0, 0.02) weights, zero biases, LayerNorm = identity, and the
    projections that write into the residual stream scaled by 1/√(2·n_layers) so the
    residual's variance does not grow with depth."""
    for name, m in model.named_modules():
        if isinstance(m, nn.Linear):
            nn.init.normal_(m.weight, 0.0, std)
            if m.bias is not None:
                nn.init.zeros_(m.bias)
        elif isinstance(m, nn.Embedding):
            nn.init.normal_(m.weight, 0.0, std)
        elif isinstance(m, (nn.LayerNorm, RMSNorm)):
            if m.weight is not None:
                nn.init.ones_(m.weight)
            if getattr(m, "bias", None) is not None:
                nn.init.zeros_(m.bias)
    for name, p in model.named_parameters():
        if name.endswith("out_proj.weight") or name.endswith("mlp.proj.weight"):
            nn.init.normal_(p, 0.0, std / math.sqrt(2 * n_layers))
