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

from dataclasses import dataclass

import torch
from einops import rearrange
from torch import Tensor, nn

from ..attention import AdditiveAttention, KVCache
from ..blocks import Decoder
from ..config import Config, SpecialTokens
from ..hooks import HookedModule, HookPoint
from ..position import LearnedPosition, SinCos2DPosition
from .cnn import CNN, CNNConfig
from .vit import ViT, ViTConfig

__all__ = ["CaptionConfig", "Captioner", "doubly_stochastic_penalty"]

ARCHS = ("rnn", "rnn-attention", "transformer")
IMAGE_VECTORS = ("mean", "flatten")
ENCODERS = ("cnn", "vit")


@dataclass
class CaptionConfig(SpecialTokens, Config):
    vocab_size: int = 64
    arch: str = "rnn-attention"  # rnn | rnn-attention | transformer
    encoder: str = "cnn"  # cnn | vit
    image_size: int = 40
    in_chans: int = 3
    widths: tuple = (16, 32, 64)  # CNN encoder stages: a 40-pixel image gives a 10×10 grid
    patch_size: int = 4  # ViT encoder: 4-pixel patches, a 10×10 grid at 40 pixels
    enc_layers: int = 2  # ViT encoder depth
    dim: int = 256  # the decoder's width (LSTM state, or Transformer model width)
    emb_dim: int = 128  # RNN decoders: word embedding width
    attention_dim: int = 128  # rnn-attention: width of the additive attention
    layers: int = 2  # Transformer decoder blocks
    heads: int = 4
    mlp_dim: int = 512
    context: int = 32  # the longest caption, in tokens with <bos>
    dropout: float = 0.1
    alpha_c: float = 1.0  # λ of the doubly stochastic attention regulariser (rnn-attention)
    # rnn-attention: h₀, c₀ = MLP(mean z) as in the paper, or (default) a learned start, so that the
    # image reaches the words only through attention (on scenes: 99.6 % exact captions and attention
    # on the object being described, against 95 % and mostly misplaced attention with the paper's)
    init_from_image: bool = False
    # the one vector the LSTM starts from (rnn; rnn-attention with init_from_image): the grid's mean, a
    # bag of features that keeps what is there but not where, or a learned map of the whole flattened
    # grid, as a CNN's last fully connected layer gives Show and Tell its image vector (it keeps the layout)
    image_vector: str = "mean"

    SIZES = (
        "vocab_size",
        "image_size",
        "in_chans",
        "patch_size",
        "enc_layers",
        "dim",
        "emb_dim",
        "attention_dim",
        "layers",
        "heads",
        "mlp_dim",
        "context",
    )
    CHOICES = {"arch": ARCHS, "encoder": ENCODERS, "image_vector": IMAGE_VECTORS}
    HELP = {
        "arch": "the decoder: rnn (an LSTM that sees the image once, no attention), rnn-attention (Show, Attend "
        "and Tell's soft attention) or transformer",
        "encoder": "the image encoder: a small CNN or a ViT, each giving a grid of feature vectors",
        "enc_layers": "--encoder vit: encoder blocks",
        "dim": "the decoder's width (the LSTM's state, or the Transformer's model width)",
        "emb_dim": "RNN decoders: word embedding width",
        "attention_dim": "rnn-attention: width of the additive attention's hidden layer",
        "layers": "--arch transformer: decoder blocks",
        "heads": "--arch transformer or --encoder vit: attention heads per layer",
        "mlp_dim": "--arch transformer or --encoder vit: hidden width of each block's MLP",
        "context": "the longest caption in tokens, <bos> included",
        "alpha_c": "rnn-attention: λ of the doubly stochastic attention regulariser (each pixel attended about "
        "once over the caption)",
        "init_from_image": "rnn-attention: start the LSTM from the mean image feature, as in the paper, instead "
        "of a learned start (then the image reaches the words only through attention)",
        "image_vector": "--arch rnn (or rnn-attention with --init-from-image): the one vector the LSTM starts "
        "from: mean (the grid's mean feature: what is there, not where) or flatten (a learned map of the whole "
        "grid, as a CNN's last layer: where things are too)",
    }

    def __post_init__(self) -> None:
        super().__post_init__()
        self.widths = tuple(self.widths)
        if self.encoder == "vit" and self.image_size % self.patch_size:
            raise ValueError(f"image_size {self.image_size} is not divisible by patch_size {self.patch_size}")
        if self.arch == "transformer" and self.dim % self.heads:
            raise ValueError(f"dim={self.dim} is not divisible by heads={self.heads}")
        if self.alpha_c < 0:
            raise ValueError(f"alpha_c must be 0 or more, got {self.alpha_c}")
        if self.image_vector != "mean" and not self.starts_from_image:
            raise ValueError(
                f"image_vector={self.image_vector!r} applies to arch rnn, or rnn-attention with init_from_image: "
                f"this {self.arch} decoder never starts from an image vector"
            )

    @property
    def starts_from_image(self) -> bool:
        """Whether the decoder starts from one image vector (h₀, c₀ = f(that vector)): the RNNs but
        rnn-attention's default, whose image reaches the words only through attention."""
        return self.arch == "rnn" or (self.arch == "rnn-attention" and self.init_from_image)

    @property
    def grid(self) -> tuple[int, int]:
        """(h, w) of the image grid the decoder attends over."""
        if self.encoder == "vit":
            g = self.image_size // self.patch_size
            return g, g
        return CNNConfig(widths=self.widths, image_size=self.image_size).grid


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
