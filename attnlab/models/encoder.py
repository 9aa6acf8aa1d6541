"""A BERT-style text encoder (Devlin et al. 2019), assembled from the shared blocks.

    x_0 = LN(E_tok[ids] + P[positions] + E_seg[segments])    token + learned position + segment
    x_l = Block_l(x_{l-1}, padding masked)                   post-LN blocks as BERT (pre-LN optional)
    pooled = tanh(W_p x_L[CLS])                              the pooler, for sentence-level heads

Heads: masked-LM (a dense + GELU + LayerNorm transform, then the token embedding Eᵀ tied, plus a
bias), sequence classification (a linear layer on the pooled [CLS]) and token classification
(``per_token``: the same linear layer on every token's last hidden state, as HuggingFace's
``BertForTokenClassification``). Calling the model with
``input_ids`` and ``attention_mask`` returns the last hidden states (B, T, D), as HuggingFace's
``BertModel(...).last_hidden_state``.
"""

from __future__ import annotations


import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ..blocks import Encoder, HeadWeights, LayerNorm
from ..errors import OptionError
from ..hooks import HookedModule, HookPoint
from ..position import LearnedPosition, RelativePosition

__all__ = ["TextEncoderConfig", "TextEncoder", "ENCODER_PRESETS", "mean_pool"]


from .configs import TextEncoderConfig, ENCODER_PRESETS  # noqa: F401  (declared without torch)


def mean_pool(hidden: Tensor, mask: Tensor) -> Tensor:
    """Mean of the hidden states (B, T, D) over the real tokens (mask (B, T) True/1), as
    sentence-transformers pools: (B, D)."""
    m = mask.to(hidden.dtype)[..., None]
    return (hidden * m).sum(1) / m.sum(1).clamp_min(1e-9)


class MaskedLMHead(nn.Module):
    """BERT's prediction head: dense -> GELU -> LayerNorm -> (tied) vocabulary projection + bias."""

    def __init__(self, c: TextEncoderConfig, embedding: nn.Embedding) -> None:
        super().__init__()
        self.dense = nn.Linear(c.dim, c.dim)
        self.norm = LayerNorm(c.dim, eps=c.norm_eps)
        self.decoder = nn.Linear(c.dim, c.vocab_size, bias=False)
        self.decoder.weight = embedding.weight
        self.bias = nn.Parameter(torch.zeros(c.vocab_size))

    def forward(self, hidden: Tensor) -> Tensor:
        return self.decoder(self.norm(F.gelu(self.dense(hidden)))) + self.bias


class TextEncoder(HeadWeights, HookedModule):
    """forward(input_ids (B, T), attention_mask (B, T) 1 = token, token_type_ids) -> (B, T, D).

    Hook points: ``hook_embed`` (B, T, D) the normalised embeddings entering block 0,
    ``encoder.blocks.L.*`` (:mod:`attnlab.blocks`), ``encoder.hook_final`` (B, T, D) the last
    hidden states, ``hook_pooled`` (B, D) the pooler's output."""

    model_type = "text-encoder"
    config_class = TextEncoderConfig
    representation_hooks = "encoder.blocks.*.hook_resid_post"  # the successive representations (CKA)
    RENAMED_WEIGHTS = {"classifier.": "head."}  # the classification head's name before attnlab 0.2

    def __init__(self, config: TextEncoderConfig) -> None:
        super().__init__()
        self.config = c = config
        self.tok_emb = nn.Embedding(c.vocab_size, c.dim, padding_idx=c.pad_id)
        self.pos = LearnedPosition(c.dim, c.context) if c.pos == "learned" else None
        # relative: Shaw's tables inside attention, one set shared by every layer (as T5 shares them)
        self.rel_pos = RelativePosition(c.dim // c.heads, c.rel_distance) if c.pos == "relative" else None
        self.seg_emb = nn.Embedding(c.type_vocab_size, c.dim)
        self.emb_norm = LayerNorm(c.dim, eps=c.norm_eps)
        self.drop = nn.Dropout(c.dropout)
        self.encoder = Encoder(
            c.layers,
            c.dim,
            c.heads,
            mlp_hidden=c.mlp_dim,
            activation="gelu",
            dropout=c.dropout,
            attn_dropout=c.dropout,
            norm_first=c.norm_first,
            norm_eps=c.norm_eps,
            window=c.window,
            position_bias=self.rel_pos,
        )
        self.pooler = nn.Linear(c.dim, c.dim)
        self.hook_embed, self.hook_pooled = HookPoint(), HookPoint()
        self.mlm = MaskedLMHead(c, self.tok_emb) if c.mlm_head else None
        self.head = nn.Linear(c.dim, c.num_classes) if c.num_classes > 0 else None
        self.apply(self._init)
        if self.mlm is not None:
            self.mlm.decoder.weight = self.tok_emb.weight

    @staticmethod
    def _init(m: nn.Module) -> None:
        """BERT's initialisation: N(0, 0.02) weights, zero biases, LayerNorm = identity."""
        if isinstance(m, (nn.Linear, nn.Embedding)):
            nn.init.normal_(m.weight, 0.0, 0.02)
            if isinstance(m, nn.Linear) and m.bias is not None:
                nn.init.zeros_(m.bias)
        elif isinstance(m, LearnedPosition):
            nn.init.normal_(m.weight, 0.0, 0.02)

    def no_weight_decay(self) -> set[str]:
        return {"pos.weight"} if self.pos is not None else set()

    def attention_blocks(self) -> list:
        """The encoder's blocks: what ``W_Q`` … ``b_O`` stack (:class:`attnlab.blocks.HeadWeights`)."""
        return list(self.encoder.blocks)

    def forward(
        self,
        input_ids: Tensor,
        attention_mask: Tensor | None = None,
        token_type_ids: Tensor | None = None,
        *,
        head: str | None = None,
        select: Tensor | None = None,
    ) -> Tensor:
        """input_ids (B, T) -> the last hidden states (B, T, D); padding (attention_mask 0) is
        never attended to. ``head="mlm"`` returns masked-LM logits instead ((B, T, V), or (N, V)
        at the N positions where ``select`` (B, T) is True: the vocabulary projection is the
        costly part, and pretraining needs it at the masked positions only); ``head="classify"``
        returns class logits (B, num_classes); ``head="tag"`` (a ``per_token`` model) returns a
        class per token (B, T, num_classes)."""
        if input_ids.dim() != 2:
            raise OptionError(f"TextEncoder expects token ids (B, T), got {tuple(input_ids.shape)}")
        if input_ids.shape[1] > self.config.context:
            raise ValueError(
                f"{input_ids.shape[1]} tokens are more than the model's context of "
                f"{self.config.context}; truncate the input"
            )
        if attention_mask is None:
            attention_mask = input_ids != self.config.pad_id
        if token_type_ids is None:
            token_type_ids = torch.zeros_like(input_ids)
        x = self.tok_emb(input_ids)
        if self.pos is not None:
            x = self.pos(x)
        x = x + self.seg_emb(token_type_ids)
        x = self.hook_embed(self.drop(self.emb_norm(x)))
        hidden = self.encoder(x, key_mask=attention_mask.bool())
        if head is None:
            return hidden
        if head == "mlm":
            if self.mlm is None:
                raise ValueError("this encoder has no masked-LM head (mlm_head=False)")
            return self.mlm(hidden[select] if select is not None else hidden)
        if head in ("classify", "tag"):
            per_token = head == "tag"
            if self.head is None or self.config.per_token != per_token:
                raise ValueError(
                    f"this encoder has no {'token' if per_token else 'text'} classification head; fine-tune it "
                    f"with `attnlab train encoder --task {head}`"
                )
            return self.head(self.drop(hidden if per_token else self.pooled(hidden)))
        raise ValueError(f"head must be None, 'mlm', 'classify' or 'tag', got {head!r}")

    def pooled(self, hidden: Tensor) -> Tensor:
        """The pooler: tanh(W h_[CLS]) (B, D)."""
        return self.hook_pooled(torch.tanh(self.pooler(hidden[:, 0])))

    def mlm_logits(
        self, input_ids: Tensor, attention_mask: Tensor | None = None, token_type_ids: Tensor | None = None
    ) -> Tensor:
        """Masked-LM logits (B, T, vocab_size)."""
        return self(input_ids, attention_mask, token_type_ids, head="mlm")

    def classify(
        self, input_ids: Tensor, attention_mask: Tensor | None = None, token_type_ids: Tensor | None = None
    ) -> Tensor:
        """Class logits (B, num_classes) from the pooled [CLS]."""
        return self(input_ids, attention_mask, token_type_ids, head="classify")

    def tag(
        self, input_ids: Tensor, attention_mask: Tensor | None = None, token_type_ids: Tensor | None = None
    ) -> Tensor:
        """Tag logits (B, T, num_classes), one row per token (a ``per_token`` model)."""
        return self(input_ids, attention_mask, token_type_ids, head="tag")

    def embed(self, input_ids: Tensor, attention_mask: Tensor | None = None) -> Tensor:
        """Sentence embeddings (B, D): mean of the last hidden states over the real tokens."""
        if attention_mask is None:
            attention_mask = input_ids != self.config.pad_id
        return mean_pool(self(input_ids, attention_mask), attention_mask)
