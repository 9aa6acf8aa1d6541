"""The small CNN baseline: `attnlab train cnn` (to compare a ViT with, e.g. by CKA)."""

from __future__ import annotations

from ..models.cnn import CNN, CNNConfig
from . import register
from .classifier import ImageClassifierRecipe, ImageClassifierVerbs


class CNNModel(ImageClassifierVerbs, CNN):
    """A CNN as :func:`attnlab.load` returns it: the model with the image classifiers' verbs."""


@register
class CNNRecipe(ImageClassifierRecipe):
    name = "cnn"
    help = "the small CNN baseline (for comparisons)"
    models = {"cnn": CNN}
    loaded = {"cnn": CNNModel}

    def new_config(self, o, splits, model_over):
        c, h, _ = splits.shape
        # --image-size must match the data (checked by the caller): the data's size unless given
        fields = {"image_size": h, **model_over, "in_chans": c, "num_classes": len(splits.labels)}
        return "cnn", CNNConfig(**fields, labels=splits.labels)
