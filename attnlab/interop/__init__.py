"""HuggingFace checkpoint folders <-> attnlab models (no ``transformers`` import needed).

One converter module per family (:mod:`.gpt2`, :mod:`.llama`, :mod:`.gemma`, :mod:`.gpt_neox`,
:mod:`.vit`, :mod:`.bert`), each registering its :class:`Converter` s once: the HuggingFace
``model_type`` it reads, the attnlab ``model_type`` it makes, and the two directions.
``load_hf`` / ``export_hf`` and the checkpoint loader find converters here; a new one is a new
module in this package.
"""

from __future__ import annotations

import contextlib
import importlib
import json
import pickle
import pkgutil
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file, save_file
from torch import Tensor, nn

from ..errors import CheckpointError, does_not_fit

__all__ = [
    "Converter",
    "register",
    "converters",
    "load_hf",
    "export_hf",
    "attnlab_model_type",
    "read_state",
    "hf_weights",
    "filled",
]


@dataclass(frozen=True)
class Converter:
    """HuggingFace ``hf_type`` checkpoints <-> attnlab ``model_type`` models.

    ``load(hf_config, hf_state, with_class=None, dtype=None) -> model`` (``with_class(model class)``:
    the class to build instead, a loaded model's class with its family's verbs; ``dtype``: the
    weights' dtype, default float32); ``export(model) -> (hf_state, hf_config)``."""

    hf_type: str
    model_type: str
    load: Callable[..., nn.Module]
    export: Callable[[nn.Module], tuple[dict[str, Tensor], dict]]
    exports: Callable[[nn.Module], bool] = lambda model: True  # (which of a model_type's converters writes it)


_CONVERTERS: dict[str, Converter] = {}
_discovered = False


def register(converter: Converter) -> Converter:
    _CONVERTERS[converter.hf_type] = converter
    return converter


def converters() -> list[Converter]:
    """Every registered converter (the modules of this package are imported on first use)."""
    global _discovered
    if not _discovered:
        for info in sorted(pkgutil.iter_modules(__path__), key=lambda m: m.name):
            importlib.import_module(f"{__name__}.{info.name}")
        _discovered = True
    return list(_CONVERTERS.values())


def attnlab_model_type(hf_type: str | None) -> str | None:
    """The attnlab model_type a HuggingFace ``model_type`` loads as (None: no converter)."""
    return next((c.model_type for c in converters() if c.hf_type == hf_type), None)


def read_state(d: Path) -> dict[str, Tensor]:
    """Every tensor of the HuggingFace folder ``d``: model.safetensors, the shards a
    model.safetensors.index.json lists, or a plain-tensor pytorch_model.bin."""
    try:
        if (d / "model.safetensors").is_file():
            return load_file(str(d / "model.safetensors"))
        if (d / "model.safetensors.index.json").is_file():
            shards = sorted(set(json.loads((d / "model.safetensors.index.json").read_text())["weight_map"].values()))
            state: dict[str, Tensor] = {}
            for shard in shards:
                if not (d / shard).is_file():
                    raise CheckpointError(f"{d} lacks {shard}, a shard its model.safetensors.index.json lists")
                state.update(load_file(str(d / shard)))
            return state
        if (d / "pytorch_model.bin").is_file():
            return torch.load(d / "pytorch_model.bin", map_location="cpu", weights_only=True)
    except pickle.UnpicklingError:
        raise CheckpointError(
            f"refusing to unpickle {d / 'pytorch_model.bin'}: it holds Python objects besides "
            "tensors, and unpickling can run code; use a model.safetensors version of it"
        ) from None
    except (SafetensorError, RuntimeError, OSError, EOFError) as e:
        if "weights only" in str(e).lower() or "weights_only" in str(e):
            raise CheckpointError(
                f"refusing to unpickle {d / 'pytorch_model.bin'}: it is not a plain tensor file; use "
                "a model.safetensors version of it"
            ) from None
        raise CheckpointError(f"weights in {d} are corrupt or truncated ({str(e).splitlines()[0]})") from None
    raise CheckpointError(f"{d} has a config.json but no model.safetensors or pytorch_model.bin")


@contextlib.contextmanager
def parameters_on_meta():
    """Modules built inside have their parameters on the meta device (no memory, no random
    initialisation: a checkpoint is about to replace them) and their buffers (rotary
    frequencies, fixed tables) made as usual. (It swaps ``nn.Module.register_parameter`` for the
    block, as accelerate's ``init_empty_weights`` does: not for threads building models at once.)"""
    register = nn.Module.register_parameter

    def on_meta(module, name, param):
        register(module, name, param)
        if param is not None:
            module._parameters[name] = nn.Parameter(param.to("meta"), requires_grad=param.requires_grad)

    nn.Module.register_parameter = on_meta  # type: ignore[method-assign]
    try:
        yield
    finally:
        nn.Module.register_parameter = register  # type: ignore[method-assign]


def filled(model_class, config, weights: dict[str, Tensor], family: str, dtype=None) -> nn.Module:
    """``model_class(config)`` holding ``weights`` (attnlab names) as its parameters, without
    first allocating and initialising parameters of its own: the weights are assigned in ``dtype``
    (default float32: a bf16 checkpoint is widened; bf16 kept as it is costs no copy), and a tied
    output head is tied again. A weight the model lacks or a parameter no weight fills is a clear
    error."""
    with parameters_on_meta():
        model = model_class(config)
    tied = getattr(config, "tie_output", False) and hasattr(model, "lm_head")
    dtype = dtype or torch.float32
    weights = {k: v.to(dtype) if v.is_floating_point() else v for k, v in weights.items()}
    missing, unexpected = model.load_state_dict(weights, strict=False, assign=True)
    if tied:
        model.lm_head.weight = model.tok_emb.weight
    missing = [k for k in missing if not (tied and k == "lm_head.weight")]
    left = [n for n, p in model.named_parameters() if p.is_meta]
    if missing or unexpected or left:
        raise CheckpointError(
            f"{family} weights do not fit: missing {(missing or left)[:3]}, unexpected {unexpected[:3]}"
        )
    return model


def hf_weights(state: dict[str, Tensor], prefix: str, family: str, what: str):
    """``get(name)``: the HuggingFace tensor ``prefix + name``, or a clear error when the
    checkpoint lacks it."""

    def get(name: str) -> Tensor:
        if prefix + name not in state:
            raise CheckpointError(f"{family} checkpoint lacks {prefix + name}; it is incomplete or not {what}")
        return state[prefix + name]

    return get


def load_hf(directory: str | Path, with_class=None, dtype=None) -> nn.Module:
    """The attnlab model of a HuggingFace folder; ``with_class(model class) -> the class to build``
    (a loaded model's class with its family's verbs) when given; its weights in ``dtype`` (a torch
    dtype; default float32)."""
    d = Path(directory)
    cfg = json.loads((d / "config.json").read_text())
    mtype = cfg.get("model_type")
    for c in converters():
        if c.hf_type == mtype:
            try:
                model = c.load(cfg, read_state(d), with_class, dtype)
                return model.to(dtype) if dtype is not None else model
            except (RuntimeError, MemoryError) as e:  # sizes that pass the checks but do not fit in memory
                raise does_not_fit(f"HuggingFace {mtype}", e) from None
            except KeyError as e:  # (a field its config.json or a tensor its weights should hold)
                raise CheckpointError(f"{d} is an incomplete HuggingFace {mtype} checkpoint: it has no {e} (a "
                                      "config.json field or a weight its converter reads)") from None  # fmt: skip
    raise CheckpointError(
        f"{d} is a HuggingFace {mtype!r} checkpoint; attnlab reads "
        f"{', '.join(c.hf_type for c in converters())} checkpoints"
    )


def export_hf(model: nn.Module, directory: str | Path, tokenizer=None) -> None:
    """Write a HuggingFace directory (config.json + model.safetensors) that ``from_pretrained``
    loads: GPT -> GPT2LMHeadModel, ViT -> ViTForImageClassification, text encoder ->
    BertForSequenceClassification / BertForMaskedLM / BertModel (by its heads). With a tokenizer
    (``tokenizer``, or the one a model loaded by :func:`attnlab.load` knows) it also writes
    tokenizer.json and tokenizer_config.json, which ``AutoTokenizer.from_pretrained`` reads to
    the same ids, and which ``attnlab.load`` of the folder reads back; a model that knows its
    end-of-sequence ids, sampling defaults or chat template (read from the checkpoint it started
    from) writes them too (generation_config.json, chat_template.jinja)."""
    kind = getattr(model, "model_type", None)
    candidates = [c for c in converters() if c.model_type == kind]
    if not candidates:
        known = ", ".join(sorted({c.model_type for c in converters()}))
        raise CheckpointError(f"export_hf writes {known} models, got {type(model).__name__}")
    exporter = next((c for c in candidates if c.exports(model)), None)
    if exporter is None:  # each family's own reason, in one line
        reasons = []
        for c in candidates:
            try:
                c.export(model)
            except CheckpointError as e:
                reasons.append(f"{c.hf_type}: {e}")
        raise CheckpointError(f"this {kind} model fits no HuggingFace family attnlab writes ({'; '.join(reasons)})")
    d = Path(directory)
    d.mkdir(parents=True, exist_ok=True)
    tensors, config = exporter.export(model)
    save_file(
        {k: v.detach().cpu().contiguous().clone() for k, v in tensors.items()},
        str(d / "model.safetensors"),
        metadata={"format": "pt"},
    )
    tokenizer = tokenizer if tokenizer is not None else getattr(model, "tokenizer", None)
    if tokenizer is not None:
        write_hf_tokenizer(tokenizer, d, getattr(model.config, "context", None))
    settings = getattr(model, "generation", None)
    if settings:  # (end-of-sequence ids, sampling defaults, chat template: after the tokenizer's config)
        from .generation import write_generation

        write_generation(settings, d, config)
    (d / "config.json").write_text(json.dumps(config, indent=1))


# the special tokens HuggingFace's tokenizer classes look for, by the names attnlab's tokenizers use
_SPECIAL_ROLES = {
    "unk_token": ("[UNK]", "<unk>"),
    "pad_token": ("[PAD]", "<pad>"),
    "cls_token": ("[CLS]",),
    "sep_token": ("[SEP]",),
    "mask_token": ("[MASK]",),
    "bos_token": ("<|endoftext|>", "<bos>"),
    "eos_token": ("<|endoftext|>", "<eos>"),
}


def write_hf_tokenizer(tokenizer, directory: str | Path, max_length: int | None = None) -> None:
    """``directory/tokenizer.json`` (the ``tokenizers`` pipeline) and ``tokenizer_config.json``
    (PreTrainedTokenizerFast, its special tokens and the model's context) for any attnlab tokenizer."""
    if not hasattr(tokenizer, "hf_tokenizer"):
        raise CheckpointError(f"a {type(tokenizer).__name__} cannot be written as a HuggingFace tokenizer")
    d = Path(directory)
    tok = tokenizer.hf_tokenizer()
    tok.save(str(d / "tokenizer.json"))
    vocab = tok.get_vocab()
    config: dict = {"tokenizer_class": "PreTrainedTokenizerFast", "clean_up_tokenization_spaces": False}
    for role, names in _SPECIAL_ROLES.items():
        name = next((n for n in names if n in vocab), None)
        if name is not None:
            config[role] = name
    if max_length:
        config["model_max_length"] = int(max_length)
    (d / "tokenizer_config.json").write_text(json.dumps(config, indent=1))
