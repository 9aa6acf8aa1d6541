"""Autoregressive sampling: x_{t+1} ~ softmax(f(x_1..x_t) / temperature), one token at a time.

With the KV cache each step feeds only the newest token: the keys and values of the
earlier ones are kept, so a step costs O(T) instead of re-running the whole prefix.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch
from torch import Tensor, nn

from ..position import long_rope_from, rotation_changes_from

__all__ = [
    "sample_next",
    "draw",
    "next_token_probs",
    "generate",
    "generate_text",
    "speculative_generate",
    "cut_at_stop",
    "default_prompt",
    "end_ids",
    "token_logprobs",
]


def end_ids(eos_id: int | Sequence[int] | None) -> tuple[int, ...]:
    """The end-of-sequence ids a generation stops at: none, one id, or several (an instruct model
    may end a turn with either of two tokens, as Llama 3's <|eot_id|> and <|end_of_text|>)."""
    if eos_id is None:
        return ()
    ids = (eos_id,) if isinstance(eos_id, int) else tuple(eos_id)
    if any(isinstance(i, bool) or not isinstance(i, int) for i in ids):
        raise ValueError(f"eos_id must be a token id or a list of them, got {eos_id!r}")
    return ids


def sample_next(
    logits: Tensor,
    *,
    temperature: float = 1.0,
    top_k: int | None = None,
    top_p: float | None = None,
    generator: torch.Generator | None = None,
) -> Tensor:
    """logits (B, V) -> next ids (B,). Temperature 0 means greedy (argmax)."""
    if temperature < 0:
        raise ValueError(f"temperature must be >= 0, got {temperature}")
    if top_p is not None and not 0 < top_p <= 1:
        raise ValueError(f"top_p must be in (0, 1], got {top_p}")
    if temperature == 0:  # (in float32: the CPU's bf16 argmax is 3x slower, and the values are the same)
        return logits.float().argmax(-1)
    return draw(next_token_probs(logits, temperature=temperature, top_k=top_k, top_p=top_p), generator)


def draw(probs: Tensor, generator: torch.Generator | None = None) -> Tensor:
    """One token from each row of ``probs`` (..., V) -> ids (...), without a host sync: the
    exponential race argmaxᵢ pᵢ / Eᵢ with Eᵢ ~ Exp(1) independent (gpt-fast's sampler; the first of
    V exponential clocks with rates pᵢ to ring is token i with probability pᵢ / Σp). A multinomial
    draw, the same distribution, may read the device back on a GPU, and a CUDA graph cannot hold
    that. A clock at exactly 0 (u = 0 in −log(1 − u)) is kept at float32's smallest normal number:
    0/0 would be NaN, which argmax takes as the largest."""
    clocks = torch.empty_like(probs, dtype=torch.float32).exponential_(1.0, generator=generator)
    return (probs.float() / clocks.clamp_min_(torch.finfo(torch.float32).tiny)).argmax(-1)


def next_token_probs(
    logits: Tensor, *, temperature: float = 1.0, top_k: int | None = None, top_p: float | None = None
) -> Tensor:
    """The distribution sampling draws from: softmax(logits / temperature) over the ``top_k``
    most likely tokens and the nucleus ``top_p``; logits (..., V) -> probabilities (..., V)."""
    if not temperature > 0:
        raise ValueError(f"temperature must be > 0 for a distribution, got {temperature}")
    if top_p is not None and not 0 < top_p <= 1:
        raise ValueError(f"top_p must be in (0, 1], got {top_p}")
    # shifted so the largest logit is 0, and the temperature kept at least float32's smallest normal
    # number: a temperature as small as 1e-300 (0 in float32) then gives the greedy choice, where
    # z / T would give 0/0 = NaN and poison the draw (and, in a batch, every other row's)
    logits = logits.float()
    logits = (logits - logits.amax(-1, keepdim=True)) / max(temperature, torch.finfo(torch.float32).tiny)
    if top_k is not None and top_k > 0:
        kth = torch.topk(logits, min(top_k, logits.shape[-1]), dim=-1).values[..., -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if top_p is not None and top_p < 1:
        # nucleus: keep the smallest set of tokens whose probability adds up to top_p
        sorted_logits, order = logits.sort(dim=-1, descending=True)
        cum = sorted_logits.softmax(-1).cumsum(-1)
        drop_sorted = cum - sorted_logits.softmax(-1) >= top_p  # mass before this token already >= p
        drop_sorted[..., 0] = False  # the most likely token always stays (a top_p of 1e-300 is 0 in float32)
        drop = drop_sorted.scatter(-1, order, drop_sorted)
        logits = logits.masked_fill(drop, float("-inf"))
    return logits.softmax(-1)


def _left_pad(prompts: Sequence[Sequence[int]], pad_id: int, device) -> tuple[Tensor, Tensor]:
    if not prompts or any(len(p) == 0 for p in prompts):
        raise ValueError("every prompt needs at least one token")
    width = max(len(p) for p in prompts)
    ids = torch.full((len(prompts), width), pad_id, dtype=torch.long)
    mask = torch.zeros(len(prompts), width, dtype=torch.bool)
    for i, p in enumerate(prompts):
        ids[i, width - len(p) :] = torch.as_tensor(list(p), dtype=torch.long)
        mask[i, width - len(p) :] = True
    return ids.to(device), mask.to(device)


@torch.no_grad()
def generate(
    model: nn.Module,
    prompts: Sequence[Sequence[int]] | Tensor,
    max_new_tokens: int,
    *,
    temperature: float = 1.0,
    top_k: int | None = None,
    top_p: float | None = None,
    use_cache: bool = True,
    eos_id: int | Sequence[int] | None = None,
    generator: torch.Generator | None = None,
    on_step: Callable[[Tensor], bool] | None = None,
    draft: nn.Module | None = None,
    draft_tokens: int = 4,
    compile: bool = False,
) -> list[list[int]]:
    """Continue each prompt by up to ``max_new_tokens`` tokens; returns prompt + continuation.

    Prompts may differ in length (they are left-padded, padding is masked out and positions
    count real tokens only). ``on_step(next_ids)`` is called after each step; returning
    True stops early. A row stops at ``eos_id`` (one id or several; the rows that stopped are
    filled with the first of them until all have). When the context fills up, the window
    slides: the cache is refilled from the last half-context of tokens. With a ``draft`` model
    the tokens come from :func:`speculative_generate` (one prompt), same distribution, fewer
    passes over the model's weights. ``compile=True``: a fixed-shape decode step compiled once
    (:mod:`attnlab.generate.fast`; CUDA graphs on a GPU), the same tokens; models it does not
    support (ALiBi, relative positions, --window) decode as without it, with a warning.
    """
    if isinstance(prompts, Tensor):
        prompts = prompts.tolist()
    ends = end_ids(eos_id)
    if draft is not None:
        if len(prompts) != 1:
            raise ValueError(f"speculative decoding continues one prompt at a time, got {len(prompts)}")
        if not use_cache:
            raise ValueError(
                "speculative decoding needs the KV cache (it rewinds it); drop --no-cache (use_cache=False)"
            )

        def step(t: Tensor) -> bool:
            stop = on_step(t) if on_step is not None else False
            return stop or int(t[0]) in ends

        kw = dict(temperature=temperature, top_k=top_k, top_p=top_p, generator=generator, on_step=step)
        return [speculative_generate(model, draft, prompts[0], max_new_tokens, draft_tokens=draft_tokens, **kw)]
    model.eval()
    device = next(model.parameters()).device
    ids, mask = _left_pad(prompts, 0, device)
    if compile and use_cache and max_new_tokens > 0:
        from .fast import fast_decoder, why_not_fast

        why = why_not_fast(model)
        if why is None:

            def pick(logits: Tensor) -> Tensor:
                return sample_next(logits, temperature=temperature, top_k=top_k, top_p=top_p, generator=generator)

            new = fast_decoder(model, ids.shape[0], length=ids.shape[1] + max_new_tokens).generate(
                ids, mask, max_new_tokens, pick, eos_id=ends or None, on_step=on_step
            )
            return [list(p) + tail for p, tail in zip(prompts, new.tolist())]
        import warnings

        warnings.warn(f"compile=True: not compiled, {why}; decoding eagerly", stacklevel=2)
    padded = not bool(mask.all())
    block = model.config.context
    done = torch.zeros(ids.shape[0], dtype=torch.bool, device=device)
    stops = torch.tensor(ends, dtype=torch.long, device=device)
    caches, fed = None, 0  # fed: how many columns of ids the cache holds
    long_from, filled_width = long_rope_from(model), 0  # (the longest row is ids' whole width: left padding)
    for _ in range(max_new_tokens):
        if use_cache:
            full = caches is not None and fed >= block
            crossed = long_from is not None and filled_width <= long_from < ids.shape[1]  # (LongRoPE's switch)
            if caches is None or full or crossed:  # (re)fill from the window that fits
                keep = min(ids.shape[1], block // 2 if full else block)
                ids_w, mask_w = ids[:, -keep:], mask[:, -keep:]
                caches = model.new_caches(ids.shape[0], block)
                logits = _forward(model, ids_w, mask_w, padded, caches, start=0)
                fed, filled_width = keep, ids.shape[1]
            else:
                logits = _forward(model, ids[:, -1:], mask[:, -fed - 1 :], padded, caches, start=fed)
                fed += 1
        else:
            logits = _forward(model, ids[:, -block:], mask[:, -block:], padded, None, start=0)
        nxt = sample_next(logits[:, -1], temperature=temperature, top_k=top_k, top_p=top_p, generator=generator)
        if ends:
            nxt = torch.where(done, torch.full_like(nxt, ends[0]), nxt)
            done |= torch.isin(nxt, stops)
        ids = torch.cat([ids, nxt[:, None]], dim=1)
        mask = torch.cat([mask, torch.ones_like(mask[:, :1])], dim=1)
        if on_step is not None and on_step(nxt):
            break
        if ends and bool(done.all()):
            break
    out = []
    for row, m in zip(ids.tolist(), mask.tolist()):
        seq = [t for t, keep in zip(row, m) if keep]
        out.append(seq)
    return out


@torch.no_grad()
def token_logprobs(
    model: nn.Module, ids: Sequence[int], top: int = 0, chunk: int = 256
) -> tuple[Tensor, Tensor, Tensor]:
    """How likely the model finds each token of ``ids`` after the ones before it: the log-softmax
    of its float32 logits (temperature 1, no filtering), what OpenAI's ``logprobs`` and
    lm-evaluation-harness's log-likelihoods read. Returns (logprobs (T-1,) of tokens 1..T-1, the
    ``top`` most likely tokens at each of those positions (T-1, top) and their logprobs (T-1, top)).
    The text is fed ``chunk`` tokens at a time through the KV cache, so memory holds ``chunk`` × V
    logits, not T × V; it must fit the model's context."""
    if len(ids) > model.config.context:
        raise ValueError(f"{len(ids)} tokens are more than the model's context of {model.config.context}")
    model.eval()
    device = next(model.parameters()).device
    tokens = torch.as_tensor(list(ids), dtype=torch.long, device=device)
    caches = model.new_caches(1, model.config.context)
    picked, top_ids, top_lp = [], [], []
    for start in range(0, len(ids) - 1, chunk):
        end = min(start + chunk, len(ids) - 1)
        logp = model(tokens[None, start:end], caches=caches)[0].float().log_softmax(-1)  # (n, V)
        picked.append(logp.gather(-1, tokens[start + 1 : end + 1, None])[:, 0])
        if top > 0:
            values, indices = logp.topk(min(top, logp.shape[-1]), dim=-1)
            top_ids.append(indices)
            top_lp.append(values)
    empty = torch.zeros(0, device=device)
    lp = torch.cat(picked) if picked else empty
    if top > 0 and top_ids:
        return lp, torch.cat(top_ids), torch.cat(top_lp)
    return lp, torch.zeros(len(lp), 0, dtype=torch.long, device=device), torch.zeros(len(lp), 0, device=device)


def _forward(model, ids, mask, padded, caches, start):
    """One forward over ``ids``; ``mask`` covers every key the attention sees."""
    if not padded:
        return model(ids, caches=caches)
    positions = (mask.long().cumsum(-1) - 1).clamp(min=0)[:, -ids.shape[1] :]  # (B, T)
    return model(ids, caches=caches, positions=positions, key_mask=mask)


class _Window:
    """One model's KV cache over a window of the text, ``seq[start:]``, from which it predicts what follows."""

    def __init__(self, net: nn.Module, seq: list[int], device) -> None:
        self.net, self.seq, self.device = net, seq, device
        self.block = net.config.context
        self.start = len(seq) - min(len(seq), self.block)
        self.caches = net.new_caches(1, self.block)

    def feed(self, tokens: list[int]) -> Tensor:
        """The logits (len(tokens), V) after the cached text and ``tokens``, which join the cache."""
        ids = torch.tensor([tokens], dtype=torch.long, device=self.device)
        return self.net(ids, caches=self.caches)[0].float()

    def unseen(self) -> list[int]:
        """The text's tokens that are not in the cache yet."""
        return self.seq[self.start + self.caches[0].length :]

    def move_to(self, start: int) -> None:
        self.start = start
        for c in self.caches:
            c.length = 0

    def forget_after(self, end: int) -> None:
        """Keep ``seq[start:end]`` in the cache (a preallocated cache only moves its length back)."""
        for c in self.caches:
            c.length = min(c.length, end - self.start)


def _check_speculative(model: nn.Module, draft: nn.Module, prompt, max_new_tokens: int, draft_tokens: int) -> None:
    if draft_tokens < 1:
        raise ValueError(f"draft_tokens must be at least 1, got {draft_tokens}")
    if not prompt:
        raise ValueError("every prompt needs at least one token")
    if model.config.vocab_size != draft.config.vocab_size:
        raise ValueError(
            f"the draft's vocabulary ({draft.config.vocab_size} tokens) differs from the model's "
            f"({model.config.vocab_size}); the draft must use the model's tokenizer"
        )
    for which, m in (("model", model), ("draft", draft)):
        changing = rotation_changes_from(m)
        if changing is not None and len(prompt) + max_new_tokens > changing[1] + 1:
            name, limit = changing
            raise ValueError(
                f"the {which} uses {name}, whose rotation changes once the text passes {limit} tokens, "
                f"which speculative decoding's verified rounds do not follow; keep the prompt and max_new_tokens "
                f"within {limit + 1} tokens or decode without a draft"
            )


def _verified(proposals: list[int], q: list, logits: Tensor, dist, generator) -> tuple[int, int]:
    """(how many of the draft's ``proposals`` the model keeps, the token that follows them): a
    proposal x drawn from q is kept with probability min(1, p(x)/q(x)) (greedy: while it is the
    model's argmax); the first refused is replaced by a draw from max(0, p − q) renormalised (greedy:
    the argmax); if all are kept, one more token comes from p. ``logits`` (k + 1, V): the model's."""
    for i, x in enumerate(proposals):
        p = dist(logits[i])
        if p is None:
            if int(logits[i].argmax()) != x:
                return i, int(logits[i].argmax())
        elif not bool(torch.rand((), generator=generator, device=p.device) * q[i][x] <= p[x]):
            return i, int(draw((p - q[i]).clamp(min=0), generator))
    p = dist(logits[-1])
    return len(proposals), int(logits[-1].argmax(-1)) if p is None else int(draw(p, generator))


@torch.no_grad()
def speculative_generate(
    model: nn.Module,
    draft: nn.Module,
    prompt: Sequence[int],
    max_new_tokens: int,
    *,
    draft_tokens: int = 4,
    temperature: float = 1.0,
    top_k: int | None = None,
    top_p: float | None = None,
    generator: torch.Generator | None = None,
    on_step: Callable[[Tensor], bool] | None = None,
    stats: dict | None = None,
) -> list[int]:
    """Speculative decoding (Leviathan et al. 2023; Chen et al. 2023): the small ``draft`` model
    proposes ``draft_tokens`` tokens one at a time, ``model`` scores all of them in one forward
    (one read of its weights instead of one per token), and the longest acceptable prefix is kept,
    plus one token of the model's own. The output follows ``model``'s distribution exactly:

    * greedy (``temperature=0``): a proposal is kept while it is the model's argmax, so the tokens
      are those ``generate(model, ...)`` gives;
    * sampling: proposal x (drawn from the draft's q) is kept with probability min(1, p(x)/q(x));
      the first one refused is replaced by a draw from max(0, p − q) renormalised; if all are kept,
      one more token is drawn from p.

    One prompt (a batch of one: rows would accept different numbers of tokens). Both models must
    share the tokenizer. Text longer than the model's context slides its window as
    :func:`generate` does, at the same tokens.
    ``on_step(ids)`` sees each accepted token as a (1,) tensor; ``stats`` (a dict) receives
    ``proposed``, ``accepted`` and ``rounds``. Returns prompt + continuation."""
    _check_speculative(model, draft, prompt, max_new_tokens, draft_tokens)
    model.eval()
    draft.eval()
    device = next(model.parameters()).device
    seq = list(prompt)
    # The model's window moves as generate()'s does (when a prediction would need more than its
    # context: to the last half-context), and a round of proposals never crosses such a move, so
    # greedy output equals generate()'s at any length. The draft's window only has to fit.
    target, drafter = _Window(model, seq, device), _Window(draft, seq, device)
    counts = {"proposed": 0, "accepted": 0, "rounds": 0}

    def dist(logits):
        return None if temperature == 0 else next_token_probs(logits, temperature=temperature, top_k=top_k, top_p=top_p)

    new = 0
    while new < max_new_tokens:
        m = len(seq)  # the index this round predicts first
        if new > 0 and (m - 1) - target.start >= target.block:  # generate() would refill here
            target.move_to(m - target.block // 2)
        # proposals whose predictions would need a refill wait for the next round
        k = min(draft_tokens, max_new_tokens - new - 1, target.block - (m - target.start))
        if m - drafter.start + k > drafter.block:
            drafter.move_to(m - drafter.block // 2)
        # 1. the draft proposes k tokens, each from its own distribution q_i
        proposals, q, pending = [], [], drafter.unseen()
        for _ in range(k):
            logits = drafter.feed(pending)[-1]
            q.append(dist(logits))
            proposals.append(int(logits.argmax(-1)) if q[-1] is None else int(draw(q[-1], generator)))
            pending = [proposals[-1]]
        # 2. the model scores them all at once: p_1..p_{k+1}; 3. it keeps a prefix and adds a token
        kept, last = _verified(proposals, q, target.feed(target.unseen() + proposals)[-(k + 1) :], dist, generator)
        counts["proposed"] += k
        counts["accepted"] += kept
        counts["rounds"] += 1
        for window in (target, drafter):  # the caches forget what was not kept
            window.forget_after(m + kept)
        stopped = False
        for t in (proposals[:kept] + [last])[: max_new_tokens - new]:
            seq.append(t)
            new += 1
            stopped = on_step is not None and bool(on_step(torch.tensor([t], device=device)))
            if stopped:
                break
        if stopped:
            break
    if stats is not None:
        stats.update(counts)
    return seq


def generate_text(
    model: nn.Module,
    tokenizer,
    prompt: str | Sequence[str] | Sequence[int],
    max_new_tokens: int = 200,
    *,
    stop: Sequence[str] = (),
    stream: Callable[[str], None] | None = None,
    eos_id: int | Sequence[int] | None = None,
    **kw,
) -> list[str]:
    """Text in, text out: ``prompt`` is a text, a list of texts, or one prompt's token ids (a
    rendered chat). ``stop`` strings end a sample (they are cut from the result); so does an
    end-of-sequence token (``eos_id``: one id or several), whose text is not shown. ``stream``
    receives the new text of the first sample as it is generated."""
    one = isinstance(prompt, str) or (len(prompt) > 0 and all(isinstance(i, int) for i in prompt))
    prompts = [prompt] if one else list(prompt)
    encoded = [tokenizer.encode(p) if isinstance(p, str) else list(p) for p in prompts]
    ends = end_ids(eos_id)
    new: list[list[int]] = [[] for _ in prompts]
    ended = [False for _ in prompts]
    shown = [""]

    def on_step(nxt: Tensor) -> bool:
        for i, t in enumerate(nxt.tolist()):
            if ended[i]:
                continue
            if t in ends:
                ended[i] = True
            else:
                new[i].append(t)
        if stream is not None:
            text = _held_back(cut_at_stop(tokenizer.decode(new[0]), stop), stop)
            if not text.endswith("\ufffd") and len(text) > len(shown[0]):  # (wait for a whole character)
                stream(text[len(shown[0]) :])
                shown[0] = text
        stopped = [e or (bool(stop) and any(s in tokenizer.decode(n) for s in stop)) for e, n in zip(ended, new)]
        return all(stopped)

    generate(model, encoded, max_new_tokens, on_step=on_step, eos_id=ends or None, **kw)
    texts = [cut_at_stop(tokenizer.decode(n), stop) for n in new]
    if stream is not None and len(texts[0]) > len(shown[0]):
        stream(texts[0][len(shown[0]) :])
    return texts


def _held_back(text: str, stop: Sequence[str]) -> str:
    """``text`` without an ending that may be the start of a stop string: streaming waits to see
    whether it completes one (then it is cut) before printing it."""
    for k in range(min(len(text), max((len(s) for s in stop), default=0)), 0, -1):
        if any(s.startswith(text[-k:]) and len(s) > k for s in stop):
            return text[:-k]
    return text


def cut_at_stop(text: str, stop: Sequence[str]) -> str:
    """``text`` up to the first of the ``stop`` strings in it (all of it when none is)."""
    cut = min((text.find(s) for s in stop if s and s in text), default=-1)
    return text if cut < 0 else text[:cut]


def default_prompt(tokenizer) -> str:
    """What an empty prompt starts from: a newline where the vocabulary has one (the start of a
    line), else the first token."""
    return "\n" if "\n" in getattr(tokenizer, "stoi", {"\n": 0}) else tokenizer.decode([0])
