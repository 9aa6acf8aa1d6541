"""Generation at the kernel-launch limit: a fixed-shape decode step, compiled once.

Decoding one token runs a few dozen small kernels; launched one by one from Python they, not the
GPU, set the pace (GPT-2 small, batch 1: ~180 tokens/s where its weights could be read ~12,000
times a second). A compiled step fuses them, and on CUDA ``mode="reduce-overhead"`` replays the
whole step as one CUDA graph. Both need a step whose shapes and Python values never change:

* the KV cache is preallocated to the context and written in place at a column held in a device
  tensor (:class:`attnlab.attention.StaticKVCache`), and attention always reads all its columns,
  masked by a device-side key mask, instead of a cache that grows by one column per token;
* positions are a device tensor advanced in place; nothing on the path reads a value back
  (the position checks are done once, before the loop);
* the prompt is prefilled eagerly (its length varies) and computes only the last position's
  logits; the generated ids go into a preallocated buffer, not a tensor grown by ``torch.cat``.

Greedy tokens equal :func:`attnlab.generate.generate`'s (tested), and so does sampling with the
same generator, up to the rounding of a masked attention over more columns.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable, Sequence

import torch
from torch import Tensor, nn

from ..attention import StaticKVCache
from ..position import long_rope_from

__all__ = ["FastDecoder", "fast_decoder", "graph_lines", "why_not_fast"]


def why_not_fast(model: nn.Module) -> str | None:
    """Why ``model`` cannot take the fixed-shape decode step, or None when it can."""
    config = getattr(model, "config", None)
    if not hasattr(model, "new_caches") or config is None or not hasattr(config, "context"):
        return f"{type(model).__name__} is not a GPT"
    if getattr(config, "pos", None) not in ("learned", "sinusoidal", "rope"):
        # ALiBi's and Shaw's biases are built for the queries at the end of the keys, which a
        # fixed-shape cache does not keep
        return f"--pos {config.pos} (its score bias assumes a growing cache; learned, sinusoidal and rope work)"
    if getattr(config, "window", None) is not None:
        return "--window (the band is built for a growing cache)"
    return None


class FastDecoder:
    """Decodes ``batch`` rows of ``model`` with a fixed-shape step (compiled unless
    ``compile=False``). ``max_len``: the cache's columns, the model's context by default; a
    shorter cache decodes texts of up to ``max_len`` tokens (attention reads every column at every
    step: a 32k-token context read for a 100-token text would cost 300 times the attention). One
    per model, batch size and length (:func:`fast_decoder` keeps them): the compiled step is reused
    across calls of :meth:`generate`."""

    def __init__(self, model: nn.Module, batch: int, *, compile: bool = True, max_len: int | None = None) -> None:
        why = why_not_fast(model)
        if why is not None:
            raise ValueError(f"the fixed-shape decode step does not support {why}")
        self.model, self.batch = model, batch
        self.max_len = min(max_len or model.config.context, model.config.context)
        param = next(model.parameters())
        self.device = param.device
        # (zeros, not empty: masked columns get weight 0, and 0 x NaN from stale memory is NaN)
        self.caches = model.new_caches(batch, self.max_len)
        for c in self.caches:
            c.k.zero_()
            c.v.zero_()
        self.columns = torch.zeros(1, dtype=torch.long, device=self.device)
        self.static = [StaticKVCache(c.k, c.v, self.columns) for c in self.caches]
        self.compiled = compile
        self.step = self._step
        self._counters_before: dict[str, int] | None = None  # the compile counters before the first step
        if compile:
            cuda = self.device.type == "cuda"
            if cuda:  # the buffers the graph writes stay where they are: CUDA graphs may replay over them
                for c in self.caches:
                    torch._dynamo.mark_static_address(c.k)
                    torch._dynamo.mark_static_address(c.v)
            self.step = torch.compile(
                self._step, fullgraph=True, dynamic=False, mode="reduce-overhead" if cuda else None
            )

    def graph_counts(self) -> dict[str, int] | None:
        """What compiling the step cost, read from torch's compile counters since just before its first
        call: ``graphs`` compiled (1 when the step compiled once), ``graph_breaks``, ``recompiles`` and
        ``cudagraph_skips`` (on CUDA: steps inductor would not capture as a CUDA graph, which then
        launch every kernel from Python). None before the first compiled step, or uncompiled. The
        counters are the process's: another compilation meanwhile is counted too."""
        if self._counters_before is None:
            return None
        now = _compile_counters()
        return {name: now[name] - self._counters_before[name] for name in now}

    def graph_line(self) -> str | None:
        """:meth:`graph_counts` in one line (``attnlab sample --compile`` prints it), or None."""
        counts = self.graph_counts()
        if counts is None:
            return None
        cuda = "CUDA graphs" if self.device.type == "cuda" else f"no CUDA graphs on {self.device.type}"
        return (
            f"compiled decode step: {counts['graphs']} graph(s), {counts['graph_breaks']} graph breaks, "
            f"{counts['recompiles']} recompiles, {counts['cudagraph_skips']} cudagraph skips ({cuda})"
        )

    def _step(self, ids: Tensor, positions: Tensor, key_mask: Tensor) -> Tensor:
        """ids (B, 1), positions (B, 1), key_mask (B, max_len) -> next-token logits (B, V), fp32."""
        logits = self.model(ids, caches=self.static, positions=positions, key_mask=key_mask)
        return logits[:, -1].float()

    def _prefill(self, ids: Tensor, mask: Tensor, padded: bool, key_mask: Tensor) -> tuple[Tensor, Tensor]:
        """Fill the cache and ``key_mask``'s first columns from the window ``ids`` (B, W) (eagerly:
        W varies); return the last position's logits (B, V) and each row's next position (B,)."""
        key_mask.zero_()
        key_mask[:, : ids.shape[1]] = mask
        for c in self.caches:
            c.length = 0
        if padded:
            positions = (mask.long().cumsum(-1) - 1).clamp(min=0)
            logits = self.model(ids, caches=self.caches, positions=positions, key_mask=mask, last_only=True)
        else:
            logits = self.model(ids, caches=self.caches, last_only=True)
        return logits[:, -1].float(), mask.long().sum(-1)

    @torch.no_grad()
    def generate(
        self,
        ids: Tensor,
        mask: Tensor,
        max_new_tokens: int,
        pick: Callable[[Tensor], Tensor],
        *,
        eos_id: int | Sequence[int] | None = None,
        on_step: Callable[[Tensor], bool] | None = None,
    ) -> Tensor:
        """Continue the left-padded prompts ``ids`` (B, P) (``mask`` True at real tokens) by up
        to ``max_new_tokens``; ``pick(logits (B, V)) -> ids (B,)`` samples. Returns the new ids
        (B, n), n ≤ max_new_tokens. When the context fills up, the window slides to the last
        half-context, as :func:`attnlab.generate.generate` does. Reads nothing back from the device unless
        ``on_step`` does (it sees each step's ids) or ``eos_id`` (one id or several) is set (every 8
        tokens)."""
        from . import end_ids

        ends = end_ids(eos_id)
        if ids.shape[0] != self.batch:
            raise ValueError(f"this decoder was built for {self.batch} rows, got {ids.shape[0]}")
        if self.max_len < self.model.config.context and ids.shape[1] + max_new_tokens > self.max_len:
            raise ValueError(
                f"this decoder's cache holds {self.max_len} tokens, fewer than the prompt ({ids.shape[1]}) and "
                f"max_new_tokens ({max_new_tokens}); build one with max_len at least their sum"
            )
        self.model.eval()
        block, device = self.max_len, self.device
        padded = not bool(mask.all())
        prompt_len = ids.shape[1]
        # the whole text so far (prompt + new tokens), preallocated: a refill reads its last columns
        text = torch.zeros(self.batch, prompt_len + max_new_tokens, dtype=torch.long, device=device)
        real = torch.ones_like(text, dtype=torch.bool)
        text[:, :prompt_len], real[:, :prompt_len] = ids, mask
        key_mask = torch.zeros(self.batch, block, dtype=torch.bool, device=device)
        done = torch.zeros(self.batch, dtype=torch.bool, device=device)
        finished_at = torch.full((), max_new_tokens, dtype=torch.long, device=device)  # all rows at eos
        stops = torch.tensor(ends, dtype=torch.long, device=device)
        fed = min(prompt_len, block)  # the cache columns in use
        logits, position = self._prefill(ids[:, -fed:], mask[:, -fed:], padded, key_mask)
        long_from, filled_width = long_rope_from(self.model), prompt_len  # (LongRoPE: refill once past N)
        n = 0
        for i in range(max_new_tokens):
            nxt = pick(logits)
            if ends:
                nxt = torch.where(done, torch.full_like(nxt, ends[0]), nxt)
                done |= torch.isin(nxt, stops)
                finished_at = torch.where(done.all() & (finished_at == max_new_tokens), i + 1, finished_at)
            text[:, prompt_len + i] = nxt
            n = i + 1
            if on_step is not None and on_step(nxt):
                break
            if ends and (i + 1) % 8 == 0 and bool(done.all()):
                break
            if n == max_new_tokens:
                break
            end = prompt_len + n
            crossed = long_from is not None and filled_width <= long_from < end
            if fed >= block or crossed:  # a full context (or LongRoPE's switch): refill, eagerly
                fed, filled_width = (block // 2 if fed >= block else min(end, block)), end
                logits, position = self._prefill(text[:, end - fed : end], real[:, end - fed : end], padded, key_mask)
                continue
            self.columns.fill_(fed)
            key_mask[:, fed] = True
            if self.compiled and self._counters_before is None:
                self._counters_before = _compile_counters()
            logits = self.step(nxt[:, None], position[:, None], key_mask)
            position = position + 1
            fed += 1
        if ends:
            n = min(n, int(finished_at))
        return text[:, prompt_len : prompt_len + n]


def _compile_counters() -> dict[str, int]:
    """torch's process-wide compile counters that say whether a step compiled once into one graph."""
    from torch._dynamo.utils import counters

    return {
        "graphs": counters["stats"]["unique_graphs"],
        "graph_breaks": sum(counters["graph_break"].values()),
        "recompiles": sum(counters["recompiles"].values()),
        "cudagraph_skips": counters["inductor"]["cudagraph_skips"],
    }


_decoders: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def fast_decoder(model: nn.Module, batch: int, *, compile: bool = True, length: int | None = None) -> FastDecoder:
    """The :class:`FastDecoder` of ``model`` for ``batch`` rows and texts of ``length`` tokens
    (prompt and new tokens; None: the whole context), built once and kept while the model lives (a
    new one would compile again). Its cache is ``length`` rounded up to a power of two from 256 (or
    the context, when that is shorter), so that texts of similar lengths share one compiled step."""
    context = model.config.context
    max_len = context if length is None else min(context, max(256, 1 << (max(length, 1) - 1).bit_length()))
    per_model = _decoders.setdefault(model, {})
    key = (batch, compile, max_len)
    if key not in per_model:
        per_model[key] = FastDecoder(model, batch, compile=compile, max_len=max_len)
    return per_model[key]


def graph_lines(model: nn.Module) -> list[str]:
    """:meth:`FastDecoder.graph_line` of each compiled decoder ``model`` has run."""
    lines = (decoder.graph_line() for decoder in _decoders.get(model, {}).values())
    return [line for line in lines if line is not None]
