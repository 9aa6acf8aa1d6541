"""Positional encodings. Attention alone is permutation-equivariant, so order must be put in.

The modules fall into four groups by where they plug into a transformer:

* absolute     -- ``forward(x, offset=0)`` returns ``x + PE`` for tokens (B, T, D):
  :class:`SinusoidalPosition`, :class:`LearnedPosition`, :class:`SinCos2DPosition`,
  :class:`FourierFeatures` (of continuous coordinates, ``forward(coords)``).
* score bias   -- ``forward(q, t_k)`` returns an additive score bias (…, H, Tq, Tk):
  :class:`ALiBi`, :class:`RelativePosition` (Shaw et al. 2018).
* rotary       -- ``forward(x, positions)`` rotates queries/keys (B, H, T, d):
  :class:`RotaryEmbedding` (RoPE).
* conditional  -- ``forward(x, grid)`` adds a depthwise convolution of the token grid:
  :class:`PEG` (conditional positional encoding, CPVT).
* graph        -- ``forward(x, eigvecs)`` adds a projection of the graph Laplacian's
  eigenvectors to node tokens: :class:`LaplacianPosition` (Dwivedi & Bresson 2021).
"""

from __future__ import annotations

import math

import torch
from einops import rearrange
from torch import Tensor, nn

__all__ = [
    "sinusoidal_encoding",
    "sincos_2d_encoding",
    "SinusoidalPosition",
    "LearnedPosition",
    "SinCos2DPosition",
    "FourierFeatures",
    "RelativePosition",
    "FourierPosition",
    "RotaryEmbedding",
    "ALiBi",
    "alibi_slopes",
    "PEG",
    "laplacian_eigenvectors",
    "LaplacianPosition",
]


def sinusoidal_encoding(n_positions: int, dim: int, base: float = 10000.0) -> Tensor:
    """Vaswani et al.: PE(pos, 2i) = sin(pos / base^(2i/d)), PE(pos, 2i+1) = cos(same). (T, D)."""
    if dim % 2:
        raise ValueError(f"sinusoidal encoding needs an even width, got {dim}")
    pos = torch.arange(n_positions, dtype=torch.float64)[:, None]
    freq = base ** (-torch.arange(0, dim, 2, dtype=torch.float64) / dim)  # (D/2,)
    pe = torch.zeros(n_positions, dim, dtype=torch.float64)
    pe[:, 0::2] = torch.sin(pos * freq)
    pe[:, 1::2] = torch.cos(pos * freq)
    return pe.float()


def _check_tokens(x: Tensor, dim: int, max_len: int, offset: int, positions: Tensor | None = None) -> None:
    if x.dim() != 3 or x.shape[-1] != dim:
        raise ValueError(f"expected tokens (B, T, {dim}), got {tuple(x.shape)}")
    end = offset + x.shape[1] if positions is None else int(positions.max()) + 1
    if end > max_len:
        raise ValueError(
            f"sequence of {end} positions is longer than the {max_len} this "
            f"encoding was built for; shorten the input or build it with a larger max_len"
        )


class SinusoidalPosition(nn.Module):
    """Fixed sinusoidal encoding added to the tokens (no parameters)."""

    def __init__(self, dim: int, max_len: int = 4096, base: float = 10000.0) -> None:
        super().__init__()
        self.dim, self.max_len = dim, max_len
        self.register_buffer("pe", sinusoidal_encoding(max_len, dim, base), persistent=False)

    def forward(self, x: Tensor, offset: int = 0, positions: Tensor | None = None, check: bool = True) -> Tensor:
        """x (B, T, D) -> x + PE at positions offset … offset+T-1, or at ``positions`` (T,) or (B, T)
        (left-padded batches)."""
        if check:  # (a fixed-shape decode step checked its positions once: reading them back here is a sync)
            _check_tokens(x, self.dim, self.max_len, offset, positions)
        if positions is not None:
            return x + self.pe[positions].to(x.dtype)
        return x + self.pe[offset : offset + x.shape[1]].to(x.dtype)


# The most positions a learned table may hold: 64k positions of a 768-wide model are already 50M
# parameters (GPT-2 small has 1,024, BERT 512); longer contexts want rope, alibi or sinusoidal.
MAX_LEARNED_POSITIONS = 65_536


class LearnedPosition(nn.Module):
    """A learned vector per position (GPT-2, BERT, ViT)."""

    def __init__(self, dim: int, max_len: int, init_std: float = 0.02) -> None:
        super().__init__()
        if max_len > MAX_LEARNED_POSITIONS:
            n = max_len * dim
            raise ValueError(
                f"context {max_len} with learned positions is a {max_len} x {dim} table ({n / 1e6:.1f}M parameters, "
                f"{n * 16 / 1e9:.2f} GB with AdamW's moments and gradients); the cap is {MAX_LEARNED_POSITIONS}: "
                "give a smaller --context (or, for a GPT, --pos rope or alibi)"
            )
        self.dim, self.max_len = dim, max_len
        self.weight = nn.Parameter(torch.randn(max_len, dim) * init_std)

    def forward(self, x: Tensor, offset: int = 0, positions: Tensor | None = None, check: bool = True) -> Tensor:
        """x (B, T, D) -> x + P at positions offset … offset+T-1, or at ``positions`` (T,) or (B, T)."""
        if check:  # (a fixed-shape decode step checked its positions once: reading them back here is a sync)
            _check_tokens(x, self.dim, self.max_len, offset, positions)
        if positions is not None:
            return x + self.weight[positions].to(x.dtype)
        return x + self.weight[offset : offset + x.shape[1]].to(x.dtype)


def _sincos_1d(dim: int, pos: Tensor) -> Tensor:
    """MAE-style 1-D sin-cos: [sin(pos ω), cos(pos ω)] with ω_i = 1/10000^(i/(D/2)). (N, D)."""
    omega = 1.0 / 10000 ** (torch.arange(dim // 2, dtype=torch.float64) / (dim / 2))
    out = pos.double().reshape(-1)[:, None] * omega[None, :]
    return torch.cat([torch.sin(out), torch.cos(out)], dim=1)


def sincos_2d_encoding(grid_h: int, grid_w: int, dim: int) -> Tensor:
    """2-D sin-cos for a patch grid (MAE / big_vision "ViT baseline"): the first half of the
    width encodes the column (x, w), the second half the row (y, h), as in MAE's
    ``get_2d_sincos_pos_embed``, so their tables and figures line up with attnlab's.
    Returns (grid_h * grid_w, D), row-major like the patch order."""
    if dim % 4:
        raise ValueError(f"2-D sin-cos encoding needs a width divisible by 4, got {dim}")
    rows, cols = torch.meshgrid(torch.arange(grid_h), torch.arange(grid_w), indexing="ij")
    emb = torch.cat([_sincos_1d(dim // 2, cols), _sincos_1d(dim // 2, rows)], dim=1)
    return emb.float()


class SinCos2DPosition(nn.Module):
    """Fixed 2-D sin-cos encoding added to patch tokens (B, n_prefix + h*w, D); the
    ``n_prefix`` leading tokens (a class token) get a zero position vector."""

    def __init__(self, dim: int, grid: tuple[int, int], n_prefix: int = 0) -> None:
        super().__init__()
        self.dim, self.grid = dim, tuple(grid)
        pe = torch.cat([torch.zeros(n_prefix, dim), sincos_2d_encoding(grid[0], grid[1], dim)])
        self.register_buffer("pe", pe, persistent=False)

    @property
    def weight(self) -> Tensor:
        """The table (n_prefix + h*w, D), named like :class:`LearnedPosition`'s."""
        return self.pe

    def forward(self, x: Tensor, offset: int = 0) -> Tensor:
        _check_tokens(x, self.dim, self.pe.shape[0], offset)
        return x + self.pe[offset : offset + x.shape[1]].to(x.dtype)


class FourierFeatures(nn.Module):
    """Random Fourier features of continuous coordinates (Tancik et al. 2020).

    γ(v) = [cos(2π B v), sin(2π B v)] with a fixed B ~ N(0, σ²) of shape (m, c);
    coords (..., c) -> (..., 2m), then optionally a linear map to ``dim``.
    """

    def __init__(self, in_dim: int, n_features: int = 64, sigma: float = 10.0, dim: int | None = None, seed: int = 0):
        super().__init__()
        g = torch.Generator().manual_seed(seed)
        self.in_dim = in_dim
        self.register_buffer("B", torch.randn(n_features, in_dim, generator=g) * sigma)
        self.proj = nn.Linear(2 * n_features, dim) if dim is not None else None

    def forward(self, coords: Tensor) -> Tensor:
        if coords.shape[-1] != self.in_dim:
            raise ValueError(f"coordinates must end in {self.in_dim} values, got {tuple(coords.shape)}")
        phase = 2 * math.pi * coords.to(self.B.dtype) @ self.B.T  # (..., m)
        feats = torch.cat([torch.cos(phase), torch.sin(phase)], dim=-1)
        return self.proj(feats) if self.proj is not None else feats


class FourierPosition(nn.Module):
    """Patch positions as random Fourier features of their coordinates, learned projection:
    pe(r, c) = W γ((r, c) / grid), γ of :class:`FourierFeatures`, added to the patch tokens
    (B, n_prefix + h*w, D); the ``n_prefix`` leading tokens (a class token) get none. The
    coordinates are continuous in [0, 1), so a new grid size needs no interpolation."""

    def __init__(self, dim: int, grid: tuple[int, int], n_prefix: int = 0, n_features: int = 64, sigma: float = 1.0):
        super().__init__()
        self.dim, self.grid, self.n_prefix = dim, tuple(grid), n_prefix
        self.features = FourierFeatures(2, n_features, sigma, dim=dim)

    def coords(self) -> Tensor:
        """(h*w, 2): each patch's (row, col), scaled to [0, 1)."""
        h, w = self.grid
        rows, cols = torch.meshgrid(torch.arange(h), torch.arange(w), indexing="ij")
        return torch.stack([rows.reshape(-1) / h, cols.reshape(-1) / w], dim=-1).to(self.features.B.device)

    @property
    def weight(self) -> Tensor:
        """The table (n_prefix + h*w, D), named like :class:`LearnedPosition`'s."""
        table = self.features(self.coords())
        return torch.cat([table.new_zeros(self.n_prefix, self.dim), table])

    def forward(self, x: Tensor, offset: int = 0) -> Tensor:
        table = self.weight
        _check_tokens(x, self.dim, table.shape[0], offset)
        return x + table[offset : offset + x.shape[1]].to(x.dtype)


class RelativePosition(nn.Module):
    """Shaw et al. (2018) relative position representations, with the key and the value term:

        e_ij = q_i · (k_j + aᴷ_ij)ᵀ / √d        z_i = Σ_j α_ij (v_j + aⱽ_ij),  α_i = softmax_j(e_i)

    aᴷ, aⱽ are learned vectors, one per clipped distance clip(j − i, −K, K) (a table of 2K + 1
    rows). ``grid=(h, w)``: the 2-D variant for image patches, one row per clipped (Δrow, Δcol) pair
    ((2K + 1)² rows) and one more for every pair involving the ``n_prefix`` leading tokens (a class
    token has no place on the grid). ``heads``: a table per head (H, rows, d) instead of one shared
    by all heads, as Shaw does. ``values=False`` keeps the key term alone.

    As a module of :class:`~attnlab.attention.MultiHeadAttention` (``position_bias=``), the key term
    is an additive score bias (:meth:`forward`, (B, H, Tq, Tk)) and the value term is added to the
    output from the attention weights (:meth:`value_term`), so attention takes its readable path
    that forms them. Queries are aligned to the end of the keys (KV cache friendly).
    """

    def __init__(
        self,
        head_dim: int,
        max_distance: int = 16,
        *,
        heads: int | None = None,
        values: bool = True,
        grid: tuple[int, int] | None = None,
        n_prefix: int = 0,
    ) -> None:
        super().__init__()
        if max_distance < 1:
            raise ValueError(f"relative positions need a clipping distance of at least 1, got {max_distance}")
        self.head_dim, self.max_distance, self.grid, self.n_prefix = head_dim, max_distance, grid, n_prefix
        span = 2 * max_distance + 1
        rows = span if grid is None else span * span + 1
        shape = (rows, head_dim) if heads is None else (heads, rows, head_dim)
        self.table = nn.Parameter(torch.randn(shape) * 0.02)  # aᴷ
        self.value_table = nn.Parameter(torch.randn(shape) * 0.02) if values else None  # aⱽ

    def distances(self, t_q: int, t_k: int, device=None) -> Tensor:
        """Table rows (Tq, Tk): clipped j − i (1-D), or clipped (Δrow, Δcol) on the grid (2-D)."""
        k = self.max_distance
        i = torch.arange(t_k - t_q, t_k, device=device)[:, None]
        j = torch.arange(t_k, device=device)[None, :]
        if self.grid is None:
            return (j - i).clamp(-k, k) + k
        h, w = self.grid
        if t_k != self.n_prefix + h * w:
            raise ValueError(f"2-D relative positions expect {self.n_prefix} + {h}×{w} tokens, got {t_k}")
        p_i, p_j = (i - self.n_prefix).clamp(min=0), (j - self.n_prefix).clamp(min=0)
        dr = (p_j // w - p_i // w).clamp(-k, k) + k
        dc = (p_j % w - p_i % w).clamp(-k, k) + k
        idx = dr * (2 * k + 1) + dc
        prefix = (i < self.n_prefix) | (j < self.n_prefix)
        return idx.masked_fill(prefix, (2 * k + 1) ** 2)  # the last row: to or from a class token

    def _rows(self, table: Tensor, t_q: int, t_k: int, device) -> Tensor:
        """(Tq, Tk, d), or (H, Tq, Tk, d) with per-head tables."""
        return table[..., self.distances(t_q, t_k, device), :]

    def forward(self, q: Tensor, t_k: int) -> Tensor:
        """The key term q_i · aᴷ_ij / √d as a score bias: q (B, H, Tq, d) -> (B, H, Tq, Tk)."""
        a = self._rows(self.table, q.shape[-2], t_k, q.device).to(q.dtype)
        eq = "bhid,ijd->bhij" if a.dim() == 3 else "bhid,hijd->bhij"
        return torch.einsum(eq, q, a) / math.sqrt(self.head_dim)

    def value_term(self, weights: Tensor) -> Tensor:
        """Σ_j α_ij aⱽ_ij: weights (B, H, Tq, Tk) -> (B, H, Tq, d)."""
        a = self._rows(self.value_table, weights.shape[-2], weights.shape[-1], weights.device).to(weights.dtype)
        eq = "bhij,ijd->bhid" if a.dim() == 3 else "bhij,hijd->bhid"
        return torch.einsum(eq, weights, a)


ROPE_SCALINGS = {
    "linear": ("factor",),
    "llama3": ("factor", "low_freq_factor", "high_freq_factor", "original_context"),
    "yarn": ("factor", "original_context", "beta_fast", "beta_slow", "attention_factor"),
    "longrope": ("original_context", "attention_factor", "short_factors", "long_factors"),
    "dynamic": ("factor", "original_context"),
}
_LISTS = ("short_factors", "long_factors")  # (comma-separated, one per rotated pair)
UNTRUNCATED = "untruncated"  # (YaRN's optional last word: the ramp's ends not rounded to whole dimensions)


def rope_scaling_parts(spec: str) -> tuple[str, list]:
    """``linear:FACTOR``, ``llama3:FACTOR:LOW:HIGH:ORIGINAL_CONTEXT``,
    ``yarn:FACTOR:ORIGINAL_CONTEXT:BETA_FAST:BETA_SLOW:ATTENTION_FACTOR`` or
    ``longrope:ORIGINAL_CONTEXT:ATTENTION_FACTOR:S1,S2,…:L1,L2,…`` or ``dynamic:FACTOR:ORIGINAL_CONTEXT``
    -> (kind, its numbers, the longrope factors as lists; YaRN's a sixth, 1.0 when its ramp's ends
    are rounded to whole dimensions, as by default, 0.0 after ``:untruncated``); a malformed spec is
    a ValueError saying the forms."""
    kind, *rest = spec.split(":")
    forms = " or ".join(f"{k}:{':'.join(n.upper() for n in names)}" for k, names in ROPE_SCALINGS.items())
    forms += f" (yarn: optionally :{UNTRUNCATED})"
    names = ROPE_SCALINGS.get(kind, ())
    truncate = not (kind == "yarn" and rest and rest[-1] == UNTRUNCATED)
    rest = rest if truncate else rest[:-1]
    try:
        numbers = [
            [float(x) for x in part.split(",")] if name in _LISTS else float(part) for name, part in zip(names, rest)
        ]
    except ValueError:
        numbers = []
    flat = [x for n in numbers for x in (n if isinstance(n, list) else [n])]
    if not names or len(rest) != len(names) or len(numbers) != len(names) or not all(x > 0 for x in flat):
        raise ValueError(f"--rope-scaling {spec!r}: write {forms} (positive numbers)")
    if kind == "llama3" and not numbers[2] > numbers[1]:
        raise ValueError(f"--rope-scaling {spec!r}: the high-frequency factor must exceed the low one")
    if kind == "longrope" and len(numbers[2]) != len(numbers[3]):
        raise ValueError(f"--rope-scaling {spec!r}: give as many long factors as short ones (one per rotated pair)")
    return kind, numbers + [float(truncate)] if kind == "yarn" else numbers


def rotation_changes_from(model: nn.Module) -> tuple[str, int] | None:
    """For a model whose rotation depends on the longest position of a call (LongRoPE, dynamic NTK),
    (its name, N): a call reaching past N tokens rotates every row otherwise, so rows batched
    together or tokens verified together past N are not rotated as each would be alone. None for
    other models."""
    config = getattr(model, "config", None)
    scaling = getattr(config, "rope_scaling", None) if getattr(config, "pos", None) == "rope" else None
    if not scaling:
        return None
    kind, numbers = rope_scaling_parts(scaling)
    if kind == "longrope":
        return "LongRoPE", int(numbers[0])
    return ("dynamic NTK scaling", int(numbers[1])) if kind == "dynamic" else None


def long_rope_from(model: nn.Module) -> int | None:
    """For a LongRoPE model (``--rope-scaling longrope:N:…``), N: a forward whose positions reach N
    rotates every query and key by the long factors, one below N by the short ones. A cache filled
    below N therefore holds keys a longer text would rotate otherwise: decoding refills it once
    when the text first grows past N tokens, as HuggingFace's Phi-3 does. None for other models."""
    changing = rotation_changes_from(model)
    return changing[1] if changing is not None and changing[0] == "LongRoPE" else None


def rope_frequencies(rotary_dim: int, base: float, scaling: str | None = None, *, long: bool = False) -> Tensor:
    """θ_i = base^(-2i/r) for i < r/2, rescaled for contexts longer than training's:
    ``linear:F`` divides every θ_i by F (position interpolation, Chen et al. 2023);
    ``llama3:F:LOW:HIGH:N`` (Llama 3.1) divides the slow frequencies (wavelength above N/LOW) by F,
    keeps the fast ones (below N/HIGH) and blends those between;
    ``yarn:F:N:βf:βs:A`` (YaRN, Peng et al. 2023; Qwen's long contexts) divides those that turn fewer
    than βs times over N positions by F, keeps those turning more than βf times, and ramps linearly
    between, by dimension index;
    ``longrope:N:A:S…:L…`` (LongRoPE, Ding et al. 2024; Phi-3 and 3.5 mini) divides each θ_i by its
    own factor, the short ones S_i, or with ``long`` the long ones L_i (for positions from N on);
    ``dynamic:F:N`` (dynamic NTK) keeps θ up to N tokens and raises the base past them, per call
    (:meth:`RotaryEmbedding.dynamic_frequencies`): here the θ up to N."""
    inv_freq = 1.0 / base ** (torch.arange(0, rotary_dim, 2).float() / rotary_dim)  # (as HuggingFace computes it)
    if not scaling:
        return inv_freq
    kind, numbers = rope_scaling_parts(scaling)
    if kind == "linear":
        return inv_freq / numbers[0]
    if kind == "dynamic":
        return inv_freq
    if kind == "longrope":
        factors = torch.tensor(numbers[3] if long else numbers[2], dtype=torch.float32)
        if len(factors) != len(inv_freq):
            raise ValueError(
                f"--rope-scaling longrope gives {len(factors)} factors for {len(inv_freq)} rotated pairs; give one per pair"
            )
        return inv_freq / factors
    if kind == "yarn":
        factor, original, beta_fast, beta_slow, _, truncate = numbers

        def dimension_turning(turns: float) -> float:  # the index i whose θ_i turns `turns` times over N positions
            return rotary_dim * math.log(original / (turns * 2 * math.pi)) / (2 * math.log(base))

        low, high = dimension_turning(beta_fast), dimension_turning(beta_slow)
        if truncate:  # (whole dimensions, as YaRN's paper and HuggingFace's default round them)
            low, high = math.floor(low), math.ceil(high)
        low, high = max(low, 0), min(high, rotary_dim - 1)
        high += 0.001 if high == low else 0  # (HuggingFace's guard against a zero-width ramp)
        ramp = ((torch.arange(rotary_dim // 2).float() - low) / (high - low)).clamp(0, 1)  # 0: kept, 1: divided
        return inv_freq / factor * ramp + inv_freq * (1 - ramp)
    factor, low, high, original = numbers
    wavelength = 2 * math.pi / inv_freq
    slow = torch.where(wavelength > original / low, inv_freq / factor, inv_freq)
    blend = (original / wavelength - low) / (high - low)  # 0 at the slow edge, 1 at the fast one
    blended = (1 - blend) * slow / factor + blend * slow
    between = (wavelength >= original / high) & (wavelength <= original / low)
    return torch.where(between, blended, slow)


class RotaryEmbedding(nn.Module):
    """RoPE (Su et al.): rotate each pair of dimensions (x_i, x_{i+r/2}) of queries and
    keys by the angle pos·θ_i, θ_i = base^(-2i/r). Then q_m · k_n depends only on m - n.
    ``rotary_dim`` r (default: the head's width): rotate the first r dimensions of each head and
    pass the rest through (GPT-NeoX and Pythia rotate a quarter); ``scaling``: θ rescaled for a
    longer context (:func:`rope_frequencies`)."""

    def __init__(
        self, head_dim: int, base: float = 10000.0, rotary_dim: int | None = None, scaling: str | None = None
    ) -> None:
        super().__init__()
        rotary_dim = head_dim if rotary_dim is None else rotary_dim
        if rotary_dim % 2 or not 0 < rotary_dim <= head_dim:
            raise ValueError(f"rotary embedding needs an even width up to the head's {head_dim}, got {rotary_dim}")
        self.head_dim, self.rotary_dim = head_dim, rotary_dim
        self.base, self.scaling = base, scaling
        self._last = None  # ((positions, its version, dtype), (cos, sin)) of the last call
        self.register_buffer("inv_freq", rope_frequencies(rotary_dim, base, scaling), persistent=False)
        kind, numbers = rope_scaling_parts(scaling) if scaling else (None, [])
        # YaRN and LongRoPE scale cos and sin by A (so the scores by A²): the attention's temperature
        self.attention_factor = numbers[4] if kind == "yarn" else numbers[1] if kind == "longrope" else 1.0
        self.long_from = int(numbers[0]) if kind == "longrope" else None
        self.dynamic = (numbers[0], int(numbers[1])) if kind == "dynamic" else None  # (F, N)
        if self.long_from is not None:
            self.register_buffer(
                "inv_freq_long", rope_frequencies(rotary_dim, base, scaling, long=True), persistent=False
            )

    def _apply(self, fn, recurse: bool = True):
        # θ stays float32 when the model is cast (model.to(torch.bfloat16)): θ rounded to bf16 turns
        # position 1,000 by up to several radians, and HuggingFace's models keep it in float32
        super()._apply(fn, recurse)
        self._last = None
        for name in ("inv_freq", "inv_freq_long"):
            buffer = getattr(self, name, None)
            if buffer is not None and buffer.dtype != torch.float32:
                exact = rope_frequencies(self.rotary_dim, self.base, self.scaling, long=name == "inv_freq_long")
                setattr(self, name, exact.to(buffer.device))
        return self

    def cos_sin(self, positions: Tensor, dtype: torch.dtype) -> tuple[Tensor, Tensor]:
        """cos(pos·θ) and sin(pos·θ), each (T, r) or (B, 1, T, r), the r/2 angles twice over.
        Every layer of a model shares one embedding and, in one forward, one ``positions`` tensor:
        the last call's pair is kept for the next layer's (not while compiling, which traces it)."""
        if torch.compiler.is_compiling():  # (a traced graph reads no Python-side state)
            return self._cos_sin(positions, dtype)
        key, last = (positions, positions._version, dtype), self._last
        if last is not None and last[0][0] is positions and last[0][1:] == key[1:]:
            return last[1]
        pair = self._cos_sin(positions, dtype)
        self._last = (key, pair)
        return pair

    def _cos_sin(self, positions: Tensor, dtype: torch.dtype) -> tuple[Tensor, Tensor]:
        inv_freq = self.inv_freq
        if self.long_from is not None:  # LongRoPE: the long factors once a position of the call reaches N
            inv_freq = torch.where(positions.max() >= self.long_from, self.inv_freq_long, self.inv_freq)
        if self.dynamic is not None:
            inv_freq = self.dynamic_frequencies(positions)
        angles = positions.float()[..., None] * inv_freq  # (..., T, r/2)
        if angles.dim() == 3:
            angles = angles[:, None]  # (B, 1, T, r/2): broadcast over heads
        cos, sin = angles.cos(), angles.sin()
        if self.attention_factor != 1.0:
            cos, sin = cos * self.attention_factor, sin * self.attention_factor
        return torch.cat([cos, cos], dim=-1).to(dtype), torch.cat([sin, sin], dim=-1).to(dtype)

    def dynamic_frequencies(self, positions: Tensor) -> Tensor:
        """Dynamic NTK scaling (``dynamic:F:N``; Reddit's bloc97 and emozilla, 2023): a call whose
        positions reach L > N tokens rotates by θ_i with the base raised to
        base · s^(r/(r-2)), s = F·L/N - (F - 1): the fastest pair turns as before, the slowest s times
        slower, those between in geometric steps; up to N, the plain θ. Computed as HuggingFace computes it (float32, on the device: no host sync).
        HuggingFace keeps the largest L seen until a call falls back under N; here each call's own L
        counts, which is the same while a text grows, as in generation. (r/2,)"""
        factor, original = self.dynamic
        length = positions.max() + 1
        grown = torch.maximum(length, torch.tensor(original, dtype=length.dtype, device=length.device))
        base = self.base * ((factor * grown / original) - (factor - 1)) ** (self.rotary_dim / (self.rotary_dim - 2))
        exponents = torch.arange(0, self.rotary_dim, 2, device=positions.device).float() / self.rotary_dim
        return torch.where(length > original, 1.0 / base**exponents, self.inv_freq)

    def forward(self, x: Tensor, positions: Tensor) -> Tensor:
        """x (B, H, T, d), positions (T,) or (B, T) -> same shape, rotated."""
        cos, sin = self.cos_sin(positions, x.dtype)
        if self.rotary_dim == self.head_dim:
            x1, x2 = x.chunk(2, dim=-1)
            return x * cos + torch.cat([-x2, x1], dim=-1) * sin
        rotated, passed = x[..., : self.rotary_dim], x[..., self.rotary_dim :]
        x1, x2 = rotated.chunk(2, dim=-1)
        rotated = rotated * cos + torch.cat([-x2, x1], dim=-1) * sin
        return torch.cat([rotated, passed], dim=-1) if passed.shape[-1] else rotated


def alibi_slopes(n_heads: int) -> Tensor:
    """Head slopes of ALiBi (Press et al.): the geometric sequence 2^(-8/n), 2^(-16/n), ...;
    for n not a power of two, the paper's interleaving of the next power of two."""

    def pow2(n: int) -> list[float]:
        start = 2 ** (-8 / n)
        return [start ** (i + 1) for i in range(n)]

    if math.log2(n_heads).is_integer():
        return torch.tensor(pow2(n_heads))
    closest = 2 ** math.floor(math.log2(n_heads))
    return torch.tensor(pow2(closest) + pow2(2 * closest)[0::2][: n_heads - closest])


class ALiBi(nn.Module):
    """Attention with linear biases: score_ij -= slope_h · |i - j|. (H, Tq, Tk)."""

    def __init__(self, n_heads: int) -> None:
        super().__init__()
        self.register_buffer("slopes", alibi_slopes(n_heads), persistent=False)

    def forward(self, q: Tensor, t_k: int) -> Tensor:
        t_q = q.shape[-2]
        i = torch.arange(t_k - t_q, t_k, device=q.device)[:, None]
        j = torch.arange(t_k, device=q.device)[None, :]
        dist = (i - j).abs().to(q.dtype)  # (Tq, Tk)
        return -self.slopes.to(q.dtype)[:, None, None] * dist


class PEG(nn.Module):
    """Positional encoding generator (Chu et al., CPVT): x + DepthwiseConv(x on its grid).

    Tokens (B, N=h*w, D) are laid out on the (h, w) grid, convolved per channel with
    a k×k kernel (zero padding gives the position cue), and added back. Extra leading
    tokens (a class token) pass through unchanged.
    """

    def __init__(self, dim: int, kernel_size: int = 3) -> None:
        super().__init__()
        self.conv = nn.Conv2d(dim, dim, kernel_size, padding=kernel_size // 2, groups=dim)

    def forward(self, x: Tensor, grid: tuple[int, int], n_prefix: int = 0) -> Tensor:
        h, w = grid
        prefix, tokens = x[:, :n_prefix], x[:, n_prefix:]
        if tokens.shape[1] != h * w:
            raise ValueError(f"PEG: {tokens.shape[1]} tokens do not fill a {h}x{w} grid")
        img = rearrange(tokens, "b (h w) d -> b d h w", h=h, w=w)
        tokens = tokens + rearrange(self.conv(img), "b d h w -> b (h w) d")
        return torch.cat([prefix, tokens], dim=1)


def laplacian_eigenvectors(adjacency: Tensor, k: int, node_mask: Tensor | None = None) -> Tensor:
    """Laplacian positional encodings (Dwivedi & Bresson 2021): the eigenvectors of the
    symmetric normalised Laplacian

        L = I − D^{−1/2} A D^{−1/2}

    sorted by eigenvalue, the first (eigenvalue 0: constant over a connected graph up to the
    degree weights, so it carries no position) dropped and the next ``k`` kept, as "positions"
    of the nodes: the graph analogue of the sinusoids, which are the eigenvectors of a path's (a
    sequence's) Laplacian. adjacency (B, N, N) (or (N, N)), symmetric, nonzero = an edge;
    ``node_mask`` (B, N) True = a real node, False = padding. Returns (B, N, k) (or (N, k)); a
    graph of n ≤ k nodes gets zero columns past its n − 1 eigenvectors, padding nodes get zeros.
    Each column's sign is arbitrary (−u is as much an eigenvector as u):
    :class:`LaplacianPosition` flips signs at random in training so that no model relies on one."""
    single = adjacency.dim() == 2
    a = ((adjacency[None] if single else adjacency) != 0).float()
    n = a.shape[-1]
    real = torch.ones(a.shape[:2], dtype=torch.bool, device=a.device) if node_mask is None else node_mask.bool()
    if single and node_mask is not None:
        real = real.reshape(1, n)
    a = a * real[:, :, None] * real[:, None, :]
    deg = a.sum(-1)
    inv_sqrt = torch.where(deg > 0, deg.clamp_min(1e-12).rsqrt(), torch.zeros_like(deg))
    lap = torch.eye(n, device=a.device) - inv_sqrt[:, :, None] * a * inv_sqrt[:, None, :]
    # padding nodes: eigenvalue 3 (> 2, the normalised Laplacian's largest possible), so their
    # indicator vectors sort after every real one and are zero on the real nodes
    lap = lap + torch.diag_embed((~real).float() * 2)
    _, vecs = torch.linalg.eigh(lap.double())
    out = vecs[..., 1 : k + 1].float() * real[..., None]
    if out.shape[-1] < k:  # fewer than k + 1 nodes in the whole batch
        out = torch.cat([out, out.new_zeros(*out.shape[:-1], k - out.shape[-1])], dim=-1)
    return out[0] if single else out


class LaplacianPosition(nn.Module):
    """x + W (s ⊙ U_k): node tokens (B, N, D) plus a learned projection W of their ``k``
    Laplacian eigenvectors U_k (B, N, k) (:func:`laplacian_eigenvectors`). In training each
    graph's eigenvectors get random signs s ∈ {−1, +1}^k (``sign_flip``), so the model learns to
    read them whatever sign the eigensolver returns."""

    def __init__(self, dim: int, k: int, sign_flip: bool = True) -> None:
        super().__init__()
        self.k, self.sign_flip = k, sign_flip
        self.proj = nn.Linear(k, dim)

    def forward(self, x: Tensor, eigvecs: Tensor) -> Tensor:
        if eigvecs.shape[-1] != self.k or eigvecs.shape[:-1] != x.shape[:-1]:
            raise ValueError(
                f"LaplacianPosition: eigenvectors {tuple(eigvecs.shape)} do not fit nodes {tuple(x.shape)} "
                f"with k={self.k}"
            )
        if self.training and self.sign_flip:
            signs = torch.randint(0, 2, (eigvecs.shape[0], 1, self.k), device=eigvecs.device) * 2 - 1
            eigvecs = eigvecs * signs
        return x + self.proj(eigvecs.to(x.dtype))
