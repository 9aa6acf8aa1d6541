"""Character-level tokenizer: one id per distinct character of the training corpus."""

from __future__ import annotations

import json
from pathlib import Path

from ..errors import DataError, UnknownTokenError
from .ids import checked_token_ids


class CharTokenizer:
    """Maps each character of a corpus to an id (sorted by code point, like nanoGPT).

    Unknown characters raise :class:`UnknownTokenError`, unless the tokenizer was
    built with ``unk="<unk>"`` (or any name), in which case they map to that id.
    """

    kind = "char"

    def __init__(self, chars: list[str], unk: str | None = None) -> None:
        if not chars:
            raise DataError("cannot build a character tokenizer from an empty corpus")
        self.chars = list(chars)
        self.unk = unk
        self.itos = self.chars + ([unk] if unk is not None else [])
        self.stoi = {c: i for i, c in enumerate(self.chars)}
        self.unk_id = len(self.chars) if unk is not None else None

    @classmethod
    def from_corpus(cls, text: str, unk: str | None = None) -> "CharTokenizer":
        return cls(sorted(set(text)), unk)

    @property
    def vocab_size(self) -> int:
        return len(self.itos)

    def encode(self, text: str) -> list[int]:
        try:
            return [self.stoi[c] for c in text]
        except KeyError:
            if self.unk_id is not None:
                return [self.stoi.get(c, self.unk_id) for c in text]
            bad = next(c for c in text if c not in self.stoi)
            raise UnknownTokenError(
                f"character {bad!r} (U+{ord(bad):04X}) is not in this tokenizer's vocabulary of "
                f"{len(self.chars)} characters; remove it from the text, or train on a corpus that "
                f"contains it, or build the tokenizer with unk='<unk>'"
            ) from None

    def decode(self, ids) -> str:
        return "".join(self.itos[i] for i in checked_token_ids(ids, len(self.itos)))

    def to_dict(self) -> dict:
        return {"type": "char", "chars": self.chars, "unk": self.unk}

    def hf_tokenizer(self):
        """The same mapping as a HuggingFace ``tokenizers.Tokenizer`` (what ``export_hf`` writes
        as tokenizer.json): every character its own token, the same ids, decoded without spaces."""
        from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers

        vocab = {c: i for i, c in enumerate(self.itos)}
        unk = self.unk if self.unk is not None else None
        tok = Tokenizer(models.WordLevel(vocab, unk_token=unk))
        tok.pre_tokenizer = pre_tokenizers.Split(Regex(r"[\s\S]"), behavior="isolated")  # one piece per character
        tok.decoder = decoders.Fuse()
        if unk is not None:
            tok.add_special_tokens([unk])
        return tok

    @classmethod
    def from_dict(cls, d: dict) -> "CharTokenizer":
        return cls(d["chars"], d.get("unk"))

    def save(self, path: str | Path) -> None:
        Path(path).write_text(json.dumps(self.to_dict(), ensure_ascii=False), encoding="utf-8")

    @classmethod
    def load(cls, path: str | Path) -> "CharTokenizer":
        return cls.from_dict(json.loads(Path(path).read_text(encoding="utf-8")))
