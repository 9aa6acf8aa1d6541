"""What the tokenizers built on HuggingFace ``tokenizers`` share (byte-level BPE, word-level,
WordPiece): the wrapped ``Tokenizer``, its vocabulary, and saving it inside attnlab's JSON."""

from __future__ import annotations

import json
from pathlib import Path

from tokenizers import Tokenizer

from .ids import checked_token_ids


class HFTokenizer:
    """Base of the ``tokenizers``-backed tokenizers; a subclass names its ``kind`` (the "type"
    its ``to_dict`` writes and ``tokens.tokenizer_from_dict`` reads back)."""

    kind: str

    def __init__(self, tokenizer: Tokenizer) -> None:
        self._tok = tokenizer

    @property
    def vocab_size(self) -> int:
        return self._tok.get_vocab_size()

    def id_to_token(self, i: int) -> str:
        return self._tok.id_to_token(int(i))

    def token_to_id(self, token: str) -> int | None:
        return self._tok.token_to_id(token)

    def _checked_ids(self, ids) -> list[int]:
        """``ids`` as ints, refusing any outside the vocabulary (``tokenizers`` would skip them)."""
        return checked_token_ids(ids, self.vocab_size)

    def save(self, path: str | Path) -> None:
        """The plain HuggingFace ``tokenizer.json``."""
        self._tok.save(str(path))

    def hf_tokenizer(self) -> Tokenizer:
        """The HuggingFace ``tokenizers.Tokenizer`` itself (what ``export_hf`` writes)."""
        return self._tok

    def to_dict(self) -> dict:
        return {"type": self.kind, "tokenizer": json.loads(self._tok.to_str())}

    @classmethod
    def from_dict(cls, d: dict):
        return cls(Tokenizer.from_str(json.dumps(d["tokenizer"])))
