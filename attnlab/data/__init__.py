"""Datasets: text corpora (:mod:`.text`), images (:mod:`.images`), parallel text and synthetic
sequence tasks (:mod:`.parallel`), and the files they come from (:mod:`.sources`). Each name below
is imported from its module on first use."""

from typing import TYPE_CHECKING

from ..compat import lazy_names

# (prepare_shards: shards.prepare, under the name that tells it from text.prepare)
_MODULES = {"open_shards": ".shards", "prepare_shards": ".shards:prepare", "TokenData": ".text",
            "embedded_corpus": ".text", "load_corpus": ".text", "prepare": ".text"}  # fmt: skip
__all__ = list(_MODULES)
__getattr__ = lazy_names(__name__, _MODULES)


if TYPE_CHECKING:
    from .shards import open_shards as open_shards
    from .shards import prepare as prepare_shards  # noqa: F401
    from .text import (
        TokenData as TokenData,
        embedded_corpus as embedded_corpus,
        load_corpus as load_corpus,
        prepare as prepare,
    )
