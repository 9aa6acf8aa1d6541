"""Word-level tokens (captions): lower-cased words and punctuation marks, one id each, trained
with HuggingFace ``tokenizers`` (WordLevel). Words seen fewer than ``min_frequency`` times map
to the unknown token."""

from __future__ import annotations

import json
from collections.abc import Iterable

from tokenizers import Tokenizer, models, normalizers, pre_tokenizers, trainers

from ..errors import DataError, UnknownTokenError


class WordTokenizer:
    kind = "word"

    def __init__(self, tokenizer: Tokenizer) -> None:
        self._tok = tokenizer

    @classmethod
    def train(cls, texts: Iterable[str], special_tokens: list[str], min_frequency: int = 1,
              unk_token: str = "<unk>") -> "WordTokenizer":
        texts = [t for t in texts if t.strip()]
        if not texts:
            raise DataError("cannot build a word vocabulary from no text")
        tok = Tokenizer(models.WordLevel(unk_token=unk_token))
        tok.normalizer = normalizers.Lowercase()
        tok.pre_tokenizer = pre_tokenizers.Whitespace()  # words \w+ and runs of punctuation
        tok.train_from_iterator(texts, trainer=trainers.WordLevelTrainer(
            special_tokens=special_tokens, min_frequency=min_frequency, show_progress=False))
        return cls(tok)

    @property
    def vocab_size(self) -> int:
        return self._tok.get_vocab_size()

    def encode(self, text: str) -> list[int]:
        return self._tok.encode(text, add_special_tokens=False).ids

    def tokens(self, text: str) -> list[str]:
        """The words ``text`` splits into (lower-cased), before the vocabulary lookup."""
        return [w for w, _ in self._tok.pre_tokenizer.pre_tokenize_str(self._tok.normalizer.normalize_str(text))]

    def decode(self, ids) -> str:
        ids = [int(i) for i in ids]
        bad = [i for i in ids if not 0 <= i < self.vocab_size]
        if bad:
            raise UnknownTokenError(f"token id {bad[0]} is outside the vocabulary (0..{self.vocab_size - 1})")
        return " ".join(self._tok.id_to_token(i) for i in ids)

    def id_to_token(self, i: int) -> str:
        return self._tok.id_to_token(int(i))

    def to_dict(self) -> dict:
        return {"type": "word", "tokenizer": json.loads(self._tok.to_str())}

    @classmethod
    def from_dict(cls, d: dict) -> "WordTokenizer":
        return cls(Tokenizer.from_str(json.dumps(d["tokenizer"])))
