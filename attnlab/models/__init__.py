"""Models assembled from the shared blocks (their configs, declared without torch, in :mod:`.configs`).
Each name below is imported from its module on first use: importing a config imports no model."""

from typing import TYPE_CHECKING

from ..compat import lazy_names

_MODULES = {
    "Captioner": ".caption",
    "CNN": ".cnn",
    "GPT": ".gpt",
    "GraphTransformer": ".graph",
    "RNNSeq2Seq": ".rnn",
    "Transformer": ".seq2seq",
    "ViT": ".vit",
    **{
        name: ".configs"
        for name in ("CaptionConfig", "CNNConfig", "GPTConfig", "GPT_PRESETS", "GraphTransformerConfig", "RNNConfig",
                     "TransformerConfig", "ViTConfig", "VIT_PRESETS")
    },
}  # fmt: skip
__all__ = list(_MODULES)
__getattr__ = lazy_names(__name__, _MODULES)

if TYPE_CHECKING:
    from .caption import Captioner as Captioner
    from .cnn import CNN as CNN
    from .configs import (
        CNNConfig as CNNConfig,
        CaptionConfig as CaptionConfig,
        GPT_PRESETS as GPT_PRESETS,
        GPTConfig as GPTConfig,
        GraphTransformerConfig as GraphTransformerConfig,
        RNNConfig as RNNConfig,
        TransformerConfig as TransformerConfig,
        VIT_PRESETS as VIT_PRESETS,
        ViTConfig as ViTConfig,
    )
    from .gpt import GPT as GPT
    from .graph import GraphTransformer as GraphTransformer
    from .rnn import RNNSeq2Seq as RNNSeq2Seq
    from .seq2seq import Transformer as Transformer
    from .vit import ViT as ViT
