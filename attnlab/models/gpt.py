"""GPT: a decoder-only transformer that predicts the next token.

x_0 = E[tokens] (+ P[positions])         token (+ learned position) embedding
x_l = Block_l(x_{l-1})                   pre-LN causal self-attention + MLP
logits = LN(x_L) Eᵀ                      tied output head
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch
from torch import Tensor, nn
from torch.nn import functional as F

from ..attention import KVCache, StaticKVCache, key_bias
from ..config import Config
from ..errors import OptionError
from ..hooks import HookedModule, HookPoint
from ..losses import chunked_cross_entropy, cross_entropy
from ..blocks import ACTIVATIONS, NORMS, HeadWeights, TransformerBlock, init_gpt2_weights, norm_layer
from ..position import (
    ALiBi,
    LearnedPosition,
    RelativePosition,
    RotaryEmbedding,
    SinusoidalPosition,
    rope_scaling_parts,
)

__all__ = ["GPTConfig", "GPT", "GPT_PRESETS"]


def _compute_dtype(x: Tensor) -> torch.dtype:
    """The dtype the layers' projections give x: autocast's where it is on (bf16 training and
    decoding), else x's own."""
    kind = x.device.type
    return torch.get_autocast_dtype(kind) if torch.is_autocast_enabled(kind) else x.dtype


POSITIONS = ("learned", "rope", "alibi", "sinusoidal", "relative")


@dataclass
class GPTConfig(Config):
    vocab_size: int = 50257
    context: int = 1024  # the most tokens the model can see at once (nanoGPT's block_size)
    layers: int = 12
    heads: int = 12
    dim: int = 768
    dropout: float = 0.0
    bias: bool = True
    pos: str = "learned"  # learned | rope | alibi | sinusoidal | relative (Shaw et al.)
    # exact GELU (nanoGPT); the gpt2 preset uses "gelu_tanh" (GPT-2's gelu_new), speedrun-cpu "relu2"
    activation: str = "gelu"
    norm_eps: float = 1e-5
    tie_output: bool = True
    mlp: bool = field(
        default=True,
        metadata={"help": "an MLP in every block (--no-mlp: attention only, as in the induction-head studies)"},
    )
    embed_scale: bool | None = field(
        default=None,
        metadata={
            "help": "multiply the token embeddings by √dim, as 'Attention is all you need' does, so that a fixed "
            "unit-amplitude (sinusoidal) position code does not drown them (default: on for --pos sinusoidal)"
        },
    )
    window: int | None = field(
        default=None,
        metadata={
            "help": "restricted attention: each token attends to itself and the WINDOW tokens before it "
            "(default: all earlier tokens)"
        },
    )

    pos_combine: str = field(
        default="add",
        metadata={
            "help": "absolute positions: add them to the token embeddings (add), or concatenate [token; position] "
            "(concat: see --pos-dim)"
        },
    )
    pos_dim: int = field(
        default=0,
        metadata={
            "help": "--pos-combine concat: the position code's width; the token embedding is dim - POS_DIM wide "
            "and [token; position] is the stream (0: both dim wide, joined and projected back to dim by a "
            "learned matrix that starts as their sum)"
        },
    )
    rel_distance: int = field(
        default=16,
        metadata={"help": "--pos relative: distances beyond this many tokens share one table row"},
    )
    rel_heads: bool = field(
        default=False,
        metadata={"help": "--pos relative: a table per head instead of one shared by all heads"},
    )
    qk_norm: bool = field(
        default=False,
        metadata={"help": "RMS-normalise each head's queries and keys (QK-norm; the speedrun-cpu preset's)"},
    )
    logit_softcap: float = field(
        default=0.0,
        metadata={
            "help": "soft-cap the output logits at ±CAP: CAP·tanh(logits/CAP), as Gemma 2 and the modded-nanogpt "
            "speedrun do (0: no cap)"
        },
    )
    zero_init: bool = field(
        default=False,
        metadata={
            "help": "start the projections that write into the residual stream (attention W_O, MLP out) and an "
            "untied output head at zero, so that every block starts as the identity (the speedrun's init)"
        },
    )
    attn_scale: float | None = field(
        default=None,
        metadata={
            "help": "multiply the attention scores q·k by this instead of 1/√d_k (1.0: unscaled dot products, "
            "the baseline of the √d_k claim)"
        },
    )
    vocab_multiple: int = field(
        default=1,
        metadata={
            "help": "round the embedding and output head up to a multiple of this many rows (64: the matmul "
            "shapes tensor cores run fastest, as nanoGPT pads GPT-2's 50,257 to 50,304); the extra rows are "
            "never output and exports drop them (1: no padding; BPE runs use 64)"
        },
    )
    kv_heads: int | None = field(
        default=None,
        metadata={
            "help": "grouped-query attention: this many key/value heads, each shared by heads / KV_HEADS query "
            "heads (default: one per query head; Llama 3, Qwen and Mistral share)"
        },
    )
    head_dim: int | None = field(
        default=None,
        metadata={"help": "each head's width (default dim / heads; Qwen3 and Gemma use other widths)"},
    )
    mlp_hidden: int | None = field(default=None, metadata={"help": "the MLP's hidden width (default 4 x dim)"})
    norm: str = field(
        default="layer",
        metadata={"help": "the normalisation: layer (LayerNorm, GPT-2's) or rms (RMSNorm: Llama, Qwen, Mistral)"},
    )
    gated_mlp: bool = field(
        default=False,
        metadata={
            "help": "a gated MLP: (act(x W_gate) * x W_up) W_down; with --activation silu it is SwiGLU "
            "(Llama, Qwen, Mistral)"
        },
    )
    qkv_bias: bool | None = field(
        default=None,
        metadata={"help": "biases on the query, key and value projections alone (default: as --bias; Qwen2 has them)"},
    )
    rope_base: float = field(
        default=10000.0,
        metadata={"help": "--pos rope: the base of the rotary frequencies (Llama 3 and Qwen: 500,000 and 1,000,000)"},
    )
    rope_scaling: str | None = field(
        default=None,
        metadata={
            "help": "--pos rope: frequencies rescaled for a longer context: linear:FACTOR, "
            "llama3:FACTOR:LOW:HIGH:ORIGINAL_CONTEXT (Llama 3.1 and 3.2: llama3:8:1:4:8192), "
            "yarn:FACTOR:ORIGINAL_CONTEXT:BETA_FAST:BETA_SLOW:ATTENTION_FACTOR (Qwen2.5's long contexts: "
            "yarn:4:32768:32:1:1.1386; a last :untruncated leaves the ramp's ends unrounded), "
            "longrope:ORIGINAL_CONTEXT:ATTENTION_FACTOR:S1,S2,...:L1,L2,... (Phi-3/3.5 mini 128k: a short and a "
            "long factor per rotated pair) or dynamic:FACTOR:ORIGINAL_CONTEXT (dynamic NTK: the base raised "
            "past the original context)"
        },
    )
    rope_fraction: float = field(
        default=1.0,
        metadata={"help": "--pos rope: rotate this share of each head's dimensions, pass the rest (Pythia: 0.25)"},
    )
    sandwich_norm: bool = field(
        default=False,
        metadata={"help": "normalise each sublayer's output too before it joins the residual stream (Gemma 2 and 3)"},
    )
    attn_softcap: float = field(
        default=0.0,
        metadata={"help": "soft-cap the attention scores at ±CAP: CAP·tanh(scores/CAP) (Gemma 2; 0: no cap)"},
    )
    global_every: int = field(
        default=0,
        metadata={
            "help": "with --window: every Nth layer attends to all earlier tokens, the others within the window "
            "(Gemma 2: 2, Gemma 3: 6; 0: every layer windowed)"
        },
    )
    window_from: int = field(
        default=0,
        metadata={
            "help": "with --window: the first N layers attend to all earlier tokens, the later ones within the "
            "window (Qwen2's max_window_layers; 0: every layer windowed)"
        },
    )
    rope_local_base: float | None = field(
        default=None,
        metadata={
            "help": "--pos rope: the rotary base of the windowed layers, which --rope-scaling leaves unscaled "
            "(Gemma 3: 10,000; default: as the other layers, --rope-base and --rope-scaling)"
        },
    )
    post_ln: bool = field(
        default=False,
        metadata={
            "help": "the original Transformer's post-LN blocks, LN(x + sublayer(x)), instead of pre-LN's "
            "x + sublayer(LN(x)) (Vaswani et al. 2017; deep ones train unstably, Xiong et al. 2020)"
        },
    )
    parallel_residual: bool = field(
        default=False,
        metadata={"help": "attention and MLP both read the block's input: x + attn(x) + mlp(x) (GPT-J, Pythia)"},
    )
    attn_tie: str = field(
        default="none",
        metadata={
            "help": "one projection fewer in attention: qk uses the queries as keys (W_K = W_Q), kv the keys as "
            "values (W_V = W_K); none keeps three"
        },
    )

    SIZES = ("vocab_size", "context", "layers", "heads", "dim")
    CHOICES = {
        "pos": POSITIONS,
        "norm": NORMS,
        "activation": ACTIVATIONS,
        "pos_combine": ("add", "concat"),
        "attn_tie": ("none", "qk", "kv"),
    }
    ALIASES = {
        "block_size": "context",
        "n_layer": "layers",
        "n_head": "heads",
        "n_embd": "dim",
        "position": "pos",
        "tie_weights": "tie_output",
    }

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.embed_scale is None:
            self.embed_scale = self.pos == "sinusoidal"
        if self.head_dim is None and self.dim % self.heads:
            raise ValueError(f"dim={self.dim} is not divisible by heads={self.heads}; pick heads dividing dim")
        for name in ("kv_heads", "head_dim", "mlp_hidden"):
            if getattr(self, name) is not None and getattr(self, name) < 1:
                raise ValueError(f"--{name.replace('_', '-')} must be at least 1, got {getattr(self, name)}")
        if self.kv_heads is not None and self.heads % self.kv_heads:
            raise ValueError(f"heads={self.heads} is not a multiple of kv_heads={self.kv_heads}; pick a divisor")
        if not 0 < self.rope_fraction <= 1:
            raise ValueError(f"--rope-fraction must be above 0 and at most 1, got {self.rope_fraction}")
        if self.rope_scaling is not None:
            kind, numbers = rope_scaling_parts(self.rope_scaling)  # (a malformed spec: its form, in one line)
            if kind == "longrope" and len(numbers[2]) != self.rotary_dim // 2:
                raise ValueError(
                    f"--rope-scaling longrope gives {len(numbers[2])} factors for {self.rotary_dim // 2} rotated "
                    "pairs; give one short and one long factor per pair"
                )
            if kind == "dynamic" and self.rotary_dim <= 2:
                raise ValueError("--rope-scaling dynamic raises the base by a power r/(r-2): rotate more than 2 dims")
        if self.pos == "rope" and self.rotary_dim % 2:
            raise ValueError(
                f"--pos rope rotates pairs of a head's dimensions: {self.rotary_dim} of them (head width "
                f"{self.d_head} x --rope-fraction {self.rope_fraction}) is odd"
            )
        if not self.rope_base > 1:
            raise ValueError(f"--rope-base must be above 1, got {self.rope_base}")
        if self.rel_distance < 1:
            raise ValueError(f"--rel-distance must be at least 1, got {self.rel_distance}")
        if self.pos_dim and not (self.pos_combine == "concat" and 0 < self.pos_dim < self.dim):
            raise ValueError(
                f"--pos-dim {self.pos_dim} splits the stream's {self.dim} dims between tokens and positions: give "
                f"--pos-combine concat and a width between 1 and {self.dim - 1}"
            )
        if self.pos_dim and self.tie_output:
            raise ValueError(
                "--pos-dim makes the token embedding narrower than the stream, so the output head cannot reuse "
                "it: add --no-tie-output"
            )
        if self.pos_combine == "concat" and self.pos not in ("learned", "sinusoidal"):
            raise ValueError(
                f"--pos-combine concat joins an absolute position code to the tokens; --pos {self.pos} has none "
                "(use learned or sinusoidal)"
            )
        if self.post_ln and (self.parallel_residual or self.sandwich_norm):
            raise ValueError(
                "--post-ln normalises after each residual sum; drop --parallel-residual and --sandwich-norm"
            )
        if self.attn_softcap < 0:
            raise ValueError(f"--attn-softcap must be 0 (off) or positive, got {self.attn_softcap}")
        if self.global_every < 0:
            raise ValueError(f"--global-every must be 0 (every layer windowed) or positive, got {self.global_every}")
        if self.global_every and self.window is None:
            raise ValueError("--global-every alternates windowed and global layers: give the --window too")
        if self.window_from < 0:
            raise ValueError(f"--window-from must be 0 (every layer windowed) or positive, got {self.window_from}")
        if self.window_from and self.window is None:
            raise ValueError("--window-from says which layers are windowed: give the --window too")
        if self.rope_local_base is not None and not self.rope_local_base > 1:
            raise ValueError(f"--rope-local-base must be above 1, got {self.rope_local_base}")
        if self.logit_softcap < 0:
            raise ValueError(f"--logit-softcap must be 0 (off) or positive, got {self.logit_softcap}")
        if self.window is not None and self.window < 1:
            raise ValueError(f"--window must be at least 1 (the tokens each one attends back to), got {self.window}")
        if self.attn_scale is not None and not self.attn_scale > 0:
            raise ValueError(f"--attn-scale must be positive, got {self.attn_scale}")
        if self.rel_heads and self.pos != "relative":
            raise ValueError(
                f"--rel-heads shapes the relative-position tables: it needs --pos relative (got --pos {self.pos})"
            )
        if self.vocab_multiple < 1:
            raise ValueError(f"--vocab-multiple must be at least 1, got {self.vocab_multiple}")

    @property
    def d_head(self) -> int:
        """Each head's width: head_dim, else dim / heads."""
        return self.head_dim or self.dim // self.heads

    def layer_window(self, layer: int) -> int | None:
        """The attention window of block ``layer`` (None: all earlier tokens)."""
        if self.global_every and (layer + 1) % self.global_every == 0 or layer < self.window_from:
            return None
        return self.window

    @property
    def rotary_dim(self) -> int:
        """The dimensions of each head that RoPE rotates."""
        return int(self.d_head * self.rope_fraction)

    @property
    def vocab_rows(self) -> int:
        """Rows of the embedding and output head: vocab_size rounded up to vocab_multiple."""
        return -(-self.vocab_size // self.vocab_multiple) * self.vocab_multiple

    @classmethod
    def from_dict(cls, d: dict, strict: bool = True):
        # a checkpoint written before embed_scale existed never scaled its embeddings
        d = cls.resolve_aliases(d) if isinstance(d, dict) else d
        if isinstance(d, dict) and "embed_scale" not in d:
            d = {**d, "embed_scale": False}
        return super().from_dict(d, strict)


# The modded-nanogpt speedrun's model changes, each a config option (ablated in benchmarks/speedrun.py):
# rotary positions, QK-norm, ReLU², an untied head, logits soft-capped at 15, zero-initialised
# output projections, no biases.
SPEEDRUN_CHANGES = dict(
    pos="rope", activation="relu2", qk_norm=True, tie_output=False, logit_softcap=15.0, zero_init=True, bias=False
)

GPT_PRESETS: dict[str, dict] = {
    # a few seconds per hundred steps on a laptop CPU; for tests and quick looks
    "nano": dict(layers=2, heads=2, dim=64, context=64),
    # nanoGPT's documented CPU run on Tiny Shakespeare
    "shakespeare-cpu": dict(layers=4, heads=4, dim=128, context=64),
    # nanoGPT's CPU model with the speedrun's changes; trained with Muon on a trapezoidal schedule
    # (the recipe's training defaults, recipes/gpt.py)
    "speedrun-cpu": dict(layers=4, heads=4, dim=128, context=64, **SPEEDRUN_CHANGES),
    # nanoGPT's GPU Shakespeare model
    "shakespeare": dict(layers=6, heads=6, dim=384, context=256, dropout=0.2),
    # its speedrun twin: the same shape with the speedrun's changes, and nanoGPT's dropout (1 M
    # characters: without it the model overfits from step ~300; benchmarks/speedrun_gpu.py)
    "speedrun": dict(layers=6, heads=6, dim=384, context=256, **SPEEDRUN_CHANGES, dropout=0.2),
    # GPT-2 small (124M)
    "gpt2": dict(layers=12, heads=12, dim=768, context=1024, vocab_size=50257, activation="gelu_tanh"),
}


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
