"""What each layer already predicts, and who wrote the logit: the logit lens (GPT), the class
lens (ViT), the masked-LM lens (text encoders) and direct logit attribution, read through the
hook points.

Logit lens (nostalgebraist, 2020): the residual stream after block ℓ, put through the final
LayerNorm and the unembedding as if the model stopped there,

    logits_ℓ = LN_f(x_ℓ) W_U        x_0 = the embeddings, x_L = the last block's output.

Direct logit attribution: the final residual stream is a sum of what each part wrote,

    x_L = embed + Σ_ℓ (Σ_h z_ℓh W_O,ℓh + b_O,ℓ) + Σ_ℓ mlp_ℓ,

and LN_f is linear once its scale σ (the standard deviation of x_L over features) is frozen:
LN_f(x) = Σ_c γ ⊙ (c − mean(c)) / σ + β (an RMSNorm: σ the root mean square, no centring, no β). So the logit of token t splits into one term per
part, γ ⊙ (c − mean c)/σ · W_U[t], and the terms sum to the logit minus β · W_U[t] (the final
norm's bias, reported as its own term): exactly, with σ the one the forward pass used.
"""

from __future__ import annotations

from typing import Callable

import torch
from torch import Tensor

from ..errors import OptionError


def require_gpt(model, tool: str) -> None:
    """Refuse anything but a GPT for ``tool``, in one line."""
    if getattr(model, "model_type", None) != "gpt":
        raise OptionError(f"{tool} reads a GPT; this is {getattr(model, 'model_type', type(model).__name__)}")


def require_vit_classifier(model, tool: str) -> None:
    """Refuse anything but a ViT with a classification head for ``tool``, in one line."""
    if getattr(model, "model_type", None) != "vit" or not isinstance(model.head, torch.nn.Linear):
        raise OptionError(f"{tool} reads a ViT classifier (a ViT with a classification head)")


def check_token(model, token: int) -> None:
    if not 0 <= token < model.config.vocab_size:
        raise OptionError(f"token {token} is not in the vocabulary of {model.config.vocab_size}")


@torch.no_grad()
def logit_lens(model, idx: Tensor) -> Tensor:
    """idx (B, T) -> (L + 1, B, T, vocab): the logits the residual stream would give after the
    embeddings (row 0) and after each block (row ℓ); the last row equals the model's logits."""
    require_gpt(model, "the logit lens")
    _, cache = model.run_with_cache(idx, names=lens_points(model))
    return lens_logits(model, cache)


def lens_points(model) -> list[str]:
    """The hook points the GPT logit lens reads: the embeddings, then each block's output."""
    return ["hook_embed"] + [f"blocks.{i}.hook_resid_post" for i in range(len(model.blocks))]


def lens_logits(model, cache) -> Tensor:
    """The logit lens from a cache that holds :func:`lens_points`: (L + 1, B, T, vocab)."""
    stream = torch.stack([cache[n] for n in lens_points(model)])  # (L + 1, B, T, D)
    return model.unembed(model.ln_f(stream))  # (the output head as the model applies it: soft cap included)


@torch.no_grad()
def class_lens(model, images: Tensor) -> Tensor:
    """ViT: images (B, C, H, W) -> (L, B, classes): the class logits each block's output would give
    through the final norm, the pooling (class token or mean) and the head; the last row equals
    the model's logits."""
    require_vit_classifier(model, "the class lens")
    names = [f"encoder.blocks.{i}.hook_resid_post" for i in range(len(model.encoder.blocks))]
    _, cache = model.run_with_cache(images, names=names)
    stream = model.encoder.ln_f(torch.stack([cache[n] for n in names]))  # (L, B, T, D)
    pooled = stream[:, :, 0] if model.config.pool == "cls" else stream.mean(dim=2)
    return model.head(pooled)


@torch.no_grad()
def mlm_lens(model, input_ids: Tensor, attention_mask: Tensor | None = None) -> Tensor:
    """A text encoder with a masked-LM head: (L + 1, B, T, vocab), the head's logits on the
    embeddings and on each block's output (through the encoder's final norm, for pre-LN models);
    the last row equals ``model(..., head="mlm")``."""
    if getattr(model, "model_type", None) != "text-encoder" or model.mlm is None:
        raise OptionError("the masked-LM lens reads a text encoder with a masked-LM head")
    names = ["hook_embed"] + [f"encoder.blocks.{i}.hook_resid_post" for i in range(len(model.encoder.blocks))]
    _, cache = model.run_with_cache(input_ids, attention_mask, names=names)
    return model.mlm(model.encoder.ln_f(torch.stack([cache[n] for n in names])))


def lens_table(logits: Tensor, ids: list[int], decode: Callable[[int], str], top_k: int = 1) -> dict:
    """A lens of one sequence as a table: ``logits`` (L + 1, T, V), the embeddings' row first, for
    the token ``ids`` (T,), each id written by ``decode`` -> {"tokens", "layers", "top_tokens"
    (L + 1, T, top_k), "top_probs" (L + 1, T, top_k) NumPy}."""
    top = logits.float().softmax(-1).topk(top_k, dim=-1)
    return {
        "tokens": [decode(i) for i in ids],
        "layers": ["embed"] + [f"block {i}" for i in range(logits.shape[0] - 1)],
        "top_tokens": [[[decode(i) for i in row] for row in layer] for layer in top.indices.tolist()],
        "top_probs": top.values.cpu().numpy(),
    }


@torch.no_grad()
def logit_lens_table(model, tokenizer, text: str, top_k: int = 1) -> dict:
    """The lens as a table for one text: layer × position, the top tokens and their probabilities."""
    idx = torch.tensor([tokenizer.encode(text)], device=next(model.parameters()).device)
    return lens_table(logit_lens(model, idx)[:, 0], idx[0].tolist(), lambda i: tokenizer.decode([i]), top_k)


@torch.no_grad()
def direct_logit_attribution(model, idx: Tensor, token: int, position: int = -1) -> dict[str, Tensor]:
    """Each part's direct contribution to the logit of ``token`` at ``position``, per batch row.

    Returns {"embed": (B,), "L{ℓ}.H{h}": (B,) per head, "L{ℓ}.attn_bias": (B,), "L{ℓ}.mlp": (B,),
    "ln_final_bias": (B,)} (with sandwich norms one "L{ℓ}.attn" per layer instead of its heads); their sum is the model's logit (see the module's docstring), soft cap
    included (``logit_softcap``: each term scaled by the cap's secant slope at the uncapped logit)."""
    require_gpt(model, "direct logit attribution")
    check_token(model, token)
    L = len(model.blocks)
    # sandwich norms (Gemma) normalise each attention output before it joins the stream: the heads'
    # shares are then not additive, and each layer's attention is one term, "L{ℓ}.attn"
    sandwich = getattr(model.config, "sandwich_norm", False)
    heads = "blocks.*.hook_attn_out" if sandwich else "blocks.*.attn.hook_z"
    names = ["hook_embed", heads, "blocks.*.hook_mlp_out", f"blocks.{L - 1}.hook_resid_post"]
    _, cache = model.run_with_cache(idx, names=names)
    final = cache[f"blocks.{L - 1}.hook_resid_post"][:, position]  # (B, D)
    ln = model.ln_f
    rms = model.config.norm == "rms"  # RMSNorm: σ = √(mean(x²) + ε), and no centring
    spread = final.pow(2).mean(-1, keepdim=True) if rms else final.var(-1, unbiased=False, keepdim=True)
    sigma = (spread + ln.eps).sqrt()  # the scale the forward pass used
    direction = model.lm_head.weight[token] * ln.weight  # γ ⊙ W_U[t]  (D,)

    def term(c: Tensor) -> Tensor:  # c (B, D): its part of the logit
        return ((c if rms else c - c.mean(-1, keepdim=True)) / sigma) @ direction

    out = {"embed": term(cache["hook_embed"][:, position])}
    for i, block in enumerate(model.blocks):
        attn = block.attn
        if sandwich:
            out[f"L{i}.attn"] = term(cache[f"blocks.{i}.hook_attn_out"][:, position])
            if block.mlp is not None:
                out[f"L{i}.mlp"] = term(cache[f"blocks.{i}.hook_mlp_out"][:, position])
            continue
        z = cache[f"blocks.{i}.attn.hook_z"][:, :, position]  # (B, H, d_v)
        w_o = attn.out_proj.weight.view(attn.out_proj.weight.shape[0], attn.n_heads, -1)  # (D, H, d_v)
        for h in range(attn.n_heads):
            out[f"L{i}.H{h}"] = term(z[:, h] @ w_o[:, h].T)
        if attn.out_proj.bias is not None:
            out[f"L{i}.attn_bias"] = term(attn.out_proj.bias.expand_as(final))
        if block.mlp is not None:  # (an attention-only model has none)
            out[f"L{i}.mlp"] = term(cache[f"blocks.{i}.hook_mlp_out"][:, position])
    ln_bias = getattr(ln, "bias", None)  # (RMSNorm has none)
    bias = ln_bias @ model.lm_head.weight[token] if ln_bias is not None else torch.zeros((), device=final.device)
    out["ln_final_bias"] = bias.expand(final.shape[0])
    cap = getattr(model.config, "logit_softcap", 0.0)
    if cap:
        # the cap acts on the sum z, not on each part: every term is scaled by cap·tanh(z/cap)/z (the
        # cap's secant slope at z), so that the terms still add up to the logit the model outputs
        z = sum(out.values())
        slope = torch.where(z == 0, torch.ones_like(z), cap * torch.tanh(z / cap) / z)
        out = {k: v * slope for k, v in out.items()}
    return out
