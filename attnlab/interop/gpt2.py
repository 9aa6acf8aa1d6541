"""GPT-2 (``GPT2LMHeadModel``) <-> attnlab GPT.

GPT-2's ``transformer.h.{i}.attn.c_attn`` is a Conv1D whose weight is (in, out), the
transpose of a Linear's; its output is [q; k; v] like attnlab's fused ``qkv``.
"""

from __future__ import annotations

from torch import Tensor, nn

from ..errors import CheckpointError
from . import Converter, filled, hf_weights, register


ACT_FROM_HF = {"gelu_new": "gelu_tanh", "gelu_pytorch_tanh": "gelu_tanh", "gelu": "gelu", "relu": "relu"}
ACT_TO_HF = {"gelu_tanh": "gelu_new", "gelu": "gelu", "relu": "relu"}


def gpt2_config(cfg: dict):
    from ..models.gpt import GPTConfig

    if cfg.get("scale_attn_by_inverse_layer_idx") or cfg.get("reorder_and_upcast_attn"):
        raise CheckpointError(
            "GPT-2 variants with scale_attn_by_inverse_layer_idx/reorder_and_upcast_attn are not supported"
        )
    n_inner = cfg.get("n_inner")
    if n_inner not in (None, 4 * cfg["n_embd"]):
        raise CheckpointError(f"GPT-2 config with n_inner={n_inner} (not 4*n_embd) is not supported")
    act = cfg.get("activation_function", "gelu_new")
    if act not in ACT_FROM_HF:
        raise CheckpointError(f"GPT-2 activation {act!r} is not supported; attnlab knows {sorted(ACT_FROM_HF)}")
    return GPTConfig(
        vocab_size=cfg["vocab_size"],
        context=cfg["n_positions"],
        layers=cfg["n_layer"],
        heads=cfg["n_head"],
        dim=cfg["n_embd"],
        dropout=0.0,
        bias=True,
        pos="learned",
        activation=ACT_FROM_HF[act],
        norm_eps=cfg.get("layer_norm_epsilon", 1e-5),
        tie_output=cfg.get("tie_word_embeddings", True),
    )


def gpt2_key_map(n_layer: int) -> list[tuple[str, str, bool]]:
    """(hf name without 'transformer.', attnlab name, transpose?)"""
    m = [
        ("wte.weight", "tok_emb.weight", False),
        ("wpe.weight", "pos_emb.weight", False),
        ("ln_f.weight", "ln_f.weight", False),
        ("ln_f.bias", "ln_f.bias", False),
    ]
    for i in range(n_layer):
        h, a = f"h.{i}.", f"blocks.{i}."
        m += [
            (h + "ln_1.weight", a + "ln1.weight", False),
            (h + "ln_1.bias", a + "ln1.bias", False),
            (h + "attn.c_attn.weight", a + "attn.qkv.weight", True),
            (h + "attn.c_attn.bias", a + "attn.qkv.bias", False),
            (h + "attn.c_proj.weight", a + "attn.out_proj.weight", True),
            (h + "attn.c_proj.bias", a + "attn.out_proj.bias", False),
            (h + "ln_2.weight", a + "ln2.weight", False),
            (h + "ln_2.bias", a + "ln2.bias", False),
            (h + "mlp.c_fc.weight", a + "mlp.fc.weight", True),
            (h + "mlp.c_fc.bias", a + "mlp.fc.bias", False),
            (h + "mlp.c_proj.weight", a + "mlp.proj.weight", True),
            (h + "mlp.c_proj.bias", a + "mlp.proj.bias", False),
        ]
    return m


def load_gpt2(cfg: dict, state: dict[str, Tensor], with_class=None, dtype=None) -> nn.Module:
    from ..models.gpt import GPT

    config = gpt2_config(cfg)
    prefix = "transformer." if any(k.startswith("transformer.") for k in state) else ""
    get = hf_weights(state, prefix, "GPT-2", "GPT-2")
    new = {}
    for hf, ours, transpose in gpt2_key_map(config.layers):
        t = get(hf)
        new[ours] = t.t().contiguous() if transpose else t
    if not config.tie_output:
        if "lm_head.weight" not in state:
            raise CheckpointError("untied GPT-2 checkpoint lacks lm_head.weight")
        new["lm_head.weight"] = state["lm_head.weight"]
    return filled(with_class(GPT) if with_class else GPT, config, new, "GPT-2", dtype)


def export_gpt2(model: nn.Module) -> tuple[dict[str, Tensor], dict]:
    c = model.config
    gpt2_only = dict(
        pos=(c.pos, "learned"),
        bias=(c.bias, True),
        mlp=(c.mlp, True),
        window=(c.window, None),
        embed_scale=(c.embed_scale, False),
        qk_norm=(c.qk_norm, False),
        logit_softcap=(c.logit_softcap, 0.0),
        pos_combine=(c.pos_combine, "add"),
        attn_tie=(c.attn_tie, "none"),
        attn_scale=(c.attn_scale, None),
        norm=(c.norm, "layer"),
        gated_mlp=(c.gated_mlp, False),
        kv_heads=(c.kv_heads or c.heads, c.heads),
        head_dim=(c.d_head, c.dim // c.heads),
        mlp_hidden=(c.mlp_hidden or 4 * c.dim, 4 * c.dim),
        qkv_bias=(c.qkv_bias if c.qkv_bias is not None else c.bias, True),
        parallel_residual=(c.parallel_residual, False),
        sandwich_norm=(c.sandwich_norm, False),
        post_ln=(c.post_ln, False),
        attn_softcap=(c.attn_softcap, 0.0),
        rope_scaling=(c.rope_scaling, None),
    )
    differ = {k: have for k, (have, need) in gpt2_only.items() if have != need}
    if c.activation not in ACT_TO_HF:
        differ["activation"] = c.activation
    if differ:
        raise CheckpointError(
            "only GPT models with learned positions, biases, MLPs, full attention, no QK-norm or logit cap and a "
            f"GPT-2 activation map to GPT-2; this one has {', '.join(f'{k}={v!r}' for k, v in differ.items())}"
        )
    sd = model.state_dict()
    # a padded vocabulary (vocab_multiple) exports its vocab_size real rows: the rest are never a token
    sd["tok_emb.weight"] = sd["tok_emb.weight"][: c.vocab_size]
    out = {}
    for hf, ours, transpose in gpt2_key_map(c.layers):
        t = sd[ours]
        out["transformer." + hf] = (t.t() if transpose else t).detach().cpu().contiguous()
    if not c.tie_output:
        out["lm_head.weight"] = sd["lm_head.weight"][: c.vocab_size].detach().cpu().contiguous()
    config = {
        "architectures": ["GPT2LMHeadModel"],
        "model_type": "gpt2",
        "vocab_size": c.vocab_size,
        "n_positions": c.context,
        "n_ctx": c.context,
        "n_embd": c.dim,
        "n_layer": c.layers,
        "n_head": c.heads,
        "n_inner": None,
        "activation_function": ACT_TO_HF[c.activation],
        "layer_norm_epsilon": c.norm_eps,
        "resid_pdrop": 0.0,
        "embd_pdrop": 0.0,
        "attn_pdrop": 0.0,
        "tie_word_embeddings": c.tie_output,
        "bos_token_id": c.vocab_size - 1,
        "eos_token_id": c.vocab_size - 1,
        "initializer_range": 0.02,
        "scale_attn_weights": True,
        "torch_dtype": "float32",
    }
    return out, config


CONVERTER = register(Converter("gpt2", "gpt", load_gpt2, export_gpt2, lambda model: model.config.pos == "learned"))
