"""Continuous batching: many generation requests share one batch, each joining when a row frees up.

Generating one token reads all of the model's weights; on a CPU (and a GPU at small batch) that
read, not the arithmetic, bounds the speed, so B rows per step cost little more than one. A fixed
batch wastes that: a row that finished early idles until the longest one ends, and a request that
arrives meanwhile waits for the whole batch. Here (Yu et al. 2022, "Orca"; the scheduling of vLLM
and HuggingFace TGI) every step feeds one token for each active request, a request that finishes
leaves at once, and a waiting one takes its row at the next step.

How rows of different ages share one KV cache: the cache is a timeline of columns. Each row's
tokens are contiguous and end at the current column ``c``; the columns before a row's first token
are masked out (``key_mask``) and each row's positions count its own tokens, exactly as a
left-padded batch in :func:`attnlab.generate.generate`. So every position scheme (learned,
sinusoidal, RoPE, ALiBi, relative) and ``--window`` see what they would see alone. A new prompt is
run alone (prefill) and its keys and values are copied into its row so that they end at ``c``; when
``c`` reaches the cache's width the columns no active row uses are dropped (all rows shift left).

A decoding step reads the device back once: the rows' new tokens, in one transfer (the host needs
them to stop a request at its end id, its length or a stop string). Each row's first column and last
token also live on the device, so nothing is copied there per step either.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import torch
from torch import Tensor, nn

from . import cut_at_stop, default_prompt, end_ids, sample_next
from ..errors import OptionError
from ..position import rotation_changes_from
from ..syncs import to_host_list

__all__ = ["Request", "ContinuousBatcher", "generate_batched", "generate_texts", "text_request", "request_text"]


@dataclass(eq=False)  # a request is itself, not its fields (two may ask the same)
class Request:
    """One prompt to continue, with its own sampling settings.

    ``generator`` draws this request's tokens (seed it to make them repeatable whatever else shares
    the batch). ``should_stop(new_tokens)`` ends the request early when it returns True (stop
    strings); ``on_token(token)`` sees each new token (streaming). After the batcher is done with
    it: ``tokens`` holds the new tokens (an end-of-sequence token that ended it last) and
    ``finish_reason`` is "length", "eos" or "stop". ``eos_id``: one id or several."""

    prompt: Sequence[int]
    max_new_tokens: int
    temperature: float = 1.0
    top_k: int | None = None
    top_p: float | None = None
    eos_id: int | Sequence[int] | None = None
    generator: torch.Generator | None = None
    should_stop: Callable[[list[int]], bool] | None = None
    on_token: Callable[[int], None] | None = None
    tokens: list[int] = field(default_factory=list)
    finish_reason: str | None = None

    @property
    def done(self) -> bool:
        return self.finish_reason is not None

    @property
    def new_tokens(self) -> list[int]:
        """What was generated without the end-of-sequence token that ended it (what text shows)."""
        return self.tokens[:-1] if self.finish_reason == "eos" else self.tokens


class ContinuousBatcher:
    """Runs :class:`Request` s through ``model`` (a GPT) ``slots`` at a time.

    ``submit`` queues a request; each ``step`` admits queued requests into free rows (running their
    prompts), then feeds every active row its last token in one forward and samples the next.
    ``run(requests)`` does both until all are done. ``width``: columns of the shared KV cache
    (default 1.25 × the context: a shift, which copies the cache once, then comes at most every
    context / 4 steps; wider means fewer shifts and more memory). A request must fit the model's
    context: prompt + max_new_tokens ≤ context (no sliding window here)."""

    def __init__(self, model: nn.Module, slots: int = 8, *, width: int | None = None):
        context = model.config.context
        width = width or context + max(context // 4, 2)
        if slots < 1:
            raise ValueError(f"slots must be at least 1, got {slots}")
        if width < context:
            raise ValueError(f"width {width} is narrower than the model's context {context}; give at least {context}")
        self.model = model.eval()
        self.slots, self.width, self.context = slots, width, context
        self.device = next(model.parameters()).device
        self.caches = model.new_caches(slots, width)
        for cache in self.caches:  # masked columns still meet the values: 0 · NaN from empty memory is NaN
            cache.k.zero_()
            cache.v.zero_()
        self.active: list[Request] = []  # row i of the cache belongs to active[i]
        self.starts: list[int] = []  # the column of each active row's first token
        # the same on the device, with each row's newest token (not yet fed): what a step reads
        self.starts_on_device = torch.zeros(slots, dtype=torch.long, device=self.device)
        self.last_on_device = torch.zeros(slots, dtype=torch.long, device=self.device)
        self.waiting: deque[Request] = deque()
        self.column = 0  # the timeline's next free column (every cache's length)
        self.steps = 0  # batched decoding forwards run so far
        self.shifts = 0  # times the timeline was compacted

    def submit(self, request: Request) -> Request:
        """Queue ``request``; checked now, so a bad one fails here and not inside a batch."""
        self.check(request)
        self.waiting.append(request)
        return request

    def check(self, request: Request) -> None:
        """Raise ValueError, in one line that says what to change, for a request this batcher cannot run."""
        n, new = len(request.prompt), request.max_new_tokens
        if n == 0:
            raise ValueError("every prompt needs at least one token")
        if new < 1:
            raise ValueError(f"max_new_tokens must be at least 1, got {new}")
        if not request.temperature >= 0:  # (NaN too)
            raise ValueError(f"temperature is {request.temperature}; give 0 (greedy) or more")
        if request.top_p is not None and not 0 < request.top_p <= 1:
            raise ValueError(f"top_p is {request.top_p}; give a probability in (0, 1]")
        if request.top_k is not None and request.top_k < 0:
            raise ValueError(f"top_k is {request.top_k}; give 0 (off) or more")
        if n + new > self.context:
            room = self.context - n
            fix = f"ask for at most {room} new tokens" if room > 0 else "shorten the prompt"
            raise ValueError(
                f"the prompt ({n} tokens) and max_new_tokens {new} exceed the model's context of {self.context} "
                f"tokens (a batched request keeps both within it, with no sliding window); {fix}"
            )
        changing = rotation_changes_from(self.model)
        if changing is not None and n + new > changing[1] + 1:
            name, limit = changing
            raise ValueError(
                f"the model uses {name}, whose rotation changes for every row once one passes {limit} tokens; "
                f"a batched request keeps the prompt ({n} tokens) and max_new_tokens within {limit + 1} tokens: "
                f"ask for at most {max(limit + 1 - n, 0)} new tokens, or generate it alone"
            )
        vocab = self.model.config.vocab_size
        if min(request.prompt) < 0 or max(request.prompt) >= vocab:
            raise ValueError(f"prompt token ids must lie in 0 … {vocab - 1}")

    @property
    def busy(self) -> bool:
        return bool(self.active or self.waiting)

    @torch.no_grad()
    def step(self) -> list[Request]:
        """Admit what fits, then one decoding step for every active row. Returns the requests that
        finished during it (a request may finish on its prompt's own token)."""
        finished = []
        while self.waiting and len(self.active) < self.slots:
            request = self.waiting.popleft()
            self._admit(request)
            if request.done:
                finished.append(request)
        if not self.active:
            return finished
        if self.column == self.width:
            self._compact()
        n, c = len(self.active), self.column
        starts = self.starts_on_device[:n]
        key_mask = torch.arange(c + 1, device=self.device)[None, :] >= starts[:, None]  # (n, c+1)
        positions = (c - starts)[:, None]  # (n, 1): each row counts its own tokens
        ids = self.last_on_device[:n, None]  # (n, 1)
        views = [cache.rows(n) for cache in self.caches]
        # (positions stay within the context: check() saw to it for every request)
        logits = self.model(ids, caches=views, positions=positions, key_mask=key_mask, check_positions=False)
        tokens = self._sample_rows(logits[:, -1])  # (n,)
        self.last_on_device[:n] = tokens
        self.column = c + 1
        for cache in self.caches:
            cache.length = self.column
        self.steps += 1
        for request, token in zip(self.active, to_host_list(tokens)):  # the step's one transfer to the host
            self._emit(request, token)
        for row in reversed(range(n)):  # the last row moves into a finished one's place
            if self.active[row].done:
                finished.append(self.active[row])
                self._release(row)
        return finished

    def run(self, requests: Sequence[Request] = ()) -> list[Request]:
        """Submit ``requests`` and step until every queued request is done; returns ``requests``."""
        for r in requests:
            self.submit(r)
        while self.busy:
            self.step()
        return list(requests)

    def _admit(self, request: Request) -> None:
        """Run the prompt alone, sample its first token and give it a row ending at the current column."""
        prompt = list(request.prompt)
        n = len(prompt)
        own = self.model.new_caches(1, n)
        logits = self.model(torch.tensor([prompt], device=self.device), caches=own, last_only=True)[:, -1]  # (1, V)
        token = self._emit(request, int(self._sample(request, logits)[0]))
        if request.done:
            return
        if not self.active:
            self._set_column(n)
        elif self.column < n:  # not enough columns before c: move every row right
            by = n - self.column
            for cache in self.caches:
                cache.shift(by)
            self.starts = [s + by for s in self.starts]
            self.starts_on_device += by
            self.column = n
        row = len(self.active)
        for cache, mine in zip(self.caches, own):
            cache.place(row, mine, self.column)
        self.active.append(request)
        self.starts.append(self.column - n)
        self.starts_on_device[row] = self.column - n
        self.last_on_device[row] = token

    def _release(self, row: int) -> None:
        end = len(self.active) - 1
        if row != end:
            for cache in self.caches:
                cache.copy_row(end, row)
            self.active[row], self.starts[row] = self.active[end], self.starts[end]
            self.starts_on_device[row] = self.starts_on_device[end]
            self.last_on_device[row] = self.last_on_device[end]
        self.active.pop()
        self.starts.pop()
        if not self.active:
            self._set_column(0)

    def _compact(self) -> None:
        """Drop the columns before the oldest active row's first token. There are some: a row holds
        at most context − 2 fed tokens (prompt + max_new_tokens ≤ context), and width ≥ context."""
        by = min(self.starts)
        for cache in self.caches:
            cache.shift(-by)
        self.starts = [s - by for s in self.starts]
        self.starts_on_device -= by
        self.column -= by
        self.shifts += 1

    def _set_column(self, column: int) -> None:
        self.column = column
        for cache in self.caches:
            cache.length = column

    @staticmethod
    def _sample(request: Request, logits: Tensor) -> Tensor:
        """The next token (1,) from one row's logits (1, V), with the request's own settings and
        generator (one draw per token, as :func:`attnlab.generate.generate` makes for a one-prompt
        batch); on the device."""
        return sample_next(
            logits,
            temperature=request.temperature,
            top_k=request.top_k,
            top_p=request.top_p,
            generator=request.generator,
        )

    def _sample_rows(self, logits: Tensor) -> Tensor:
        """Every active row's next token (n,), on the device: the greedy rows in one argmax, each
        sampling row with its own settings and generator."""
        tokens = logits.argmax(-1)
        for row, request in enumerate(self.active):
            if request.temperature != 0:
                tokens[row] = self._sample(request, logits[row : row + 1])[0]
        return tokens

    @staticmethod
    def _emit(request: Request, token: int) -> int:
        request.tokens.append(token)
        if request.on_token is not None:
            request.on_token(token)
        if token in end_ids(request.eos_id):
            request.finish_reason = "eos"
        elif len(request.tokens) >= request.max_new_tokens:
            request.finish_reason = "length"
        elif request.should_stop is not None and request.should_stop(request.tokens):
            request.finish_reason = "stop"
        return token


def generate_batched(
    model: nn.Module,
    prompts: Sequence[Sequence[int]],
    max_new_tokens: int | Sequence[int],
    *,
    slots: int = 8,
    temperature: float = 1.0,
    top_k: int | None = None,
    top_p: float | None = None,
    eos_id: int | Sequence[int] | None = None,
    seed: int | None = None,
) -> list[list[int]]:
    """Continue every prompt (token ids) through a :class:`ContinuousBatcher` of ``slots`` rows;
    returns prompt + continuation for each, in order. ``max_new_tokens``: one count for all or one
    per prompt. With ``seed``, prompt i draws from a generator seeded ``seed + i``, so its tokens do
    not depend on which prompts share its batch."""
    counts = [max_new_tokens] * len(prompts) if isinstance(max_new_tokens, int) else list(max_new_tokens)
    if len(counts) != len(prompts):
        raise ValueError(f"{len(counts)} max_new_tokens counts for {len(prompts)} prompts; give one per prompt")
    device = next(model.parameters()).device
    requests = [
        Request(
            list(p),
            m,
            temperature=temperature,
            top_k=top_k,
            top_p=top_p,
            eos_id=eos_id,
            generator=None if seed is None else torch.Generator(device=device).manual_seed(seed + i),
        )
        for i, (p, m) in enumerate(zip(prompts, counts))
    ]
    ContinuousBatcher(model, slots).run(requests)
    return [list(r.prompt) + r.tokens for r in requests]


def text_request(
    tokenizer,
    prompt: str | Sequence[int],
    max_new_tokens: int,
    *,
    stop: Sequence[str] = (),
    seed: int | None = None,
    device=None,
    **sampling,
) -> Request:
    """A :class:`Request` for text: ``prompt`` encoded (an empty one: :func:`default_prompt`; token
    ids are taken as they are),
    ending at the first of the ``stop`` strings its continuation contains; ``seed`` gives it its own
    generator; ``sampling``: temperature, top_k, top_p. :func:`request_text` turns the finished
    request back into text."""
    if any(s == "" for s in stop):
        raise ValueError("a stop string '' would stop before the first token; give non-empty strings")
    gen = None if seed is None else torch.Generator(device=device or "cpu").manual_seed(seed)
    should_stop = (lambda tokens: any(s in tokenizer.decode(tokens) for s in stop)) if stop else None
    ids = list(prompt) if not isinstance(prompt, str) else tokenizer.encode(prompt or default_prompt(tokenizer))
    return Request(ids, max_new_tokens, generator=gen, should_stop=should_stop, **sampling)


def request_text(tokenizer, request: Request, stop: Sequence[str] = ()) -> str:
    """The continuation a finished ``request`` generated, as text (without the end-of-sequence
    token that ended it), cut at the first stop string."""
    return cut_at_stop(tokenizer.decode(request.new_tokens), stop)


def generate_texts(
    model, tokenizer, prompts, max_new_tokens: int, *, slots: int, stop=(), seed=None, on_done=None, **sampling
) -> list[str]:
    """Continue every prompt (texts; an empty one starts a new line) by continuous batching,
    ``slots`` at a time; prompt i draws with seed ``seed + i``. ``on_done(i, text)`` is called as
    each finishes. Returns the continuations in the prompts' order; a prompt that does not fit the
    context with ``max_new_tokens`` is refused in one line, before anything runs."""
    device = next(model.parameters()).device
    batcher = ContinuousBatcher(model, slots)
    requests = []
    for i, p in enumerate(prompts):
        r = text_request(
            tokenizer,
            p,
            max_new_tokens,
            stop=stop,
            seed=None if seed is None else seed + i,
            device=device,
            **sampling,
        )
        try:
            batcher.submit(r)
        except ValueError as e:
            raise OptionError(f"prompt {i + 1}: {e}") from None
        requests.append(r)
    index = {r: i for i, r in enumerate(requests)}
    while batcher.busy:
        for r in batcher.step():
            if on_done is not None:
                on_done(index[r], request_text(tokenizer, r, stop))
    return [request_text(tokenizer, r, stop) for r in requests]
