"""Interventions through the hook points: ablating heads, MLP neurons and whole sublayers, and
activation patching from a clean run into a corrupted one (Meng et al. 2022; Wang et al. 2022),
the way TransformerLens's ``patching`` measures where a behaviour lives. Models with an encoder
and a decoder are intervened on in their encoder (``encoder.blocks``).

Patching: run the model on a *clean* input and keep its activations; run it on a *corrupted*
input (one that changes the answer) with one activation replaced by its clean value; the metric
(say the logit difference between the right and the wrong answer) says how much of the clean
behaviour that one activation restores:

    restored = (metric(patched) − metric(corrupt)) / (metric(clean) − metric(corrupt))

1 at a place that carries everything the answer needs, 0 where patching changes nothing. The
fraction is only as meaningful as its denominator: when clean and corrupted runs barely differ
(a span below ``SMALL_SPAN``), a fraction of +4 is noise magnified, and the report says so.
"""

from __future__ import annotations

import warnings
from contextlib import contextmanager
from typing import Callable

import torch
from torch import Tensor

from ..errors import OptionError
from ..options import PATCH_TARGETS

Metric = Callable[[Tensor], Tensor]  # logits -> one number per batch row (B,)

# A clean − corrupt span of the metric (a logit difference or a log-probability: nats) below which
# the restored fractions mostly measure noise: patching then warns.
SMALL_SPAN = 0.1


def patching_span(model, clean: tuple, corrupt: tuple, metric: Metric) -> dict[str, float]:
    """The metric on the clean and the corrupted input (batch means) and their difference, the
    denominator of every restored fraction: {"clean", "corrupt", "span"}."""
    with torch.no_grad():
        m_clean, m_corrupt = metric(model(*clean)).mean(), metric(model(*corrupt)).mean()
    return {"clean": float(m_clean), "corrupt": float(m_corrupt), "span": float(m_clean - m_corrupt)}


def span_note(span: float) -> str:
    """What the report says about the denominator: its value, and a warning when it is small."""
    note = f"clean − corrupt = {span:+.4f}: each fraction is (patched − corrupt) / {span:+.4f}"
    if abs(span) < SMALL_SPAN:
        note += (
            f"; warning: that span is below {SMALL_SPAN} (the two inputs barely differ on this metric), "
            "so the fractions magnify noise: corrupt the input more"
        )
    return note


def logit_difference(answer: int, wrong: int | None = None, position: int = -1) -> Metric:
    """logit[answer] − logit[wrong] at ``position`` (or the answer's log-probability without ``wrong``)."""

    def metric(logits: Tensor) -> Tensor:
        last = logits[:, position] if logits.dim() == 3 else logits
        if wrong is None:
            return last.float().log_softmax(-1)[:, answer]
        return (last[:, answer] - last[:, wrong]).float()

    return metric


def parse_heads(text: str, what: str = "head") -> list[tuple[int, int]]:
    """``"0.1,2.3"`` -> [(0, 1), (2, 3)] (LAYER.HEAD, or LAYER.NEURON for ``what="neuron"``)."""
    pairs = []
    for item in text.split(","):
        layer, _, index = item.strip().partition(".")
        if not (layer.isdigit() and index.isdigit()):
            raise OptionError(
                f"{what} {item.strip()!r}: write {what}s as LAYER.{what.upper()}, comma-separated (0.1,2.3)"
            )
        pairs.append((int(layer), int(index)))
    return pairs


def parse_sublayers(text: str) -> list[tuple[int, str]]:
    """``"0.attn,1.mlp"`` -> [(0, "attn"), (1, "mlp")]."""
    out = []
    for item in text.split(","):
        layer, _, part = item.strip().partition(".")
        if not (layer.isdigit() and part in ("attn", "mlp")):
            raise OptionError(
                f"sublayer {item.strip()!r}: write LAYER.attn or LAYER.mlp, comma-separated (0.attn,1.mlp)"
            )
        out.append((int(layer), part))
    return out


def parse_parts(text: str) -> dict[str, list]:
    """What to ablate, comma-separated: ``L.H`` a head, ``L.mlp.N`` one MLP neuron, ``L.attn`` or
    ``L.mlp`` a whole sublayer's output -> {"heads": [(L, H)], "neurons": [(L, N)], "outputs":
    [(L, "attn" | "mlp")]}, the keyword arguments of :func:`ablated`; :func:`describe_parts`
    writes them back."""
    parts: dict[str, list] = {"heads": [], "neurons": [], "outputs": []}
    for item in text.split(","):
        fields = item.strip().split(".")
        if len(fields) == 3 and fields[1] == "mlp":
            parts["neurons"] += parse_heads(f"{fields[0]}.{fields[2]}", "neuron")
        elif len(fields) == 2 and fields[1] in ("attn", "mlp"):
            parts["outputs"] += parse_sublayers(item)
        elif len(fields) == 2:
            parts["heads"] += parse_heads(item)
        else:
            raise OptionError(
                f"{item.strip()!r}: ablate LAYER.HEAD (a head), LAYER.mlp.NEURON (a neuron) or LAYER.attn / "
                "LAYER.mlp (a sublayer), comma-separated (0.1,1.mlp.17,1.attn)"
            )
    return parts


def describe_parts(parts: dict[str, list]) -> str:
    """The text of :func:`parse_parts` for its result."""
    items = [f"{layer}.{head}" for layer, head in parts.get("heads", ())]
    items += [f"{layer}.mlp.{n}" for layer, n in parts.get("neurons", ())]
    items += [f"{layer}.{part}" for layer, part in parts.get("outputs", ())]
    return ",".join(items)


def check_parts(model, heads=(), neurons=(), outputs=(), how: str = "zero") -> None:
    """Refuse an ablation of parts ``model`` does not have (see :func:`ablated`), before any work."""
    if how not in ("zero", "mean"):
        raise OptionError(f"ablation {how!r}: choose zero or mean")
    check_heads(model, list(heads))
    blocks = _blocks(model)
    for layer, index in neurons:
        check_heads(model, [(layer, 0)])
        mlp = blocks[layer].mlp
        width = mlp.fc.out_features if mlp is not None else 0
        if not 0 <= index < width:
            raise OptionError(f"neuron {layer}.mlp.{index} does not exist: layer {layer}'s MLP has {width} neurons")
    for layer, part in outputs:
        check_heads(model, [(layer, 0)])
        if part not in ("attn", "mlp") or (part == "mlp" and blocks[layer].mlp is None):
            raise OptionError(f"output {layer}.{part}: give attn or mlp (of a block that has one)")
    if not (heads or neurons or outputs):
        raise OptionError("nothing to ablate: name heads (L.H), neurons (L.mlp.N) or sublayers (L.attn, L.mlp)")


def check_heads(model, heads: list[tuple[int, int]]) -> None:
    """Refuse heads that are not in ``model`` (one line, naming the model's size)."""
    blocks = _blocks(model)
    for layer, head in heads:
        if not 0 <= layer < len(blocks):
            raise OptionError(f"layer {layer} does not exist: the model has layers 0-{len(blocks) - 1}")
        n = blocks[layer].attn.n_heads
        if not 0 <= head < n:
            raise OptionError(f"head {layer}.{head} does not exist: layer {layer} has heads 0-{n - 1}")


def _blocks(model):
    blocks = model
    for part in block_prefix(model).split("."):
        blocks = getattr(blocks, part, None)
    if blocks is None:
        raise OptionError(f"{type(model).__name__} has no stack of attention blocks to intervene on")
    return blocks


def block_prefix(model) -> str:
    """Where a model's attention blocks are: ``blocks`` (GPT) or ``encoder.blocks`` (the others)."""
    return "blocks" if hasattr(model, "blocks") else "encoder.blocks"


@contextmanager
def ablated(
    model,
    heads: list[tuple[int, int]] = (),
    how: str = "zero",
    reference: tuple | None = None,
    *,
    neurons: list[tuple[int, int]] = (),
    outputs: list[tuple[int, str]] = (),
):
    """Within the block, parts of the model write nothing (``how="zero"``) or their mean value
    (``how="mean"``) over the ``reference`` inputs (the positional arguments of one forward pass),
    or, without ``reference``, over each forward pass's own batch and positions:

    ``heads`` (layer, head): a head's output (``attn.hook_z``); ``neurons`` (layer, index): one
    MLP neuron after its activation (``mlp.hook_post``); ``outputs`` (layer, "attn" | "mlp"): a
    whole sublayer's contribution to the residual stream (``hook_attn_out`` / ``hook_mlp_out``)."""
    check_parts(model, heads, neurons, outputs, how)
    prefix = block_prefix(model)
    targets: dict[str, list[tuple]] = {}  # hook point -> the indices to replace there
    for layer, head in heads:
        targets.setdefault(f"{prefix}.{layer}.attn.hook_z", []).append((slice(None), head))  # z[:, h] (B, T, d)
    for layer, index in neurons:
        targets.setdefault(f"{prefix}.{layer}.mlp.hook_post", []).append((Ellipsis, index))  # (B, T)
    for layer, part in outputs:
        targets.setdefault(f"{prefix}.{layer}.hook_{part}_out", []).append((Ellipsis,))  # (B, T, D)
    means: dict[tuple, Tensor] = {}
    if how == "mean" and reference is not None:
        with torch.no_grad():
            _, cache = model.run_with_cache(*reference, names=list(targets))
        means = {
            (n, i): cache[n][idx].mean(dim=(0, 1), keepdim=True) for n in targets for i, idx in enumerate(targets[n])
        }

    def replacer(name: str):
        def replace(x: Tensor, hook) -> Tensor:
            x = x.clone()
            for i, idx in enumerate(targets[name]):
                if how == "zero":
                    x[idx] = 0
                elif (name, i) in means:
                    x[idx] = means[(name, i)].to(x.dtype)
                else:  # the mean over this very batch and its positions
                    x[idx] = x[idx].mean(dim=(0, 1), keepdim=True)
            return x

        return name, replace

    with model.hooks([replacer(name) for name in targets]):
        yield model


def by_position(over: str) -> bool:
    """Whether target ``over`` is patched position by position (its result is (L, T): label it with the tokens)."""
    return PATCH_TARGETS.get(over, ("", ""))[1] == "position"


def _target_names(model, over: str) -> tuple[list[str], str]:
    """The hook point of target ``over`` in every block, and what one patch covers (:data:`PATCH_TARGETS`)."""
    if not isinstance(over, str) or over not in PATCH_TARGETS:
        raise OptionError(f"patching over {over!r}: choose one of {', '.join(PATCH_TARGETS)}")
    point, unit = PATCH_TARGETS[over]
    return [f"{block_prefix(model)}.{i}.{point}" for i in range(len(_blocks(model)))], unit


def _span(m_clean: Tensor, m_corrupt: Tensor) -> Tensor:
    """clean − corrupt, the denominator of every restored fraction; refused when there is none."""
    span = m_clean - m_corrupt
    if span.abs() < 1e-6:
        raise OptionError(
            "the clean and corrupted inputs give the same metric: corrupt the input so the answer changes"
        )
    return span


@torch.no_grad()
def patch_activations(model, clean: tuple, corrupt: tuple, metric: Metric, over: str = "resid_pre") -> Tensor:
    """How much of the clean behaviour each activation restores (see the module docstring).

    ``clean`` / ``corrupt``: the positional arguments of a forward pass each (same shapes).
    ``over`` (:data:`PATCH_TARGETS`): ``"resid_pre"`` (and ``resid_mid``, ``resid_post``,
    ``attn_out``, ``mlp_out``): that value of each block at each position -> (L, T); ``"head"``:
    each head's output (``attn.hook_z``) at every position -> (L, H); ``"head_position"``: each
    head at each position -> (L, H, T); ``"q"``, ``"k"``, ``"v"``, ``"pattern"``: a head's
    queries, keys, values or attention pattern at every position -> (L, H). Values are averaged
    over the batch (TransformerLens's ``get_act_patch_*``; its by-position head results are
    (L, T, H))."""
    names, unit = _target_names(model, over)
    blocks = _blocks(model)
    if over == "mlp_out" and any(b.mlp is None for b in blocks):
        raise OptionError("this model's blocks have no MLP: patch over attn_out or a residual stream instead")
    if any(torch.is_tensor(a) and torch.is_tensor(b) and a.shape != b.shape for a, b in zip(clean, corrupt)):
        raise OptionError("the clean and corrupted inputs must have the same shape (the same number of tokens)")
    clean_logits, cache = model.run_with_cache(*clean, names=names)
    m_corrupt = metric(model(*corrupt)).mean()
    span = _span(metric(clean_logits).mean(), m_corrupt)
    if span.abs() < SMALL_SPAN:
        warnings.warn(span_note(float(span)), stacklevel=2)
    shape = cache[names[0]].shape  # streams (B, T, D); heads (B, H, T, …)
    if unit == "position":
        cells = [(j,) for j in range(shape[1])]
    elif unit == "head":
        cells = [(h,) for h in range(shape[1])]
    else:
        cells = [(h, j) for h in range(shape[1]) for j in range(shape[2])]
    out = torch.zeros(len(blocks), len(cells))
    for i, name in enumerate(names):
        for c, cell in enumerate(cells):

            def put(x: Tensor, hook, cell=cell, name=name) -> Tensor:
                x = x.clone()
                x[(slice(None), *cell)] = cache[name][(slice(None), *cell)]
                return x

            with model.hooks([(name, put)]):
                out[i, c] = ((metric(model(*corrupt)).mean() - m_corrupt) / span).item()
    return out.view(len(blocks), shape[1], shape[2]) if unit == "head_position" else out


def attribution_patching(model, clean: tuple, corrupt: tuple, metric: Metric, over: str = "resid_pre") -> Tensor:
    """Activation patching's first-order estimate from one forward and one backward pass (Nanda
    2023, "Attribution patching"): patching activation a from its corrupted value to its clean one
    changes the metric by about (a_clean − a_corrupt) · ∂metric/∂a at the corrupted run, so every
    cell of :func:`patch_activations` is estimated at once, as a fraction of clean − corrupt. Exact
    where the metric is linear in a; a screen for the cells to patch in earnest elsewhere. Same
    ``over`` targets and result shapes as :func:`patch_activations`."""
    names, unit = _target_names(model, over)
    with torch.no_grad():
        clean_logits, clean_cache = model.run_with_cache(*clean, names=names)
    with model.caching(names, detach=False) as cache:
        corrupt_logits = model(*corrupt)
    m_corrupt = metric(corrupt_logits).mean()
    span = _span(metric(clean_logits).mean(), m_corrupt.detach())
    acts = [cache[n] for n in names]
    grads = torch.autograd.grad(m_corrupt, acts, allow_unused=True)  # (of the batch mean: each row's 1/B in)
    rows = []
    for name, act, grad in zip(names, acts, grads):
        effect = (clean_cache[name] - act.detach()) * (grad if grad is not None else torch.zeros_like(act))
        if unit == "head":  # (B, H, T, …): a head at every position
            rows.append(effect.flatten(2).sum((0, -1)))
        else:  # streams (B, T, D) by position; heads (B, H, T, d) by head and position
            rows.append(effect.sum((0, -1)))
    return (torch.stack(rows) / span).detach().cpu()


@torch.no_grad()
def path_patching(
    model, clean: tuple, corrupt: tuple, metric: Metric, receivers: list[tuple[int, int, str]] | None = None
) -> Tensor:
    """Path patching (Wang et al. 2022): how much of the clean behaviour each head restores through
    the paths from it to the ``receivers`` alone -> (L, H) fractions of clean − corrupt, as
    :func:`patch_activations` reports them.

    For each sender head: (1) run the corrupted input with the sender's output (``attn.hook_z``)
    taken from the clean run and every other head's frozen at its corrupted value (the MLPs
    recompute: they are part of every path), and record what the receivers read; (2) run the
    corrupted input again with only the receivers' inputs replaced by those records, and score it.
    ``receivers``: None for the logits (the direct paths, through the MLPs after the sender), or
    (layer, head, "q" | "k" | "v") inputs of later heads; senders at or after a receiver's layer
    score 0."""
    blocks, prefix = _blocks(model), block_prefix(model)
    n_layers = len(blocks)
    z_names = [f"{prefix}.{i}.attn.hook_z" for i in range(n_layers)]
    for layer, head, part in receivers or []:
        if part not in ("q", "k", "v") or not 0 <= layer < n_layers or not 0 <= head < blocks[layer].attn.n_heads:
            raise OptionError(f"receiver {(layer, head, part)!r}: (layer, head, 'q' | 'k' | 'v') of this model")
    receiver_names = sorted({f"{prefix}.{layer}.attn.hook_{part}" for layer, _, part in receivers or []})
    clean_logits, clean_cache = model.run_with_cache(*clean, names=z_names)
    corrupt_logits, corrupt_cache = model.run_with_cache(*corrupt, names=z_names)
    m_corrupt = metric(corrupt_logits).mean()
    span = _span(metric(clean_logits).mean(), m_corrupt)
    heads = blocks[0].attn.n_heads
    out = torch.zeros(n_layers, heads)
    last_receiver = max((layer for layer, _, _ in receivers or []), default=n_layers)
    for sender_layer in range(min(n_layers, last_receiver)):
        for sender in range(heads):

            def freeze(x: Tensor, hook, sender_layer=sender_layer, sender=sender) -> Tensor:
                x = corrupt_cache[hook.name].clone()  # every head as in the corrupted run ...
                if hook.name == z_names[sender_layer]:
                    x[:, sender] = clean_cache[hook.name][:, sender]  # ... but the sender, as in the clean one
                return x

            with model.hooks([(z_names, freeze)]):
                if receivers is None:  # the direct paths: score this run itself
                    out[sender_layer, sender] = ((metric(model(*corrupt)).mean() - m_corrupt) / span).item()
                    continue
                _, received = model.run_with_cache(*corrupt, names=receiver_names)

            def deliver(x: Tensor, hook) -> Tensor:
                x = x.clone()
                for layer, head, part in receivers:
                    if hook.name == f"{prefix}.{layer}.attn.hook_{part}" and layer > sender_layer:
                        x[:, head] = received[hook.name][:, head]
                return x

            with model.hooks([(receiver_names, deliver)]):
                out[sender_layer, sender] = ((metric(model(*corrupt)).mean() - m_corrupt) / span).item()
    return out


def patching_figure(restored: Tensor, path, *, over: str = "resid_pre", labels: list[str] | None = None, title=""):
    """The patching heat map: layers down, positions (with their tokens) or heads across."""
    from .plots import plt, save_figure

    n_layers, n = restored.shape
    fig, ax = plt.subplots(figsize=(1.5 + 0.45 * n, 1.2 + 0.4 * n_layers), dpi=110)
    lim = max(float(restored.abs().max()), 1e-6)
    im = ax.imshow(restored.numpy(), cmap="RdBu", vmin=-lim, vmax=lim, aspect="auto")
    ax.set_yticks(range(n_layers), [f"layer {i}" for i in range(n_layers)])
    ticks = labels if labels is not None else [str(j) for j in range(n)]
    ax.set_xticks(range(n), ticks, rotation=60 if over == "resid_pre" else 0, fontsize=8)
    ax.set_xlabel("position (token)" if over == "resid_pre" else "head")
    ax.set_title(title or "restored fraction of the clean metric")
    fig.colorbar(im, ax=ax, fraction=0.04, label="restored fraction (1: all of the clean metric)")
    return save_figure(fig, path)
