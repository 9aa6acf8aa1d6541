"""Autoregressive sampling: x_{t+1} ~ softmax(f(x_1..x_t) / temperature), one token at a time.

With the KV cache each step feeds only the newest token: the keys and values of the
earlier ones are kept, so a step costs O(T) instead of re-running the whole prefix.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch
from torch import Tensor, nn

__all__ = ["sample_next", "generate", "generate_text"]


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
    if temperature == 0:
        return logits.argmax(-1)
    logits = logits.float() / temperature
    if top_k is not None and top_k > 0:
        kth = torch.topk(logits, min(top_k, logits.shape[-1]), dim=-1).values[..., -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if top_p is not None and top_p < 1:
        # nucleus: keep the smallest set of tokens whose probability adds up to top_p
        sorted_logits, order = logits.sort(dim=-1, descending=True)
        cum = sorted_logits.softmax(-1).cumsum(-1)
        drop_sorted = cum - sorted_logits.softmax(-1) >= top_p  # mass before this token already >= p
        drop = drop_sorted.scatter(-1, order, drop_sorted)
        logits = logits.masked_fill(drop, float("-inf"))
    probs = logits.softmax(-1)
    return torch.multinomial(probs, 1, generator=generator).squeeze(-1)


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
    eos_id: int | None = None,
    generator: torch.Generator | None = None,
    on_step: Callable[[Tensor], bool] | None = None,
) -> list[list[int]]:
    """Continue each prompt by up to ``max_new_tokens`` tokens; returns prompt + continuation.

    Prompts may differ in length (they are left-padded, padding is masked out and positions
    count real tokens only). ``on_step(next_ids)`` is called after each step; returning
    True stops early. A row stops at ``eos_id``. When the context fills up, the window
    slides: the cache is refilled from the last half-context of tokens.
    """
    model.eval()
    device = next(model.parameters()).device
    if isinstance(prompts, Tensor):
        prompts = prompts.tolist()
    ids, mask = _left_pad(prompts, 0, device)
    padded = not bool(mask.all())
    block = model.config.context
    done = torch.zeros(ids.shape[0], dtype=torch.bool, device=device)
    caches, fed = None, 0  # fed: how many columns of ids the cache holds
    for _ in range(max_new_tokens):
        if use_cache:
            if caches is None or fed >= block:  # (re)fill from the window that fits
                keep = min(ids.shape[1], block if caches is None else block // 2)
                ids_w, mask_w = ids[:, -keep:], mask[:, -keep:]
                caches = model.new_caches(ids.shape[0], block)
                logits = _forward(model, ids_w, mask_w, padded, caches, start=0)
                fed = keep
            else:
                logits = _forward(model, ids[:, -1:], mask[:, -fed - 1 :], padded, caches, start=fed)
                fed += 1
        else:
            logits = _forward(model, ids[:, -block:], mask[:, -block:], padded, None, start=0)
        nxt = sample_next(logits[:, -1], temperature=temperature, top_k=top_k, top_p=top_p, generator=generator)
        if eos_id is not None:
            nxt = torch.where(done, torch.full_like(nxt, eos_id), nxt)
            done |= nxt == eos_id
        ids = torch.cat([ids, nxt[:, None]], dim=1)
        mask = torch.cat([mask, torch.ones_like(mask[:, :1])], dim=1)
        if on_step is not None and on_step(nxt):
            break
        if eos_id is not None and bool(done.all()):
            break
    out = []
    for row, m in zip(ids.tolist(), mask.tolist()):
        seq = [t for t, keep in zip(row, m) if keep]
        out.append(seq)
    return out


def _forward(model, ids, mask, padded, caches, start):
    """One forward over ``ids``; ``mask`` covers every key the attention sees."""
    if not padded:
        return model(ids, caches=caches)
    positions = (mask.long().cumsum(-1) - 1).clamp(min=0)[:, -ids.shape[1] :]  # (B, T)
    return model(ids, caches=caches, positions=positions, key_mask=mask)


def generate_text(
    model: nn.Module,
    tokenizer,
    prompt: str | Sequence[str],
    max_new_tokens: int = 200,
    *,
    stop: Sequence[str] = (),
    stream: Callable[[str], None] | None = None,
    **kw,
) -> list[str]:
    """Text in, text out. ``stop`` strings end a sample (they are cut from the result).
    ``stream`` receives the new text of the first sample as it is generated."""
    prompts = [prompt] if isinstance(prompt, str) else list(prompt)
    encoded = [tokenizer.encode(p) for p in prompts]
    new: list[list[int]] = [[] for _ in prompts]
    shown = [""]

    def on_step(nxt: Tensor) -> bool:
        for i, t in enumerate(nxt.tolist()):
            new[i].append(t)
        if stream is not None:
            text = _held_back(_cut(tokenizer.decode(new[0]), stop), stop)
            if not text.endswith("\ufffd") and len(text) > len(shown[0]):  # (wait for a whole character)
                stream(text[len(shown[0]) :])
                shown[0] = text
        return bool(stop) and all(any(s in tokenizer.decode(n) for s in stop) for n in new)

    generate(model, encoded, max_new_tokens, on_step=on_step, **kw)
    texts = [_cut(tokenizer.decode(n), stop) for n in new]
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


def _cut(text: str, stop: Sequence[str]) -> str:
    cut = min((text.find(s) for s in stop if s and s in text), default=-1)
    return text if cut < 0 else text[:cut]
