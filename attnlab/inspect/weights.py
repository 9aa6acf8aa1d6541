"""Weight processing, as TransformerLens does it before analysis (``HookedTransformer``'s defaults,
``TransformerBridge.enable_compatibility_mode``): the same function of the input, weights that are
easier to read.

* ``fold_ln``: each LayerNorm's weight w and bias β go into the layer that reads it,
  W' = diag(w) W, b' = b + β W (the norm keeps only centring and scaling), and the reading
  weights are centred over the input (a normalised vector has zero mean, so that component of W
  never mattered).
* ``center_writing_weights``: everything that writes into the residual stream (W_E, W_pos,
  each W_O and MLP output, their biases) has its mean over the model dimension removed; every
  reader of the stream is a LayerNorm, which removes it anyway.
* ``center_unembed``: W_U and b_U have their mean over the vocabulary removed: each position's
  logits shift by one constant, so the log-probabilities are unchanged.
* ``fold_value_biases``: b_V moves into b_O (b_O' = b_O + Σ_h b_V^h W_O^h): a pattern's rows sum
  to 1, so a head's output gets exactly that constant.

GPTs (pre-LN, every family block) only; the result is a copy, its output head untied from the
embedding and given a bias (b_U). RMSNorm models (Llama, Qwen, Mistral) have their gains folded
without centring, and their writers are not centred: an RMSNorm does not remove the mean
(TransformerLens skips the same steps for them).
"""

from __future__ import annotations

import copy

import torch
from torch import Tensor, nn

__all__ = ["process_weights"]


def process_weights(
    model,
    *,
    fold_ln: bool = True,
    center_writing_weights: bool = True,
    center_unembed: bool = True,
    fold_value_biases: bool = True,
):
    """A copy of the GPT ``model`` with its weights processed (see the module's docstring); its
    log-probabilities equal ``model``'s (its logits too, without ``center_unembed``)."""
    from ..models.gpt import GPT

    if not isinstance(model, GPT):
        raise ValueError(f"process_weights reads GPTs, got {type(model).__name__}")
    c = model.config
    if center_unembed and c.logit_softcap:
        raise ValueError("center_unembed changes a soft-capped model's outputs (the cap is not shift-invariant)")
    if fold_value_biases and c.attn_tie == "kv":
        raise ValueError("fold_value_biases: with --attn-tie kv the values are the keys, b_V is b_K")
    out = copy.deepcopy(model)
    with torch.no_grad():
        _untie_and_bias_head(out)
        rms = c.norm == "rms"  # (RMSNorm does not remove the mean: nothing is centred for it)
        if fold_ln:
            for block in out.blocks:
                _fold(block.ln1, [block.attn.qkv], center=not rms)
                if block.mlp is not None:  # (a gated MLP reads the norm twice: its gate and its up projection)
                    _fold(block.ln2, [block.mlp.fc] + ([block.mlp.gate] if c.gated_mlp else []), center=not rms)
            _fold(out.ln_f, [out.lm_head], center=not rms)
        if center_writing_weights and not rms:
            _center_writing(out)
        if center_unembed:
            real = slice(0, c.vocab_size)
            out.lm_head.weight[real] -= out.lm_head.weight[real].mean(0, keepdim=True)
            out.lm_head.bias[real] -= out.lm_head.bias[real].mean()
        if fold_value_biases:
            for block in out.blocks:
                _fold_value_bias(block.attn)
    if fold_ln or center_unembed:
        out.config = copy.copy(c)
        out.config.tie_output = False
    return out.eval()


def _untie_and_bias_head(model) -> None:
    """Its own output matrix (not the embedding's) and a bias b_U, zero to start."""
    head = model.lm_head
    new = nn.Linear(head.in_features, head.out_features, bias=True).to(head.weight.device, head.weight.dtype)
    new.weight.copy_(head.weight)
    new.bias.zero_()
    model.lm_head = new


def _fold(norm: nn.Module, readers: list[nn.Linear], center: bool = True) -> None:
    """W' = W diag(w), b' = b + W β (PyTorch's (out, in) layout) for each reader, W' centred over
    the input when ``center`` (a LayerNorm's output has zero mean; an RMSNorm's need not); the
    norm left with weight 1 and bias 0."""
    bias = getattr(norm, "bias", None)
    for reader in readers:
        w = norm.weight if norm.weight is not None else torch.ones(reader.in_features)
        weight = reader.weight * w[None, :]
        if bias is not None:
            shift = reader.weight @ bias + (reader.bias if reader.bias is not None else 0)
            if reader.bias is None:
                reader.bias = nn.Parameter(torch.zeros_like(shift))
            reader.bias.copy_(shift)
        reader.weight.copy_(weight - weight.mean(1, keepdim=True) if center else weight)
    if norm.weight is not None:
        norm.weight.fill_(1.0)
    if bias is not None:
        bias.zero_()


def _center(t: Tensor, dim: int) -> None:
    t -= t.mean(dim, keepdim=True)


def _center_writing(model) -> None:
    _center(model.tok_emb.weight, -1)
    pos = model.pos_emb
    if pos is not None:
        if hasattr(pos, "weight"):  # learned
            _center(pos.weight, -1)
        elif hasattr(pos, "pe"):  # sinusoidal: the fixed table, centred the same way
            pos.pe = pos.pe - pos.pe.mean(-1, keepdim=True)
    if model.pos_mix is not None:  # [token; position] projected into the stream
        _center(model.pos_mix.weight, 0)
    for block in model.blocks:
        for writer in (block.attn.out_proj, block.mlp.proj if block.mlp is not None else None):
            if writer is None:
                continue
            _center(writer.weight, 0)  # (D, in): over the model dimension
            if writer.bias is not None:
                _center(writer.bias, 0)


def _fold_value_bias(attn) -> None:
    """b_O += W_O b_V (all heads at once), then b_V = 0."""
    if attn.qkv.bias is None:
        return
    q_dim, k_dim, v_dim = attn._split
    made = attn.qkv.bias.shape[0]
    b_v = attn.qkv.bias[made - v_dim :]
    if attn.n_kv_heads != attn.n_heads:  # (grouped keys and values: each value head serves several)
        b_v = b_v.view(attn.n_kv_heads, -1).repeat_interleave(attn.n_heads // attn.n_kv_heads, 0).flatten()
    shift = attn.out_proj.weight @ b_v
    if attn.out_proj.bias is None:
        attn.out_proj.bias = nn.Parameter(torch.zeros_like(shift))
    attn.out_proj.bias += shift
    attn.qkv.bias[made - v_dim :] = 0
