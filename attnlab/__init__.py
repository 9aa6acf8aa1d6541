"""attnlab: transformers the way they are taught, fast to train and easy to look inside.

The Python API (:mod:`attnlab.api`) does everything the command line does::

    import attnlab
    run = attnlab.train("gpt", max_iters=200)           # the embedded corpus, runs/gpt
    model = attnlab.load(run.out)                        # knows its tokenizer
    model.generate("The ", max_new_tokens=100)
    logits, cache = model.run_with_cache(ids)            # every named hook point
    attnlab.explore(model, text="The attention")        # inline in Jupyter

``import attnlab`` imports no torch: each name below is the function itself (its signature and
docstring, for ``help()`` and type checkers), imported from its module when first used.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from .compat import install

__version__ = "0.2.0"
install()  # the old module names of 0.1 (attnlab.batching, ...): attnlab.compat.OLD_MODULES

# public name -> the module that defines it
_LAZY = {
    **{
        name: "attnlab.api"
        for name in ("train", "load", "evaluate", "explore", "families", "train_options", "train_args", "Run")
    },
    "export_hf": "attnlab.interop",
    **{name: "attnlab.training.callbacks" for name in ("Callback", "EarlyStopping", "WandbCallback")},
}
__all__ = [
    "__version__",
    "train",
    "load",
    "evaluate",
    "explore",
    "families",
    "train_options",
    "train_args",
    "Run",
    "export_hf",
    "Callback",
    "EarlyStopping",
    "WandbCallback",
    "sae",
]

if TYPE_CHECKING:  # what type checkers and IDEs see (at run time, __getattr__ below imports them)
    from . import sae
    from .api import Run, evaluate, explore, families, load, train, train_args, train_options
    from .interop import export_hf
    from .training.callbacks import Callback, EarlyStopping, WandbCallback


def __getattr__(name: str) -> object:
    import importlib

    if name in _LAZY:
        value = getattr(importlib.import_module(_LAZY[name]), name)
    elif name == "sae":  # attnlab.sae: sparse autoencoders
        value = importlib.import_module("attnlab.sae")
    else:
        raise AttributeError(f"module 'attnlab' has no attribute {name!r}")
    globals()[name] = value  # (looked up once)
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
