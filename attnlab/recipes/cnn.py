"""The small CNN baseline: `attnlab train cnn` (to compare a ViT with, e.g. by CKA)."""

from __future__ import annotations

from ..models.configs import CNNConfig
from .base import ModelKind
from . import register
from .classifier import ImageClassifierRecipe, ImageClassifierVerbs


@register
class CNNRecipe(ImageClassifierRecipe):
    name = "cnn"
    help = "the small CNN baseline (for comparisons)"
    models = {"cnn": ModelKind(CNNConfig, "attnlab.models.cnn:CNN", ImageClassifierVerbs)}

    def new_config(self, o, splits, model_over):
        c, h, _ = splits.shape
        # --image-size must match the data (checked by the caller): the data's size unless given
        fields = {"image_size": h, **model_over, "in_chans": c, "num_classes": len(splits.labels)}
        return "cnn", CNNConfig(**fields, labels=splits.labels)
