"""GPT: a decoder-only transformer that predicts the next token.

x_0 = E[tokens] (+ P[positions])         token (+ learned position) embedding
x_l = Block_l(x_{l-1})                   pre-LN causal self-attention + MLP
logits = LN(x_L) Eᵀ                      tied output head
"""

from __future__ import annotations

import math

import torch
from torch import Tensor, nn
from torch.nn import functional as F

from ..attention import KVCache, StaticKVCache, key_bias
from ..errors import OptionError
from ..hooks import HookedModule, HookPoint
from ..losses import chunked_cross_entropy, cross_entropy
from ..blocks import HeadWeights, TransformerBlock, init_gpt2_weights, norm_layer
from ..position import (
    ALiBi,
    LearnedPosition,
    RelativePosition,
    RotaryEmbedding,
    SinusoidalPosition,
)

__all__ = ["GPTConfig", "GPT", "GPT_PRESETS"]


def _compute_dtype(x: Tensor) -> torch.dtype:
    """The dtype the layers' projections give x: autocast's where it is on (bf16 training and
    decoding), else x's own."""
    kind = x.device.type
    return torch.get_autocast_dtype(kind) if torch.is_autocast_enabled(kind) else x.dtype


from .configs import POSITIONS, GPTConfig, SPEEDRUN_CHANGES, GPT_PRESETS  # noqa: F401  (declared without torch)


class GPT(HeadWeights, HookedModule):
    """Calling the model on token ids (B, T) returns next-token logits (B, T, vocab_size).

    Hook points: ``hook_embed`` (B, T, D) the residual stream entering block 0 (token +
    absolute position embedding), ``blocks.L.*`` (:mod:`attnlab.blocks`), ``hook_final`` (B, T, D)
    after the final LayerNorm, just before the unembedding."""

    model_type = "gpt"
    config_class = GPTConfig
    representation_hooks = "blocks.*.hook_resid_post"  # the successive representations (CKA)

    def __init__(self, config: GPTConfig) -> None:
        super().__init__()
        self.config = c = config
        self.tok_emb = nn.Embedding(c.vocab_rows, c.dim - c.pos_dim)
        # absolute positions are added to the tokens; rotary and ALiBi act inside attention
        # (one parameter-free module shared by all layers)
        absolute = {"learned": LearnedPosition, "sinusoidal": SinusoidalPosition}.get(c.pos)
        # concat with --pos-dim P: x = [E(token); P(pos)], D − P and P wide; without: x = W [E(token); P(pos)],
        # W (dim, 2·dim) (set to [I I] below: it starts as the sum)
        self.pos_emb = absolute(c.pos_dim or c.dim, c.context) if absolute else None
        self.pos_mix = nn.Linear(2 * c.dim, c.dim, bias=False) if c.pos_combine == "concat" and not c.pos_dim else None
        self.drop = nn.Dropout(c.dropout)
        rotary = RotaryEmbedding(c.d_head, c.rope_base, c.rotary_dim, c.rope_scaling) if c.pos == "rope" else None
        # (Gemma 3: the windowed layers rotate with another base)
        local = c.rope_local_base is not None and c.pos == "rope" and c.window is not None
        local_rotary = RotaryEmbedding(c.d_head, c.rope_local_base, c.rotary_dim) if local else rotary
        # a score bias: ALiBi's fixed slopes, or Shaw's learned tables (one set for every layer, as T5 shares
        # its relative bias, with the value term)
        bias = None
        if c.pos == "alibi":
            bias = ALiBi(c.heads)
        elif c.pos == "relative":
            bias = RelativePosition(c.d_head, c.rel_distance, heads=c.heads if c.rel_heads else None)
        self.rel_pos = bias if c.pos == "relative" else None
        self.blocks = nn.ModuleList(
            TransformerBlock(
                c.dim,
                c.heads,
                activation=c.activation,
                dropout=c.dropout,
                attn_dropout=c.dropout,
                causal=True,
                bias=c.bias,
                norm_eps=c.norm_eps,
                rotary=rotary if c.layer_window(i) is None else local_rotary,
                position_bias=bias,
                mlp=c.mlp,
                window=c.layer_window(i),
                qk_norm=c.qk_norm,
                attn_scale=c.attn_scale,
                tie=c.attn_tie,
                n_kv_heads=c.kv_heads,
                d_k=c.head_dim,
                qkv_bias=c.qkv_bias,
                mlp_hidden=c.mlp_hidden,
                norm=c.norm,
                gated=c.gated_mlp,
                norm_first=not c.post_ln,
                parallel=c.parallel_residual,
                sandwich=c.sandwich_norm,
                attn_softcap=c.attn_softcap,
            )
            for i in range(c.layers)
        )
        self.ln_f = norm_layer(c.norm, c.dim, c.norm_eps, c.bias)
        self.hook_embed, self.hook_final = HookPoint(), HookPoint()
        self.lm_head = nn.Linear(c.dim, c.vocab_rows, bias=False)
        init_gpt2_weights(self, c.layers)
        if self.pos_mix is not None:
            with torch.no_grad():
                self.pos_mix.weight.copy_(torch.cat([torch.eye(c.dim), torch.eye(c.dim)], dim=1))
        if c.zero_init:  # each block starts as the identity; the gradient reaches these first
            for name, p in self.named_parameters():
                if name.endswith(("out_proj.weight", "mlp.proj.weight")) or (
                    name == "lm_head.weight" and not c.tie_output
                ):
                    nn.init.zeros_(p)
        if c.tie_output:
            self.lm_head.weight = self.tok_emb.weight  # the output head reuses E (Press & Wolf)

    @classmethod
    def from_preset(cls, name: str, **overrides) -> "GPT":
        if name not in GPT_PRESETS:
            raise ValueError(f"unknown GPT preset {name!r}; choose one of {sorted(GPT_PRESETS)}")
        return cls(GPTConfig(**{**GPT_PRESETS[name], **overrides}))

    def num_params(self, non_embedding: bool = True) -> int:
        n = sum(p.numel() for p in self.parameters())
        if non_embedding and isinstance(self.pos_emb, LearnedPosition):
            n -= self.pos_emb.weight.numel()
        return n

    def new_caches(self, batch: int, max_len: int | None = None, *, device=None, dtype=None) -> list[KVCache]:
        max_len = max_len or self.config.context
        device = device or self.tok_emb.weight.device
        dtype = dtype or self.tok_emb.weight.dtype
        return [b.attn.new_cache(batch, max_len, device=device, dtype=dtype) for b in self.blocks]

    def forward(
        self,
        idx: Tensor,
        *,
        caches: list[KVCache] | list[StaticKVCache] | None = None,
        positions: Tensor | None = None,
        key_mask: Tensor | None = None,
        last_only: bool = False,
        check_positions: bool = True,
        targets: Tensor | None = None,
        loss_chunk: int = 0,
        start_at_layer: int | None = None,
        stop_at_layer: int | None = None,
    ) -> Tensor:
        """idx (B, T) int64 -> logits (B, T, vocab); with ``last_only`` (B, 1, vocab), the last
        position's only (a prompt's prefill: the others would be computed and thrown away).

        ``caches`` (from :meth:`new_caches`) make this an incremental step: idx holds only
        the new tokens. ``positions`` (B, T) and ``key_mask`` (B, T_total, True = real
        token) support left-padded batches of prompts of different lengths.
        :class:`StaticKVCache` s make it a fixed-shape decode step (``attnlab.generate.fast``):
        ``positions`` and ``key_mask`` (B, max_len) are then required and are not checked here
        (that would read them back from the device at every token): the decoder checks once.
        ``check_positions=False`` skips that check for given ``positions`` too (a caller that
        knows they fit: the continuous batcher).

        ``targets`` (B, T): return the mean next-token cross-entropy (0-dim, fp32) instead of the
        logits, computed ``loss_chunk`` tokens at a time when it is set
        (:func:`attnlab.losses.chunked_cross_entropy`: the full fp32 logits never exist at once).

        TransformerLens's ``stop_at_layer=L`` returns the residual stream (B, T, D) entering block L
        instead (0: the embeddings only; negative counts from the end); ``start_at_layer=L`` takes
        that stream as its input in place of token ids and runs the blocks from L on.
        """
        head = dict(last_only=last_only, targets=targets, loss_chunk=loss_chunk)
        if start_at_layer is not None:  # idx is the residual stream entering that block
            if idx.dim() != 3 or idx.shape[-1] != self.config.dim or not idx.is_floating_point():
                raise ValueError(
                    f"start_at_layer takes the residual stream (B, T, {self.config.dim}), got "
                    f"{tuple(idx.shape)} {idx.dtype}"
                )
            if positions is None:
                positions = torch.arange(idx.shape[1], device=idx.device)
            return self._blocks_from(idx, start_at_layer, stop_at_layer, None, key_mask, positions, **head)
        if idx.dim() != 2 or idx.dtype not in (torch.int64, torch.int32):
            raise OptionError(
                f"GPT expects token ids of shape (B, T) and integer dtype, got {tuple(idx.shape)} {idx.dtype}"
            )
        b, t = idx.shape
        # (len, not the list's truth value: torch 2.11's dynamo cannot trace bool(list))
        cached = caches is not None and len(caches) > 0
        if not cached:
            caches = None
        static = cached and isinstance(caches[0], StaticKVCache)
        unchecked = static or (positions is not None and not check_positions)
        if static and (positions is None or key_mask is None):
            raise ValueError("a static KV cache needs positions= and key_mask= (see attnlab.generate.fast)")
        offset = caches[0].length if cached and not static else 0
        # the furthest position: a cache's column count, unless positions are given (a batch whose
        # rows start at different columns, as in continuous batching, counts each row's own tokens)
        end = 0 if unchecked else offset + t if positions is None else int(positions.max()) + 1
        if end > self.config.context and self.pos_emb is not None:
            raise ValueError(
                f"sequence of {end} tokens is longer than the model's context of "
                f"{self.config.context}; crop the input to the last {self.config.context} tokens"
            )
        x = self.tok_emb(idx)  # (B, T, C)
        if self.config.embed_scale:
            x = x * math.sqrt(self.config.dim)  # E·√d_model (Vaswani et al. 3.4)
        if self.config.pos_combine == "concat":  # the position code beside the token's
            pe = self.pos_emb(x.new_zeros(*x.shape[:-1], self.pos_emb.dim), offset=offset, positions=positions,
                              check=not unchecked)  # (B, T, P)  # fmt: skip
            x = torch.cat([x, pe], dim=-1)  # (B, T, D) with --pos-dim, else (B, T, 2D) projected back to D
            x = self.pos_mix(x) if self.pos_mix is not None else x
        elif self.pos_emb is not None:
            x = self.pos_emb(x, offset=offset, positions=positions, check=not unchecked)
        x = self.hook_embed(self.drop(x))
        if positions is None:
            positions = torch.arange(offset, offset + t, device=idx.device)  # (T,)
        return self._blocks_from(x, 0, stop_at_layer, caches, key_mask, positions, **head)

    def _blocks_from(self, x, start, stop, caches, key_mask, positions, *, last_only, targets, loss_chunk) -> Tensor:
        """Blocks ``start`` … ``stop`` − 1 on the residual stream x (B, T, D): the stream entering
        block ``stop``, or with ``stop`` None the final norm and the output head (or the loss
        against ``targets``)."""
        n = len(self.blocks)
        last = n if stop is None else stop
        first, last = start + n if start < 0 else start, last + n if last < 0 else last  # (negative: from the end)
        if not 0 <= first <= last <= n:
            raise ValueError(f"start_at_layer {start} / stop_at_layer {stop}: this GPT has layers 0 … {n - 1}")
        rope_positions = positions if self.config.pos == "rope" else None
        bias = None
        if caches is not None and key_mask is not None and x.shape[1] == 1:
            # a decoding step: one query per row, which sees its own (real) key; the key mask in the
            # kernel's additive form, built once here rather than broadcast and converted per layer
            bias, key_mask = key_bias(key_mask, _compute_dtype(x)), None
        for i in range(first, last):
            x = self.blocks[i](
                x,
                key_mask=key_mask,
                bias=bias,
                positions=rope_positions,
                cache=caches[i] if caches is not None else None,
            )
        if stop is not None:
            return x
        if last_only:
            x = x[:, -1:]
        final = self.hook_final(self.ln_f(x))
        if targets is None:
            return self.unembed(final)
        if loss_chunk:
            return chunked_cross_entropy(final, self.unembed, targets, loss_chunk)
        return cross_entropy(self.unembed(final), targets)

    def unembed(self, x: Tensor) -> Tensor:
        """The output head after the final norm: (..., D) -> logits (..., vocab_size), soft-capped
        where the config says so. The logit lens reads every layer through it."""
        logits = self.lm_head(x)  # (..., vocab_rows)
        if self.config.vocab_rows != self.config.vocab_size:  # padding rows are never a token
            logits = logits[..., : self.config.vocab_size]
        if self.config.logit_softcap:
            cap = self.config.logit_softcap
            logits = cap * torch.tanh(logits / cap)  # smooth clip to (-cap, cap)
        return logits

    def attention_blocks(self) -> list:
        """The blocks whose attention ``W_Q`` … ``b_O`` stack (:class:`attnlab.blocks.HeadWeights`)."""
        return list(self.blocks)

    @property
    def W_E(self) -> Tensor:
        """(vocab, D): the token embeddings (a padded vocabulary's real rows); with --pos-dim P, as they
        enter the stream: zero in its last P dims, the positions' own."""
        e = self.tok_emb.weight[: self.config.vocab_size]
        return F.pad(e, (0, self.config.pos_dim)) if self.config.pos_dim else e

    @property
    def W_pos(self) -> Tensor:
        """(context, D): the learned or sinusoidal position table (other schemes have none)."""
        if self.pos_emb is None:
            raise ValueError(f"--pos {self.config.pos} adds no position vectors to the stream: there is no W_pos")
        table = self.pos_emb.weight if hasattr(self.pos_emb, "weight") else self.pos_emb.pe[: self.config.context]
        return F.pad(table, (self.config.dim - self.config.pos_dim, 0)) if self.config.pos_dim else table

    @property
    def W_U(self) -> Tensor:
        """(D, vocab): the unembedding, before any soft cap."""
        return self.lm_head.weight[: self.config.vocab_size].T

    @property
    def b_U(self) -> Tensor:
        """(vocab,): the unembedding's bias (zero unless weight processing folded one in)."""
        bias = self.lm_head.bias
        return (
            bias[: self.config.vocab_size]
            if bias is not None
            else self.lm_head.weight.new_zeros(self.config.vocab_size)
        )

    def loss(self, idx: Tensor, targets: Tensor, ignore_index: int = -100) -> Tensor:
        """Mean next-token cross-entropy; targets (B, T) are idx shifted by one."""
        return cross_entropy(self(idx), targets, ignore_index=ignore_index)
