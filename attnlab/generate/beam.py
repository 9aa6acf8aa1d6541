"""Greedy and beam-search decoding for sequence-to-sequence models.

Works with any model offering ``encode(src, src_mask) -> state``, ``start(state, max_len)``,
``step(state, prev (B,)) -> (log-probs (B, V), state)`` and ``reorder(state, index)``.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor, nn


@dataclass
class Hypothesis:
    tokens: list[int]  # without <bos> and <eos>
    score: float  # length-normalised log-probability used for ranking
    logprob: float  # raw sum of log-probabilities


def length_penalty(length: int, alpha: float) -> float:
    """GNMT (Wu et al. 2016): ((5 + |Y|) / 6)^α; α = 0 ranks by the raw log-probability."""
    return ((5 + length) / 6) ** alpha


def special_ids(model: nn.Module, bos_id: int | None, eos_id: int | None) -> tuple[int, int]:
    """``bos_id`` and ``eos_id``, each defaulting to the model's config."""
    return (model.config.bos_id if bos_id is None else bos_id), (model.config.eos_id if eos_id is None else eos_id)


@torch.no_grad()
def greedy_decode(
    model: nn.Module,
    src: Tensor,
    src_mask: Tensor | None = None,
    *,
    max_len: int = 100,
    bos_id: int | None = None,
    eos_id: int | None = None,
) -> list[list[int]]:
    """The most likely next token at each step, from ``bos_id`` until ``eos_id`` (both default to the
    model's own, ``model.config``); one token list per source, without <bos> and <eos>."""
    model.eval()
    bos_id, eos_id = special_ids(model, bos_id, eos_id)
    state = model.start(model.encode(src, src_mask), max_len)
    prev = torch.full((src.shape[0],), bos_id, dtype=torch.long, device=src.device)
    out = [[] for _ in range(src.shape[0])]
    done = torch.zeros(src.shape[0], dtype=torch.bool, device=src.device)
    for _ in range(max_len):
        logp, state = model.step(state, prev)
        prev = logp.argmax(-1)
        for i, (tok, d) in enumerate(zip(prev.tolist(), done.tolist())):
            if not d and tok != eos_id:
                out[i].append(tok)
        done |= prev == eos_id
        if bool(done.all()):
            break
    return out


@torch.no_grad()
def beam_search(
    model: nn.Module,
    src: Tensor,
    src_mask: Tensor | None = None,
    *,
    beam: int = 5,
    max_len: int = 100,
    alpha: float = 1.0,
    bos_id: int | None = None,
    eos_id: int | None = None,
    n_best: int | None = None,
) -> list[list[Hypothesis]]:
    """Batched beam search. Each sentence keeps ``beam`` live hypotheses; one that emits <eos>
    among the top ``beam`` candidates is finished. A sentence is done when it has ``beam``
    finished hypotheses; at ``max_len`` the live ones are finished as they are (no crash when
    no beam ever ends). Returns, per sentence, hypotheses sorted best first."""
    bos_id, eos_id = special_ids(model, bos_id, eos_id)
    if beam < 1:
        raise ValueError(f"beam size must be >= 1, got {beam}")
    model.eval()
    b, k = src.shape[0], beam
    state = model.start(model.encode(src, src_mask), max_len)
    state = model.reorder(state, torch.arange(b, device=src.device).repeat_interleave(k))
    scores = torch.full((b, k), float("-inf"), device=src.device)
    scores[:, 0] = 0.0  # all beams start identical: keep one
    tokens = torch.zeros(b * k, 0, dtype=torch.long, device=src.device)
    prev = torch.full((b * k,), bos_id, dtype=torch.long, device=src.device)
    finished: list[list[Hypothesis]] = [[] for _ in range(b)]
    done = [False] * b
    for t in range(max_len):
        logp, state = model.step(state, prev)  # (B*K, V)
        v = logp.shape[-1]
        cand = (scores.view(-1, 1) + logp).view(b, k * v)
        top_scores, top_idx = cand.topk(min(2 * k, k * v), dim=-1)  # 2K so K stay alive after <eos>
        beam_idx, tok_idx = top_idx // v, top_idx % v
        new_scores = torch.full((b, k), float("-inf"), device=src.device)
        new_origin = torch.zeros(b, k, dtype=torch.long, device=src.device)
        new_tok = torch.full((b, k), eos_id, dtype=torch.long, device=src.device)
        for i in range(b):
            if done[i]:
                continue
            alive = 0
            for rank in range(top_idx.shape[1]):
                s, bi, tok = top_scores[i, rank].item(), beam_idx[i, rank].item(), tok_idx[i, rank].item()
                if s == float("-inf"):
                    break
                if tok == eos_id:
                    if rank < k:
                        seq = tokens[i * k + bi].tolist()
                        finished[i].append(Hypothesis(seq, s / length_penalty(len(seq) + 1, alpha), s))
                    continue
                if alive < k:
                    new_scores[i, alive], new_origin[i, alive], new_tok[i, alive] = s, bi, tok
                    alive += 1
            if len(finished[i]) >= k or alive == 0:
                done[i] = True
        if all(done):
            break
        origin = (torch.arange(b, device=src.device)[:, None] * k + new_origin).view(-1)
        tokens = torch.cat([tokens.index_select(0, origin), new_tok.view(-1, 1)], dim=1)
        state = model.reorder(state, origin)
        scores, prev = new_scores, new_tok.view(-1)
    for i in range(b):  # max_len reached: finish what is still alive
        if not done[i]:
            for j in range(k):
                s = scores[i, j].item()
                if s > float("-inf"):
                    seq = tokens[i * k + j].tolist()
                    finished[i].append(Hypothesis(seq, s / length_penalty(len(seq), alpha), s))
    return [sorted(f, key=lambda h: h.score, reverse=True)[: n_best or k] for f in finished]


def decode(
    model: nn.Module,
    src: Tensor,
    src_mask: Tensor | None = None,
    *,
    beam: int = 1,
    max_len: int = 100,
    alpha: float = 1.0,
) -> list[list[int]]:
    """One token list per source, without <bos> and <eos>: :func:`greedy_decode` for ``beam`` 1,
    else the best hypothesis of :func:`beam_search` (what `translate`, `caption` and `eval` print)."""
    if beam <= 1:
        return greedy_decode(model, src, src_mask, max_len=max_len)
    return [h[0].tokens for h in beam_search(model, src, src_mask, beam=beam, max_len=max_len, alpha=alpha)]
