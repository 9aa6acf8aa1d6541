"""attnlab: transformers the way they are taught, fast to train and easy to look inside."""

from __future__ import annotations

__version__ = "0.1.0"

__all__ = ["__version__", "load", "export_hf"]


def load(path, **kw):
    """Load a ready model from an attnlab run folder or a HuggingFace checkpoint directory."""
    from .recipes import load_model

    return load_model(path, **kw)


def export_hf(model, directory) -> None:
    """Write ``model`` as a HuggingFace checkpoint directory (config.json + model.safetensors)."""
    from .interop import export_hf as _export

    _export(model, directory)
