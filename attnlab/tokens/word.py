"""Word-level tokens (captions): lower-cased words and punctuation marks, one id each, trained
with HuggingFace ``tokenizers`` (WordLevel). Words seen fewer than ``min_frequency`` times map
to the unknown token."""

from __future__ import annotations

from collections.abc import Iterable

from tokenizers import Tokenizer, models, normalizers, pre_tokenizers, trainers

from ..errors import DataError
from .hf import HFTokenizer


class WordTokenizer(HFTokenizer):
    kind = "word"

    @classmethod
    def train(
        cls, texts: Iterable[str], special_tokens: list[str], min_frequency: int = 1, unk_token: str = "<unk>"
    ) -> "WordTokenizer":
        texts = [t for t in texts if t.strip()]
        if not texts:
            raise DataError("cannot build a word vocabulary from no text")
        tok = Tokenizer(models.WordLevel(unk_token=unk_token))
        tok.normalizer = normalizers.Lowercase()
        tok.pre_tokenizer = pre_tokenizers.Whitespace()  # words \w+ and runs of punctuation
        tok.train_from_iterator(
            texts,
            trainer=trainers.WordLevelTrainer(
                special_tokens=special_tokens, min_frequency=min_frequency, show_progress=False
            ),
        )
        return cls(tok)

    def encode(self, text: str) -> list[int]:
        return self._tok.encode(text, add_special_tokens=False).ids

    def tokens(self, text: str) -> list[str]:
        """The words ``text`` splits into (lower-cased), before the vocabulary lookup."""
        return [w for w, _ in self._tok.pre_tokenizer.pre_tokenize_str(self._tok.normalizer.normalize_str(text))]

    def decode(self, ids) -> str:
        return " ".join(self._tok.id_to_token(i) for i in self._checked_ids(ids))
