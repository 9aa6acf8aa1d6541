"""The encoder–decoder Transformer (Vaswani et al. 2017), assembled from the shared blocks.

    memory = Encoder(E_src[src]·√d + PE)                  self-attention, padding masked
    h = Decoder(E_tgt[tgt_in]·√d + PE, memory)            masked self-attention + cross-attention
    logits = h E_tgtᵀ (tied) or W h

Every sequence-to-sequence model here (this and :class:`attnlab.models.RNNSeq2Seq`) offers the
same decoding interface used by greedy and beam search: ``encode``, ``start``, ``step``,
``reorder``.
"""

from __future__ import annotations

import math

from torch import Tensor, nn

from ..hooks import HookedModule, HookPoint
from ..blocks import Decoder, Encoder
from ..position import LearnedPosition, RelativePosition, SinusoidalPosition

__all__ = ["TransformerConfig", "Transformer"]


from .configs import TransformerConfig  # noqa: F401  (declared without torch)


class Transformer(HookedModule):
    """forward(src (B, S), tgt_in (B, T), src_mask (B, S) True = token) -> logits (B, T, tgt_vocab).

    Hook points: ``hook_src_embed`` (B, S, D) and ``hook_tgt_embed`` (B, T, D) the streams
    entering the encoder and the decoder, ``encoder.blocks.L.*`` and ``decoder.blocks.L.*``
    (:mod:`attnlab.blocks`; ``decoder.blocks.L.cross_attn.hook_pattern`` is the alignment),
    ``encoder.hook_final`` (the memory) and ``decoder.hook_final``."""

    model_type = "transformer"
    config_class = TransformerConfig
    representation_hooks = "encoder.blocks.*.hook_resid_post"  # the successive representations (CKA)

    def __init__(self, config: TransformerConfig) -> None:
        super().__init__()
        self.config = c = config
        self.src_emb = nn.Embedding(c.src_vocab, c.dim, padding_idx=c.pad_id)
        self.tgt_emb = self.src_emb if c.share_embeddings else nn.Embedding(c.tgt_vocab, c.dim, padding_idx=c.pad_id)
        pos_cls = {"sinusoidal": SinusoidalPosition, "learned": LearnedPosition}.get(c.pos)
        self.src_pos = pos_cls(c.dim, c.context) if pos_cls else None
        self.tgt_pos = pos_cls(c.dim, c.context) if pos_cls else None
        # relative: Shaw's tables in the encoder's and the decoder's self-attention (one set for each
        # stack, shared by its layers); cross-attention compares positions of two sentences, so none
        relative = c.pos == "relative"
        self.src_rel = RelativePosition(c.dim // c.heads, c.rel_distance) if relative else None
        self.tgt_rel = RelativePosition(c.dim // c.heads, c.rel_distance) if relative else None
        self.drop = nn.Dropout(c.dropout)
        kw = dict(
            mlp_hidden=c.mlp_dim,
            activation=c.activation,
            dropout=c.dropout,
            attn_dropout=c.dropout,
            norm_first=c.norm_first,
        )
        self.encoder = Encoder(c.enc_layers, c.dim, c.heads, position_bias=self.src_rel, **kw)
        self.decoder = Decoder(c.dec_layers, c.dim, c.heads, position_bias=self.tgt_rel, **kw)
        self.lm_head = nn.Linear(c.dim, c.tgt_vocab, bias=False)
        self.hook_src_embed, self.hook_tgt_embed = HookPoint(), HookPoint()
        self._init()
        if c.tie_output:
            self.lm_head.weight = self.tgt_emb.weight

    # checkpoints written before attnlab 0.2 held the decoder stack as separate modules
    RENAMED_WEIGHTS = {"decoder_blocks.": "decoder.blocks.", "decoder_norm.": "decoder.ln_f.", "out.": "lm_head."}

    def _init(self) -> None:
        for p in self.parameters():
            if p.dim() > 1:
                nn.init.xavier_uniform_(p)
        nn.init.normal_(self.src_emb.weight, 0, self.config.dim**-0.5)
        if self.tgt_emb is not self.src_emb:
            nn.init.normal_(self.tgt_emb.weight, 0, self.config.dim**-0.5)

    def _embed(self, emb: nn.Embedding, pos, ids: Tensor, offset: int = 0) -> Tensor:
        if ids.shape[1] + offset > self.config.context:
            raise ValueError(
                f"sequence of {ids.shape[1] + offset} tokens is longer than the model's context of "
                f"{self.config.context}"
            )
        x = emb(ids) * math.sqrt(self.config.dim)
        return self.drop(pos(x, offset=offset) if pos is not None else x)

    # ---- training -------------------------------------------------------------------------
    def encode(self, src: Tensor, src_mask: Tensor | None = None) -> dict:
        """-> decoding state: memory (B, S, D) and its mask."""
        if src_mask is None:
            src_mask = src != self.config.pad_id
        memory = self.encoder(self.hook_src_embed(self._embed(self.src_emb, self.src_pos, src)), key_mask=src_mask)
        return {"memory": memory, "memory_mask": src_mask}

    def decode(self, tgt_in: Tensor, state: dict, caches=None, offset: int = 0) -> Tensor:
        x = self.hook_tgt_embed(self._embed(self.tgt_emb, self.tgt_pos, tgt_in, offset))
        key_mask = None if caches is not None else (tgt_in != self.config.pad_id)
        x = self.decoder(x, state["memory"], key_mask=key_mask, memory_mask=state["memory_mask"], caches=caches)
        return self.lm_head(x)

    def forward(self, src: Tensor, tgt_in: Tensor, src_mask: Tensor | None = None) -> Tensor:
        return self.decode(tgt_in, self.encode(src, src_mask))

    # ---- incremental decoding ---------------------------------------------------------------
    def start(self, state: dict, max_len: int) -> dict:
        b = state["memory"].shape[0]
        dev, dt = state["memory"].device, state["memory"].dtype
        caches = [blk.self_attn.new_cache(b, max_len + 1, device=dev, dtype=dt) for blk in self.decoder.blocks]
        return {**state, "caches": caches, "t": 0}

    def step(self, state: dict, prev: Tensor) -> tuple[Tensor, dict]:
        """prev (B,) last tokens -> log-probabilities (B, V) of the next, and the new state."""
        logits = self.decode(prev[:, None], state, state["caches"], offset=state["t"])[:, -1]
        state["t"] += 1
        return logits.float().log_softmax(-1), state

    def reorder(self, state: dict, index: Tensor) -> dict:
        for c in state["caches"]:
            c.reorder(index)
        return {
            **state,
            "memory": state["memory"].index_select(0, index),
            "memory_mask": state["memory_mask"].index_select(0, index),
        }
