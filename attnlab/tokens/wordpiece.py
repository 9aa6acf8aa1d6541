"""WordPiece (BERT) tokens through HuggingFace ``tokenizers``: lower-cased, accents stripped,
split on whitespace and punctuation, then into the longest vocabulary pieces (``##`` marks a
piece inside a word). Special tokens `[PAD] [UNK] [CLS] [SEP] [MASK]`; an encoded text is
``[CLS] text [SEP]`` (or ``[CLS] a [SEP] b [SEP]`` for a pair)."""

from __future__ import annotations

import itertools
import json
from collections.abc import Iterable
from pathlib import Path

from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, processors, trainers

from ..errors import DataError
from .hf import HFTokenizer

SPECIALS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]


class WordPieceTokenizer(HFTokenizer):
    kind = "wordpiece"

    def __init__(self, tokenizer: Tokenizer) -> None:
        super().__init__(tokenizer)
        missing = [s for s in SPECIALS if tokenizer.token_to_id(s) is None]
        if missing:
            raise DataError(f"the tokenizer lacks the special tokens {missing}; a BERT tokenizer needs {SPECIALS}")
        self.pad_id, self.unk_id, self.cls_id, self.sep_id, self.mask_id = (tokenizer.token_to_id(s) for s in SPECIALS)
        self._tok.post_processor = processors.TemplateProcessing(
            single="[CLS] $A [SEP]",
            pair="[CLS] $A [SEP] $B:1 [SEP]:1",
            special_tokens=[("[CLS]", self.cls_id), ("[SEP]", self.sep_id)],
        )

    @property
    def special_ids(self) -> tuple[int, ...]:
        """The ids of `[PAD]`, `[UNK]`, `[CLS]`, `[SEP]` and `[MASK]`."""
        return (self.pad_id, self.unk_id, self.cls_id, self.sep_id, self.mask_id)

    @staticmethod
    def _pipeline(model, lowercase: bool = True) -> Tokenizer:
        tok = Tokenizer(model)
        tok.normalizer = normalizers.BertNormalizer(lowercase=lowercase, strip_accents=lowercase or None)
        tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
        tok.decoder = decoders.WordPiece()
        return tok

    @classmethod
    def train(cls, texts: Iterable[str], vocab_size: int = 4096, min_frequency: int = 2) -> "WordPieceTokenizer":
        texts = (t for t in texts if t.strip())  # (consumed as a stream, never held whole)
        first = next(texts, None)
        if first is None:
            raise DataError("cannot train a WordPiece tokenizer on no text")
        tok = cls._pipeline(models.WordPiece(unk_token="[UNK]"))
        tok.train_from_iterator(
            itertools.chain([first], texts),
            trainer=trainers.WordPieceTrainer(
                vocab_size=vocab_size, min_frequency=min_frequency, special_tokens=SPECIALS, show_progress=False
            ),
        )
        return cls(tok)

    @classmethod
    def from_vocab(cls, vocab_txt: str | Path, lowercase: bool = True) -> "WordPieceTokenizer":
        """A BERT ``vocab.txt`` (one piece per line, id = line number)."""
        vocab = {w: i for i, w in enumerate(Path(vocab_txt).read_text(encoding="utf-8").splitlines())}
        return cls(cls._pipeline(models.WordPiece(vocab, unk_token="[UNK]"), lowercase))

    @classmethod
    def load(cls, folder: str | Path) -> "WordPieceTokenizer":
        """The tokenizer of a checkpoint folder: tokenizer.json, else vocab.txt."""
        folder = Path(folder)
        if (folder / "tokenizer.json").is_file():
            return cls(Tokenizer.from_file(str(folder / "tokenizer.json")))
        if (folder / "vocab.txt").is_file():
            cfg = folder / "tokenizer_config.json"
            lower = json.loads(cfg.read_text()).get("do_lower_case", True) if cfg.is_file() else True
            return cls.from_vocab(folder / "vocab.txt", lower)
        raise DataError(f"{folder} has no tokenizer.json or vocab.txt")

    def encode(self, text: str, pair: str | None = None) -> list[int]:
        """Ids of ``[CLS] text [SEP]`` (``[CLS] text [SEP] pair [SEP]``)."""
        return self._tok.encode(text, pair).ids

    def encode_batch(self, texts: list[str]) -> list[list[int]]:
        """Ids of ``[CLS] text [SEP]`` for each text, encoded on ``tokenizers``' threads."""
        return [e.ids for e in self._tok.encode_batch(texts)]

    def encode_with_types(self, text: str, pair: str | None = None) -> tuple[list[int], list[int]]:
        e = self._tok.encode(text, pair)
        return e.ids, e.type_ids

    def encode_words(self, words: list[str]) -> tuple[list[int], list[int | None]]:
        """Ids of ``[CLS] words [SEP]`` for text already split into words, and the index of the
        word each token comes from (None for [CLS] and [SEP]): a word may give several pieces."""
        e = self._tok.encode(list(words), is_pretokenized=True)
        return e.ids, e.word_ids

    def tokens(self, text: str) -> list[str]:
        return self._tok.encode(text).tokens

    def decode(self, ids) -> str:
        return self._tok.decode([int(i) for i in ids], skip_special_tokens=True)
