"""Models assembled from the shared blocks."""

from .gpt import GPT, GPT_PRESETS, GPTConfig

MODEL_TYPES = {"gpt": GPT}

__all__ = ["GPT", "GPTConfig", "GPT_PRESETS", "MODEL_TYPES"]
