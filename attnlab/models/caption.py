"""Image captioning: a CNN (or ViT) turns the image into a grid of features z (h×w cells of D),
and a decoder writes the caption word by word.

* ``arch="rnn"`` — no attention: h₀, c₀ = MLP(mean of z), then an LSTM sees only its own words.
  The whole image must squeeze through h₀ (the bottleneck of the lecture).
* ``arch="rnn-attention"`` — Show, Attend and Tell (Xu et al. 2015), soft attention: at every step

      e_{t,i} = f_att(h_{t-1}, z_i),   a_t = softmax(e_t),   ẑ_t = β_t Σ_i a_{t,i} z_i,
      β_t = σ(f_β(h_{t-1}))                                  (the gating scalar)
      h_t = LSTM([E y_{t-1}; ẑ_t], h_{t-1})
      p(y_t) = softmax(L_o(E y_{t-1} + L_h h_t + L_z ẑ_t))   (the deep output layer)

  trained with the doubly stochastic regulariser λ Σ_i (1 - Σ_t a_{t,i})² (every cell looked at
  about once over the caption).
* ``arch="transformer"`` — the image tokens (with 2-D sin-cos positions) are the memory of a
  GPT-style decoder with cross-attention (:class:`attnlab.blocks.Decoder`).

All three share the decoding interface of the seq2seq models (``encode``, ``start``, ``step``,
``reorder``), so greedy and beam search are :mod:`attnlab.generate.beam`'s.
"""

from __future__ import annotations


import torch
from einops import rearrange
from torch import Tensor, nn

from ..attention import AdditiveAttention, KVCache
from ..blocks import Decoder
from ..hooks import HookedModule, HookPoint
from ..position import LearnedPosition, SinCos2DPosition
from .cnn import CNN, CNNConfig
from .vit import ViT, ViTConfig

__all__ = ["CaptionConfig", "Captioner", "doubly_stochastic_penalty"]

from .configs import ARCHS, IMAGE_VECTORS, ENCODERS, CaptionConfig  # noqa: F401  (declared without torch)


class ImageGrid(nn.Module):
    """Images (B, C, H, W) -> grid features z (B, N = h·w, D) from a CNN or a ViT (mean-pooled
    ViT: no class token, so every token is a patch)."""

    def __init__(self, c: CaptionConfig) -> None:
        super().__init__()
        if c.encoder == "cnn":
            self.net = CNN(CNNConfig(in_chans=c.in_chans, num_classes=0, widths=c.widths, image_size=c.image_size))
            self.dim = c.widths[-1]
        else:
            self.net = ViT(
                ViTConfig(
                    image_size=c.image_size,
                    patch_size=c.patch_size,
                    in_chans=c.in_chans,
                    num_classes=0,
                    dim=c.dim,
                    layers=c.enc_layers,
                    heads=c.heads,
                    pool="mean",
                    pos="sincos",
                    dropout=c.dropout,
                )
            )
            self.dim = c.dim
        self.grid = c.grid

    def forward(self, images: Tensor) -> Tensor:
        if isinstance(self.net, CNN):
            return rearrange(self.net.features(images), "b d h w -> b (h w) d")
        return self.net.tokens(images)


def doubly_stochastic_penalty(alphas: Tensor, step_mask: Tensor) -> Tensor:
    """Σ_i (1 - Σ_t a_{t,i})², averaged over the batch. alphas (B, T, N); step_mask (B, T) is
    True on real caption steps (padding steps do not count)."""
    seen = (alphas * step_mask[..., None]).sum(1)  # (B, N)
    return ((1 - seen) ** 2).sum(-1).mean()


class Captioner(HookedModule):
    """forward(images (B, C, H, W), tgt_in (B, T)) -> logits (B, T, vocab).

    Hook points: ``hook_grid`` (B, N, D_z) the image features z, then for the RNN decoders per
    decoding step (a cache joins the steps along dim 1, or Tq for the attention)
    ``attn.hook_scores`` / ``attn.hook_pattern`` (B, 1, 1, N) the attention a_t over the grid
    (rnn-attention), ``hook_context`` (B, 1, D_z) the gated context β_t ẑ_t, ``hook_dec_hidden``
    (B, 1, dim) h_t; for the Transformer ``hook_memory`` (B, N, dim), ``hook_tgt_embed`` (B, T, dim)
    and ``decoder.blocks.L.*`` (``cross_attn.hook_pattern`` (B, H, T, N) is its attention over the
    grid). The image encoder's own hook points are under ``encoder.net.``."""

    model_type = "captioner"
    config_class = CaptionConfig
    representation_hooks = "hook_grid"  # the successive representations (CKA)
    RENAMED_WEIGHTS = {"out.": "lm_head."}  # the vocabulary projection's name before attnlab 0.2

    def __init__(self, config: CaptionConfig) -> None:
        super().__init__()
        self.config = c = config
        self.encoder = ImageGrid(c)
        d_z = self.encoder.dim
        self.drop = nn.Dropout(c.dropout)
        if c.arch == "transformer":
            self.memory_proj = nn.Linear(d_z, c.dim)
            self.memory_pos = SinCos2DPosition(c.dim, self.encoder.grid)
            self.tok_emb = nn.Embedding(c.vocab_size, c.dim, padding_idx=c.pad_id)
            self.pos_emb = LearnedPosition(c.dim, c.context)
            self.decoder = Decoder(
                c.layers,
                c.dim,
                c.heads,
                mlp_hidden=c.mlp_dim,
                dropout=c.dropout,
                attn_dropout=c.dropout,
                norm_first=True,
            )
            self.lm_head = nn.Linear(c.dim, c.vocab_size, bias=False)
            self.lm_head.weight = self.tok_emb.weight  # tied
        else:
            self.tok_emb = nn.Embedding(c.vocab_size, c.emb_dim, padding_idx=c.pad_id)
            attend = c.arch == "rnn-attention"
            if not c.starts_from_image:  # the image reaches the words only through attention
                self.h0 = nn.Parameter(torch.zeros(2, c.dim))
            else:  # h₀ = f_init(v), v the image vector: mean z (D_z) or the flattened grid (N·D_z)
                d_v = d_z if c.image_vector == "mean" else d_z * self.encoder.grid[0] * self.encoder.grid[1]
                self.init_h = nn.Sequential(nn.Linear(d_v, c.dim), nn.Tanh())
                self.init_c = nn.Sequential(nn.Linear(d_v, c.dim), nn.Tanh())
            self.cell = nn.LSTMCell(c.emb_dim + (d_z if attend else 0), c.dim)
            if attend:
                self.attn = AdditiveAttention(c.dim, d_z, c.attention_dim)
                self.gate = nn.Linear(c.dim, 1)  # f_β
                self.out_z = nn.Linear(d_z, c.emb_dim, bias=False)  # L_z
            self.out_h = nn.Linear(c.dim, c.emb_dim)  # L_h
            self.lm_head = nn.Linear(c.emb_dim, c.vocab_size)  # L_o
        self.hook_grid = HookPoint()
        if c.arch == "transformer":
            self.hook_memory, self.hook_tgt_embed = HookPoint(), HookPoint()
        else:
            self.hook_dec_hidden = HookPoint(step_dim=1)
            if c.arch == "rnn-attention":
                self.hook_context = HookPoint(step_dim=1)

    @property
    def grid(self) -> tuple[int, int]:
        return self.encoder.grid

    # ---- training -----------------------------------------------------------------------------
    def forward(self, images: Tensor, tgt_in: Tensor) -> Tensor:
        state = self.start(self.encode(images), tgt_in.shape[1])
        if self.config.arch == "transformer":
            return self._decode_tokens(tgt_in, state)
        logits = []
        for t in range(tgt_in.shape[1]):  # teacher forcing: the reference word goes in
            lt, state = self._rnn_step(state, tgt_in[:, t])
            logits.append(lt)
        return torch.stack(logits, 1)

    # ---- the decoding interface -----------------------------------------------------------------
    def encode(self, images: Tensor, mask: Tensor | None = None) -> dict:
        """-> state with the grid features z (B, N, D) (``mask`` is unused: every cell is real)."""
        z = self.hook_grid(self.encoder(images))
        if self.config.arch == "transformer":
            return {"memory": self.hook_memory(self.memory_pos(self.memory_proj(z)))}
        return {"z": z}

    def start(self, state: dict, max_len: int) -> dict:
        if self.config.arch == "transformer":
            m = state["memory"]
            caches = [
                blk.self_attn.new_cache(m.shape[0], max_len + 1, device=m.device, dtype=m.dtype)
                for blk in self.decoder.blocks
            ]
            return {**state, "caches": caches, "t": 0}
        z = state["z"]
        if hasattr(self, "h0"):
            h, c = self.h0[:, None].expand(-1, z.shape[0], -1).unbind(0)
        else:
            v = z.mean(1) if self.config.image_vector == "mean" else z.flatten(1)  # (B, D_z) or (B, N·D_z)
            h, c = self.init_h(v), self.init_c(v)
        state = {**state, "h": h, "c": c}
        if self.config.arch == "rnn-attention":
            state["keys"] = self.attn.project_keys(z)  # U z_i once per image
        return state

    def step(self, state: dict, prev: Tensor) -> tuple[Tensor, dict]:
        """prev (B,) last words -> log-probabilities (B, V) of the next, and the new state."""
        if self.config.arch == "transformer":
            logits = self._decode_tokens(prev[:, None], state, state["caches"], offset=state["t"])[:, -1]
            state["t"] += 1
        else:
            logits, state = self._rnn_step(state, prev)
        return logits.float().log_softmax(-1), state

    def reorder(self, state: dict, index: Tensor) -> dict:
        out = {}
        for k, v in state.items():
            if k == "caches":
                for cache in v:
                    cache.reorder(index)
                out[k] = v
            elif torch.is_tensor(v):
                out[k] = v.index_select(0, index)
            else:
                out[k] = v
        return out

    # ---- the two decoders -------------------------------------------------------------------------
    def _rnn_step(self, state: dict, prev: Tensor) -> tuple[Tensor, dict]:
        emb = self.drop(self.tok_emb(prev))  # (B, E)
        h, c = state["h"], state["c"]
        if self.config.arch == "rnn-attention":
            ctx, alpha = self.attn(h[:, None], state["z"], projected=state["keys"])  # (B, 1, D), (B, 1, N)
            ctx = self.hook_context((torch.sigmoid(self.gate(h)) * ctx[:, 0])[:, None])[:, 0]  # β_t ẑ_t
            h, c = self.cell(torch.cat([emb, ctx], -1), (h, c))
            h = self.hook_dec_hidden(h[:, None])[:, 0]
            out = emb + self.out_h(self.drop(h)) + self.out_z(ctx)
            state = {**state, "h": h, "c": c, "alpha": alpha[:, 0]}
        else:
            h, c = self.cell(emb, (h, c))
            h = self.hook_dec_hidden(h[:, None])[:, 0]
            out = emb + self.out_h(self.drop(h))
            state = {**state, "h": h, "c": c}
        return self.lm_head(self.drop(out)), state

    def _decode_tokens(
        self, tokens: Tensor, state: dict, caches: list[KVCache] | None = None, offset: int = 0
    ) -> Tensor:
        if tokens.shape[1] + offset > self.config.context:
            raise ValueError(
                f"a caption of {tokens.shape[1] + offset} tokens is longer than the model's context of "
                f"{self.config.context}"
            )
        x = self.hook_tgt_embed(self.drop(self.pos_emb(self.tok_emb(tokens), offset=offset)))
        key_mask = None if caches is not None else tokens != self.config.pad_id
        x = self.decoder(x, state["memory"], key_mask=key_mask, caches=caches)
        return self.lm_head(x)
