"""The small CNN baseline: `attnlab train cnn` (to compare a ViT with, e.g. by CKA)."""

from __future__ import annotations

from ..models.cnn import CNN, CNNConfig
from . import register
from .classifier import ImageClassifierRecipe


@register
class CNNRecipe(ImageClassifierRecipe):
    name = "cnn"
    help = "the small CNN baseline (for comparisons)"
    models = {"cnn": CNN}

    def new_config(self, args, splits, model_over):
        c, h, _ = splits.shape
        return "cnn", CNNConfig(
            **model_over, in_chans=c, num_classes=len(splits.labels), labels=splits.labels, image_size=h
        )
