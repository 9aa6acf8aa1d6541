"""Looking inside: attention capture (one hook mechanism for every model) and plots. Each name
below is imported from its module on first use."""

from typing import TYPE_CHECKING

from ..compat import lazy_names

_MODULES = {"AttentionRecord": ".capture", "capture_attention": ".capture", "capture_features": ".capture"}
__all__ = list(_MODULES)
__getattr__ = lazy_names(__name__, _MODULES)

if TYPE_CHECKING:
    from .capture import (
        AttentionRecord as AttentionRecord,
        capture_attention as capture_attention,
        capture_features as capture_features,
    )
