"""Models assembled from the shared blocks."""

from .caption import CaptionConfig, Captioner
from .cnn import CNN, CNNConfig
from .gpt import GPT, GPT_PRESETS, GPTConfig
from .graph import GraphTransformer, GraphTransformerConfig
from .rnn import RNNConfig, RNNSeq2Seq
from .seq2seq import Transformer, TransformerConfig
from .vit import VIT_PRESETS, ViT, ViTConfig

__all__ = [
    "Captioner",
    "CaptionConfig",
    "GPT",
    "GPTConfig",
    "GPT_PRESETS",
    "ViT",
    "ViTConfig",
    "VIT_PRESETS",
    "CNN",
    "CNNConfig",
    "Transformer",
    "TransformerConfig",
    "RNNSeq2Seq",
    "RNNConfig",
    "GraphTransformer",
    "GraphTransformerConfig",
]
