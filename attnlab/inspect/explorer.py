"""The attention explorer: the numbers behind each view (a Python API a notebook can use), and one
self-contained HTML page that shows them (no CDN, no server; opens from disk).

    text_attention(model, tokenizer, text)         GPT: (L, H, T, T) self-attention + next-token top-k
    image_attention(model, image, mean, std)       ViT: (L, H, T, T), class-token rows, rollout, distances
    cross_attention(model, src_vocab, tgt_vocab, src, tgt=None)   seq2seq: (L, H, T_tgt, T_src)

File size stays bounded: a head's matrix is stored densely (uint16, 2 bytes per weight) while
T ≤ ``DENSE_MAX``; past that only the ``TOP_K`` largest weights of each row are kept (4 bytes
each), so a page holds about L·H·T·min(T, TOP_K)·4 bytes before base64 (a 1,024-token GPT with
4 layers of 4 heads: 2 MiB). Heads are decoded in the page when first shown.
"""

from __future__ import annotations

import base64
import io
import json
from pathlib import Path

import numpy as np
import torch

from . import analysis as A
from .capture import capture_attention

DENSE_MAX = 256
TOP_K = 32


def stack_layers(rec) -> np.ndarray:
    """An attention record of one input -> (L, H, Tq, Tk), first layer first."""
    return torch.stack([w[0] for w in rec.layers()]).float().cpu().numpy()


@torch.no_grad()
def text_attention(model, tokenizer, text: str, top_k: int = 10, generate: int = 0, sae=None) -> dict:
    """A GPT's self-attention over ``text``: tokens, attention (L, H, T, T) and, at every position,
    the ``top_k`` next tokens with their probabilities. ``generate``: first continue the text by
    that many greedy tokens (``generated_from`` says where they start); under the causal mask
    each generated token's row is the attention it had when it was produced. ``sae``: a sparse
    autoencoder (:mod:`attnlab.inspect.sae`) whose most active latents at each position the page
    lists (``sae``: {"hook", "latents": per position [(latent, activation)], up to 8})."""
    ids = tokenizer.encode(text)
    if not ids:
        raise ValueError("the text is empty: give some text to look at")
    prompt_len = len(ids)
    if generate:
        from ..generate import generate as continue_ids

        if len(ids) + generate > model.config.context:
            raise ValueError(
                f"the text ({len(ids)} tokens) and {generate} generated tokens exceed the model's context of "
                f"{model.config.context}; generate fewer"
            )
        with torch.no_grad():
            ids = continue_ids(model, [ids], generate, temperature=0)[0]
    if len(ids) > model.config.context:
        raise ValueError(
            f"the text has {len(ids)} tokens, more than the model's context of {model.config.context}; shorten it"
        )
    from .detectors import pattern_scores
    from .lens import lens_logits, lens_points

    x = torch.tensor([ids], device=next(model.parameters()).device)
    # one forward pass feeds every view: the patterns, the logit lens and, for short texts, the
    # neuron view's q, k and scores (q·k/√d_k + position bias, masked keys at −inf)
    neuron = x.shape[1] <= NEURON_VIEW_MAX
    names = ["blocks.*.attn.hook_pattern", *lens_points(model), *(neuron_view_points("blocks") if neuron else [])]
    if sae is not None:
        names.append(sae.config.hook)
    with torch.no_grad():
        logits, cache = model.run_with_cache(x, names=names)
        patterns = torch.stack(cache.layers("attn.hook_pattern"))  # (L, 1, H, T, T)
        lens = lens_logits(model, cache)[:, 0].float().softmax(-1).max(-1)  # each layer's top guess (L + 1, T)
    probs = logits[0].float().softmax(-1)
    top = probs.topk(min(top_k, probs.shape[-1]), dim=-1)
    tokens = [tokenizer.decode([i]) for i in ids]
    names = [[tokenizer.decode([int(i)]) for i in row] for row in top.indices.cpu()]
    layers = lambda hook: torch.stack(cache.layers(hook))[:, 0].float().cpu().numpy()  # noqa: E731  (L, ...)
    return {
        "kind": "text",
        "tokens": tokens,
        "attention": layers("attn.hook_pattern"),
        "next_tokens": names,
        "next_probs": top.values.cpu().numpy(),
        "lens_tokens": [[tokenizer.decode([int(i)]) for i in row] for row in lens.indices.cpu()],
        "lens_probs": lens.values.cpu().numpy(),
        "detectors": {k: v.numpy() for k, v in pattern_scores(patterns, x).items()},  # on this text: (L, H)
        "generated_from": prompt_len if generate else None,
        **(neuron_view(cache) if neuron else {}),
        **({"sae": sae_view(sae, cache)} if sae is not None else {}),
    }


@torch.no_grad()
def sae_view(sae, cache, top: int = 8) -> dict:
    """The most active latents of ``sae`` at each position of a one-sequence cache."""
    latents = sae.encode(cache[sae.config.hook][0].float().to(sae.W_dec.device)).cpu()  # (T, d_sae)
    best = latents.topk(min(top, latents.shape[-1]), dim=-1)
    return {
        "hook": sae.config.hook,
        "latents": [
            [(int(i), round(float(v), 4)) for v, i in zip(vals, idx) if v > 0]
            for vals, idx in zip(best.values, best.indices)
        ],
    }


NEURON_VIEW_MAX = 128  # tokens; beyond it the page would carry q, k and scores for every head


def neuron_view_points(prefix: str) -> list[str]:
    """The hook points the neuron view reads, for the blocks under ``prefix``."""
    return [f"{prefix}.*.attn.hook_q", f"{prefix}.*.attn.hook_k", f"{prefix}.*.attn.hook_scores"]


def neuron_view(cache) -> dict[str, np.ndarray]:
    """The neuron view's data from a cache of one sequence: q and k (L, H, T, d_k) and the scores
    q·k/√d_k (+ any position bias; masked keys at −inf) (L, H, T, T)."""
    return {
        name: torch.stack(cache.layers(f"attn.hook_{name}"))[:, 0].float().cpu().numpy()
        for name in ("q", "k", "scores")
    }


@torch.no_grad()
def image_attention(model, image: torch.Tensor, mean, std) -> dict:
    """A ViT's self-attention over one image ((C, H, W) in [0, 1]): attention (L, H, T, T), the
    patch grid, attention rollout (head fusion × discard ratio) from the class token (or the mean
    token without one), and the mean attention distance per layer and head."""
    from ..data.images import normalize

    x = normalize(image[None], mean, std).to(next(model.parameters()).device)
    with capture_attention(model) as rec:
        model(x)
    ordered = rec.layers()
    att = torch.stack([m[0] for m in ordered]).float()  # (L, H, T, T)
    npre, grid = model.n_prefix, model.grid
    rollout = {}
    for fusion in ("mean", "max", "min"):
        for discard in (0.0, 0.5, 0.9):
            r = A.rollout(ordered, fusion, discard, n_prefix=npre)[0]
            src = r[0, npre:] if npre else r.mean(0)
            rollout[f"{fusion}/{discard}"] = torch.nan_to_num(src / src.max().clamp_min(1e-12)).cpu().numpy()
    dist = torch.stack([A.mean_attention_distance(m, grid, model.config.patch_size, npre) for m in ordered])
    return {
        "kind": "image",
        "image": image.cpu().numpy(),
        "grid": list(grid),
        "n_prefix": npre,
        "patch_size": model.config.patch_size,
        "attention": att.cpu().numpy(),
        "rollout": rollout,
        "distance": dist.cpu().numpy(),
    }


@torch.no_grad()
def cross_attention(model, src_vocab, tgt_vocab, src: str, tgt: str | None = None) -> dict:
    """A seq2seq model's cross-attention: every decoder layer and head (L, H, T_tgt, T_src) for the
    translation of ``src`` (or for the given target ``tgt``, teacher-forced)."""
    from ..data.parallel import pad_batch
    from ..generate.beam import greedy_decode

    ids = src_vocab.encode(src)[: model.config.context]
    if not ids:
        raise ValueError("the source sentence is empty: give one to translate")
    device = next(model.parameters()).device
    s, mask = pad_batch([ids], src_vocab.pad_id)
    s, mask = s.to(device), mask.to(device)
    out = (
        tgt_vocab.encode(tgt)[: model.config.context - 1]
        if tgt
        else greedy_decode(model, s, mask, max_len=min(100, model.config.context - 1))[0]
    )
    tgt_in = torch.tensor([[model.config.bos_id] + out], device=device)
    name = lambda v, i: v.tokenizer.decode([i]) if v.tokenizer.kind == "bpe" else v.tokenizer.itos[i]  # noqa: E731
    if getattr(model.config, "attention", None) == "none":
        raise ValueError("this RNN has no attention (attention='none'), so it has no alignment to draw")
    # the Transformer's decoder cross-attention per layer and head; an RNN's alignment is one layer of one head
    transformer = bool(model.hook_points("*.cross_attn.hook_pattern"))
    with capture_attention(model, include="cross_attn" if transformer else None) as rec:
        model(s, tgt_in, mask)
    att = stack_layers(rec)
    data = {
        "kind": "cross",
        "source": [name(src_vocab, i) for i in ids],
        "target": [name(tgt_vocab, i) for i in out] + ["<eos>"],
        "attention": att,
    }
    if transformer:  # the model view of all three attentions: encoder self, decoder self (and cross, above)
        names = ["encoder.blocks.*.attn.hook_pattern", "decoder.blocks.*.self_attn.hook_pattern"]
        _, cache = model.run_with_cache(s, tgt_in, mask, names=names)
        for key, prefix in (("encoder_self", "encoder.blocks."), ("decoder_self", "decoder.blocks.")):
            maps = [v[0] for k, v in cache.items() if k.startswith(prefix)]
            data[key] = torch.stack(maps).float().cpu().numpy()  # (L, H, T, T)
    return data


# ---- the page --------------------------------------------------------------------------------------
def _b64(a: np.ndarray) -> str:
    return base64.b64encode(np.ascontiguousarray(a).tobytes()).decode("ascii")


def encode_head(w: np.ndarray) -> dict:
    """One head's (Tq, Tk) weights for the page: dense uint16 while Tk ≤ DENSE_MAX, else the
    TOP_K largest of each row as (uint16 index, uint16 weight) pairs, with the mass each row
    drops (1 − the kept weights), which the page and its JSON state."""
    tq, tk = w.shape
    q = np.clip(np.rint(w * 65535), 0, 65535).astype("<u2")
    if tk <= DENSE_MAX:
        return {"dense": _b64(q)}
    k = min(TOP_K, tk)
    idx = np.argsort(-w, axis=1, kind="stable")[:, :k]
    vals = np.take_along_axis(q, idx, axis=1)
    dropped = np.clip(1.0 - np.take_along_axis(w, idx, axis=1).sum(1), 0.0, 1.0)
    return {
        "topk": k,
        "index": _b64(idx.astype("<u2")),
        "value": _b64(vals),
        "dropped": _b64(np.rint(dropped * 65535).astype("<u2")),
    }


def _png_data_url(image: np.ndarray) -> str:
    from PIL import Image

    a = np.clip(image.transpose(1, 2, 0) * 255, 0, 255).astype(np.uint8)
    img = Image.fromarray(a[..., 0] if a.shape[2] == 1 else a)
    buf = io.BytesIO()
    img.save(buf, format="PNG")
    return "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode("ascii")


def page_payload(data: dict, title: str) -> dict:
    """The JSON the page reads: everything but the attention, plus each head encoded."""
    att = data["attention"]
    payload = {
        "kind": data["kind"],
        "title": title,
        "layers": int(att.shape[0]),
        "heads": int(att.shape[1]),
        "tq": int(att.shape[2]),
        "tk": int(att.shape[3]),
        "attention": [[encode_head(att[layer, head]) for head in range(att.shape[1])] for layer in range(att.shape[0])],
        # past DENSE_MAX keys a row keeps its TOP_K largest weights: said on the page and in its JSON
        "top_k": TOP_K if att.shape[3] > DENSE_MAX else None,
    }
    for key in ("encoder_self", "decoder_self"):  # a Transformer's other two attentions (cross is the default)
        if key in data:
            a = data[key]
            payload.setdefault("views", {})[key] = {
                "layers": int(a.shape[0]),
                "heads": int(a.shape[1]),
                "tq": int(a.shape[2]),
                "tk": int(a.shape[3]),
                "attention": [
                    [encode_head(a[layer, head]) for head in range(a.shape[1])] for layer in range(a.shape[0])
                ],
            }
    if data["kind"] == "text":
        payload.update(tokens=data["tokens"])
        if "next_tokens" in data:  # a GPT: what it predicts at each position
            payload.update(next_tokens=data["next_tokens"], next_probs=np.round(data["next_probs"], 5).tolist())
        if "q" in data:  # the neuron view: q, k and the scores of every head
            payload.update(
                q=np.round(data["q"], 4).tolist(),
                k=np.round(data["k"], 4).tolist(),
                scores=np.round(np.where(np.isfinite(data["scores"]), data["scores"], -1e9), 4).tolist(),
            )
        if data.get("generated_from") is not None:  # tokens from here on were generated by the model
            payload.update(generated_from=int(data["generated_from"]))
        if "detectors" in data:  # head-detector scores on this text, per layer and head
            payload.update(detectors={k: np.round(v, 4).tolist() for k, v in data["detectors"].items()})
        if "lens_tokens" in data:  # the logit lens: each layer's top next token at each position
            payload.update(lens_tokens=data["lens_tokens"], lens_probs=np.round(data["lens_probs"], 5).tolist())
        if "sae" in data:  # a sparse autoencoder's most active latents at each position
            payload.update(sae=data["sae"])
    elif data["kind"] == "image":
        payload.update(
            image=_png_data_url(data["image"]),
            grid=data["grid"],
            n_prefix=data["n_prefix"],
            rollout={k: np.round(v, 5).tolist() for k, v in data["rollout"].items()},
            distance=np.round(data["distance"], 4).tolist(),
            patch_size=data["patch_size"],
        )
    else:
        payload.update(source=data["source"], target=data["target"])
    return payload


class Exploration(dict):
    """The numbers behind the explorer's views (attention per layer and head, ...): shown inline in
    Jupyter, written as one offline HTML page by :meth:`save`."""

    def __init__(self, data: dict, title: str = "attnlab explorer") -> None:
        super().__init__(data)
        self.title = title

    def html(self) -> str:
        return page_html(dict(self), self.title)

    def save(self, path: str | Path) -> Path:
        """Write the self-contained page (it opens from disk, with no network)."""
        return write_page(dict(self), path, self.title)

    def _repr_html_(self) -> str:
        # the page in a sandboxed frame of its own, so that its script and styles stay its own
        import html

        return (
            f'<iframe srcdoc="{html.escape(self.html())}" style="width:100%;height:760px;border:0" '
            'sandbox="allow-scripts allow-downloads"></iframe>'
        )

    def show(self) -> None:
        """Display inline in a notebook."""
        try:
            from IPython.display import HTML, display
        except ImportError:
            raise ValueError("show() needs IPython (a notebook); outside one, use .save('page.html')") from None
        display(HTML(self._repr_html_()))


def page_html(data: dict, title: str) -> str:
    """The self-contained explorer page for ``data`` (from one of the functions above), as HTML text:
    ``explorer.html`` (HTML, CSS and JavaScript, no external resource) with the data in place of
    ``__DATA__``. Its views draw on canvases; a head's weights are decoded from base64 the first
    time it is shown. Its element ``#status`` mirrors what is selected (data-layer, data-head,
    data-query, data-top: the most attended positions, best first), so that tests and scripts can
    read the page's state."""
    from importlib import resources

    template = resources.files(__package__).joinpath("explorer.html").read_text(encoding="utf-8")
    payload = json.dumps(page_payload(data, title), separators=(",", ":"), allow_nan=False).replace("</", "<\\/")
    return template.replace("__TITLE__", title.replace("<", "&lt;")).replace("__DATA__", payload)


def write_page(data: dict, path: str | Path, title: str) -> Path:
    """Write :func:`page_html` to ``path`` (atomically)."""
    from ..outputs import atomic_write_text

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    return atomic_write_text(path, page_html(data, title))
