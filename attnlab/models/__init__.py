"""Models assembled from the shared blocks."""

from .cnn import CNN, CNNConfig
from .gpt import GPT, GPT_PRESETS, GPTConfig
from .vit import VIT_PRESETS, ViT, ViTConfig

MODEL_TYPES = {"gpt": GPT, "vit": ViT, "cnn": CNN}

__all__ = ["GPT", "GPTConfig", "GPT_PRESETS", "ViT", "ViTConfig", "VIT_PRESETS", "CNN", "CNNConfig", "MODEL_TYPES"]
