"""RNN encoder–decoder, with and without attention (Cho et al. 2014; Bahdanau et al. 2015; Luong et al. 2015).

Without attention the decoder sees the source only through one vector c (the encoder's final
state), at every step: the bottleneck. With attention it computes a new context at each step,

    e_{t,i} = f_att(s_{t-1}, h_i),   a_t = softmax(e_t),   c_t = Σ_i a_{t,i} h_i,

with f_att additive (Bahdanau) or scaled dot-product (Luong "general"), and the weights a_{t,i}
form the alignment matrix. The next-token distribution is softmax(W_o [s_t; c_t; E y_{t-1}]), or with
``readout`` > 0 Bahdanau's deep output softmax(W_o maxout(W [s_t; c_t; E y_{t-1}])).
"""

from __future__ import annotations


import torch
from torch import Tensor, nn
from torch.nn.utils.rnn import pack_padded_sequence, pad_packed_sequence

from ..attention import AdditiveAttention, DotAttention
from ..hooks import HookedModule, HookPoint

__all__ = ["RNNConfig", "RNNSeq2Seq"]


from .configs import RNNConfig  # noqa: F401  (declared without torch)


class RNNSeq2Seq(HookedModule):
    """forward(src (B, S), tgt_in (B, T), src_mask) -> logits (B, T, tgt_vocab).

    Hook points: ``hook_src_embed`` (B, S, E), ``hook_memory`` (B, S, enc_dim) the encoder states
    h_i, ``hook_summary`` (B, enc_dim) the final state (the bottleneck), and per decoding step
    (a cache joins the steps along dim 1, or Tq for the attention): ``attn.hook_scores`` /
    ``attn.hook_pattern`` (B, 1, 1, S) the alignment a_t, ``hook_context`` (B, 1, enc_dim) c_t,
    ``hook_dec_hidden`` (B, 1, dim) s_t.

    ``teacher_forcing`` < 1 feeds the model's own greedy prediction instead of the reference
    token with probability 1 - teacher_forcing at each step (training only)."""

    model_type = "rnn"
    config_class = RNNConfig
    representation_hooks = "hook_memory"  # the successive representations (CKA)

    def __init__(self, config: RNNConfig) -> None:
        super().__init__()
        self.config = c = config
        rnn = nn.GRU if c.cell == "gru" else nn.LSTM
        self.src_emb = nn.Embedding(c.src_vocab, c.emb_dim, padding_idx=c.pad_id)
        self.tgt_emb = nn.Embedding(c.tgt_vocab, c.emb_dim, padding_idx=c.pad_id)
        self.encoder = rnn(
            c.emb_dim,
            c.dim,
            c.layers,
            batch_first=True,
            bidirectional=c.bidirectional,
            dropout=c.dropout if c.layers > 1 else 0.0,
        )
        enc_dim = c.dim * (2 if c.bidirectional else 1)
        self.bridge = nn.Linear(enc_dim, c.dim * c.layers)  # final encoder state -> initial decoder state
        self.decoder = rnn(
            c.emb_dim + enc_dim, c.dim, c.layers, batch_first=True, dropout=c.dropout if c.layers > 1 else 0.0
        )
        if c.attention == "additive":
            self.attn = AdditiveAttention(c.dim, enc_dim, c.dim)
        elif c.attention == "dot":
            self.attn = DotAttention(c.dim, enc_dim)  # Luong "general": s W h
        self.drop = nn.Dropout(c.dropout)
        n_features = c.dim + enc_dim + c.emb_dim  # [s_t; c_t; E y_{t-1}]
        if c.readout > 0:  # t = maxout(W [s; c; E y]) of width `readout`, then the vocabulary
            self.readout = nn.Linear(n_features, 2 * c.readout)
        self.lm_head = nn.Linear(c.readout or n_features, c.tgt_vocab)
        self.teacher_forcing = 1.0
        self.hook_src_embed, self.hook_memory, self.hook_summary = HookPoint(), HookPoint(), HookPoint()
        self.hook_context, self.hook_dec_hidden = HookPoint(step_dim=1), HookPoint(step_dim=1)

    # checkpoints written before attnlab 0.2 held Luong's W as a bare linear layer, the vocabulary
    # projection as `out`
    RENAMED_WEIGHTS = {"attn_query.weight": "attn.w_query.weight", "out.": "lm_head."}

    # ---- encoder ----------------------------------------------------------------------------
    def encode(self, src: Tensor, src_mask: Tensor | None = None) -> dict:
        c = self.config
        if src_mask is None:
            src_mask = src != self.config.pad_id
        lengths = src_mask.sum(1).clamp(min=1).cpu()
        packed = pack_padded_sequence(
            self.hook_src_embed(self.drop(self.src_emb(src))), lengths, batch_first=True, enforce_sorted=False
        )
        out, h = self.encoder(packed)
        h_enc, _ = pad_packed_sequence(out, batch_first=True, total_length=src.shape[1])  # (B, S, enc_dim)
        h_enc = self.hook_memory(h_enc)
        h_last = h[0] if c.cell == "lstm" else h  # (layers*dirs, B, hidden)
        h_last = h_last.view(c.layers, 2 if c.bidirectional else 1, src.shape[0], c.dim)[-1]  # top layer
        summary = self.hook_summary(torch.cat(list(h_last), dim=-1))  # (B, enc_dim): forward and backward final states
        s0 = torch.tanh(self.bridge(summary)).view(src.shape[0], c.layers, c.dim).transpose(0, 1).contiguous()
        state = {
            "keys": h_enc,
            "mask": src_mask,
            "summary": summary,
            "hidden": (s0, torch.zeros_like(s0)) if c.cell == "lstm" else s0,
        }
        if c.attention == "additive":
            state["projected"] = self.attn.project_keys(h_enc)
        return state

    # ---- one decoder step -------------------------------------------------------------------
    def _context(self, state: dict) -> tuple[Tensor, Tensor | None]:
        """c_t from s_{t-1}: (B, enc_dim) and the weights (B, S)."""
        c = self.config
        if c.attention == "none":
            return state["summary"], None  # the same vector at every step: the bottleneck
        h = state["hidden"][0] if c.cell == "lstm" else state["hidden"]
        s_prev = h[-1][:, None]  # (B, 1, hidden), top layer
        if c.attention == "additive":
            ctx, w = self.attn(s_prev, state["keys"], state["mask"], projected=state["projected"])
        else:
            ctx, w = self.attn(s_prev, state["keys"], state["mask"])
        return ctx[:, 0], w[:, 0]

    def _features(self, state: dict, prev: Tensor) -> tuple[Tensor, Tensor | None]:
        """One recurrence step: [s_t; c_t; E y_{t-1}] (B, n_features) and the attention weights."""
        emb = self.drop(self.tgt_emb(prev))  # (B, E)
        ctx, w = self._context(state)
        ctx = self.hook_context(ctx[:, None])[:, 0]
        out, state["hidden"] = self.decoder(torch.cat([emb, ctx], -1)[:, None], state["hidden"])
        out = self.hook_dec_hidden(out)  # (B, 1, dim)
        return torch.cat([out[:, 0], ctx, emb], -1), w

    def _logits(self, features: Tensor) -> Tensor:
        """(..., n_features) -> (..., tgt_vocab)."""
        x = self.drop(features)
        if self.config.readout > 0:
            x = self.readout(x).unflatten(-1, (-1, 2)).amax(-1)  # maxout over pairs of units
        return self.lm_head(x)

    def _step(self, state: dict, prev: Tensor) -> tuple[Tensor, Tensor | None]:
        features, w = self._features(state, prev)
        return self._logits(features), w

    def forward(self, src: Tensor, tgt_in: Tensor, src_mask: Tensor | None = None) -> Tensor:
        state = self.encode(src, src_mask)
        own_predictions = self.training and self.teacher_forcing < 1.0
        features, logits = [], []
        prev = tgt_in[:, 0]
        for t in range(tgt_in.shape[1]):
            f, _ = self._features(state, prev)
            if own_predictions:  # the next input may be the model's own guess: logits needed now
                logits.append(self._logits(f))
            else:
                features.append(f)
            if t + 1 < tgt_in.shape[1]:
                prev = tgt_in[:, t + 1]
                if own_predictions:
                    use_own = torch.rand(prev.shape[0], device=prev.device) >= self.teacher_forcing
                    prev = torch.where(use_own, logits[-1].argmax(-1), prev)
        # with the inputs known, the readout (the largest matmul) runs once for all steps
        return torch.stack(logits, 1) if own_predictions else self._logits(torch.stack(features, 1))

    # ---- incremental decoding interface -----------------------------------------------------
    def start(self, state: dict, max_len: int) -> dict:
        return state

    def step(self, state: dict, prev: Tensor) -> tuple[Tensor, dict]:
        logits, w = self._step(state, prev)
        state["weights"] = w
        return logits.float().log_softmax(-1), state

    def reorder(self, state: dict, index: Tensor) -> dict:
        new = {}
        for k, v in state.items():
            if k == "hidden":
                new[k] = (
                    tuple(x.index_select(1, index) for x in v) if isinstance(v, tuple) else v.index_select(1, index)
                )
            elif torch.is_tensor(v):
                new[k] = v.index_select(0, index)
            else:
                new[k] = v
        return new
