"""Scaled dot-product attention and multi-head attention.

The lecture's equations, and where they live here:

* scores ``S = Q Kᵀ / √d_k``                      -> :func:`attention_scores`
* weights ``P = softmax(S)`` row by row (rows sum to 1) -> :func:`scaled_dot_product_attention` (reference path)
* output ``Z = P V``                               -> :func:`scaled_dot_product_attention`
* causal (masked) attention, future scores = −∞  -> :func:`causal_mask`
* multi-head ``concat(head_1..head_H) W_O``        -> :class:`MultiHeadAttention`

Mask convention, everywhere in attnlab: a boolean mask is **True where a query
may attend to a key**. Float tensors passed as ``bias`` are *added* to the
scores before the softmax (ALiBi, relative positions, or −inf for "never").
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from .hooks import HookPoint

__all__ = [
    "attention_scores",
    "causal_mask",
    "scaled_dot_product_attention",
    "MultiHeadAttention",
    "KVCache",
    "StaticKVCache",
    "AdditiveAttention",
    "attend",
    "attention_weights",
    "DotAttention",
    "local_attention",
    "local_mask",
    "key_bias",
]


# the fused kernel serves grouped-query attention itself (``enable_gqa``, torch 2.5 on): keys and
# values are read once per group instead of copied to every query head
KERNEL_GQA = torch.__version__ >= (2, 5)


def causal_mask(t_q: int, t_k: int | None = None, device=None) -> Tensor:
    """Boolean (t_q, t_k) mask, True where query i may attend to key j.

    Queries are aligned to the *end* of the keys, so with a KV cache (t_k > t_q)
    query i sits at absolute position ``t_k - t_q + i`` and sees keys ``0..that``.
    """
    t_k = t_q if t_k is None else t_k
    offset = t_k - t_q
    i = torch.arange(t_q, device=device)[:, None]
    j = torch.arange(t_k, device=device)[None, :]
    return j <= i + offset


def local_mask(t_q: int, t_k: int | None = None, window: int = 1, device=None) -> Tensor:
    """Restricted attention ("Attention is all you need", Table 1's fourth row): a boolean
    (t_q, t_k) band, True where key j is at most ``window`` positions from query i
    (|i − j| ≤ r; with ``causal`` as well, only the r keys before i and i itself remain). Queries
    are aligned to the end of the keys, as in :func:`causal_mask`. Each query then sees 2r + 1
    keys (r + 1 when causal) instead of T: O(r·n·d) per layer, a path of O(n/r) layers."""
    if window < 1:
        raise ValueError(f"window must be at least 1 (each query sees the keys within it), got {window}")
    t_k = t_q if t_k is None else t_k
    i = torch.arange(t_q, device=device)[:, None] + (t_k - t_q)
    j = torch.arange(t_k, device=device)[None, :]
    return (i - j).abs() <= window


def grid_local_mask(grid: tuple[int, int], window: int, n_prefix: int = 0, device=None) -> Tensor:
    """Restricted attention on a 2-D token grid (image patches, row-major): a boolean
    (n_prefix + h·w, n_prefix + h·w) mask, True where patch j is within ``window`` rows and
    ``window`` columns of patch i (a (2r + 1)² neighbourhood); the ``n_prefix`` leading tokens (a
    class token) attend to every token and every token to them, so the image still has a summary."""
    if window < 1:
        raise ValueError(f"window must be at least 1 (each patch sees the patches within it), got {window}")
    h, w = grid
    rows = torch.arange(h * w, device=device) // w
    cols = torch.arange(h * w, device=device) % w
    near = ((rows[:, None] - rows[None, :]).abs() <= window) & ((cols[:, None] - cols[None, :]).abs() <= window)
    n = n_prefix + h * w
    mask = torch.ones(n, n, dtype=torch.bool, device=device)
    mask[n_prefix:, n_prefix:] = near
    return mask


def attention_scores(q: Tensor, k: Tensor, scale: float | None = None) -> Tensor:
    """``Q Kᵀ / √d_k``: (..., Tq, d_k) x (..., Tk, d_k) -> (..., Tq, Tk)."""
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else scale
    return (q @ k.transpose(-2, -1)) * scale


def _check_qkv(q: Tensor, k: Tensor, v: Tensor) -> None:
    if q.dim() < 2 or k.dim() < 2 or v.dim() < 2:
        raise ValueError(
            f"attention needs q, k, v of shape (..., T, d); got q{tuple(q.shape)}, k{tuple(k.shape)}, v{tuple(v.shape)}"
        )
    if q.shape[-1] != k.shape[-1]:
        raise ValueError(f"queries and keys must have the same width d_k: q{tuple(q.shape)} vs k{tuple(k.shape)}")
    if k.shape[-2] != v.shape[-2]:
        raise ValueError(f"keys and values must have the same length: k{tuple(k.shape)} vs v{tuple(v.shape)}")


def _check_broadcast(name: str, m: Tensor, t_q: int, t_k: int, lead: tuple[int, ...]) -> None:
    if m.dim() < 2 or m.shape[-2] not in (1, t_q) or m.shape[-1] not in (1, t_k):
        raise ValueError(
            f"{name} of shape {tuple(m.shape)} does not fit scores of shape "
            f"{(*lead, t_q, t_k)}; it must broadcast to (..., Tq={t_q}, Tk={t_k})"
        )
    try:
        torch.broadcast_shapes(m.shape, (*lead, t_q, t_k))
    except RuntimeError:
        raise ValueError(
            f"{name} of shape {tuple(m.shape)} does not broadcast to scores of shape {(*lead, t_q, t_k)}"
        ) from None


def _combine(mask: Tensor | None, causal: bool, t_q: int, t_k: int, device) -> Tensor | None:
    """One boolean 'may attend' mask from an explicit mask and the causal flag (a single query,
    aligned to the end of the keys, may see them all: no causal mask for it)."""
    if causal and t_q > 1:
        c = causal_mask(t_q, t_k, device)
        mask = c if mask is None else mask & c
    return mask


def key_bias(key_mask: Tensor, dtype: torch.dtype) -> Tensor:
    """A key mask in the additive form the fused kernel takes as it is: bool (B, Tk), True = a real
    token -> ``dtype`` (B, 1, 1, Tk), 0 at real tokens and −inf at padding. A decoding step builds it
    once for all layers; each layer would otherwise broadcast the boolean mask and the kernel
    convert it. Only for queries that each see at least one real key (a row of −inf is NaN, where
    the boolean mask gives zeros): a decoding step's query sees its own key."""
    bias = torch.zeros(key_mask.shape, dtype=dtype, device=key_mask.device).masked_fill_(~key_mask, float("-inf"))
    return bias[:, None, None, :]


def scaled_dot_product_attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    mask: Tensor | None = None,
    *,
    causal: bool = False,
    bias: Tensor | None = None,
    dropout: float = 0.0,
    return_weights: bool = False,
    scale: float | None = None,
    score_hook: Callable[[Tensor], Tensor] | None = None,
    pattern_hook: Callable[[Tensor], Tensor] | None = None,
    softcap: float = 0.0,
) -> Tensor | tuple[Tensor, Tensor]:
    """``softmax(Q Kᵀ/√d_k + bias, masked) V``; with ``softcap`` c the scores are first
    soft-capped, c·tanh(S/c) (Gemma 2; the reference path, which forms them).

    Shapes: q (..., Tq, d_k), k (..., Tk, d_k), v (..., Tk, d_v) -> (..., Tq, d_v).
    ``mask``: bool, broadcastable to (..., Tq, Tk), True = may attend.
    ``causal``: query i sees keys up to its own position (bottom-right aligned
    when Tk > Tq, as with a KV cache). ``bias``: float, added to the scores.

    With ``return_weights=True`` the readable reference path forms the weight
    matrix P explicitly and returns ``(out, P)``; otherwise the fused
    ``torch.nn.functional.scaled_dot_product_attention`` runs, which for a plain
    causal or unmasked call never materialises the (Tq, Tk) matrix.
    A query that may attend to no key at all gets zero weights and a zero output.
    ``score_hook`` / ``pattern_hook`` (reference path only): functions that see and may replace
    the masked scores S (..., Tq, Tk) and the weights P (a model's hook points).
    """
    _check_qkv(q, k, v)
    t_q, t_k = q.shape[-2], k.shape[-2]
    lead = tuple(q.shape[:-2])
    if mask is not None:
        if mask.dtype != torch.bool:
            raise ValueError(f"mask must be boolean (True = may attend), got {mask.dtype}; pass float scores as bias=")
        _check_broadcast("mask", mask, t_q, t_k, lead)
    if bias is not None:
        _check_broadcast("bias", bias, t_q, t_k, lead)
    if return_weights or softcap:
        out = _reference(
            q, k, v, _combine(mask, causal, t_q, t_k, q.device), bias, dropout, scale, score_hook, pattern_hook, softcap
        )
        return out if return_weights else out[0]
    return _fast(q, k, v, mask, causal, bias, dropout, scale)


def _reference(q, k, v, allowed, bias, dropout, scale, hook_scores=None, hook_pattern=None, softcap=0.0):
    scores = attention_scores(q, k, scale)  # (..., Tq, Tk)
    if softcap:
        scores = softcap * torch.tanh(scores / softcap)  # smooth clip to (-c, c)
    if bias is not None:
        scores = scores + bias
    if hook_scores is not None:  # hooks see the scores as the softmax will: masked keys at -inf
        if allowed is not None:
            scores = scores.masked_fill(~allowed, float("-inf"))
        scores = hook_scores(scores)
    weights = attention_weights(scores, allowed, dropout if hook_pattern is None else 0.0)
    if hook_pattern is not None:  # hooks see (and may replace) the weights before dropout
        weights = hook_pattern(weights)
        if dropout > 0.0:
            weights = F.dropout(weights, p=dropout)
    return weights @ v, weights


def attention_weights(scores: Tensor, allowed: Tensor | None = None, dropout: float = 0.0) -> Tensor:
    """P = softmax(scores) over the allowed keys, rows summing to 1: (..., Tq, Tk) -> (..., Tq, Tk).
    A row with no allowed key gets zeros, not NaN."""
    if allowed is not None:
        scores = scores.masked_fill(~allowed, float("-inf"))
    weights = torch.softmax(scores.float(), dim=-1).to(scores.dtype)
    if allowed is not None:
        weights = weights.masked_fill(~allowed.any(-1, keepdim=True), 0.0)
    if dropout > 0.0:
        weights = F.dropout(weights, p=dropout)
    return weights


def attend(scores: Tensor, v: Tensor, allowed: Tensor | None = None, dropout: float = 0.0) -> tuple[Tensor, Tensor]:
    """Any attention's second half: P = softmax(scores) over allowed keys, Z = P V.

    scores (..., Tq, Tk), v (..., Tk, d_v) -> (Z (..., Tq, d_v), P (..., Tq, Tk))."""
    weights = attention_weights(scores, allowed, dropout).to(v.dtype)
    return weights @ v, weights


def _fast(q, k, v, mask, causal, bias, dropout, scale):
    t_q, t_k = q.shape[-2], k.shape[-2]
    # (k and v may have fewer heads than q, a divisor of them: grouped-query attention in the kernel)
    groups = {"enable_gqa": True} if q.dim() > 2 and k.shape[-3] != q.shape[-3] else {}
    if mask is None and bias is None and (not causal or t_q == t_k or t_q == 1):
        # 'is_causal' is top-left aligned, so it is exact only when Tq == Tk; a single
        # new query (KV-cache decoding) may see every cached key.
        return F.scaled_dot_product_attention(
            q, k, v, dropout_p=dropout, is_causal=causal and t_q == t_k and t_q > 1, scale=scale, **groups
        )
    allowed = _combine(mask, causal, t_q, t_k, q.device)
    attn_mask = allowed
    if bias is not None:
        attn_mask = bias.to(q.dtype)
        if allowed is not None:
            attn_mask = attn_mask.masked_fill(~allowed, float("-inf"))
    out = F.scaled_dot_product_attention(q, k, v, attn_mask=attn_mask, dropout_p=dropout, scale=scale, **groups)
    if allowed is not None:
        out = out.masked_fill(~allowed.any(-1, keepdim=True), 0.0)
    return out


def local_attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    window: int,
    *,
    causal: bool = False,
    key_mask: Tensor | None = None,
    dropout: float = 0.0,
    scale: float | None = None,
    block: int | None = None,
) -> Tensor:
    """Restricted self-attention without the T×T matrix: the queries in blocks of ``block`` rows,
    each block against only the keys within ``window`` of it (2·window + block keys; window +
    block when causal), through the fused kernel. Memory and work O(T·(block + 2·window)·d)
    instead of O(T²·d): Table 1's O(r·n·d) row. Equal to :func:`scaled_dot_product_attention`
    with ``mask=local_mask(T, T, window)``.

    q, k, v (B, H, T, d) with the same T (self-attention, no cache); ``key_mask`` (B, T), True =
    real token. -> (B, H, T, d_v)."""
    _check_qkv(q, k, v)
    t = q.shape[-2]
    if k.shape[-2] != t:
        raise ValueError(f"local_attention is self-attention over one sequence: q has {t} positions, k {k.shape[-2]}")
    block = block or max(window, 128)
    outs = []
    for start in range(0, t, block):
        end = min(t, start + block)
        k_start, k_end = max(0, start - window), end if causal else min(t, end + window)
        i = torch.arange(start, end, device=q.device)[:, None]
        j = torch.arange(k_start, k_end, device=q.device)[None, :]
        allowed = (i - j).abs() <= window  # (block, keys)
        if causal:
            allowed = allowed & (j <= i)
        if key_mask is not None:
            allowed = allowed & key_mask[:, None, None, k_start:k_end]  # (B, 1, block, keys)
        out = F.scaled_dot_product_attention(
            q[..., start:end, :],
            k[..., k_start:k_end, :],
            v[..., k_start:k_end, :],
            attn_mask=allowed,
            dropout_p=dropout,
            scale=scale,
        )
        if key_mask is not None:  # a query with no real key in reach gets zeros, as on the full path
            out = out.masked_fill(~allowed.any(-1, keepdim=True), 0.0)
        outs.append(out)
    return torch.cat(outs, dim=-2)


@dataclass
class KVCache:
    """Keys and values of the tokens seen so far, for one attention layer.

    Preallocated to ``max_len`` so that decoding one token costs a copy of one
    row, not a concatenation of the whole history. Shapes (B, H_kv, T, d).
    """

    k: Tensor
    v: Tensor
    length: int = 0

    @classmethod
    def empty(cls, batch: int, n_kv_heads: int, max_len: int, d_k: int, d_v: int, *, device=None, dtype=None):
        k = torch.empty(batch, n_kv_heads, max_len, d_k, device=device, dtype=dtype)
        v = torch.empty(batch, n_kv_heads, max_len, d_v, device=device, dtype=dtype)
        return cls(k, v, 0)

    @property
    def max_len(self) -> int:
        return self.k.shape[2]

    def append(self, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
        t = k.shape[2]
        if self.length + t > self.max_len:
            raise ValueError(
                f"KV cache is full: {self.length} cached + {t} new tokens > max_len {self.max_len}; "
                "allocate a larger cache or shorten the sequence"
            )
        self.k[:, :, self.length : self.length + t] = k.to(self.k.dtype)
        self.v[:, :, self.length : self.length + t] = v.to(self.v.dtype)
        self.length += t
        return self.k[:, :, : self.length], self.v[:, :, : self.length]

    def reorder(self, index: Tensor) -> None:
        """Select batch rows (beam search)."""
        self.k = self.k.index_select(0, index)
        self.v = self.v.index_select(0, index)

    def rows(self, n: int) -> KVCache:
        """The first ``n`` batch rows as a cache that writes into this one's memory (a view)."""
        return KVCache(self.k[:n], self.v[:n], self.length)

    def place(self, row: int, source: KVCache, end: int) -> None:
        """Copy the tokens of ``source`` (a one-row cache) into batch row ``row``, ending at column
        ``end``: columns end − source.length … end − 1 (continuous batching admits a prompt)."""
        n = source.length
        self.k[row, :, end - n : end] = source.k[0, :, :n].to(self.k.dtype)
        self.v[row, :, end - n : end] = source.v[0, :, :n].to(self.v.dtype)

    def copy_row(self, src: int, dst: int) -> None:
        self.k[dst] = self.k[src]
        self.v[dst] = self.v[src]

    def shift(self, by: int) -> None:
        """Move every row's columns by ``by`` (negative: to the left, dropping the first −by;
        positive: to the right, leaving the first ``by`` unset). ``length`` moves with them."""
        if by < 0:
            self.k[:, :, : self.length + by] = self.k[:, :, -by : self.length].clone()
            self.v[:, :, : self.length + by] = self.v[:, :, -by : self.length].clone()
        elif by > 0:
            if self.length + by > self.max_len:
                raise ValueError(f"KV cache is full: cannot shift {self.length} tokens by {by} in {self.max_len}")
            self.k[:, :, by : self.length + by] = self.k[:, :, : self.length].clone()
            self.v[:, :, by : self.length + by] = self.v[:, :, : self.length].clone()
        self.length += by


@dataclass
class StaticKVCache:
    """A KV cache of fixed shape, for a compiled decode step: keys and values (B, H_kv, max_len, d)
    written in place at ``columns`` (a (T,) device tensor that the decoder advances between steps,
    shared by every layer), attention always over all ``max_len`` columns with a key mask of the
    written ones. No Python number changes from one token to the next, so one compiled graph
    (and, on CUDA, one CUDA graph) serves every step. Its buffers are usually a
    :class:`KVCache`'s, which the prompt filled (``attnlab.generate.fast``)."""

    k: Tensor
    v: Tensor
    columns: Tensor

    def write(self, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
        """Store the new keys/values (B, H_kv, T, d) at ``columns``; return the whole buffers."""
        self.k.index_copy_(2, self.columns, k.to(self.k.dtype))
        self.v.index_copy_(2, self.columns, v.to(self.v.dtype))
        return self.k, self.v


class MultiHeadAttention(nn.Module):
    """H heads of scaled dot-product attention, concatenated and projected by W_O.

    Self-attention (default): Q, K, V all come from ``x`` through one fused
    projection. Cross-attention (``cross=True`` or ``d_context`` given): Q from
    ``x`` (B, Tq, d_model), K and V from ``context`` (B, Tk, d_context).

    Options: ``d_k``/``d_v`` per head (default d_model // n_heads), grouped-query
    attention with ``n_kv_heads`` < ``n_heads``, a rotary embedding applied to
    Q and K, an attention-bias position module (ALiBi, relative), QK-norm, KV cache.

    Hook points (:mod:`attnlab.hooks`), shapes for B sequences and H heads:
    ``hook_q`` (B, H, Tq, d_k) after any rotary embedding, ``hook_k`` / ``hook_v`` (B, H_kv, Tk, d)
    (with a KV cache: the new tokens' only), ``hook_scores`` (B, H, Tq, Tk) = Q Kᵀ/√d_k + bias with
    masked keys at −inf, ``hook_pattern`` (B, H, Tq, Tk) the softmax weights, ``hook_z``
    (B, H, Tq, d_v) each head's output before W_O. Hooking the scores or the pattern switches
    to the reference path (the weights are formed); the others keep the fused kernel.
    """

    def __init__(
        self,
        d_model: int,
        n_heads: int,
        *,
        cross: bool = False,
        d_context: int | None = None,
        d_k: int | None = None,
        d_v: int | None = None,
        n_kv_heads: int | None = None,
        d_out: int | None = None,
        bias: bool = True,
        qkv_bias: bool | None = None,
        dropout: float = 0.0,
        causal: bool = False,
        rotary: nn.Module | None = None,
        position_bias: nn.Module | None = None,
        window: int | None = None,
        qk_norm: bool = False,
        qk_norm_eps: float | None = None,
        scale: float | None = None,
        tie: str = "none",
        softcap: float = 0.0,
    ) -> None:
        """``bias`` applies to every projection; ``qkv_bias`` (default: ``bias``) to the
        query/key/value projections alone (timm's ViT option); ``window``: restricted attention,
        each query sees only the keys within ``window`` positions (:func:`local_mask`);
        ``qk_norm``: RMSNorm (with a learned gain) on each head's queries and keys before any
        rotary embedding, so that a score q·k/√d_k is bounded by the gains, not by how large the
        projections grew (Dehghani et al. 2023; the modded-nanogpt speedrun). ``scale``: what
        the scores q·k are multiplied by (default 1/√d_k; 1.0 gives unscaled dot products).
        ``tie`` (self-attention): "qk" uses the queries as keys (W_K = W_Q: symmetric scores),
        "kv" the keys as values (W_V = W_K): one projection fewer, to show why there are three."""
        super().__init__()
        if tie not in ("none", "qk", "kv"):
            raise ValueError(f"tie must be none, qk or kv, got {tie!r}")
        if tie != "none" and (cross or d_context is not None):
            raise ValueError("tie shares projections of one input: self-attention only, not cross-attention")
        if tie == "qk" and n_kv_heads not in (None, n_heads):
            raise ValueError("tie='qk' needs as many key heads as query heads (no grouped-query attention)")
        if tie == "kv" and d_v not in (None, d_k):
            raise ValueError("tie='kv' needs values as wide as keys (d_v = d_k)")
        self.scale, self.tie, self.softcap = scale, tie, softcap  # (softcap c: scores c·tanh(S/c); 0 none)
        if window is not None and window < 1:
            raise ValueError(f"window must be at least 1 (each query sees the keys within it), got {window}")
        self.window = window
        if n_heads < 1:
            raise ValueError(f"n_heads must be >= 1, got {n_heads}")
        if d_k is None and d_model % n_heads != 0:
            raise ValueError(
                f"d_model={d_model} is not divisible by n_heads={n_heads}; "
                f"choose n_heads dividing {d_model} or pass d_k explicitly"
            )
        n_kv_heads = n_heads if n_kv_heads is None else n_kv_heads
        if n_kv_heads < 1 or n_heads % n_kv_heads != 0:
            raise ValueError(f"n_heads={n_heads} must be a multiple of n_kv_heads={n_kv_heads}")
        self.d_model, self.n_heads, self.n_kv_heads = d_model, n_heads, n_kv_heads
        self.d_k = d_k if d_k is not None else d_model // n_heads
        self.d_v = d_v if d_v is not None else self.d_k
        self.cross = cross or d_context is not None
        self.d_context = d_context if d_context is not None else d_model
        self.causal, self.dropout = causal, dropout
        self.rotary, self.position_bias = rotary, position_bias
        # (ε: qk_norm_eps, else the dtype's machine epsilon, torch's default)
        self.q_norm = nn.RMSNorm(self.d_k, eps=qk_norm_eps) if qk_norm else None
        self.k_norm = nn.RMSNorm(self.d_k, eps=qk_norm_eps) if qk_norm else None
        q_dim, k_dim, v_dim = n_heads * self.d_k, n_kv_heads * self.d_k, n_kv_heads * self.d_v
        self._split = (q_dim, k_dim, v_dim)
        # the projections actually made: a tied one is not
        made = {"none": self._split, "qk": (q_dim, v_dim), "kv": (q_dim, k_dim)}[tie]
        in_bias = bias if qkv_bias is None else qkv_bias
        if self.cross:
            self.q_proj = nn.Linear(d_model, q_dim, bias=in_bias)
            self.kv_proj = nn.Linear(self.d_context, k_dim + v_dim, bias=in_bias)
        else:
            self.qkv = nn.Linear(d_model, sum(made), bias=in_bias)  # [W_Q; W_K; W_V] (less a tied one)
        self.out_proj = nn.Linear(n_heads * self.d_v, d_out or d_model, bias=bias)  # W_O
        self.hook_q, self.hook_k, self.hook_v = HookPoint(), HookPoint(), HookPoint()
        self.hook_scores, self.hook_pattern = HookPoint(), HookPoint()
        self.hook_z = HookPoint()
        self.hook_result = HookPoint()  # (B, H, Tq, d_out): each head's z_h W_O^h, formed only when watched

    def head_weights(self) -> dict[str, Tensor]:
        """The projections per head in TransformerLens's layout (row vectors: q = x W_Q + b_Q):
        W_Q (H, d_model, d_k), W_K (H_kv, d_context, d_k), W_V (H_kv, d_context, d_v),
        W_O (H, d_v, d_out); b_Q (H, d_k), b_K (H_kv, d_k), b_V (H_kv, d_v), b_O (d_out,) (zeros
        where there is no bias). Views of the parameters: a tied projection appears twice."""
        q_dim, k_dim, v_dim = self._split
        if self.cross:
            w_q, b_q = self.q_proj.weight, self.q_proj.bias
            w_k, w_v = self.kv_proj.weight.split((k_dim, v_dim))
            b_k, b_v = self.kv_proj.bias.split((k_dim, v_dim)) if self.kv_proj.bias is not None else (None, None)
        else:
            made = {"none": (q_dim, k_dim, v_dim), "qk": (q_dim, v_dim), "kv": (q_dim, k_dim)}[self.tie]
            weights = self.qkv.weight.split(made)
            biases = self.qkv.bias.split(made) if self.qkv.bias is not None else (None,) * len(made)
            if self.tie == "qk":
                (w_q, w_v), (b_q, b_v) = weights, biases
                w_k, b_k = w_q, b_q
            elif self.tie == "kv":
                (w_q, w_k), (b_q, b_k) = weights, biases
                w_v, b_v = w_k, b_k
            else:
                (w_q, w_k, w_v), (b_q, b_k, b_v) = weights, biases

        def per_head(w: Tensor, heads: int) -> Tensor:  # Linear (heads·d, d_in) -> (heads, d_in, d)
            return w.view(heads, -1, w.shape[-1]).transpose(1, 2)

        def bias(b: Tensor | None, heads: int, width: int) -> Tensor:
            return b.view(heads, width) if b is not None else self.out_proj.weight.new_zeros(heads, width)

        w_o = self.out_proj.weight  # (d_out, H·d_v)
        return {
            "W_Q": per_head(w_q, self.n_heads),
            "W_K": per_head(w_k, self.n_kv_heads),
            "W_V": per_head(w_v, self.n_kv_heads),
            "W_O": w_o.view(w_o.shape[0], self.n_heads, self.d_v).permute(1, 2, 0),
            "b_Q": bias(b_q, self.n_heads, self.d_k),
            "b_K": bias(b_k, self.n_kv_heads, self.d_k),
            "b_V": bias(b_v, self.n_kv_heads, self.d_v),
            "b_O": self.out_proj.bias if self.out_proj.bias is not None else w_o.new_zeros(w_o.shape[0]),
        }

    def new_cache(self, batch: int, max_len: int, *, device=None, dtype=None) -> KVCache:
        return KVCache.empty(batch, self.n_kv_heads, max_len, self.d_k, self.d_v, device=device, dtype=dtype)

    def _project(self, x: Tensor, context: Tensor | None) -> tuple[Tensor, Tensor, Tensor]:
        if x.dim() != 3 or x.shape[-1] != self.d_model:
            raise ValueError(f"attention input must be (B, T, {self.d_model}), got {tuple(x.shape)}")
        if self.cross:
            if context is None:
                raise ValueError("cross-attention needs a context tensor (B, Tk, d_context)")
            if context.dim() != 3 or context.shape[-1] != self.d_context or context.shape[0] != x.shape[0]:
                raise ValueError(f"context must be ({x.shape[0]}, Tk, {self.d_context}), got {tuple(context.shape)}")
            q = self.q_proj(x)
            k, v = self.kv_proj(context).split(self._split[1:], dim=-1)
        else:
            if context is not None:
                raise ValueError("self-attention got a context; build the module with cross=True")
            projected = self.qkv(x)
            if self.tie == "qk":
                q, v = projected.split((self._split[0], self._split[2]), dim=-1)
                k = q
            elif self.tie == "kv":
                q, k = projected.split(self._split[:2], dim=-1)
                v = k
            else:
                q, k, v = projected.split(self._split, dim=-1)
        # "b t (h d) -> b h t d", written with view/transpose: einops' Python-side parsing costs
        # more than the kernels when decoding one token at a time
        q = _split_heads(q, self.n_heads)  # (B, H, Tq, d_k)
        k = _split_heads(k, self.n_kv_heads)  # (B, Hkv, Tk, d_k)
        v = _split_heads(v, self.n_kv_heads)  # (B, Hkv, Tk, d_v)
        return q, k, v

    def forward(
        self,
        x: Tensor,
        context: Tensor | None = None,
        *,
        mask: Tensor | None = None,
        key_mask: Tensor | None = None,
        bias: Tensor | None = None,
        positions: Tensor | None = None,
        cache: KVCache | None = None,
        need_weights: bool = False,
    ) -> Tensor | tuple[Tensor, Tensor]:
        """x (B, Tq, d_model) -> (B, Tq, d_out); with ``need_weights`` also (B, H, Tq, Tk).

        ``mask``: bool (Tq, Tk), (B, Tq, Tk) or (B, H, Tq, Tk), True = may attend.
        ``key_mask``: bool (B, Tk), True = a real token, False = padding (never attended).
        ``positions``: (Tq,) or (B, Tq) absolute positions of the queries for rotary
        embeddings (default: cache length + 0..Tq-1).
        ``cache``: a :class:`KVCache`; new keys/values are appended and attention runs
        over everything cached. A :class:`StaticKVCache` instead: they are written at its
        columns, attention runs over all of its columns, ``key_mask`` (B, max_len) says which
        hold tokens and ``positions`` must be given (one new query per row: causal by the mask).
        """
        q, k, v = self._queries_keys_values(x, context, positions, cache)
        t_q, t_k = q.shape[2], k.shape[2]
        hooked = self.hook_scores.active or self.hook_pattern.active
        banded = (
            self.window is not None
            and cache is None
            and t_q == t_k
            and mask is None
            and bias is None
            and self.position_bias is None
            and not (need_weights or hooked or self.softcap)
        )
        # Shaw's value term needs the weights: Σ_j α_ij aⱽ_ij is added to the output
        value_term = (
            self.position_bias.value_term if getattr(self.position_bias, "value_table", None) is not None else None
        )
        formed = need_weights or hooked or value_term is not None  # the reference path, which forms P
        masked = any(m is not None for m in (mask, key_mask, bias, self.window, self.position_bias))
        if self.n_kv_heads != self.n_heads and (banded or formed or self.softcap or not self._kernel_groups(x, masked)):
            # grouped-query: each K/V head serves n_heads/n_kv_heads queries
            rep = self.n_heads // self.n_kv_heads
            k, v = k.repeat_interleave(rep, dim=1), v.repeat_interleave(rep, dim=1)
        if banded:  # restricted attention block by block: never forms the (Tq, Tk) matrix
            if key_mask is not None:
                self._full_mask(None, key_mask, x.shape[0], t_q, t_k)  # (checks it)
            dropout = self.dropout if self.training else 0.0
            out = local_attention(q, k, v, self.window, causal=self.causal, key_mask=key_mask, dropout=dropout,
                                  scale=self.scale)  # fmt: skip
            return self._output(self.hook_z(out))  # z: (B, H, Tq, d_v)
        if self.window is not None:  # the band, joined with any mask the caller gave
            band = local_mask(t_q, t_k, self.window, device=x.device)
            mask = band if mask is None else mask & band
        mask = self._full_mask(mask, key_mask, x.shape[0], t_q, t_k)
        if self.position_bias is not None:
            pb = self.position_bias(q, t_k)  # (H, Tq, Tk) or (B, H, Tq, Tk)
            bias = pb if bias is None else bias + pb
        out = scaled_dot_product_attention(
            q,
            k,
            v,
            mask,
            causal=self.causal,
            bias=bias,
            dropout=self.dropout if self.training else 0.0,
            return_weights=formed,
            scale=self.scale,
            score_hook=self.hook_scores if hooked else None,
            pattern_hook=self.hook_pattern if hooked else None,
            softcap=self.softcap,
        )
        weights = None
        if formed:
            out, weights = out
            if value_term is not None:
                out = out + value_term(weights).to(out.dtype)
        out = self._output(self.hook_z(out))  # z: (B, H, Tq, d_v)
        return (out, weights) if need_weights else out

    def _queries_keys_values(self, x: Tensor, context: Tensor | None, positions: Tensor | None, cache):
        """The heads' queries (B, H, Tq, d_k), keys (B, Hkv, Tk, d_k) and values (B, Hkv, Tk, d_v):
        projected, normalised (``qk_norm``), rotated (RoPE), through their hook points, and the
        keys and values joined with the ``cache``'s (Tk counts the cached ones)."""
        q, k, v = self._project(x, context)
        if self.q_norm is not None:  # (in fp32: under bf16 autocast RMSNorm would mix dtypes)
            q, k = self.q_norm(q.float()).to(q.dtype), self.k_norm(k.float()).to(k.dtype)
        static = isinstance(cache, StaticKVCache)
        if self.rotary is not None:
            if positions is None:
                offset = cache.length if cache is not None and not static else 0
                positions = torch.arange(offset, offset + q.shape[2], device=x.device)
            q = self.rotary(q, positions)
            if not self.cross:
                k = self.rotary(k, positions)
        q, k, v = self.hook_q(q), self.hook_k(k), self.hook_v(v)
        if static:
            k, v = cache.write(k, v)
        elif cache is not None:
            k, v = cache.append(k, v)
        return q, k, v

    @staticmethod
    def _kernel_groups(x: Tensor, masked: bool) -> bool:
        """Whether the fused kernel reads the K/V heads once per group itself: on the CPU, and on a
        GPU when unmasked (a masked grouped call falls back there to the unfused math kernel)."""
        return KERNEL_GQA and (x.device.type == "cpu" or not masked)

    def _output(self, z: Tensor) -> Tensor:
        """(B, H, Tq, d_v) -> (B, Tq, d_out): the heads concatenated, times W_O. When
        ``hook_result`` is watched, each head's share z_h W_O^h (B, H, Tq, d_out) is formed and
        passed through it first (TransformerLens's ``hook_result``), and their sum is the output."""
        if not self.hook_result.watched:
            return self.out_proj(_merge_heads(z))  # concat heads "b h t d -> b t (h d)", W_O
        w_o = self.out_proj.weight.view(-1, self.n_heads, self.d_v)  # (d_out, H, d_v)
        result = self.hook_result(torch.einsum("bhtd,ohd->bhto", z, w_o.to(z.dtype)))
        out = result.sum(1)
        return out + self.out_proj.bias.to(out.dtype) if self.out_proj.bias is not None else out

    def _full_mask(self, mask, key_mask, batch, t_q, t_k):
        if mask is not None and mask.dim() == 3:
            mask = mask[:, None]  # (B, Tq, Tk) -> (B, 1, Tq, Tk)
        if key_mask is not None:
            if key_mask.dtype != torch.bool or key_mask.shape != (batch, t_k):
                raise ValueError(
                    f"key_mask must be bool ({batch}, {t_k}) with True for real tokens, "
                    f"got {key_mask.dtype} {tuple(key_mask.shape)}"
                )
            km = key_mask[:, None, None, :]  # (B, 1, 1, Tk)
            mask = km if mask is None else mask & km
        return mask


def _split_heads(x: Tensor, heads: int) -> Tensor:
    """(B, T, H·d) -> (B, H, T, d)."""
    b, t, _ = x.shape
    return x.view(b, t, heads, -1).transpose(1, 2)


def _merge_heads(x: Tensor) -> Tensor:
    """(B, H, T, d) -> (B, T, H·d)."""
    b, h, t, d = x.shape
    return x.transpose(1, 2).reshape(b, t, h * d)


class _RecurrentAttention(nn.Module):
    """What every single-head attention of a recurrent decoder shares: one query per decoding
    step, a softmax over the source, and the hook points ``hook_scores`` / ``hook_pattern``
    shaped (B, 1, Tq, Tk) like a one-head :class:`MultiHeadAttention`'s, so that readers of
    attention patterns treat every family alike. A cache joins the decoding steps along Tq."""

    def __init__(self) -> None:
        super().__init__()
        self.hook_scores, self.hook_pattern = HookPoint(step_dim=-2), HookPoint(step_dim=-2)

    def _attend(self, scores: Tensor, values: Tensor, key_mask: Tensor | None) -> tuple[Tensor, Tensor]:
        """scores (B, Tq, Tk), values (B, Tk, d) -> context (B, Tq, d), weights (B, Tq, Tk)."""
        allowed = key_mask[:, None, :] if key_mask is not None else None
        if self.hook_scores.active:
            if allowed is not None:
                scores = scores.masked_fill(~allowed, float("-inf"))
            scores = self.hook_scores(scores[:, None])[:, 0]
        weights = attention_weights(scores, allowed).to(values.dtype)
        if self.hook_pattern.active:
            weights = self.hook_pattern(weights[:, None])[:, 0]
        return weights @ values, weights


class AdditiveAttention(_RecurrentAttention):
    """Bahdanau et al. (2015): e_{t,i} = vᵀ tanh(W s_{t-1} + U h_i), a_t = softmax(e_t),
    c_t = Σ_i a_{t,i} h_i. The scores differ from dot-product attention; the softmax and the
    weighted sum are shared.

    query (B, Tq, d_query), keys/values (B, Tk, d_key) -> context (B, Tq, d_key), weights (B, Tq, Tk).
    """

    def __init__(self, d_query: int, d_key: int, d_att: int | None = None) -> None:
        super().__init__()
        d_att = d_att or d_key
        self.w_query = nn.Linear(d_query, d_att, bias=False)  # W
        self.w_key = nn.Linear(d_key, d_att, bias=True)  # U (its bias is the b inside tanh)
        self.v = nn.Linear(d_att, 1, bias=False)  # v

    def project_keys(self, keys: Tensor) -> Tensor:
        """U h_i for all i; compute once per source sentence and pass as ``projected``."""
        return self.w_key(keys)

    def forward(
        self, query: Tensor, keys: Tensor, key_mask: Tensor | None = None, projected: Tensor | None = None
    ) -> tuple[Tensor, Tensor]:
        uk = self.project_keys(keys) if projected is None else projected  # (B, Tk, A)
        e = self.v(torch.tanh(self.w_query(query)[:, :, None, :] + uk[:, None, :, :])).squeeze(-1)  # (B, Tq, Tk)
        return self._attend(e, keys, key_mask)


class DotAttention(_RecurrentAttention):
    """Luong et al. (2015), "general" scores, scaled: e_{t,i} = (W s_t)ᵀ h_i / √d_key,
    a_t = softmax(e_t), c_t = Σ_i a_{t,i} h_i.

    query (B, Tq, d_query), keys/values (B, Tk, d_key) -> context (B, Tq, d_key), weights (B, Tq, Tk).
    """

    def __init__(self, d_query: int, d_key: int) -> None:
        super().__init__()
        self.w_query = nn.Linear(d_query, d_key, bias=False)  # W

    def forward(self, query: Tensor, keys: Tensor, key_mask: Tensor | None = None) -> tuple[Tensor, Tensor]:
        return self._attend(attention_scores(self.w_query(query), keys), keys, key_mask)
