"""The residual stream taken apart, as TransformerLens's ``ActivationCache`` helpers do, for a GPT, a
ViT or a pre-LN text encoder and its :meth:`~attnlab.hooks.HookedModule.run_with_cache` cache (names
and semantics as there; a ViT's and an encoder's blocks are ``encoder.blocks.*``):

    accumulated_resid(model, cache)     (L + 1, B, T, D): the stream entering each block, then after the last
    decompose_resid(model, cache)       (1 + 2L, B, T, D): what each part wrote: the embeddings, each
                                        attention and MLP sublayer (their sum is the final stream)
    stack_head_results(model, cache)    (L·H, B, T, D): what each head wrote, z_h W_O^h (no W_O bias)
    apply_ln_to_stack(model, cache, s)  components through a LayerNorm with its scale frozen at the
                                        value the forward pass used (centred, divided by σ, no weight
                                        or bias: multiply by γ ⊙ W_U[t] for a logit, as in the docs)
    logit_diff(logits, answers)         the mean logit difference of (right, wrong) answer pairs

One difference: attnlab's ``hook_embed`` is the token and position embeddings together, so the
decomposition has one ``embed`` component where TransformerLens has ``embed`` and ``pos_embed``.
"""

from __future__ import annotations

import torch
from torch import Tensor

from ..errors import OptionError
from .patching import block_prefix

__all__ = ["accumulated_resid", "decompose_resid", "stack_head_results", "apply_ln_to_stack", "logit_diff"]


def _get(cache, name: str) -> Tensor:
    if name not in cache:
        raise OptionError(
            f"the cache holds no {name}: run the model with run_with_cache() naming it (or every hook point)"
        )
    return cache[name]


def _require_blocks(model, tool: str) -> None:
    if not hasattr(model, "attention_blocks"):
        raise OptionError(f"{tool} reads a transformer (GPT, ViT, text encoder); this is {type(model).__name__}")


def _blocks(model) -> list:
    """The model's transformer blocks (GPT, ViT, pre-LN text encoder); a post-LN stack is refused:
    its stream is renormalised after every sublayer, so it is no sum of the sublayers' outputs."""
    blocks = model.attention_blocks()
    if blocks and not blocks[0].norm_first:
        raise OptionError(
            f"this {type(model).__name__} is post-LN (each sublayer's sum is renormalised), so its residual stream "
            "does not decompose into what each part wrote; train it with --norm-first for these tools"
        )
    return blocks


def _final_norm(model):
    return model.ln_f if hasattr(model, "ln_f") else model.encoder.ln_f


def _layer(model, layer: int | None) -> int:
    n = len(_blocks(model))
    layer = n if layer is None or layer == -1 else layer
    if not 0 <= layer <= n:
        raise OptionError(f"layer {layer}: this model has layers 0 … {n - 1} (or {n} / None: the end)")
    return layer


def _finish(
    model,
    cache,
    stack: list[Tensor],
    labels: list[str],
    layer,
    apply_ln,
    pos_slice,
    mlp_input,
    return_labels,
    lens=False,
):
    out = torch.stack(stack)
    if pos_slice is not None:
        out = out[..., pos_slice, :]
    if apply_ln and lens:  # each stream through the whole final norm, its own statistics (the logit lens)
        out = _final_norm(model)(out)
    elif apply_ln:
        out = apply_ln_to_stack(model, cache, out, layer, mlp_input=mlp_input, pos_slice=pos_slice)
    return (out, labels) if return_labels else out


def accumulated_resid(
    model,
    cache,
    layer: int | None = None,
    *,
    incl_mid: bool = False,
    apply_ln: bool = False,
    pos_slice=None,
    mlp_input: bool = False,
    return_labels: bool = False,
):
    """The stream entering blocks 0 … ``layer`` (labels ``"0_pre"`` …), with ``incl_mid`` each block's
    middle too (``"l_mid"``), and for ``layer`` None (the end) the final stream (``"final_post"``):
    (components, B, T, D), or (…, pos) with ``pos_slice``. With ``apply_ln`` at the end, each stream
    goes through the whole final norm with its own statistics (the logit lens, as TransformerLens
    4 does); at an earlier layer, through that layer's norm with the scale frozen
    (:func:`apply_ln_to_stack`)."""
    _require_blocks(model, "accumulated_resid")
    n, layer = len(_blocks(model)), _layer(model, layer)
    stack, labels = [], []
    for i in range(layer + 1):
        if i == n:
            stack.append(_get(cache, f"{block_prefix(model)}.{n - 1}.hook_resid_post"))
            labels.append("final_post")
            continue
        stack.append(_get(cache, f"{block_prefix(model)}.{i}.hook_resid_pre"))
        labels.append(f"{i}_pre")
        if (incl_mid and i < layer) or (mlp_input and i == layer):
            stack.append(_get(cache, f"{block_prefix(model)}.{i}.hook_resid_mid"))
            labels.append(f"{i}_mid")
    return _finish(model, cache, stack, labels, layer, apply_ln, pos_slice, mlp_input, return_labels, layer == n)


def decompose_resid(
    model,
    cache,
    layer: int | None = None,
    *,
    mode: str = "all",
    incl_embeds: bool = True,
    apply_ln: bool = False,
    pos_slice=None,
    mlp_input: bool = False,
    return_labels: bool = False,
):
    """What each part wrote into the stream entering ``layer`` (None: the final stream), in order:
    ``"embed"`` (tokens and positions), then ``"l_attn_out"`` and ``"l_mlp_out"`` per block
    (``mode``: all, attn or mlp); they sum to that stream. (components, B, T, D)."""
    _require_blocks(model, "decompose_resid")
    if mode not in ("all", "attn", "mlp"):
        raise OptionError(f"mode {mode!r}: choose all, attn or mlp")
    layer = _layer(model, layer)
    stack, labels = [], []
    if incl_embeds:
        stack.append(_get(cache, "hook_embed"))
        labels.append("embed")
    for i in range(layer):
        if mode != "mlp":
            stack.append(_get(cache, f"{block_prefix(model)}.{i}.hook_attn_out"))
            labels.append(f"{i}_attn_out")
        if mode != "attn" and _blocks(model)[i].mlp is not None:
            stack.append(_get(cache, f"{block_prefix(model)}.{i}.hook_mlp_out"))
            labels.append(f"{i}_mlp_out")
    if mlp_input and mode != "mlp":
        stack.append(_get(cache, f"{block_prefix(model)}.{layer}.hook_attn_out"))
        labels.append(f"{layer}_attn_out")
    return _finish(model, cache, stack, labels, layer, apply_ln, pos_slice, mlp_input, return_labels)


def stack_head_results(
    model,
    cache,
    layer: int | None = None,
    *,
    apply_ln: bool = False,
    pos_slice=None,
    incl_remainder: bool = False,
    return_labels: bool = False,
):
    """What each head of blocks 0 … ``layer`` − 1 wrote into the stream, z_h W_O^h (the W_O bias is
    not a head's: with ``incl_remainder``, the stream minus every head's part is one more
    component, ``"remainder"``): (L·H, B, T, D), labels ``"L0H0"`` …"""
    _require_blocks(model, "stack_head_results")
    n, layer = len(_blocks(model)), _layer(model, layer)
    stack, labels = [], []
    for i in range(layer):
        z = _get(cache, f"{block_prefix(model)}.{i}.attn.hook_z")  # (B, H, T, d_v)
        w_o = _blocks(model)[i].attn.head_weights()["W_O"]  # (H, d_v, D)
        stack += list(torch.einsum("bhtd,hdD->hbtD", z, w_o))
        labels += [f"L{i}H{h}" for h in range(z.shape[1])]
    if incl_remainder:
        total = _get(
            cache,
            f"{block_prefix(model)}.{layer}.hook_resid_pre"
            if layer < n
            else f"{block_prefix(model)}.{n - 1}.hook_resid_post",
        )
        stack.append(total - (torch.stack(stack).sum(0) if stack else 0))
        labels.append("remainder")
    return _finish(model, cache, stack, labels, layer, apply_ln, pos_slice, False, return_labels)


def apply_ln_to_stack(model, cache, stack: Tensor, layer: int | None = None, *, mlp_input=False, pos_slice=None):
    """Components (…, B, T, D) through the LayerNorm read at ``layer`` (None: the final one; else the
    block's first, or second with ``mlp_input``) with its scale frozen at the value the forward
    pass used: each component centred and divided by σ of that norm's real input, so that the
    components still add up to the normalised stream (before the norm's weight and bias)."""
    _require_blocks(model, "apply_ln_to_stack")
    n, layer = len(_blocks(model)), _layer(model, layer)
    if layer == n:
        source, norm = _get(cache, f"{block_prefix(model)}.{n - 1}.hook_resid_post"), _final_norm(model)
    else:
        block = _blocks(model)[layer]
        source = _get(cache, f"{block_prefix(model)}.{layer}.hook_resid_{'mid' if mlp_input else 'pre'}")
        norm = block.ln2 if mlp_input else block.ln1
    if pos_slice is not None:
        source = source[..., pos_slice, :]
    sigma = (source.var(-1, unbiased=False, keepdim=True) + norm.eps).sqrt()  # (B, T, 1)
    return (stack - stack.mean(-1, keepdim=True)) / sigma


def logit_diff(logits: Tensor, answers: Tensor, *, position: int = -1, per_prompt: bool = False) -> Tensor:
    """logits (B, T, V) and answers (B, 2) of (right, wrong) token ids -> the logit difference at
    ``position``: (B,) with ``per_prompt``, else its mean (the IOI tutorials' ``logits_to_ave_logit_diff``)."""
    if answers.dim() != 2 or answers.shape != (logits.shape[0], 2):
        raise OptionError(f"answers must be (batch, 2) right/wrong token ids, got {tuple(answers.shape)}")
    last = logits[:, position] if logits.dim() == 3 else logits
    picked = last.gather(-1, answers)  # (B, 2)
    diff = picked[:, 0] - picked[:, 1]
    return diff if per_prompt else diff.mean()
