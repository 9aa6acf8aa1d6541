"""Which input made this output: integrated gradients (Sundararajan et al. 2017, computed by
captum, a well-kept library: ``pip install attnlab[interpret]``) and gradient × input, for text
(per token, at the embeddings, through the ``hook_embed`` hook point) and images (per pixel).

Integrated gradients of an output f along the straight path from a baseline x' to the input x,

    IG_i = (x_i − x'_i) · ∫₀¹ ∂f(x' + α (x − x')) / ∂x_i dα,

sum to f(x) − f(x') (completeness; captum reports the gap as its convergence delta). The
baseline x' is what "no information" means, and the attributions depend on it (Sturmfels et al.
2020, "Visualizing the impact of feature attribution baselines"): text takes zero embeddings, or
every position holding one token (``baseline=pad_id``); images the dataset's mean (zeros after
normalisation), or the image blurred (``baseline="blur"``), which keeps its colours and removes
its detail. ``steps`` points approximate the integral (more: a smaller completeness gap);
``internal_batch_size`` runs them that many at a time (memory).
"""

from __future__ import annotations

from typing import Callable

import torch
import torch.nn.functional as F
from torch import Tensor

from ..errors import OptionError
from ..options import ATTRIBUTION_METHOD, ATTRIBUTION_METHODS, ATTRIBUTION_STEPS
from .lens import check_token, require_gpt, require_vit_classifier

METHODS = ATTRIBUTION_METHODS


def _captum_ig():
    try:
        from captum.attr import IntegratedGradients
    except ImportError:
        raise OptionError(
            "integrated gradients need captum: pip install 'attnlab[interpret]' (or method='gradient_x_input')"
        ) from None
    return IntegratedGradients


def check_steps(steps, internal_batch_size=None) -> None:
    if not isinstance(steps, int) or isinstance(steps, bool) or not 1 <= steps <= 10_000:
        raise OptionError(f"steps={steps!r}: integrated gradients take 1 to 10000 steps (32 is usual)")
    if internal_batch_size is not None and (
        not isinstance(internal_batch_size, int) or isinstance(internal_batch_size, bool) or internal_batch_size < 1
    ):
        raise OptionError(
            f"internal_batch_size={internal_batch_size!r}: must be a positive integer (or None: all at once)"
        )


def attribute(
    fn: Callable[[Tensor], Tensor],
    x: Tensor,
    method: str = ATTRIBUTION_METHOD,
    steps: int = ATTRIBUTION_STEPS,
    *,
    baseline: Tensor | None = None,
    internal_batch_size: int | None = None,
):
    """Attributions (x's shape) of ``fn(x)`` (B,) to each element of x, and the completeness gap
    (B,) for integrated gradients (``None`` for gradient × input). ``baseline``: x' (x's shape;
    default zeros); ``internal_batch_size``: path points evaluated at once (default all ``steps``)."""
    if method not in METHODS:
        raise OptionError(f"attribution method {method!r}: choose one of {', '.join(METHODS)}")
    check_steps(steps, internal_batch_size)
    if baseline is not None and baseline.shape != x.shape:
        raise OptionError(f"the baseline has shape {tuple(baseline.shape)}; it must have the input's {tuple(x.shape)}")
    if method == "gradient_x_input":
        x = x.detach().requires_grad_(True)
        (grad,) = torch.autograd.grad(fn(x).sum(), x)
        return (grad * x).detach(), None
    ig = _captum_ig()(fn)
    baseline = torch.zeros_like(x) if baseline is None else baseline.to(x)
    attr, delta = ig.attribute(
        x, baselines=baseline, n_steps=steps, internal_batch_size=internal_batch_size, return_convergence_delta=True
    )
    return attr.detach(), delta.detach()


def blurred(images: Tensor, sigma: float | None = None) -> Tensor:
    """images (B, C, H, W) under a Gaussian blur of ``sigma`` pixels (default H/8), reflecting at
    the edges: the "blurred" integrated-gradients baseline."""
    sigma = sigma or max(1.0, images.shape[-2] / 8)
    radius = max(1, min(int(3 * sigma), min(images.shape[-2:]) - 1))
    t = torch.arange(-radius, radius + 1, dtype=images.dtype, device=images.device)
    kernel = torch.exp(-(t**2) / (2 * sigma**2))
    kernel = kernel / kernel.sum()
    c = images.shape[1]
    x = F.pad(images, (radius, radius, radius, radius), mode="reflect")
    x = F.conv2d(x, kernel.view(1, 1, 1, -1).expand(c, 1, 1, -1), groups=c)  # along the width
    return F.conv2d(x, kernel.view(1, 1, -1, 1).expand(c, 1, -1, 1), groups=c)  # along the height


def text_attributions(
    model,
    idx: Tensor,
    target: int,
    *,
    position: int = -1,
    method: str = ATTRIBUTION_METHOD,
    steps: int = ATTRIBUTION_STEPS,
    baseline: int | None = None,
    internal_batch_size: int | None = None,
) -> dict:
    """A GPT's ``target`` token logit at ``position`` (B rows of idx (B, T)), attributed to each
    input token at the embeddings (tokens + positions): {"tokens": (B, T) per-token sums,
    "delta": completeness gap (B,) or None}. ``baseline``: None for zero embeddings, or a token
    id: the embeddings of that token at every position (a pad or space token: "no text here")."""
    require_gpt(model, "text_attributions (other text models: attribute() with your own function)")
    check_token(model, target)
    _, cache = model.run_with_cache(idx, names="hook_embed")
    embeds = cache["hook_embed"]
    base = None
    if baseline is not None:
        check_token(model, baseline)
        _, base_cache = model.run_with_cache(torch.full_like(idx, baseline), names="hook_embed")
        base = base_cache["hook_embed"]

    def fn(e: Tensor) -> Tensor:  # the logit with the embeddings replaced by e (captum stacks the path along B)
        ids = idx.repeat(e.shape[0] // idx.shape[0], 1)
        with model.hooks([("hook_embed", lambda x, hook: e)]):
            return model(ids)[:, position, target]

    attr, delta = attribute(fn, embeds, method, steps, baseline=base, internal_batch_size=internal_batch_size)
    return {"tokens": attr.sum(-1), "delta": delta}


IMAGE_BASELINES = ("zeros", "blur")


def image_baseline(images: Tensor, baseline: str | Tensor | None) -> Tensor | None:
    """The integrated-gradients baseline for normalised ``images``: None or "zeros" (the dataset's
    mean), "blur" (:func:`blurred`), or a tensor of the images' shape."""
    if baseline is None or isinstance(baseline, Tensor):
        return baseline
    if baseline == "zeros":
        return None
    if baseline == "blur":
        return blurred(images)
    raise OptionError(f"image baseline {baseline!r}: choose one of {', '.join(IMAGE_BASELINES)} (or give a tensor)")


def image_attributions(
    model,
    images: Tensor,
    target: int,
    *,
    method: str = ATTRIBUTION_METHOD,
    steps: int = ATTRIBUTION_STEPS,
    baseline: str | Tensor | None = None,
    internal_batch_size: int | None = None,
) -> dict:
    """An image classifier's ``target`` class logit attributed to each pixel of ``images``
    (B, C, H, W, normalised as the model reads them): {"pixels": (B, H, W) summed over channels,
    "delta": completeness gap (B,) or None}; ``baseline``: :func:`image_baseline`."""
    classes = getattr(model.config, "num_classes", 0)
    if not 0 <= target < classes:
        raise OptionError(f"class {target} is not one of the model's {classes} classes")
    base = image_baseline(images, baseline)
    attr, delta = attribute(
        lambda x: model(x)[:, target], images, method, steps, baseline=base, internal_batch_size=internal_batch_size
    )
    return {"pixels": attr.sum(1), "delta": delta}


def caption_attributions(
    model,
    images: Tensor,
    caption: list[int],
    *,
    positions: list[int] | None = None,
    method: str = ATTRIBUTION_METHOD,
    steps: int = ATTRIBUTION_STEPS,
) -> dict:
    """A captioner's logit of each word of ``caption`` (word ids without specials, fed to the
    decoder as its input: teacher forcing) at the step that writes it, attributed to each pixel of
    ``images`` (1, 3, H, W, normalised as the model reads them): {"pixels": (P, H, W) summed over
    channels, "delta": (P,) or None} for the words at ``positions`` (default: every word).
    Where attention says what the decoder looked at, this says which pixels changed its mind."""
    if getattr(model, "model_type", None) != "captioner":
        raise OptionError("caption attributions read an image captioner")
    c = model.config
    if not 0 < len(caption) < c.context:
        raise OptionError(f"the caption must hold 1 to {c.context - 1} words, got {len(caption)}")
    if any(not 0 <= w < c.vocab_size for w in caption):
        raise OptionError(f"caption word ids must lie in 0..{c.vocab_size - 1}")
    positions = list(range(len(caption))) if positions is None else positions
    if any(not 0 <= t < len(caption) for t in positions):
        raise OptionError(f"positions must lie in 0..{len(caption) - 1} (one per word)")
    tgt_in = torch.tensor([[c.bos_id, *caption]], device=images.device)  # (1, T + 1)
    maps, deltas = [], []
    for t in positions:

        def fn(x: Tensor, t: int = t) -> Tensor:  # the logit of word t at the step that writes it
            return model(x, tgt_in.expand(x.shape[0], -1))[:, t, caption[t]]

        attr, delta = attribute(fn, images, method, steps)
        maps.append(attr[0].sum(0))
        deltas.append(delta)
    return {"pixels": torch.stack(maps), "delta": None if deltas[0] is None else torch.cat(deltas)}


def gradient_rollout(model, images: Tensor, target: int) -> Tensor:
    """Class-specific, gradient-weighted attention rollout of a ViT (Chefer et al. 2021, "Generic
    attention-model explainability"): with each block's attention A (B, H, T, T) and the gradient
    ∇A of the ``target`` class logit,

        Ā = mean over heads of (∇A ⊙ A)⁺,    R ← R + Ā R   (R starts as the identity, block by block)

    and the class token's row of R over the patches is the relevance map: (B, gh, gw). Unlike
    plain rollout, it differs from class to class."""
    require_vit_classifier(model, "gradient-weighted rollout")
    if model.config.pool != "cls":
        raise OptionError("gradient-weighted rollout follows the class token; this ViT pools by mean")
    if not 0 <= target < model.config.num_classes:
        raise OptionError(f"class {target} is not one of the model's {model.config.num_classes} classes")
    with model.caching("encoder.blocks.*.attn.hook_pattern", detach=False) as cache:
        logits = model(images)
    patterns = cache.layers("attn.hook_pattern")  # [(B, H, T, T)] first block first
    grads = torch.autograd.grad(logits[:, target].sum(), patterns)
    b, _, t, _ = patterns[0].shape
    relevance = torch.eye(t, device=images.device, dtype=patterns[0].dtype).expand(b, t, t).clone()
    for a, g in zip(patterns, grads):
        weighted = (g * a).clamp(min=0).mean(1).detach()  # (B, T, T)
        relevance = relevance + weighted @ relevance
    gh, gw = model.config.grid
    return relevance[:, 0, model.n_prefix :].reshape(b, gh, gw)
