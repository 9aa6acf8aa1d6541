"""Gemma 2 (``gemma2``) and Gemma 3 text (``gemma3_text``) <-> attnlab GPT.

Both are configurations of attnlab's GPT:

    x_0 = E[tokens] · √D                                  embeddings scaled (embed_scale)
    x = x + N_post(Attn(N_pre x));  x = x + N_post'(MLP(N_pre' x))   sandwich norms (sandwich_norm)
    Attn: grouped-query, rotary, scores · query_pre_attn_scalar^-1/2 (attn_scale),
          windowed on all layers but every Nth (window, global_every)
    MLP: GeGLU, gelu_tanh(x W_gate) ⊙ x W_up
    logits = N_f(x_L) Eᵀ                                  tied head

Gemma 2 soft-caps the attention scores and the logits (attn_softcap, logit_softcap); Gemma 3
RMS-normalises each head's queries and keys (qk_norm) and rotates its windowed layers with
another base (rope_local_base). Gemma's RMSNorm multiplies by (1 + w): attnlab's RMSNorm keeps
the gain 1 + w itself, so the converter adds 1 reading and subtracts it writing.
"""

from __future__ import annotations

from torch import Tensor, nn

from ..errors import CheckpointError
from . import Converter, filled, hf_weights, register
from .llama import decoder_shape, qkv_sizes, rope_of, scaling_of, shape_entries

ARCHITECTURES = {"gemma2": "Gemma2ForCausalLM", "gemma3_text": "Gemma3ForCausalLM"}
ACTIVATIONS = {"gelu_pytorch_tanh": "gelu_tanh", "gelu": "gelu"}


def global_every(layer_types: list[str] | None, pattern: int | None) -> int:
    """The N of "every Nth layer attends globally" that ``layer_types`` follows (0: none does)."""
    if not layer_types:
        return int(pattern or 0)
    full = [i for i, t in enumerate(layer_types) if t == "full_attention"]
    n = full[0] + 1 if full else 0
    expected = ["full_attention" if n and (i + 1) % n == 0 else "sliding_attention" for i in range(len(layer_types))]
    if layer_types != expected:
        raise CheckpointError(f"layer_types {layer_types} follow no every-Nth-layer pattern; attnlab cannot build it")
    return n


def gemma_rope(cfg: dict) -> tuple[float, float | None, str | None]:
    """(the global layers' rotary base, the windowed layers' when they rotate otherwise, the global
    layers' --rope-scaling) of a Gemma config, as transformers 5 writes it (per layer type) or as
    older configs do (Gemma 3: ``rope_scaling`` for the global layers, ``rope_local_base_freq``
    unscaled for the windowed ones; Gemma 2: one rotation for all)."""
    params = cfg.get("rope_parameters") or {}
    per_type = params if "full_attention" in params else {"full_attention": params or cfg.get("rope_scaling") or {}}

    def rotation(p: dict | None, theta: float | None) -> tuple[float, str | None]:
        base, _, scaling = rope_of({**cfg, "rope_theta": None, "rope_scaling": None,
                                    "rope_parameters": {"rope_theta": theta or 10000.0, **(p or {})}})  # fmt: skip
        return base, scaling

    base, scaling = rotation(per_type["full_attention"], cfg.get("rope_theta"))
    if "sliding_attention" in per_type:
        local = rotation(per_type["sliding_attention"], cfg.get("rope_local_base_freq"))
    elif cfg["model_type"] == "gemma3_text" and cfg.get("rope_local_base_freq"):
        local = (float(cfg["rope_local_base_freq"]), None)
    else:
        local = (base, scaling)
    if local == (base, scaling):
        return base, None, scaling
    if local[1] is not None:
        raise CheckpointError(f"{cfg['model_type']} checkpoint whose windowed layers scale RoPE otherwise: not built")
    return base, local[0], scaling


def gemma_config(cfg: dict):
    from ..models.gpt import GPTConfig

    kind = cfg["model_type"]
    act = cfg.get("hidden_activation") or cfg.get("hidden_act") or "gelu_pytorch_tanh"
    if act not in ACTIVATIONS:
        raise CheckpointError(f"{kind} activation {act!r} is not supported; attnlab knows {sorted(ACTIVATIONS)}")
    if cfg.get("attention_bias"):
        raise CheckpointError(f"{kind} checkpoint with attention biases is not supported")
    if cfg.get("use_bidirectional_attention"):
        raise CheckpointError(f"{kind} checkpoint with bidirectional attention is not a causal language model")
    base, local, scaling = gemma_rope(cfg)
    shape = decoder_shape(cfg, context=8192, scaling=scaling)
    head_dim = shape["head_dim"] or shape["dim"] // shape["heads"]
    every = global_every(
        cfg.get("layer_types"), cfg.get("_sliding_window_pattern") or cfg.get("sliding_window_pattern")
    )
    window = cfg.get("sliding_window")
    all_global = every == 1 or not window
    return GPTConfig(
        **shape,
        dropout=0.0,
        bias=False,
        pos="rope",
        rope_base=base,
        rope_local_base=None if all_global else local,
        rope_scaling=scaling,
        norm="rms",
        norm_eps=cfg.get("rms_norm_eps", 1e-6),
        gated_mlp=True,
        activation=ACTIVATIONS[act],
        embed_scale=True,
        sandwich_norm=True,
        attn_scale=float(cfg.get("query_pre_attn_scalar") or head_dim) ** -0.5,
        attn_softcap=float(cfg.get("attn_logit_softcapping") or 0.0),
        logit_softcap=float(cfg.get("final_logit_softcapping") or 0.0),
        qk_norm=kind == "gemma3_text",
        window=None if all_global else int(window) - 1,  # (HuggingFace's W keys: the query and W - 1 before it)
        global_every=0 if all_global else every,
        tie_output=bool(cfg.get("tie_word_embeddings", True)),
    )


NORMS = [("input_layernorm", "ln1"), ("post_attention_layernorm", "ln1_post"),
         ("pre_feedforward_layernorm", "ln2"), ("post_feedforward_layernorm", "ln2_post")]  # fmt: skip


def key_map(layers: int, qk_norm: bool) -> list[tuple[str, str, bool]]:
    """(HuggingFace name, attnlab name, a Gemma norm (1 + w)?) of every tensor but q/k/v."""
    m = [("model.embed_tokens.weight", "tok_emb.weight", False), ("model.norm.weight", "ln_f.weight", True)]
    for i in range(layers):
        h, a = f"model.layers.{i}.", f"blocks.{i}."
        m += [(h + f"{theirs}.weight", a + f"{ours}.weight", True) for theirs, ours in NORMS]
        m += [
            (h + "self_attn.o_proj.weight", a + "attn.out_proj.weight", False),
            (h + "mlp.gate_proj.weight", a + "mlp.gate.weight", False),
            (h + "mlp.up_proj.weight", a + "mlp.fc.weight", False),
            (h + "mlp.down_proj.weight", a + "mlp.proj.weight", False),
        ]
        if qk_norm:
            m += [(h + "self_attn.q_norm.weight", a + "attn.q_norm.weight", True)]
            m += [(h + "self_attn.k_norm.weight", a + "attn.k_norm.weight", True)]
    return m


def load_gemma(cfg: dict, state: dict[str, Tensor], with_class=None, dtype=None) -> nn.Module:
    import torch

    from ..models.gpt import GPT

    config = gemma_config(cfg)
    kind = cfg["model_type"]
    prefix = "model.language_model." if any(k.startswith("model.language_model.") for k in state) else ""
    get = hf_weights({k.replace(prefix, "model.", 1) if prefix else k: v for k, v in state.items()}, "", kind,
                     f"a {kind} model")  # fmt: skip
    new = {ours: get(hf) + 1 if gain else get(hf) for hf, ours, gain in key_map(config.layers, config.qk_norm)}
    for i in range(config.layers):
        h = f"model.layers.{i}.self_attn."
        new[f"blocks.{i}.attn.qkv.weight"] = torch.cat([get(h + f"{p}_proj.weight") for p in "qkv"])
    if not config.tie_output:
        new["lm_head.weight"] = get("lm_head.weight")
    return filled(with_class(GPT) if with_class else GPT, config, new, kind, dtype)


def family_of(c) -> str | None:
    """gemma2 or gemma3_text for a Gemma-shaped attnlab GPTConfig (None: not one)."""
    shaped = c.norm == "rms" and c.gated_mlp and c.pos == "rope" and c.sandwich_norm and c.embed_scale and c.mlp
    plain = not c.bias and not c.qkv_bias and not c.parallel_residual and c.rope_fraction == 1 and c.attn_tie == "none"
    plain = plain and not c.post_ln and not c.window_from
    if not (shaped and plain and c.pos_combine == "add"):
        return None
    if c.qk_norm:
        return "gemma3_text" if not c.attn_softcap and not c.logit_softcap else None
    return "gemma2" if c.rope_local_base is None else None


def export_gemma(model: nn.Module) -> tuple[dict[str, Tensor], dict]:
    c = model.config
    kind = family_of(c)
    if kind is None:
        raise CheckpointError(
            "only RMSNorm, GeGLU, rotary GPT models with sandwich norms and scaled embeddings map to Gemma"
        )
    sd = {k: v.detach().cpu() for k, v in model.state_dict().items()}
    sd["tok_emb.weight"] = sd["tok_emb.weight"][: c.vocab_size]
    out = {hf: (sd[ours] - 1 if gain else sd[ours]).contiguous() for hf, ours, gain in key_map(c.layers, c.qk_norm)}
    d = c.d_head
    for i in range(c.layers):
        qkv = sd[f"blocks.{i}.attn.qkv.weight"].split(qkv_sizes(c))
        for p, w in zip("qkv", qkv):
            out[f"model.layers.{i}.self_attn.{p}_proj.weight"] = w.contiguous()
    if not c.tie_output:
        out["lm_head.weight"] = sd["lm_head.weight"][: c.vocab_size].contiguous()
    layer_types = ["sliding_attention" if c.layer_window(i) is not None else "full_attention" for i in range(c.layers)]
    scalar = (c.attn_scale or d**-0.5) ** -2
    rotation = {"rope_theta": c.rope_base, **scaling_of(c)}
    config = {
        **shape_entries(c, kind, ARCHITECTURES[kind]),
        "hidden_activation": {v: k for k, v in ACTIVATIONS.items()}[c.activation],
        "query_pre_attn_scalar": round(scalar, 6) if abs(scalar - round(scalar)) > 1e-6 else int(round(scalar)),
        "sliding_window": c.window + 1 if c.window is not None else None,
        "layer_types": layer_types,
        "attn_logit_softcapping": c.attn_softcap or None,
        "final_logit_softcapping": c.logit_softcap or None,
        "attention_bias": False,
        "tie_word_embeddings": c.tie_output,
        "bos_token_id": None,
        "eos_token_id": None,
        "pad_token_id": None,
        "torch_dtype": "float32",
    }
    if kind == "gemma3_text":  # (the windowed layers unscaled with their own base, or rotating as the others)
        local = {"rope_theta": c.rope_local_base, "rope_type": "default"} if c.rope_local_base else rotation
        config.update(rope_parameters={"full_attention": rotation, "sliding_attention": local},
                      rope_theta=c.rope_base, rope_local_base_freq=local["rope_theta"])  # fmt: skip
    else:
        config.update(rope_parameters=rotation, rope_theta=c.rope_base)
    return out, config


def exports_as(kind: str):
    return lambda model: family_of(model.config) == kind


CONVERTERS = [register(Converter(kind, "gpt", load_gemma, export_gemma, exports_as(kind))) for kind in ARCHITECTURES]
