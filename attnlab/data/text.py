"""Text corpora for language modelling: read, tokenise once, cache as memory-mapped ids."""

from __future__ import annotations

import hashlib
import json
import os
import re
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from ..errors import DataError
from ..tokens import BPETokenizer, CharTokenizer, tokenizer_from_dict
from . import hf, sources

EMBEDDED = "python-docs"


def embedded_corpus() -> str:
    """English text that ships with every CPython: the interpreter's help topics (pydoc_data),
    about 460 kB. Needs no download and no data directory."""
    try:
        from pydoc_data.topics import topics
    except ImportError:  # a trimmed Python without pydoc_data: fall back to stdlib docstrings
        import collections, json as _json, pathlib  # noqa: E401

        mods = [collections, _json, pathlib, re, os]
        return "\n\n".join((m.__doc__ or "") for m in mods)
    text = "\n\n".join(topics[k].strip() for k in sorted(topics))
    # the help pages are indented like a terminal manual; flush-left prose is easier to learn
    text = re.sub(r"(?m)^[ \t]+", "", text)
    return re.sub(r"\n{3,}", "\n\n", text) + "\n"


def read_text_file(path: Path) -> str:
    return decode_text(path.read_bytes(), path)


def decode_text(data: bytes, path: Path, at: int = 0) -> str:
    """``data``, the bytes of ``path`` from offset ``at``, as UTF-8 text; a binary file or another
    encoding is refused in one line."""
    if b"\x00" in data[:8192]:
        raise DataError(f"{path} looks like a binary file (it contains NUL bytes); give a UTF-8 text file")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise DataError(
            f"{path} is not UTF-8 text (bad byte 0x{data[e.start]:02x} at offset {at + e.start}); "
            "convert it with e.g. `iconv -t utf-8` or give another file"
        ) from None


def load_corpus(spec: str | None, data_dir: str | None = None) -> tuple[str, str]:
    """Return (name, text) for ``spec``: None/'python-docs' (embedded), a dataset name,
    a text file, or a folder of text files (read in sorted order)."""
    if spec in (None, "", EMBEDDED):
        return EMBEDDED, embedded_corpus()
    if spec in sources.named("text"):
        paths = sources.resolve(spec, data_dir)
        return spec, "".join(read_text_file(p) for p in paths)
    if hf.is_hf(spec):
        return hf.corpus(spec)
    path = Path(spec).expanduser()
    if path.is_dir():
        files = sorted(p for p in path.rglob("*") if p.is_file() and not p.name.startswith("."))
        if not files:
            raise DataError(f"folder {path} holds no files; put .txt files in it")
        text = "\n".join(read_text_file(p) for p in files)
    elif path.is_file():
        text = read_text_file(path)
    else:
        raise DataError(
            f"no such file, folder or dataset: {spec!r}; give a path to UTF-8 text, or one of "
            f"{[EMBEDDED, *sources.named('text')]}"
        )
    if not text.strip():
        raise DataError(f"corpus {spec} is empty; give a file with some text in it")
    return str(path), text


def build_tokenizer(kind: str, text: str, vocab_size: int | None = None):
    if kind == "char":
        return CharTokenizer.from_corpus(text)
    if kind == "bpe":
        return BPETokenizer.train(text, vocab_size or 1024)
    raise ValueError(f"unknown tokenizer {kind!r}; choose char or bpe")


@dataclass
class TokenData:
    """Train/validation token ids as memory-mapped arrays."""

    train: np.ndarray
    val: np.ndarray
    tokenizer: object
    name: str

    def batch(self, split: str, batch_size: int, block_size: int, generator: torch.Generator):
        """Random windows (nanoGPT style): x (B, T) and y = x shifted by one."""
        data = self.train if split == "train" else self.val
        n = len(data) - block_size - 1
        if n < 1:
            raise DataError(
                f"the {split} split has {len(data)} tokens, fewer than one block of {block_size} + 1; "
                "use more text or a smaller --block-size"
            )
        ix = torch.randint(n, (batch_size,), generator=generator).tolist()
        x = torch.from_numpy(np.stack([data[i : i + block_size] for i in ix]).astype(np.int64))
        y = torch.from_numpy(np.stack([data[i + 1 : i + 1 + block_size] for i in ix]).astype(np.int64))
        return x, y


VAL_FRACTION = 0.1  # the last 10 % of a corpus is its validation split


def split_ids(ids, val_fraction: float = VAL_FRACTION):
    """Token ids -> (train, val): the first 1 - val_fraction, then the rest (no shuffling: the
    validation text is unseen text, not unseen windows of seen text)."""
    cut = int(len(ids) * (1 - val_fraction))
    return ids[:cut], ids[cut:]


def prepare(
    spec: str | None,
    cache: Path,
    *,
    tokenizer: str = "char",
    vocab_size: int | None = None,
    data_dir: str | None = None,
    val_fraction: float = VAL_FRACTION,
    existing_tokenizer: dict | None = None,
) -> TokenData:
    """Read and tokenise the corpus once; ids go to ``cache`` as train.bin / val.bin (memory-mapped
    on later runs). ``existing_tokenizer`` (from a checkpoint) is reused instead of training one.
    (A folder of token shards: :func:`attnlab.data.shards.token_data`.)"""
    name, text = load_corpus(spec, data_dir)
    key = hashlib.sha256(
        text.encode() + json.dumps([tokenizer, vocab_size, existing_tokenizer is not None, val_fraction]).encode()
    ).hexdigest()[:16]
    cache.mkdir(parents=True, exist_ok=True)
    meta_path = cache / "meta.json"
    try:  # (a cache: unreadable, it is rebuilt)
        meta = json.loads(meta_path.read_text(encoding="utf-8")) if meta_path.exists() else {}
    except (OSError, UnicodeDecodeError, json.JSONDecodeError):
        meta = {}
    if isinstance(meta, dict) and meta.get("key") == key:
        tok = tokenizer_from_dict(meta["tokenizer"])
        dt = np.dtype(meta["dtype"])
        return TokenData(
            np.memmap(cache / "train.bin", dtype=dt, mode="r"),
            np.memmap(cache / "val.bin", dtype=dt, mode="r"),
            tok,
            name,
        )
    tok = (
        tokenizer_from_dict(existing_tokenizer) if existing_tokenizer else build_tokenizer(tokenizer, text, vocab_size)
    )
    ids = np.asarray(tok.encode(text), dtype=np.uint16 if tok.vocab_size < 2**16 else np.uint32)
    train, val = split_ids(ids, val_fraction)
    for part, arr in (("train", train), ("val", val)):
        tmp = cache / f"{part}.bin.tmp{os.getpid()}"  # several torchrun ranks may write at once
        arr.tofile(tmp)
        os.replace(tmp, cache / f"{part}.bin")
    meta = {"key": key, "dtype": ids.dtype.name, "tokenizer": tok.to_dict(), "name": name, "n_tokens": int(len(ids))}
    tmp = cache / f"meta.json.tmp{os.getpid()}"
    tmp.write_text(json.dumps(meta))
    os.replace(tmp, meta_path)
    return TokenData(train, val, tok, name)
