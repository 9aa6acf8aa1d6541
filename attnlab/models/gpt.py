"""GPT: a decoder-only transformer that predicts the next token.

    x_0 = E[tokens] (+ P[positions])         token (+ learned position) embedding
    x_l = Block_l(x_{l-1})                   pre-LN causal self-attention + MLP
    logits = LN(x_L) Eᵀ                      tied output head
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ..attention import KVCache
from ..config import Config
from ..blocks import TransformerBlock, init_gpt2_weights
from ..position import ALiBi, RotaryEmbedding, SinusoidalPosition

__all__ = ["GPTConfig", "GPT", "GPT_PRESETS"]

POSITIONS = ("learned", "rope", "alibi", "sinusoidal")


@dataclass
class GPTConfig(Config):
    vocab_size: int = 50257
    block_size: int = 1024  # the context length: the most tokens the model can see at once
    n_layer: int = 12
    n_head: int = 12
    n_embd: int = 768
    dropout: float = 0.0
    bias: bool = True
    position: str = "learned"  # learned | rope | alibi | sinusoidal
    activation: str = "gelu"  # exact GELU (nanoGPT); the gpt2 preset uses "gelu_tanh" (GPT-2's gelu_new)
    norm_eps: float = 1e-5
    tie_weights: bool = True

    SIZES = ("vocab_size", "block_size", "n_layer", "n_head", "n_embd")

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.position not in POSITIONS:
            raise ValueError(f"unknown position encoding {self.position!r}; choose one of {POSITIONS}")
        if self.n_embd % self.n_head:
            raise ValueError(
                f"n_embd={self.n_embd} is not divisible by n_head={self.n_head}; pick n_head dividing n_embd"
            )
        for name in ("vocab_size", "block_size", "n_layer", "n_head", "n_embd"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be a positive integer, got {getattr(self, name)}")


GPT_PRESETS: dict[str, dict] = {
    # a few seconds per hundred steps on a laptop CPU; for tests and quick looks
    "nano": dict(n_layer=2, n_head=2, n_embd=64, block_size=64),
    # nanoGPT's documented CPU run on Tiny Shakespeare
    "shakespeare-cpu": dict(n_layer=4, n_head=4, n_embd=128, block_size=64),
    # nanoGPT's GPU Shakespeare model
    "shakespeare": dict(n_layer=6, n_head=6, n_embd=384, block_size=256, dropout=0.2),
    # GPT-2 small (124M)
    "gpt2": dict(n_layer=12, n_head=12, n_embd=768, block_size=1024, vocab_size=50257, activation="gelu_tanh"),
}


class GPT(nn.Module):
    """Calling the model on token ids (B, T) returns next-token logits (B, T, vocab_size)."""

    model_type = "gpt"
    config_class = GPTConfig

    def __init__(self, config: GPTConfig) -> None:
        super().__init__()
        self.config = c = config
        self.tok_emb = nn.Embedding(c.vocab_size, c.n_embd)
        self.pos_emb = nn.Embedding(c.block_size, c.n_embd) if c.position == "learned" else None
        self.sinusoidal = SinusoidalPosition(c.n_embd, c.block_size) if c.position == "sinusoidal" else None
        self.drop = nn.Dropout(c.dropout)
        head_dim = c.n_embd // c.n_head
        # one position module shared by all layers (parameter-free)
        rotary = RotaryEmbedding(head_dim) if c.position == "rope" else None
        alibi = ALiBi(c.n_head) if c.position == "alibi" else None
        self.blocks = nn.ModuleList(
            TransformerBlock(
                c.n_embd, c.n_head, activation=c.activation, dropout=c.dropout, attn_dropout=c.dropout,
                causal=True, bias=c.bias, norm_eps=c.norm_eps, rotary=rotary, position_bias=alibi,
            )
            for _ in range(c.n_layer)
        )
        self.ln_f = nn.LayerNorm(c.n_embd, eps=c.norm_eps, bias=c.bias)
        self.lm_head = nn.Linear(c.n_embd, c.vocab_size, bias=False)
        init_gpt2_weights(self, c.n_layer)
        if c.tie_weights:
            self.lm_head.weight = self.tok_emb.weight  # the output head reuses E (Press & Wolf)

    @classmethod
    def from_preset(cls, name: str, **overrides) -> "GPT":
        if name not in GPT_PRESETS:
            raise ValueError(f"unknown GPT preset {name!r}; choose one of {sorted(GPT_PRESETS)}")
        return cls(GPTConfig(**{**GPT_PRESETS[name], **overrides}))

    def num_params(self, non_embedding: bool = True) -> int:
        n = sum(p.numel() for p in self.parameters())
        if non_embedding and self.pos_emb is not None:
            n -= self.pos_emb.weight.numel()
        return n

    def new_caches(self, batch: int, max_len: int | None = None, *, device=None, dtype=None) -> list[KVCache]:
        max_len = max_len or self.config.block_size
        device = device or self.tok_emb.weight.device
        dtype = dtype or self.tok_emb.weight.dtype
        return [b.attn.new_cache(batch, max_len, device=device, dtype=dtype) for b in self.blocks]

    def forward(
        self,
        idx: Tensor,
        *,
        caches: list[KVCache] | None = None,
        positions: Tensor | None = None,
        key_mask: Tensor | None = None,
    ) -> Tensor:
        """idx (B, T) int64 -> logits (B, T, vocab).

        ``caches`` (from :meth:`new_caches`) make this an incremental step: idx holds only
        the new tokens. ``positions`` (B, T) and ``key_mask`` (B, T_total, True = real
        token) support left-padded batches of prompts of different lengths.
        """
        if idx.dim() != 2 or idx.dtype not in (torch.int64, torch.int32):
            raise ValueError(f"GPT expects token ids of shape (B, T) and integer dtype, got {tuple(idx.shape)} {idx.dtype}")
        b, t = idx.shape
        offset = caches[0].length if caches else 0
        if offset + t > self.config.block_size and self.config.position in ("learned", "sinusoidal"):
            raise ValueError(
                f"sequence of {offset + t} tokens is longer than the model's context of "
                f"{self.config.block_size}; crop the input to the last {self.config.block_size} tokens"
            )
        if positions is None:
            positions = torch.arange(offset, offset + t, device=idx.device)  # (T,)
        x = self.tok_emb(idx)  # (B, T, C)
        if self.pos_emb is not None:
            x = x + self.pos_emb(positions)
        elif self.sinusoidal is not None:
            x = x + self.sinusoidal.pe[positions].to(x.dtype)
        x = self.drop(x)
        rope_positions = positions if self.config.position == "rope" else None
        for i, block in enumerate(self.blocks):
            x = block(x, key_mask=key_mask, positions=rope_positions, cache=caches[i] if caches else None)
        return self.lm_head(self.ln_f(x))  # (B, T, vocab)

    def loss(self, idx: Tensor, targets: Tensor, ignore_index: int = -100) -> Tensor:
        """Mean next-token cross-entropy; targets (B, T) are idx shifted by one."""
        logits = self(idx)
        return F.cross_entropy(logits.float().flatten(0, 1), targets.flatten(), ignore_index=ignore_index)
