"""Looking inside: attention capture (one hook mechanism for every model) and plots."""

from .hooks import capture_attention

__all__ = ["capture_attention"]
