"""GPT-NeoX (``gpt_neox``: Pythia, GPT-NeoX-20B) <-> attnlab GPT.

Pythia is a configuration of attnlab's GPT (and any rotary, pre-LN GPT with biases exports as a
GPT-NeoX with ``use_parallel_residual`` false):

    x = x + Attn(LN1 x) + MLP(LN2 x)     parallel residual: both sublayers read the block's input
    q, k rotated on their first quarter  partial rotary embedding (rotary_pct 0.25)
    LayerNorm with biases, GELU MLP, biases everywhere, an untied output head (embed_out).

Its fused ``query_key_value`` is laid out head by head ([q_0; k_0; v_0; q_1; ...], each
``head_dim`` rows), where attnlab's ``qkv`` stacks all queries, then all keys, then all values:
the converter reorders the rows (both ways).
"""

from __future__ import annotations

from torch import Tensor, nn

from ..errors import CheckpointError
from . import Converter, filled, hf_weights, register

ACTIVATIONS = {"gelu": "gelu", "gelu_new": "gelu_tanh", "gelu_fast": "gelu_tanh", "relu": "relu"}


def rope_settings(cfg: dict) -> tuple[float, float]:
    """(base, rotated fraction) from a config that writes them as transformers 5 does
    (``rope_parameters``) or as older ones do (``rotary_emb_base``, ``rotary_pct``)."""
    params = cfg.get("rope_parameters") or cfg.get("rope_scaling") or {}
    kind = params.get("rope_type", params.get("type", "default"))
    if kind != "default":
        raise CheckpointError(f"gpt_neox checkpoint with RoPE scaling {kind!r}: attnlab reads unscaled rotary only")
    base = cfg.get("rotary_emb_base") or cfg.get("rope_theta") or params.get("rope_theta") or 10000.0
    fraction = cfg.get("rotary_pct") or cfg.get("partial_rotary_factor") or params.get("partial_rotary_factor") or 1.0
    return float(base), float(fraction)


def neox_config(cfg: dict):
    from ..models.gpt import GPTConfig

    act = cfg.get("hidden_act", "gelu")
    if act not in ACTIVATIONS:
        raise CheckpointError(f"gpt_neox activation {act!r} is not supported; attnlab knows {sorted(ACTIVATIONS)}")
    if not cfg.get("attention_bias", True):
        raise CheckpointError("gpt_neox checkpoint without attention biases is not supported")
    base, fraction = rope_settings(cfg)
    return GPTConfig(
        vocab_size=cfg["vocab_size"],
        context=cfg.get("max_position_embeddings", 2048),
        layers=cfg["num_hidden_layers"],
        heads=cfg["num_attention_heads"],
        dim=cfg["hidden_size"],
        mlp_hidden=cfg["intermediate_size"],
        dropout=0.0,
        bias=True,
        pos="rope",
        rope_base=base,
        rope_fraction=fraction,
        parallel_residual=bool(cfg.get("use_parallel_residual", True)),
        activation=ACTIVATIONS[act],
        norm_eps=cfg.get("layer_norm_eps", 1e-5),
        tie_output=bool(cfg.get("tie_word_embeddings", False)),
    )


def key_map(layers: int) -> list[tuple[str, str]]:
    """(HuggingFace name, attnlab name) of every tensor but the fused q/k/v projection's."""
    m = [
        ("gpt_neox.embed_in.weight", "tok_emb.weight"),
        ("gpt_neox.final_layer_norm.weight", "ln_f.weight"),
        ("gpt_neox.final_layer_norm.bias", "ln_f.bias"),
    ]
    for i in range(layers):
        h, a = f"gpt_neox.layers.{i}.", f"blocks.{i}."
        for kind in ("weight", "bias"):
            m += [
                (h + f"input_layernorm.{kind}", a + f"ln1.{kind}"),
                (h + f"post_attention_layernorm.{kind}", a + f"ln2.{kind}"),
                (h + f"attention.dense.{kind}", a + f"attn.out_proj.{kind}"),
                (h + f"mlp.dense_h_to_4h.{kind}", a + f"mlp.fc.{kind}"),
                (h + f"mlp.dense_4h_to_h.{kind}", a + f"mlp.proj.{kind}"),
            ]
    return m


def from_head_major(t: Tensor, heads: int) -> Tensor:
    """[q_0; k_0; v_0; q_1; ...] (heads·3·d, ...) -> [q_0; q_1; ...; k_0; ...; v_0; ...]."""
    return t.view(heads, 3, -1, *t.shape[1:]).transpose(0, 1).reshape(t.shape)


def to_head_major(t: Tensor, heads: int) -> Tensor:
    """The inverse of :func:`from_head_major`."""
    return t.view(3, heads, -1, *t.shape[1:]).transpose(0, 1).reshape(t.shape)


def load_neox(cfg: dict, state: dict[str, Tensor], with_class=None, dtype=None) -> nn.Module:
    from ..models.gpt import GPT

    config = neox_config(cfg)
    get = hf_weights(state, "", "gpt_neox", "a GPT-NeoX model")
    new = {ours: get(hf) for hf, ours in key_map(config.layers)}
    for i in range(config.layers):
        h = f"gpt_neox.layers.{i}.attention.query_key_value."
        for kind in ("weight", "bias"):
            new[f"blocks.{i}.attn.qkv.{kind}"] = from_head_major(get(h + kind), config.heads)
    if not config.tie_output:
        new["lm_head.weight"] = get("embed_out.weight")
    return filled(with_class(GPT) if with_class else GPT, config, new, "gpt_neox", dtype)


def is_neox(c) -> bool:
    """Whether an attnlab GPTConfig is GPT-NeoX-shaped."""
    return (
        c.norm == "layer" and c.pos == "rope" and c.bias and c.mlp and not c.gated_mlp
        and c.qkv_bias in (None, True) and (c.kv_heads or c.heads) == c.heads and c.head_dim in (None, c.dim // c.heads)
        and c.window is None and not c.qk_norm and not c.embed_scale and c.logit_softcap == 0
        and c.attn_scale is None and c.attn_tie == "none" and c.activation in ACTIVATIONS.values()
        and not c.sandwich_norm and not c.attn_softcap and not c.rope_scaling and not c.post_ln
    )  # fmt: skip


def export_neox(model: nn.Module) -> tuple[dict[str, Tensor], dict]:
    c = model.config
    if not is_neox(c):
        raise CheckpointError(
            "only rotary GPT models with LayerNorm, biases, a plain MLP and one key head per query head map to GPT-NeoX"
        )
    sd = {k: v.detach().cpu() for k, v in model.state_dict().items()}
    sd["tok_emb.weight"] = sd["tok_emb.weight"][: c.vocab_size]
    out = {hf: sd[ours].contiguous() for hf, ours in key_map(c.layers)}
    for i in range(c.layers):
        for kind in ("weight", "bias"):
            qkv = sd[f"blocks.{i}.attn.qkv.{kind}"]
            out[f"gpt_neox.layers.{i}.attention.query_key_value.{kind}"] = to_head_major(qkv, c.heads).contiguous()
    out["embed_out.weight"] = (sd["lm_head.weight"] if not c.tie_output else sd["tok_emb.weight"])[: c.vocab_size]
    config = {
        "architectures": ["GPTNeoXForCausalLM"],
        "model_type": "gpt_neox",
        "vocab_size": c.vocab_size,
        "hidden_size": c.dim,
        "intermediate_size": c.mlp_hidden or 4 * c.dim,
        "num_hidden_layers": c.layers,
        "num_attention_heads": c.heads,
        "hidden_act": {v: k for k, v in ACTIVATIONS.items() if k != "gelu_fast"}[c.activation],
        "max_position_embeddings": c.context,
        "layer_norm_eps": c.norm_eps,
        "rotary_pct": c.rope_fraction,
        "rotary_emb_base": c.rope_base,
        "rope_parameters": {
            "rope_theta": c.rope_base,
            "partial_rotary_factor": c.rope_fraction,
            "rope_type": "default",
        },
        "use_parallel_residual": c.parallel_residual,
        "attention_bias": True,
        "tie_word_embeddings": False,
        "torch_dtype": "float32",
    }
    return out, config


CONVERTER = register(Converter("gpt_neox", "gpt", load_neox, export_neox, lambda model: is_neox(model.config)))
