"""BERT (``BertModel`` / ``BertForMaskedLM`` / ``BertForSequenceClassification`` /
``BertForTokenClassification``) <-> attnlab TextEncoder."""

from __future__ import annotations

import torch
from torch import Tensor, nn

from ..errors import CheckpointError
from . import Converter, hf_weights, register


BERT_EMBED = (
    ("tok_emb.weight", "embeddings.word_embeddings.weight"),
    ("pos.weight", "embeddings.position_embeddings.weight"),
    ("seg_emb.weight", "embeddings.token_type_embeddings.weight"),
    ("emb_norm.weight", "embeddings.LayerNorm.weight"),
    ("emb_norm.bias", "embeddings.LayerNorm.bias"),
)
BERT_BLOCK = (
    ("attn.out_proj", "attention.output.dense"),
    ("ln1", "attention.output.LayerNorm"),
    ("mlp.fc", "intermediate.dense"),
    ("mlp.proj", "output.dense"),
    ("ln2", "output.LayerNorm"),
)
BERT_MLM = (
    ("mlm.dense.weight", "cls.predictions.transform.dense.weight"),
    ("mlm.dense.bias", "cls.predictions.transform.dense.bias"),
    ("mlm.norm.weight", "cls.predictions.transform.LayerNorm.weight"),
    ("mlm.norm.bias", "cls.predictions.transform.LayerNorm.bias"),
    ("mlm.bias", "cls.predictions.bias"),
)


def bert_key_map(layers: int) -> list[tuple[str, str]]:
    """(attnlab name, HuggingFace name without the "bert." prefix) of the encoder body; the fused
    qkv is handled apart (HF keeps query, key and value separately)."""
    m = list(BERT_EMBED)
    for i in range(layers):
        a, h = f"encoder.blocks.{i}.", f"encoder.layer.{i}."
        for ours, theirs in BERT_BLOCK:
            m += [(a + ours + ".weight", h + theirs + ".weight"), (a + ours + ".bias", h + theirs + ".bias")]
    return m + [("pooler.weight", "pooler.dense.weight"), ("pooler.bias", "pooler.dense.bias")]


def load_bert(cfg: dict, state: dict[str, Tensor], with_class=None, dtype=None) -> nn.Module:
    """HF BertModel / BertForMaskedLM / BertForSequenceClassification / BertForTokenClassification
    -> attnlab TextEncoder."""
    from ..models.encoder import TextEncoder, TextEncoderConfig

    if cfg.get("hidden_act", "gelu") != "gelu" or cfg.get("position_embedding_type", "absolute") != "absolute":
        raise CheckpointError(
            "only BERT with exact gelu and absolute positions is supported, got hidden_act="
            f"{cfg.get('hidden_act')!r}, position_embedding_type={cfg.get('position_embedding_type')!r}"
        )
    prefix = "bert." if any(k.startswith("bert.") for k in state) else ""
    has_mlm = "cls.predictions.transform.dense.weight" in state
    num_classes = state["classifier.weight"].shape[0] if "classifier.weight" in state else 0
    id2label = cfg.get("id2label") or {}
    labels = [id2label.get(str(i), id2label.get(i, str(i))) for i in range(num_classes)] if num_classes else None
    config = TextEncoderConfig(
        vocab_size=cfg["vocab_size"],
        context=cfg["max_position_embeddings"],
        layers=cfg["num_hidden_layers"],
        heads=cfg["num_attention_heads"],
        dim=cfg["hidden_size"],
        mlp_dim=cfg["intermediate_size"],
        type_vocab_size=cfg.get("type_vocab_size", 2),
        dropout=0.0,
        norm_eps=cfg.get("layer_norm_eps", 1e-12),
        pad_id=cfg.get("pad_token_id") or 0,
        mlm_head=has_mlm,
        num_classes=num_classes,
        labels=labels,
        # the same classifier.weight in both heads: only the architecture says what it classifies
        per_token=bool(num_classes) and "BertForTokenClassification" in (cfg.get("architectures") or []),
    )
    model = (with_class(TextEncoder) if with_class else TextEncoder)(config)

    get = hf_weights(state, prefix, "BERT", "BERT")

    has_pooler = prefix + "pooler.dense.weight" in state
    new = {ours: get(theirs) for ours, theirs in bert_key_map(config.layers) if has_pooler or "pooler" not in ours}
    for i in range(config.layers):
        h = f"encoder.layer.{i}.attention.self."
        new[f"encoder.blocks.{i}.attn.qkv.weight"] = torch.cat(
            [get(h + f"{n}.weight") for n in ("query", "key", "value")]
        )
        new[f"encoder.blocks.{i}.attn.qkv.bias"] = torch.cat([get(h + f"{n}.bias") for n in ("query", "key", "value")])
    if has_mlm:
        for ours, theirs in BERT_MLM:
            new[ours] = state[theirs]
    if num_classes:
        new["head.weight"], new["head.bias"] = state["classifier.weight"], state["classifier.bias"]
    missing, unexpected = model.load_state_dict(new, strict=False)
    missing = [k for k in missing if k != "mlm.decoder.weight" and not (k.startswith("pooler.") and not has_pooler)]
    if missing or unexpected:
        raise CheckpointError(f"BERT weights do not fit: missing {missing[:3]}, unexpected {unexpected[:3]}")
    return model


def export_bert(model: nn.Module) -> tuple[dict[str, Tensor], dict]:
    c = model.config
    if c.norm_first:
        raise CheckpointError("a pre-LN text encoder (norm_first=True) does not map to BERT, which is post-LN")
    if model.config.window is not None:
        raise CheckpointError("a text encoder with restricted attention (--window) does not map to BERT")
    if c.pos != "learned":
        raise CheckpointError("a text encoder with relative positions (--pos relative) does not map to BERT")
    sd = model.state_dict()
    if c.num_classes:
        arch = "BertForTokenClassification" if c.per_token else "BertForSequenceClassification"
        prefix = "bert."
    elif c.mlm_head:
        arch, prefix = "BertForMaskedLM", "bert."
    else:
        arch, prefix = "BertModel", ""
    out = {
        prefix + theirs: sd[ours]
        for ours, theirs in bert_key_map(c.layers)
        if not (arch in ("BertForMaskedLM", "BertForTokenClassification") and ours.startswith("pooler."))
    }  # HF's masked LM and token classifier have no pooler
    for i in range(c.layers):
        h = f"{prefix}encoder.layer.{i}.attention.self."
        for name, w, b in zip(
            ("query", "key", "value"),
            sd[f"encoder.blocks.{i}.attn.qkv.weight"].chunk(3),
            sd[f"encoder.blocks.{i}.attn.qkv.bias"].chunk(3),
        ):
            out[h + f"{name}.weight"], out[h + f"{name}.bias"] = w, b
    if arch == "BertForMaskedLM":
        out.update({theirs: sd[ours] for ours, theirs in BERT_MLM})
        out["cls.predictions.decoder.weight"] = sd["tok_emb.weight"]
        out["cls.predictions.decoder.bias"] = sd["mlm.bias"]
    if c.num_classes:
        out["classifier.weight"], out["classifier.bias"] = sd["head.weight"], sd["head.bias"]
    labels = c.labels or [str(i) for i in range(c.num_classes)]
    config = {
        "architectures": [arch],
        "model_type": "bert",
        "vocab_size": c.vocab_size,
        "hidden_size": c.dim,
        "num_hidden_layers": c.layers,
        "num_attention_heads": c.heads,
        "intermediate_size": c.mlp_dim,
        "hidden_act": "gelu",
        "hidden_dropout_prob": c.dropout,
        "attention_probs_dropout_prob": c.dropout,
        "max_position_embeddings": c.context,
        "type_vocab_size": c.type_vocab_size,
        "layer_norm_eps": c.norm_eps,
        "pad_token_id": c.pad_id,
        "position_embedding_type": "absolute",
        "initializer_range": 0.02,
        "torch_dtype": "float32",
    }
    if c.num_classes:
        config.update(
            num_labels=c.num_classes,
            id2label={str(i): str(lab) for i, lab in enumerate(labels)},
            label2id={str(lab): i for i, lab in enumerate(labels)},
        )
    return out, config


CONVERTER = register(Converter("bert", "text-encoder", load_bert, export_bert))
