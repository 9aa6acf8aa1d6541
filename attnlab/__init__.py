"""attnlab: transformers the way they are taught, fast to train and easy to look inside.

The Python API (:mod:`attnlab.api`) does everything the command line does::

    import attnlab
    run = attnlab.train("gpt", max_iters=200)           # the embedded corpus, runs/gpt
    model = attnlab.load(run.out)                        # knows its tokenizer
    model.generate("The ", max_new_tokens=100)
    logits, cache = model.run_with_cache(ids)            # every named hook point
    attnlab.explore(model, text="The attention")        # inline in Jupyter
"""

from __future__ import annotations

__version__ = "0.2.0"

__all__ = [
    "__version__",
    "train",
    "load",
    "evaluate",
    "explore",
    "families",
    "train_options",
    "export_hf",
    "Callback",
    "EarlyStopping",
    "WandbCallback",
]

# attnlab.Callback and friends, imported when first used: importing attnlab stays free of torch
_LAZY = {name: "attnlab.training.callbacks" for name in ("Callback", "EarlyStopping", "WandbCallback")}


def __getattr__(name: str):
    import importlib

    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name]), name)
    if name == "sae":  # attnlab.sae: sparse autoencoders
        return importlib.import_module("attnlab.sae")
    raise AttributeError(f"module 'attnlab' has no attribute {name!r}")


def train(family: str, **kw):
    """Train a model of ``family`` and return its :class:`attnlab.api.Run` (see :func:`attnlab.api.train`)."""
    from .api import train as _train

    return _train(family, **kw)


def load(path, **kw):
    """A ready model with its tokenizer and verbs, from an attnlab run or a HuggingFace folder
    (see :func:`attnlab.api.load`)."""
    from .api import load as _load

    return _load(path, **kw)


def evaluate(model_or_path, **kw) -> dict:
    """The metrics of ``attnlab eval`` (see :func:`attnlab.api.evaluate`)."""
    from .api import evaluate as _evaluate

    return _evaluate(model_or_path, **kw)


def explore(model_or_path, **kw):
    """The explorer's data, shown inline in Jupyter (see :func:`attnlab.api.explore`)."""
    from .api import explore as _explore

    return _explore(model_or_path, **kw)


def families() -> list[str]:
    """The model families ``train`` takes."""
    from .api import families as _families

    return _families()


def train_options(family: str) -> dict:
    """Every option of ``train(family, ...)`` with its default."""
    from .api import train_options as _train_options

    return _train_options(family)


def export_hf(model, directory) -> None:
    """Write ``model`` as a HuggingFace checkpoint directory (config.json + model.safetensors)."""
    from .interop import export_hf as _export

    _export(model, directory)
