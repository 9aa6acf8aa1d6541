"""Llama-shaped checkpoints (``llama``: Llama 2/3, SmolLM2; ``qwen2``; ``qwen3``; ``mistral``;
``phi3``: Phi-3/3.5 mini, Phi-4 mini) <-> attnlab GPT.

Each is a configuration of attnlab's own GPT, not a copy of HuggingFace's modelling files:

    x_0 = E[tokens]                                   no position table: RoPE acts inside attention
    x = x + Attn(RMSNorm(x))                          grouped-query attention, rotary q and k
    x = x + W_down (silu(x W_gate) ⊙ x W_up)          SwiGLU on RMSNorm(x)
    logits = RMSNorm(x_L) W_out                       tied or untied head

and the families differ in a few options: Qwen2 has query/key/value biases without an output
bias (``qkv_bias``), Qwen3 RMS-normalises each head's queries and keys before the rotation
(``qk_norm``) with heads wider than dim / heads (``head_dim``), Mistral attends within a sliding
window, Phi-3 fuses its projections (``qkv_proj``, ``gate_up_proj``) and may rotate part of each
head (``rope_fraction``). HuggingFace's separate q/k/v projections become attnlab's fused ``qkv`` ([W_Q; W_K; W_V]:
the same rows, stacked), its ``gate_proj`` / ``up_proj`` / ``down_proj`` the gated MLP's ``gate``
/ ``fc`` / ``proj``. RoPE scaling (``rope_scaling``): linear, Llama 3's, YaRN (Qwen's long
contexts) and LongRoPE (Phi-3 and 3.5 mini's 128k models).
"""

from __future__ import annotations

import math

import torch
from torch import Tensor, nn

from ..errors import CheckpointError
from ..position import rope_scaling_parts
from . import Converter, filled, hf_weights, register

ARCHITECTURES = {
    "llama": "LlamaForCausalLM",
    "qwen2": "Qwen2ForCausalLM",
    "qwen3": "Qwen3ForCausalLM",
    "mistral": "MistralForCausalLM",
    "phi3": "Phi3ForCausalLM",
}
ACTIVATIONS = {"silu": "silu", "gelu_pytorch_tanh": "gelu_tanh", "gelu": "gelu"}


def rope_of(cfg: dict) -> tuple[float, float, str | None]:
    """(rotary base, rotated fraction of each head, attnlab's --rope-scaling) of a HuggingFace
    config (``rope_theta``, ``partial_rotary_factor`` and ``rope_scaling``, or transformers 5's
    ``rope_parameters``), with HuggingFace's defaults for what a scaling leaves out (YaRN's βs, the
    attention factors, a factor from the two context lengths)."""
    params = {**(cfg.get("rope_scaling") or {}), **(cfg.get("rope_parameters") or {})}
    kind = params.get("rope_type", params.get("type", "default"))
    longest = cfg.get("max_position_embeddings")
    original = params.get("original_max_position_embeddings") or cfg.get("original_max_position_embeddings") or longest
    factor = params.get("factor") or (longest / original if kind in ("yarn", "longrope") else None)
    scaling = None
    if kind == "linear":
        scaling = f"linear:{params['factor']!r}"
    elif kind == "llama3":
        scaling = f"llama3:{params['factor']!r}:{params['low_freq_factor']!r}:{params['high_freq_factor']!r}:{original}"
    elif kind == "yarn":
        attention = params.get("attention_factor") or yarn_attention(
            factor, params.get("mscale"), params.get("mscale_all_dim")
        )
        beta_fast, beta_slow = params.get("beta_fast") or 32, params.get("beta_slow") or 1
        scaling = f"yarn:{float(factor)!r}:{original}:{float(beta_fast)!r}:{float(beta_slow)!r}:{float(attention)!r}"
        scaling += "" if params.get("truncate", True) else ":untruncated"
    elif kind == "dynamic":  # (HuggingFace's N is max_position_embeddings itself)
        scaling = f"dynamic:{float(params['factor'])!r}:{longest}"
    elif kind == "longrope":
        attention = params.get("attention_factor")
        if attention is None:  # (LongRoPE's: √(1 + ln F / ln N), none without extension)
            attention = 1.0 if factor <= 1 else math.sqrt(1 + math.log(factor) / math.log(original))
        lists = [",".join(repr(float(x)) for x in params[k]) for k in ("short_factor", "long_factor")]
        scaling = f"longrope:{original}:{float(attention)!r}:{lists[0]}:{lists[1]}"
    elif kind != "default":
        raise CheckpointError(
            f"{cfg.get('model_type')} checkpoint with RoPE scaling {kind!r}: attnlab builds linear, llama3, yarn, "
            "longrope and dynamic scaling"
        )
    fraction = cfg.get("partial_rotary_factor") or params.get("partial_rotary_factor") or 1.0
    return float(cfg.get("rope_theta") or params.get("rope_theta") or 10000.0), float(fraction), scaling


def decoder_shape(cfg: dict, context: int, scaling: str | None = None) -> dict:
    """The GPTConfig sizes every Llama-shaped HuggingFace config gives the same way (Gemma's too):
    vocabulary, context (``context`` when the config has none; F times it under dynamic NTK scaling
    ``scaling``, whose max_position_embeddings is the context it extends), layers, heads, key/value
    heads, width, head width (when not width / heads) and MLP width."""
    heads = cfg["num_attention_heads"]
    head_dim = cfg.get("head_dim") or cfg["hidden_size"] // heads
    context = cfg.get("max_position_embeddings", context)
    if scaling and scaling.startswith("dynamic:"):
        context = int(context * rope_scaling_parts(scaling)[1][0])
    return dict(
        vocab_size=cfg["vocab_size"],
        context=context,
        layers=cfg["num_hidden_layers"],
        heads=heads,
        kv_heads=cfg.get("num_key_value_heads") or heads,
        dim=cfg["hidden_size"],
        head_dim=head_dim if head_dim * heads != cfg["hidden_size"] else None,
        mlp_hidden=cfg["intermediate_size"],
    )


def shape_entries(c, family: str, architecture: str) -> dict:
    """:func:`decoder_shape` backwards: the config.json entries every Llama-shaped export (Gemma's
    too) writes the same way from the GPTConfig ``c``."""
    kind, numbers = rope_scaling_parts(c.rope_scaling) if c.rope_scaling else (None, [])
    return {
        "architectures": [architecture],
        "model_type": family,
        "vocab_size": c.vocab_size,
        "hidden_size": c.dim,
        "intermediate_size": c.mlp_hidden or 4 * c.dim,
        "num_hidden_layers": c.layers,
        "num_attention_heads": c.heads,
        "num_key_value_heads": c.kv_heads or c.heads,
        "head_dim": c.d_head,
        "max_position_embeddings": int(numbers[1]) if kind == "dynamic" else c.context,  # (dynamic NTK's N)
        "rms_norm_eps": c.norm_eps,
    }


def qkv_sizes(c) -> tuple[int, int, int]:
    """The rows of W_Q, W_K and W_V in attnlab's fused ``qkv`` of the GPTConfig ``c``."""
    kv = c.kv_heads or c.heads
    return c.heads * c.d_head, kv * c.d_head, kv * c.d_head


def llama_config(cfg: dict):
    """A HuggingFace config.json of a Llama-shaped family as attnlab's GPTConfig."""
    from ..models.gpt import GPTConfig

    kind = cfg["model_type"]
    act = cfg.get("hidden_act", "silu")
    if act not in ACTIVATIONS:
        raise CheckpointError(f"{kind} activation {act!r} is not supported; attnlab knows {sorted(ACTIVATIONS)}")
    window, window_from = None, 0
    if kind in ("mistral", "phi3") and cfg.get("sliding_window"):
        window = int(cfg["sliding_window"]) - 1  # (HuggingFace's W keys: the query and the W - 1 before it)
    if kind in ("qwen2", "qwen3"):
        window, window_from = qwen_window(cfg)
    rope_base, rope_fraction, rope_scaling = rope_of(cfg)
    attention_bias = bool(cfg.get("attention_bias") or False)
    mlp_bias = bool(cfg.get("mlp_bias") or False)
    if attention_bias != mlp_bias and kind == "llama":
        raise CheckpointError("llama checkpoint with attention_bias != mlp_bias: attnlab has one --bias for both")
    return GPTConfig(
        **decoder_shape(cfg, context=2048, scaling=rope_scaling),
        dropout=0.0,
        bias=attention_bias,
        qkv_bias=True if kind == "qwen2" else None,
        pos="rope",
        rope_base=rope_base,
        rope_fraction=rope_fraction,
        rope_scaling=rope_scaling,
        norm="rms",
        norm_eps=cfg.get("rms_norm_eps", 1e-6),
        gated_mlp=True,
        activation=ACTIVATIONS[act],
        qk_norm=kind == "qwen3",
        window=window,
        window_from=window_from,
        tie_output=bool(cfg.get("tie_word_embeddings", False)),
    )


def qwen_window(cfg: dict) -> tuple[int | None, int]:
    """(window, window_from) of a Qwen2 or Qwen3 config: with ``use_sliding_window``, the layers from
    ``max_window_layers`` on attend within the last ``sliding_window`` keys (or as ``layer_types``
    says, when it follows that pattern); (None, 0) without."""
    layers, size = cfg["num_hidden_layers"], cfg.get("sliding_window")
    if not cfg.get("use_sliding_window") or not size:
        return None, 0
    types = cfg.get("layer_types")
    if types is None:
        first = min(int(cfg.get("max_window_layers", layers)), layers)
        types = ["full_attention"] * first + ["sliding_attention"] * (layers - first)
    first = types.index("sliding_attention") if "sliding_attention" in types else layers
    if types != ["full_attention"] * first + ["sliding_attention"] * (layers - first):
        raise CheckpointError(
            f"{cfg['model_type']} layer_types {types}: attnlab windows the layers from one index on, not this pattern"
        )
    return (int(size) - 1, first) if first < layers else (None, 0)  # (HuggingFace's W keys: the query and W - 1)


def family_of(c) -> str | None:
    """The HuggingFace family an attnlab GPTConfig exports as (None: not Llama-shaped)."""
    shaped = c.norm == "rms" and c.gated_mlp and c.pos == "rope" and c.mlp and c.attn_tie == "none"
    shaped = shaped and not c.parallel_residual and not c.sandwich_norm and not c.attn_softcap and not c.global_every
    shaped = shaped and not c.post_ln
    plain = not c.embed_scale and c.logit_softcap == 0 and c.attn_scale is None and c.pos_combine == "add"
    if not (shaped and plain):
        return None
    partial = c.rope_fraction < 1  # (of these, only Phi-3's modelling rotates part of a head)
    if c.qk_norm:  # (Qwen's windows: on the layers from --window-from on)
        return "qwen3" if not c.bias and not c.qkv_bias and not partial else None
    if c.qkv_bias and not c.bias:
        return "qwen2" if not partial else None
    if c.window_from:
        return None
    if c.qkv_bias not in (None, c.bias):
        return None
    if partial:
        return "phi3" if not c.bias else None
    return "mistral" if c.window is not None and not c.bias else "llama" if c.window is None else None


def key_map(layers: int, qk_norm: bool) -> list[tuple[str, str]]:
    """(HuggingFace name, attnlab name) of every tensor but the fused q/k/v projection."""
    m = [("model.embed_tokens.weight", "tok_emb.weight"), ("model.norm.weight", "ln_f.weight")]
    for i in range(layers):
        h, a = f"model.layers.{i}.", f"blocks.{i}."
        m += [
            (h + "input_layernorm.weight", a + "ln1.weight"),
            (h + "post_attention_layernorm.weight", a + "ln2.weight"),
            (h + "self_attn.o_proj.weight", a + "attn.out_proj.weight"),
            (h + "mlp.gate_proj.weight", a + "mlp.gate.weight"),
            (h + "mlp.up_proj.weight", a + "mlp.fc.weight"),
            (h + "mlp.down_proj.weight", a + "mlp.proj.weight"),
        ]
        if qk_norm:
            m += [(h + "self_attn.q_norm.weight", a + "attn.q_norm.weight")]
            m += [(h + "self_attn.k_norm.weight", a + "attn.k_norm.weight")]
    return m


def unfused(state: dict[str, Tensor], config) -> dict[str, Tensor]:
    """Phi-3's fused ``qkv_proj`` ([W_Q; W_K; W_V]) and ``gate_up_proj`` ([W_gate; W_up]) under
    Llama's separate names (views: nothing is copied)."""
    out = dict(state)
    for i in range(config.layers):
        h = f"model.layers.{i}."
        if h + "self_attn.qkv_proj.weight" in out:
            q, k, v = out.pop(h + "self_attn.qkv_proj.weight").split(qkv_sizes(config))
            out.update({h + "self_attn.q_proj.weight": q, h + "self_attn.k_proj.weight": k,
                        h + "self_attn.v_proj.weight": v})  # fmt: skip
        if h + "mlp.gate_up_proj.weight" in out:
            gate, up = out.pop(h + "mlp.gate_up_proj.weight").chunk(2)
            out.update({h + "mlp.gate_proj.weight": gate, h + "mlp.up_proj.weight": up})
    return out


def load_llama(cfg: dict, state: dict[str, Tensor], with_class=None, dtype=None) -> nn.Module:
    from ..models.gpt import GPT

    config = llama_config(cfg)
    kind = cfg["model_type"]
    if kind == "phi3":
        state = unfused(state, config)
    get = hf_weights(state, "", kind, f"a {kind} model")
    new = {ours: get(hf) for hf, ours in key_map(config.layers, config.qk_norm)}
    optional = [(".o_proj.bias", ".out_proj.bias"), (".gate_proj.bias", ".gate.bias")]
    optional += [(".up_proj.bias", ".fc.bias"), (".down_proj.bias", ".proj.bias")]
    for i in range(config.layers):
        h, a = f"model.layers.{i}.", f"blocks.{i}."
        proj = [get(h + f"self_attn.{p}_proj.weight") for p in "qkv"]
        new[a + "attn.qkv.weight"] = torch.cat(proj)  # [W_Q; W_K; W_V]: (H·d + 2·H_kv·d, D)
        if h + "self_attn.q_proj.bias" in state:
            new[a + "attn.qkv.bias"] = torch.cat([get(h + f"self_attn.{p}_proj.bias") for p in "qkv"])
        for theirs, ours in optional:
            sub = "self_attn" if "o_proj" in theirs else "mlp"
            name = h + sub + theirs
            if name in state:
                new[a + ("attn" if sub == "self_attn" else "mlp") + ours] = state[name]
    if not config.tie_output:
        new["lm_head.weight"] = get("lm_head.weight")
    return filled(with_class(GPT) if with_class else GPT, config, new, kind, dtype)


def export_llama(model: nn.Module) -> tuple[dict[str, Tensor], dict]:
    c = model.config
    kind = family_of(c)
    if kind is None:
        raise CheckpointError(
            "only RMSNorm, gated-MLP, rotary GPT models without soft-caps, embedding scale or tied projections map "
            "to Llama, Qwen2, Qwen3 or Mistral"
        )
    sd = {k: v.detach().cpu() for k, v in model.state_dict().items()}
    sd["tok_emb.weight"] = sd["tok_emb.weight"][: c.vocab_size]
    out = {hf: sd[ours].contiguous() for hf, ours in key_map(c.layers, c.qk_norm)}
    split = qkv_sizes(c)
    for i in range(c.layers):
        h, a = f"model.layers.{i}.", f"blocks.{i}."
        for p, w in zip("qkv", sd[a + "attn.qkv.weight"].split(split)):
            out[h + f"self_attn.{p}_proj.weight"] = w.contiguous()
        if a + "attn.qkv.bias" in sd:
            for p, b in zip("qkv", sd[a + "attn.qkv.bias"].split(split)):
                out[h + f"self_attn.{p}_proj.bias"] = b.contiguous()
        if c.bias:
            out[h + "self_attn.o_proj.bias"] = sd[a + "attn.out_proj.bias"].contiguous()
            for theirs, ours in (("gate_proj", "gate"), ("up_proj", "fc"), ("down_proj", "proj")):
                out[h + f"mlp.{theirs}.bias"] = sd[a + f"mlp.{ours}.bias"].contiguous()
    if not c.tie_output:
        out["lm_head.weight"] = sd["lm_head.weight"][: c.vocab_size].contiguous()
    if kind == "phi3":  # (fused as Phi-3 keeps them)
        for i in range(c.layers):
            h = f"model.layers.{i}."
            out[h + "self_attn.qkv_proj.weight"] = torch.cat([out.pop(h + f"self_attn.{p}_proj.weight") for p in "qkv"])
            out[h + "mlp.gate_up_proj.weight"] = torch.cat(
                [out.pop(h + f"mlp.{p}_proj.weight") for p in ("gate", "up")]
            )
    config = {
        **shape_entries(c, kind, ARCHITECTURES[kind]),
        "hidden_act": {v: k for k, v in ACTIVATIONS.items()}[c.activation],
        "rope_theta": c.rope_base,
        "partial_rotary_factor": c.rope_fraction,
        "rope_parameters": {"rope_theta": c.rope_base, "partial_rotary_factor": c.rope_fraction, **scaling_of(c)},
        "tie_word_embeddings": c.tie_output,
        "attention_dropout": 0.0,
        "torch_dtype": "float32",
    }
    if kind in ("llama", "qwen3"):
        config.update(attention_bias=c.bias, mlp_bias=c.bias)
    if kind == "mistral":
        config["sliding_window"] = c.window + 1
    if kind in ("qwen2", "qwen3"):
        windowed = c.window is not None
        config.update(use_sliding_window=windowed, sliding_window=c.window + 1 if windowed else None,
                      max_window_layers=c.window_from if windowed else c.layers,
                      layer_types=["full_attention" if c.layer_window(i) is None else "sliding_attention"
                                   for i in range(c.layers)])  # fmt: skip
    if kind == "phi3":
        original = config["rope_parameters"].get("original_max_position_embeddings", c.context)
        config.update(sliding_window=c.window + 1 if c.window is not None else None,
                      original_max_position_embeddings=original)  # fmt: skip
        if c.vocab_size <= 32000:  # (Phi3Config's default special ids, 32000, would lie outside the vocabulary)
            config.update(bos_token_id=None, eos_token_id=None, pad_token_id=None)
    return out, config


def scaling_of(c) -> dict:
    """HuggingFace's rope_parameters entries for attnlab's --rope-scaling."""
    if not c.rope_scaling:
        return {"rope_type": "default"}
    kind, numbers = rope_scaling_parts(c.rope_scaling)
    if kind == "linear":
        return {"rope_type": "linear", "factor": numbers[0]}
    if kind == "yarn":
        factor, original, beta_fast, beta_slow, attention, truncate = numbers
        return {"rope_type": "yarn", "factor": factor, "original_max_position_embeddings": int(original),
                "beta_fast": beta_fast, "beta_slow": beta_slow, "attention_factor": attention,
                "truncate": bool(truncate)}  # fmt: skip
    if kind == "dynamic":
        return {"rope_type": "dynamic", "factor": numbers[0]}
    if kind == "longrope":
        original, attention, short, long = numbers
        return {"rope_type": "longrope", "original_max_position_embeddings": int(original),
                "attention_factor": attention, "short_factor": short, "long_factor": long}  # fmt: skip
    factor, low, high, original = numbers
    return {"rope_type": "llama3", "factor": factor, "low_freq_factor": low, "high_freq_factor": high,
            "original_max_position_embeddings": int(original)}  # fmt: skip


def yarn_attention(factor: float, mscale: float | None, mscale_all_dim: float | None) -> float:
    """YaRN's attention factor when a config leaves it out: 0.1 ln F + 1 (DeepSeek's form, the ratio
    of two such with their own multipliers, when both are given); 1 without extension."""

    def scale(m: float = 1.0) -> float:
        return 1.0 if factor <= 1 else 0.1 * m * math.log(factor) + 1.0

    return scale(mscale) / scale(mscale_all_dim) if mscale and mscale_all_dim else scale()


def exports_as(kind: str):
    return lambda model: family_of(model.config) == kind


CONVERTERS = [register(Converter(kind, "gpt", load_llama, export_llama, exports_as(kind))) for kind in ARCHITECTURES]
