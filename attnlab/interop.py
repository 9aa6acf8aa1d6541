"""HuggingFace checkpoint directories <-> attnlab models (no transformers import needed).

GPT-2: ``transformer.h.{i}.attn.c_attn`` is a Conv1D whose weight is (in, out), the
transpose of a Linear's; its output is [q; k; v] like attnlab's fused ``qkv``.
"""

from __future__ import annotations

import json
import pickle
from pathlib import Path

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file, save_file
from torch import Tensor, nn

from .errors import CheckpointError

_ACT_FROM_HF = {"gelu_new": "gelu_tanh", "gelu_pytorch_tanh": "gelu_tanh", "gelu": "gelu", "relu": "relu"}
_ACT_TO_HF = {"gelu_tanh": "gelu_new", "gelu": "gelu", "relu": "relu"}


def _read_state(d: Path) -> dict[str, Tensor]:
    try:
        if (d / "model.safetensors").is_file():
            return load_file(str(d / "model.safetensors"))
        if (d / "pytorch_model.bin").is_file():
            return torch.load(d / "pytorch_model.bin", map_location="cpu", weights_only=True)
    except pickle.UnpicklingError:
        raise CheckpointError(f"refusing to unpickle {d / 'pytorch_model.bin'}: it holds Python objects besides "
                              "tensors, and unpickling can run code; use a model.safetensors version of it") from None
    except (SafetensorError, RuntimeError, OSError, EOFError) as e:
        if "weights only" in str(e).lower() or "weights_only" in str(e):
            raise CheckpointError(f"refusing to unpickle {d / 'pytorch_model.bin'}: it is not a plain tensor file; use "
                                  "a model.safetensors version of it") from None
        raise CheckpointError(f"weights in {d} are corrupt or truncated ({str(e).splitlines()[0]})") from None
    raise CheckpointError(f"{d} has a config.json but no model.safetensors or pytorch_model.bin")


def load_hf(directory: str | Path) -> nn.Module:
    d = Path(directory)
    cfg = json.loads((d / "config.json").read_text())
    mtype = cfg.get("model_type")
    if mtype == "gpt2":
        return _load_gpt2(cfg, _read_state(d))
    if mtype == "vit":
        return _load_vit(cfg, _read_state(d))
    if mtype == "bert":
        return _load_bert(cfg, _read_state(d))
    raise CheckpointError(
        f"{d} is a HuggingFace {mtype!r} checkpoint; attnlab reads gpt2, vit and bert checkpoints"
    )


def _gpt2_config(cfg: dict):
    from .models.gpt import GPTConfig

    if cfg.get("scale_attn_by_inverse_layer_idx") or cfg.get("reorder_and_upcast_attn"):
        raise CheckpointError("GPT-2 variants with scale_attn_by_inverse_layer_idx/reorder_and_upcast_attn are not supported")
    n_inner = cfg.get("n_inner")
    if n_inner not in (None, 4 * cfg["n_embd"]):
        raise CheckpointError(f"GPT-2 config with n_inner={n_inner} (not 4*n_embd) is not supported")
    act = cfg.get("activation_function", "gelu_new")
    if act not in _ACT_FROM_HF:
        raise CheckpointError(f"GPT-2 activation {act!r} is not supported; attnlab knows {sorted(_ACT_FROM_HF)}")
    return GPTConfig(
        vocab_size=cfg["vocab_size"], context=cfg["n_positions"], layers=cfg["n_layer"],
        heads=cfg["n_head"], dim=cfg["n_embd"], dropout=0.0, bias=True, pos="learned",
        activation=_ACT_FROM_HF[act], norm_eps=cfg.get("layer_norm_epsilon", 1e-5),
        tie_weights=cfg.get("tie_word_embeddings", True),
    )


def _gpt2_key_map(n_layer: int) -> list[tuple[str, str, bool]]:
    """(hf name without 'transformer.', attnlab name, transpose?)"""
    m = [("wte.weight", "tok_emb.weight", False), ("wpe.weight", "pos_emb.weight", False),
         ("ln_f.weight", "ln_f.weight", False), ("ln_f.bias", "ln_f.bias", False)]
    for i in range(n_layer):
        h, a = f"h.{i}.", f"blocks.{i}."
        m += [
            (h + "ln_1.weight", a + "ln1.weight", False), (h + "ln_1.bias", a + "ln1.bias", False),
            (h + "attn.c_attn.weight", a + "attn.qkv.weight", True), (h + "attn.c_attn.bias", a + "attn.qkv.bias", False),
            (h + "attn.c_proj.weight", a + "attn.out_proj.weight", True), (h + "attn.c_proj.bias", a + "attn.out_proj.bias", False),
            (h + "ln_2.weight", a + "ln2.weight", False), (h + "ln_2.bias", a + "ln2.bias", False),
            (h + "mlp.c_fc.weight", a + "mlp.fc.weight", True), (h + "mlp.c_fc.bias", a + "mlp.fc.bias", False),
            (h + "mlp.c_proj.weight", a + "mlp.proj.weight", True), (h + "mlp.c_proj.bias", a + "mlp.proj.bias", False),
        ]
    return m


def _weights(state: dict[str, Tensor], prefix: str, family: str, what: str):
    """``get(name)``: the HuggingFace tensor ``prefix + name``, or a clear error when the
    checkpoint lacks it."""

    def get(name: str) -> Tensor:
        if prefix + name not in state:
            raise CheckpointError(f"{family} checkpoint lacks {prefix + name}; it is incomplete or not {what}")
        return state[prefix + name]

    return get


def _load_gpt2(cfg: dict, state: dict[str, Tensor]) -> nn.Module:
    from .models.gpt import GPT

    config = _gpt2_config(cfg)
    model = GPT(config)
    prefix = "transformer." if any(k.startswith("transformer.") for k in state) else ""
    get = _weights(state, prefix, "GPT-2", "GPT-2")
    new = {}
    for hf, ours, transpose in _gpt2_key_map(config.layers):
        t = get(hf)
        new[ours] = t.t().contiguous() if transpose else t
    if not config.tie_weights:
        if "lm_head.weight" not in state:
            raise CheckpointError("untied GPT-2 checkpoint lacks lm_head.weight")
        new["lm_head.weight"] = state["lm_head.weight"]
    missing, unexpected = model.load_state_dict(new, strict=False)
    missing = [k for k in missing if not (config.tie_weights and k == "lm_head.weight")]
    if missing or unexpected:
        raise CheckpointError(f"GPT-2 weights do not fit: missing {missing[:3]}, unexpected {unexpected[:3]}")
    return model


def export_hf(model: nn.Module, directory: str | Path) -> None:
    """Write a HuggingFace directory (config.json + model.safetensors) that ``from_pretrained``
    loads: GPT -> GPT2LMHeadModel, ViT -> ViTForImageClassification, text encoder ->
    BertForSequenceClassification / BertForMaskedLM / BertModel (by its heads)."""
    exporters = {"gpt": _export_gpt2, "vit": _export_vit, "text-encoder": _export_bert}
    kind = getattr(model, "model_type", None)
    if kind not in exporters:
        raise CheckpointError(f"export_hf writes GPT, ViT and text-encoder models, got {type(model).__name__}")
    d = Path(directory)
    d.mkdir(parents=True, exist_ok=True)
    tensors, config = exporters[kind](model)
    save_file({k: v.detach().cpu().contiguous().clone() for k, v in tensors.items()}, str(d / "model.safetensors"),
              metadata={"format": "pt"})
    (d / "config.json").write_text(json.dumps(config, indent=1))


def _export_gpt2(model: nn.Module) -> tuple[dict[str, Tensor], dict]:
    c = model.config
    if c.pos != "learned" or not c.bias:
        raise CheckpointError(
            f"only GPT models with learned positions and biases map to GPT-2; this one has pos={c.pos!r}, bias={c.bias}"
        )
    sd = model.state_dict()
    out = {}
    for hf, ours, transpose in _gpt2_key_map(c.layers):
        t = sd[ours]
        out["transformer." + hf] = (t.t() if transpose else t).detach().cpu().contiguous()
    if not c.tie_weights:
        out["lm_head.weight"] = sd["lm_head.weight"].detach().cpu().contiguous()
    config = {
        "architectures": ["GPT2LMHeadModel"], "model_type": "gpt2", "vocab_size": c.vocab_size,
        "n_positions": c.context, "n_ctx": c.context, "n_embd": c.dim, "n_layer": c.layers,
        "n_head": c.heads, "n_inner": None, "activation_function": _ACT_TO_HF[c.activation],
        "layer_norm_epsilon": c.norm_eps, "resid_pdrop": 0.0, "embd_pdrop": 0.0, "attn_pdrop": 0.0,
        "tie_word_embeddings": c.tie_weights, "bos_token_id": c.vocab_size - 1, "eos_token_id": c.vocab_size - 1,
        "initializer_range": 0.02, "scale_attn_weights": True, "torch_dtype": "float32",
    }
    return out, config


def _load_vit(cfg: dict, state: dict[str, Tensor]) -> nn.Module:
    """HF ViTModel / ViTForImageClassification -> attnlab ViT (class-token pooling, learned positions).
    A ViTModel (no classifier) becomes a ViT with num_classes=0 returning the class token's features."""
    from .models.vit import ViT, ViTConfig

    if cfg.get("hidden_act", "gelu") != "gelu":
        raise CheckpointError(f"ViT with hidden_act={cfg.get('hidden_act')!r} is not supported (only exact gelu)")
    prefix = "vit." if any(k.startswith("vit.") for k in state) else ""
    has_head = "classifier.weight" in state
    d = cfg["hidden_size"]
    id2label = cfg.get("id2label") or {}
    num_classes = state["classifier.weight"].shape[0] if has_head else 0
    labels = [id2label.get(str(i), id2label.get(i, str(i))) for i in range(num_classes)] if has_head else None
    config = ViTConfig(
        image_size=cfg["image_size"], patch_size=cfg["patch_size"], in_chans=cfg.get("num_channels", 3),
        num_classes=num_classes, dim=d, layers=cfg["num_hidden_layers"], heads=cfg["num_attention_heads"],
        mlp_ratio=cfg["intermediate_size"] / d, pool="cls", pos="learned",
        norm_eps=cfg.get("layer_norm_eps", 1e-12), qkv_bias=cfg.get("qkv_bias", True), labels=labels,
    )
    model = ViT(config)

    get = _weights(state, prefix, "ViT", "a ViT")

    new = {
        "cls_token": get("embeddings.cls_token"),
        "pos.weight": get("embeddings.position_embeddings")[0],
        "patch_embed.proj.weight": get("embeddings.patch_embeddings.projection.weight"),
        "patch_embed.proj.bias": get("embeddings.patch_embeddings.projection.bias"),
        "encoder.ln_f.weight": get("layernorm.weight"),
        "encoder.ln_f.bias": get("layernorm.bias"),
    }
    for i in range(config.layers):
        h, a = f"encoder.layer.{i}.", f"encoder.blocks.{i}."
        new[a + "attn.qkv.weight"] = torch.cat([get(h + f"attention.attention.{n}.weight") for n in ("query", "key", "value")])
        if config.qkv_bias:
            new[a + "attn.qkv.bias"] = torch.cat([get(h + f"attention.attention.{n}.bias") for n in ("query", "key", "value")])
        for ours, theirs in (("attn.out_proj", "attention.output.dense"), ("mlp.fc", "intermediate.dense"),
                             ("mlp.proj", "output.dense"), ("ln1", "layernorm_before"), ("ln2", "layernorm_after")):
            new[a + ours + ".weight"] = get(h + theirs + ".weight")
            new[a + ours + ".bias"] = get(h + theirs + ".bias")
    if has_head:
        new["head.weight"], new["head.bias"] = state["classifier.weight"], state["classifier.bias"]
    missing, unexpected = model.load_state_dict(new, strict=False)
    if missing or unexpected:
        raise CheckpointError(f"ViT weights do not fit: missing {missing[:3]}, unexpected {unexpected[:3]}")
    return model


# ---- ViT export ---------------------------------------------------------------------------------------
_VIT_BLOCK = (("attn.out_proj", "attention.output.dense"), ("mlp.fc", "intermediate.dense"),
              ("mlp.proj", "output.dense"), ("ln1", "layernorm_before"), ("ln2", "layernorm_after"))


def _export_vit(model: nn.Module) -> tuple[dict[str, Tensor], dict]:
    c = model.config
    if c.pool != "cls" or c.pos != "learned" or c.peg or c.num_classes < 1:
        raise CheckpointError("only ViTs with a class token, learned positions, no PEG and a classifier map to "
                              f"ViTForImageClassification; this one has pool={c.pool}, pos={c.pos}, peg={c.peg}, "
                              f"num_classes={c.num_classes}")
    sd = model.state_dict()
    out = {"vit.embeddings.cls_token": sd["cls_token"], "vit.embeddings.position_embeddings": sd["pos.weight"][None],
           "vit.embeddings.patch_embeddings.projection.weight": sd["patch_embed.proj.weight"],
           "vit.embeddings.patch_embeddings.projection.bias": sd["patch_embed.proj.bias"],
           "vit.layernorm.weight": sd["encoder.ln_f.weight"], "vit.layernorm.bias": sd["encoder.ln_f.bias"],
           "classifier.weight": sd["head.weight"], "classifier.bias": sd["head.bias"]}
    for i in range(c.layers):
        h, a = f"vit.encoder.layer.{i}.", f"encoder.blocks.{i}."
        for name, w in zip(("query", "key", "value"), sd[a + "attn.qkv.weight"].chunk(3)):
            out[h + f"attention.attention.{name}.weight"] = w
        if c.qkv_bias:
            for name, b in zip(("query", "key", "value"), sd[a + "attn.qkv.bias"].chunk(3)):
                out[h + f"attention.attention.{name}.bias"] = b
        for ours, theirs in _VIT_BLOCK:
            out[h + theirs + ".weight"], out[h + theirs + ".bias"] = sd[a + ours + ".weight"], sd[a + ours + ".bias"]
    labels = c.labels or [str(i) for i in range(c.num_classes)]
    config = {"architectures": ["ViTForImageClassification"], "model_type": "vit", "hidden_size": c.dim,
              "num_hidden_layers": c.layers, "num_attention_heads": c.heads,
              "intermediate_size": round(c.dim * c.mlp_ratio), "hidden_act": "gelu", "hidden_dropout_prob": 0.0,
              "attention_probs_dropout_prob": 0.0, "initializer_range": 0.02, "layer_norm_eps": c.norm_eps,
              "image_size": c.image_size, "patch_size": c.patch_size, "num_channels": c.in_chans,
              "qkv_bias": c.qkv_bias, "id2label": {str(i): str(lab) for i, lab in enumerate(labels)},
              "label2id": {str(lab): i for i, lab in enumerate(labels)}, "torch_dtype": "float32"}
    return out, config


# ---- BERT ------------------------------------------------------------------------------------------------
_BERT_EMBED = (("tok_emb.weight", "embeddings.word_embeddings.weight"), ("pos.weight", "embeddings.position_embeddings.weight"),
               ("seg_emb.weight", "embeddings.token_type_embeddings.weight"),
               ("emb_norm.weight", "embeddings.LayerNorm.weight"), ("emb_norm.bias", "embeddings.LayerNorm.bias"))
_BERT_BLOCK = (("attn.out_proj", "attention.output.dense"), ("ln1", "attention.output.LayerNorm"),
               ("mlp.fc", "intermediate.dense"), ("mlp.proj", "output.dense"), ("ln2", "output.LayerNorm"))
_BERT_MLM = (("mlm.dense.weight", "cls.predictions.transform.dense.weight"),
             ("mlm.dense.bias", "cls.predictions.transform.dense.bias"),
             ("mlm.norm.weight", "cls.predictions.transform.LayerNorm.weight"),
             ("mlm.norm.bias", "cls.predictions.transform.LayerNorm.bias"), ("mlm.bias", "cls.predictions.bias"))


def _bert_key_map(layers: int) -> list[tuple[str, str]]:
    """(attnlab name, HuggingFace name without the "bert." prefix) of the encoder body; the fused
    qkv is handled apart (HF keeps query, key and value separately)."""
    m = list(_BERT_EMBED)
    for i in range(layers):
        a, h = f"encoder.blocks.{i}.", f"encoder.layer.{i}."
        for ours, theirs in _BERT_BLOCK:
            m += [(a + ours + ".weight", h + theirs + ".weight"), (a + ours + ".bias", h + theirs + ".bias")]
    return m + [("pooler.weight", "pooler.dense.weight"), ("pooler.bias", "pooler.dense.bias")]


def _load_bert(cfg: dict, state: dict[str, Tensor]) -> nn.Module:
    """HF BertModel / BertForMaskedLM / BertForSequenceClassification -> attnlab TextEncoder."""
    from .models.encoder import TextEncoder, TextEncoderConfig

    if cfg.get("hidden_act", "gelu") != "gelu" or cfg.get("position_embedding_type", "absolute") != "absolute":
        raise CheckpointError("only BERT with exact gelu and absolute positions is supported, got hidden_act="
                              f"{cfg.get('hidden_act')!r}, position_embedding_type={cfg.get('position_embedding_type')!r}")
    prefix = "bert." if any(k.startswith("bert.") for k in state) else ""
    has_mlm = "cls.predictions.transform.dense.weight" in state
    num_labels = state["classifier.weight"].shape[0] if "classifier.weight" in state else 0
    id2label = cfg.get("id2label") or {}
    labels = [id2label.get(str(i), id2label.get(i, str(i))) for i in range(num_labels)] if num_labels else None
    config = TextEncoderConfig(
        vocab_size=cfg["vocab_size"], context=cfg["max_position_embeddings"], layers=cfg["num_hidden_layers"],
        heads=cfg["num_attention_heads"], dim=cfg["hidden_size"], mlp_dim=cfg["intermediate_size"],
        type_vocab_size=cfg.get("type_vocab_size", 2), dropout=0.0, norm_eps=cfg.get("layer_norm_eps", 1e-12),
        pad_id=cfg.get("pad_token_id") or 0, mlm_head=has_mlm, num_labels=num_labels, labels=labels)
    model = TextEncoder(config)

    get = _weights(state, prefix, "BERT", "BERT")

    has_pooler = prefix + "pooler.dense.weight" in state
    new = {ours: get(theirs) for ours, theirs in _bert_key_map(config.layers) if has_pooler or "pooler" not in ours}
    for i in range(config.layers):
        h = f"encoder.layer.{i}.attention.self."
        new[f"encoder.blocks.{i}.attn.qkv.weight"] = torch.cat([get(h + f"{n}.weight") for n in ("query", "key", "value")])
        new[f"encoder.blocks.{i}.attn.qkv.bias"] = torch.cat([get(h + f"{n}.bias") for n in ("query", "key", "value")])
    if has_mlm:
        for ours, theirs in _BERT_MLM:
            new[ours] = state[theirs]
    if num_labels:
        new["classifier.weight"], new["classifier.bias"] = state["classifier.weight"], state["classifier.bias"]
    missing, unexpected = model.load_state_dict(new, strict=False)
    missing = [k for k in missing if k != "mlm.decoder.weight" and not (k.startswith("pooler.") and not has_pooler)]
    if missing or unexpected:
        raise CheckpointError(f"BERT weights do not fit: missing {missing[:3]}, unexpected {unexpected[:3]}")
    return model


def _export_bert(model: nn.Module) -> tuple[dict[str, Tensor], dict]:
    c = model.config
    if c.norm_first:
        raise CheckpointError("a pre-LN text encoder (norm_first=True) does not map to BERT, which is post-LN")
    sd = model.state_dict()
    if c.num_labels:
        arch, prefix = "BertForSequenceClassification", "bert."
    elif c.mlm_head:
        arch, prefix = "BertForMaskedLM", "bert."
    else:
        arch, prefix = "BertModel", ""
    out = {prefix + theirs: sd[ours] for ours, theirs in _bert_key_map(c.layers)
           if not (arch == "BertForMaskedLM" and ours.startswith("pooler."))}  # HF's masked LM has no pooler
    for i in range(c.layers):
        h = f"{prefix}encoder.layer.{i}.attention.self."
        for name, w, b in zip(("query", "key", "value"), sd[f"encoder.blocks.{i}.attn.qkv.weight"].chunk(3),
                              sd[f"encoder.blocks.{i}.attn.qkv.bias"].chunk(3)):
            out[h + f"{name}.weight"], out[h + f"{name}.bias"] = w, b
    if arch == "BertForMaskedLM":
        out.update({theirs: sd[ours] for ours, theirs in _BERT_MLM})
        out["cls.predictions.decoder.weight"] = sd["tok_emb.weight"]
        out["cls.predictions.decoder.bias"] = sd["mlm.bias"]
    if c.num_labels:
        out["classifier.weight"], out["classifier.bias"] = sd["classifier.weight"], sd["classifier.bias"]
    labels = c.labels or [str(i) for i in range(c.num_labels)]
    config = {"architectures": [arch], "model_type": "bert", "vocab_size": c.vocab_size, "hidden_size": c.dim,
              "num_hidden_layers": c.layers, "num_attention_heads": c.heads, "intermediate_size": c.mlp_dim,
              "hidden_act": "gelu", "hidden_dropout_prob": c.dropout, "attention_probs_dropout_prob": c.dropout,
              "max_position_embeddings": c.context, "type_vocab_size": c.type_vocab_size,
              "layer_norm_eps": c.norm_eps, "pad_token_id": c.pad_id, "position_embedding_type": "absolute",
              "initializer_range": 0.02, "torch_dtype": "float32"}
    if c.num_labels:
        config.update(num_labels=c.num_labels, id2label={str(i): str(lab) for i, lab in enumerate(labels)},
                      label2id={str(lab): i for i, lab in enumerate(labels)})
    return out, config
