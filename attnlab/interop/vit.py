"""HuggingFace ViT (``ViTModel`` / ``ViTForImageClassification``) <-> attnlab ViT."""

from __future__ import annotations

import torch
from torch import Tensor, nn

from ..errors import CheckpointError
from . import Converter, hf_weights, register


def load_vit(cfg: dict, state: dict[str, Tensor], with_class=None, dtype=None) -> nn.Module:
    """HF ViTModel / ViTForImageClassification -> attnlab ViT (class-token pooling, learned positions).
    A ViTModel (no classifier) becomes a ViT with num_classes=0 returning the class token's features."""
    from ..models.vit import ViT, ViTConfig

    if cfg.get("hidden_act", "gelu") != "gelu":
        raise CheckpointError(f"ViT with hidden_act={cfg.get('hidden_act')!r} is not supported (only exact gelu)")
    prefix = "vit." if any(k.startswith("vit.") for k in state) else ""
    has_head = "classifier.weight" in state
    d = cfg["hidden_size"]
    id2label = cfg.get("id2label") or {}
    num_classes = state["classifier.weight"].shape[0] if has_head else 0
    labels = [id2label.get(str(i), id2label.get(i, str(i))) for i in range(num_classes)] if has_head else None
    config = ViTConfig(
        image_size=cfg["image_size"],
        patch_size=cfg["patch_size"],
        in_chans=cfg.get("num_channels", 3),
        num_classes=num_classes,
        dim=d,
        layers=cfg["num_hidden_layers"],
        heads=cfg["num_attention_heads"],
        mlp_ratio=cfg["intermediate_size"] / d,
        pool="cls",
        pos="learned",
        norm_eps=cfg.get("layer_norm_eps", 1e-12),
        qkv_bias=cfg.get("qkv_bias", True),
        labels=labels,
    )
    model = (with_class(ViT) if with_class else ViT)(config)

    get = hf_weights(state, prefix, "ViT", "a ViT")

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
        new[a + "attn.qkv.weight"] = torch.cat(
            [get(h + f"attention.attention.{n}.weight") for n in ("query", "key", "value")]
        )
        if config.qkv_bias:
            new[a + "attn.qkv.bias"] = torch.cat(
                [get(h + f"attention.attention.{n}.bias") for n in ("query", "key", "value")]
            )
        for ours, theirs in (
            ("attn.out_proj", "attention.output.dense"),
            ("mlp.fc", "intermediate.dense"),
            ("mlp.proj", "output.dense"),
            ("ln1", "layernorm_before"),
            ("ln2", "layernorm_after"),
        ):
            new[a + ours + ".weight"] = get(h + theirs + ".weight")
            new[a + ours + ".bias"] = get(h + theirs + ".bias")
    if has_head:
        new["head.weight"], new["head.bias"] = state["classifier.weight"], state["classifier.bias"]
    missing, unexpected = model.load_state_dict(new, strict=False)
    if missing or unexpected:
        raise CheckpointError(f"ViT weights do not fit: missing {missing[:3]}, unexpected {unexpected[:3]}")
    return model


# ---- ViT export ---------------------------------------------------------------------------------------
VIT_BLOCK = (
    ("attn.out_proj", "attention.output.dense"),
    ("mlp.fc", "intermediate.dense"),
    ("mlp.proj", "output.dense"),
    ("ln1", "layernorm_before"),
    ("ln2", "layernorm_after"),
)


def export_vit(model: nn.Module) -> tuple[dict[str, Tensor], dict]:
    c = model.config
    if c.pool != "cls" or c.pos != "learned" or c.peg or c.num_classes < 1 or c.window is not None:
        raise CheckpointError(
            "only ViTs with a class token, learned positions, no PEG, full attention and a classifier map to "
            f"ViTForImageClassification; this one has pool={c.pool}, pos={c.pos}, peg={c.peg}, "
            f"window={c.window}, num_classes={c.num_classes}"
        )
    sd = model.state_dict()
    out = {
        "vit.embeddings.cls_token": sd["cls_token"],
        "vit.embeddings.position_embeddings": sd["pos.weight"][None],
        "vit.embeddings.patch_embeddings.projection.weight": sd["patch_embed.proj.weight"],
        "vit.embeddings.patch_embeddings.projection.bias": sd["patch_embed.proj.bias"],
        "vit.layernorm.weight": sd["encoder.ln_f.weight"],
        "vit.layernorm.bias": sd["encoder.ln_f.bias"],
        "classifier.weight": sd["head.weight"],
        "classifier.bias": sd["head.bias"],
    }
    for i in range(c.layers):
        h, a = f"vit.encoder.layer.{i}.", f"encoder.blocks.{i}."
        for name, w in zip(("query", "key", "value"), sd[a + "attn.qkv.weight"].chunk(3)):
            out[h + f"attention.attention.{name}.weight"] = w
        if c.qkv_bias:
            for name, b in zip(("query", "key", "value"), sd[a + "attn.qkv.bias"].chunk(3)):
                out[h + f"attention.attention.{name}.bias"] = b
        for ours, theirs in VIT_BLOCK:
            out[h + theirs + ".weight"], out[h + theirs + ".bias"] = sd[a + ours + ".weight"], sd[a + ours + ".bias"]
    labels = c.labels or [str(i) for i in range(c.num_classes)]
    config = {
        "architectures": ["ViTForImageClassification"],
        "model_type": "vit",
        "hidden_size": c.dim,
        "num_hidden_layers": c.layers,
        "num_attention_heads": c.heads,
        "intermediate_size": round(c.dim * c.mlp_ratio),
        "hidden_act": "gelu",
        "hidden_dropout_prob": 0.0,
        "attention_probs_dropout_prob": 0.0,
        "initializer_range": 0.02,
        "layer_norm_eps": c.norm_eps,
        "image_size": c.image_size,
        "patch_size": c.patch_size,
        "num_channels": c.in_chans,
        "qkv_bias": c.qkv_bias,
        "id2label": {str(i): str(lab) for i, lab in enumerate(labels)},
        "label2id": {str(lab): i for i, lab in enumerate(labels)},
        "torch_dtype": "float32",
    }
    return out, config


CONVERTER = register(Converter("vit", "vit", load_vit, export_vit))
