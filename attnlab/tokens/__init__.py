"""Tokens: text to ids, images and signals to sequences of vectors."""

from __future__ import annotations

from pathlib import Path
import json

from typing import TYPE_CHECKING

from ..compat import lazy_names

_MODULES = {"BPETokenizer": ".bpe", "CharTokenizer": ".char", "ChunkEmbed1D": ".patch", "PatchEmbed": ".patch",
            "WordTokenizer": ".word", "WordPieceTokenizer": ".wordpiece"}  # fmt: skip
__getattr__ = lazy_names(__name__, _MODULES)  # (each imported on first use: a tokenizer's module, not torch)

if TYPE_CHECKING:
    from .bpe import BPETokenizer as BPETokenizer
    from .char import CharTokenizer as CharTokenizer
    from .patch import ChunkEmbed1D as ChunkEmbed1D, PatchEmbed as PatchEmbed
    from .word import WordTokenizer as WordTokenizer
    from .wordpiece import WordPieceTokenizer as WordPieceTokenizer

__all__ = [
    "CharTokenizer",
    "BPETokenizer",
    "WordTokenizer",
    "WordPieceTokenizer",
    "PatchEmbed",
    "ChunkEmbed1D",
    "tokenizer_from_dict",
    "load_tokenizer",
]


def tokenizer_from_dict(d: dict):
    from .bpe import BPETokenizer as BPETokenizer
    from .char import CharTokenizer as CharTokenizer
    from .word import WordTokenizer as WordTokenizer
    from .wordpiece import WordPieceTokenizer as WordPieceTokenizer

    kinds = {"char": CharTokenizer, "bpe": BPETokenizer, "word": WordTokenizer, "wordpiece": WordPieceTokenizer}
    if d.get("type") not in kinds:
        raise ValueError(f"unknown tokenizer type {d.get('type')!r}; expected one of {sorted(kinds)}")
    return kinds[d["type"]].from_dict(d)


def load_tokenizer(path: str | Path):
    """Load a tokenizer saved by attnlab (char or bpe JSON) or a plain HF tokenizer.json."""
    from .bpe import BPETokenizer as BPETokenizer

    d = json.loads(Path(path).read_text(encoding="utf-8"))
    if d.get("type") in ("char", "bpe", "word", "wordpiece"):
        return tokenizer_from_dict(d)
    return BPETokenizer.load(path)
