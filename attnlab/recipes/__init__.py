"""The registry of recipes, one per model family, and loading a model from any checkpoint.

Every module in this package except ``base`` is a recipe module; the registry imports them all
and keeps each :class:`Recipe` registered with :func:`register`. The command line
(``attnlab train NAME``, ``eval``, ``inspect``, the family's own commands) and checkpoint
loading (``model_type`` -> model class) are built from it, so adding a family is adding a file
here (and its model in :mod:`attnlab.models`).
"""

from __future__ import annotations

import importlib
import pkgutil
from pathlib import Path

from ..errors import CheckpointError, a, does_not_fit
from ..training.runs import TrainingRun
from .base import ModelKind, Recipe, TrainOptions

__all__ = [
    "Recipe",
    "ModelKind",
    "TrainingRun",
    "TrainOptions",
    "register",
    "recipes",
    "recipe_for",
    "model_class",
    "build_model",
    "load_model",
    "checkpoint_recipe",
]

_REGISTRY: dict[str, Recipe] = {}
_discovered = False


def register(cls: type[Recipe]) -> type[Recipe]:
    """Class decorator: add a recipe to the registry (by its ``name``)."""
    _REGISTRY[cls.name] = cls()
    return cls


def recipes() -> list[Recipe]:
    """Every registered recipe (the modules of this package are imported on first use)."""
    global _discovered
    if not _discovered:
        for info in sorted(pkgutil.iter_modules(__path__), key=lambda m: m.name):
            if info.name != "base":
                importlib.import_module(f"{__name__}.{info.name}")
        _discovered = True
    # in the order of their modules' names, whichever module was imported first (the command
    # line's eval options, merged from every family, come out the same either way)
    return sorted(_REGISTRY.values(), key=lambda r: type(r).__module__)


def recipe_for(model_type: str | None) -> Recipe:
    """The recipe that owns ``model_type`` (a name from config.json)."""
    for r in recipes():
        if model_type in r.models:
            return r
    known = sorted(t for r in recipes() for t in r.models)
    raise CheckpointError(f"checkpoint has unknown model_type {model_type!r}; attnlab knows {known}")


def model_class(model_type: str | None) -> type:
    return recipe_for(model_type).models[model_type].model_class


def build_model(config: dict, with_class=None):
    """A fresh model from a checkpoint's config.json (its ``model_type`` and ``model`` fields);
    old field names are accepted (see :mod:`attnlab.config`). ``with_class(model class)``: the
    class to build instead (a loaded model's class with its family's verbs)."""
    mtype = config.get("model_type")
    cls = model_class(mtype)
    if with_class is not None:
        cls = with_class(cls)
    try:
        return cls(cls.config_class.from_dict(config["model"]))
    except (ValueError, TypeError, KeyError) as e:
        raise CheckpointError(f"checkpoint config does not describe a valid {mtype} model: {e}") from None
    except (RuntimeError, MemoryError) as e:  # sizes that pass the checks but do not fit in memory
        raise does_not_fit(mtype, e) from None


def _is_huggingface(path: Path) -> bool:
    from ..checkpoint import CONFIG, read_config

    return path.is_dir() and (path / CONFIG).is_file() and "attnlab_version" not in read_config(path)


def checkpoint_model_type(path: str | Path) -> str | None:
    """The attnlab model_type of a run, checkpoint or HuggingFace folder, without loading it."""
    from ..checkpoint import find_checkpoint, read_config

    p = Path(path)
    if p.is_file():
        from ..interop.gguf_file import is_gguf

        if is_gguf(p):  # (llama.cpp's file: a decoder, read into attnlab's GPT)
            return "gpt"
    if _is_huggingface(p):
        from ..interop import attnlab_model_type

        hf_type = read_config(p).get("model_type")
        return attnlab_model_type(hf_type) or hf_type
    return read_config(find_checkpoint(p)).get("model_type")


def checkpoint_recipe(path: str | Path) -> Recipe:
    return recipe_for(checkpoint_model_type(path))


def load_model(
    path: str | Path,
    *,
    expect: str | tuple[str, ...] | None = None,
    device: str | None = None,
    with_meta: bool = False,
    needs: str | None = None,
    dtype=None,
):
    """A ready model (eval mode) from an attnlab run/checkpoint folder or a HuggingFace directory;
    ``expect`` names the model type(s) the caller can use (``needs`` says so in words).

    The one loader: :func:`attnlab.load`, the commands and the families' helpers all read a model
    here. It is built as its family's class with the family's verbs (``Recipe.loaded``: no class is
    swapped later), knowing its folder (``checkpoint``), its config.json (``run_meta``) and what
    its verbs read from it (``attach``: the tokenizer, vocabularies or image statistics).
    ``dtype``: a torch dtype for the weights (default: as saved; HuggingFace's in float32)."""
    from ..checkpoint import find_checkpoint, load_weights, read_config

    p = Path(path)
    wanted = (expect,) if isinstance(expect, str) else expect
    mtype = checkpoint_model_type(p)
    recipe = recipe_for(mtype)  # an unknown model type is named as such
    if wanted is not None and mtype not in wanted:
        needs = needs or f"a {' or '.join(wanted)} model"
        raise CheckpointError(f"{path} holds {a(mtype)} model, but this command needs {needs}")
    with_class = recipe.loaded_class
    if p.is_file():  # (a GGUF file: checkpoint_model_type said so)
        from ..interop.gguf_file import load_gguf

        model, meta = load_gguf(p, with_class, dtype)
    elif _is_huggingface(p):
        from ..interop import load_hf

        model, meta = load_hf(p, with_class, dtype), {"model_type": None}
    else:
        ckpt = find_checkpoint(p)
        meta = read_config(ckpt)
        if not isinstance(meta.get("model"), dict):  # (a damaged file: build_model would say "'model'")
            raise CheckpointError(f"{ckpt / 'config.json'} has no 'model' section (the model's shape); the file is "
                                  "damaged: use the run's other checkpoint (best/ or last/) or train again")  # fmt: skip
        model = build_model(meta, with_class)
        load_weights(model, ckpt)
        if dtype is not None:
            model.to(dtype)
    model.eval()
    if device:
        model.to(device)
    model.checkpoint, model.run_meta, model.recipe = str(path), meta, recipe
    model.attach(meta)
    return (model, meta) if with_meta else model
