"""Byte-level BPE (GPT-2 style) trained with HuggingFace ``tokenizers``.

Byte-level means every UTF-8 string, whatever its alphabet, is encodable, and
decode(encode(text)) == text exactly.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable
from pathlib import Path

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

from ..errors import DataError
from .hf import HFTokenizer

_BYTE_ALPHABET = 256


class BPETokenizer(HFTokenizer):
    kind = "bpe"

    @classmethod
    def train(
        cls,
        texts: Iterable[str] | str,
        vocab_size: int,
        special_tokens: list[str] | None = None,
        min_frequency: int = 2,
    ) -> "BPETokenizer":
        """Learn ``vocab_size - 256 - len(special_tokens)`` merges on top of the 256 bytes."""
        special_tokens = list(special_tokens or [])
        if vocab_size < _BYTE_ALPHABET + len(special_tokens):
            raise ValueError(
                f"vocab_size={vocab_size} is smaller than the {_BYTE_ALPHABET} byte tokens plus "
                f"{len(special_tokens)} special tokens; use at least {_BYTE_ALPHABET + len(special_tokens)}"
            )
        texts = iter([texts] if isinstance(texts, str) else texts)  # (consumed as a stream, never held whole)
        first = next((t for t in texts if t), None)
        if first is None:
            raise DataError("cannot train a BPE tokenizer on an empty corpus")
        tok = Tokenizer(models.BPE())
        tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
        tok.decoder = decoders.ByteLevel()
        trainer = trainers.BpeTrainer(
            vocab_size=vocab_size,
            min_frequency=min_frequency,
            special_tokens=special_tokens,
            initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
            show_progress=False,
        )
        tok.train_from_iterator(itertools.chain([first], texts), trainer=trainer)
        return cls(tok)

    def encode(self, text: str) -> list[int]:
        return self._tok.encode(text, add_special_tokens=False).ids

    def encode_with_offsets(self, text: str) -> tuple[list[int], list[tuple[int, int]]]:
        """The ids of ``text`` and each one's (start, end) characters in it."""
        e = self._tok.encode(text, add_special_tokens=False)
        return e.ids, [tuple(o) for o in e.offsets]

    def encode_batch(self, texts: list[str]) -> list[list[int]]:
        return [e.ids for e in self._tok.encode_batch(texts, add_special_tokens=False)]

    def decode(self, ids) -> str:
        return self._tok.decode(self._checked_ids(ids), skip_special_tokens=False)

    @classmethod
    def load(cls, path: str | Path) -> "BPETokenizer":
        return cls(Tokenizer.from_file(str(path)))
