"""Looking inside: attention capture (one hook mechanism for every model) and plots."""

from .capture import AttentionRecord, capture_attention, capture_features

__all__ = ["AttentionRecord", "capture_attention", "capture_features"]
