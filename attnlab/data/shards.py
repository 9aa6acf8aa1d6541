"""Corpora larger than memory: read as a stream, tokenised in batches, written as token shards.

    attnlab data prepare corpus/ --tokenizer bpe --vocab-size 8192 --out shards/
    attnlab train gpt --data shards/

A source (a text file, a folder of them, a glob, ``.gz`` / ``.bz2`` / ``.xz`` / ``.zst`` files, or
``hf:NAME`` streamed from HuggingFace ``datasets``) is read as a sequence of *documents*: a
dataset row, or a block of a file of at most :data:`DOC_BYTES` bytes cut after its last newline
(a shorter file is one document). Each document goes whole to the validation split or to the
training split, decided by a hash of (``seed``, its number): a fixed split by documents, whatever
the machine. Documents are tokenised a batch at a time (characters through a lookup table, BPE
through the ``tokenizers`` library's batch encoding on its own threads) while a thread reads the
next batch, and their ids are appended to fixed-size shards of ``shard_tokens`` ids (uint8,
uint16 or uint32: the narrowest that holds the vocabulary; ``train_00000.bin``, ``val_00000.bin``,
...), beside each a ``.docs`` file of the offsets (uint64) where its documents start. Memory stays bounded by a few
batches, whatever the corpus's size.

``index.json`` holds the tokenizer, the settings, every shard (its token count and, once full,
its SHA-256) and where in the source the next document starts. It is rewritten atomically after
every batch, so a preparation killed at any point (kill -9 included) resumes from its last batch:
the open shards are cut back to what the index counts and the source is read on from there, and
the shards end byte-identical to those of a preparation never stopped.

The vocabulary comes from the stream too: characters from a pass that counts every byte of the
source (:func:`char_vocabulary`), BPE and WordPiece trained on a bounded sample, the first
``sample_mb`` MB of documents streamed to the trainer (:func:`sample`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated, Literal

import contextlib
import glob
import hashlib
import io
import itertools
import json
import os
import queue
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path


from ..errors import DataError, OptionError, UnknownTokenError
from ..options import Arg, at_least, below_one, checked, number, vocab_size
from . import hf

if TYPE_CHECKING:
    import numpy as np

    from .text import TokenData

INDEX = "index.json"
FORMAT = "attnlab-token-shards"
DOC_BYTES = 1 << 18  # a file is cut into documents of at most 256 KiB (after their last newline)
BATCH_BYTES = 8 << 20  # documents tokenised together: 8 MiB of text
SPLITS = ("train", "val")


# ---- the source, as documents ---------------------------------------------------------------------------
def open_binary(path: Path) -> io.BufferedIOBase:
    """``path`` as a stream of its (decompressed) bytes."""
    import bz2
    import gzip
    import lzma

    suffix = path.suffix.lower()
    if suffix == ".gz":
        return gzip.open(path, "rb")
    if suffix == ".bz2":
        return bz2.open(path, "rb")
    if suffix in (".xz", ".lzma"):
        return lzma.open(path, "rb")
    if suffix == ".zst":
        try:
            import zstandard
        except ImportError:
            raise DataError(f"{path} is zstd-compressed: pip install zstandard to read it") from None
        return io.BufferedReader(zstandard.ZstdDecompressor().stream_reader(open(path, "rb")))  # noqa: SIM115
    return open(path, "rb")  # noqa: SIM115


def source_files(source: str) -> list[Path]:
    """The files of ``source`` (a file, a folder read recursively, or a glob), in sorted order."""
    path = Path(source).expanduser()
    if path.is_file():
        return [path]
    if path.is_dir():
        files = sorted(p for p in path.rglob("*") if p.is_file() and not p.name.startswith("."))
    else:
        files = sorted(Path(p) for p in glob.glob(os.path.expanduser(source), recursive=True) if Path(p).is_file())
    if not files:
        raise DataError(f"{source}: no such file, folder or glob with files in it; give text files to prepare")
    return files


@dataclass
class Cursor:
    """Where the next document starts: file ``file`` (or, for a dataset, row ``file``, ``offset``
    0) at byte ``offset`` of its decompressed content; ``document``: the documents before it."""

    file: int = 0
    offset: int = 0
    document: int = 0


def file_documents(files: list[Path], start: Cursor) -> Iterator[tuple[Cursor, str, int]]:
    """(the cursor after it, the document, its bytes) for every document of ``files`` from ``start``
    on: blocks of at most DOC_BYTES bytes, each cut after its last newline (else between characters)."""
    from .text import decode_text

    document = start.document
    for index in range(start.file, len(files)):
        offset = start.offset if index == start.file else 0
        with open_binary(files[index]) as f:
            skip_to(f, offset)
            rest = b""
            while block := rest + f.read(DOC_BYTES - len(rest)):
                cut = len(block)
                if cut == DOC_BYTES:  # (a shorter block is the file's end)
                    cut = block.rfind(b"\n") + 1 or character_boundary(block)
                piece, rest = block[:cut], block[cut:]
                offset += len(piece)
                document += 1
                yield Cursor(index, offset, document), decode_text(piece, files[index], offset - len(piece)), len(piece)


def character_boundary(block: bytes) -> int:
    """The longest prefix of ``block`` that ends between two UTF-8 characters."""
    lead = len(block) - 1
    while lead >= 0 and block[lead] & 0xC0 == 0x80:  # continuation bytes: back to the last character's first
        lead -= 1
    if lead < 0:
        return len(block)
    first = block[lead]
    size = 1 if first < 0x80 else 2 if first < 0xE0 else 3 if first < 0xF0 else 4
    return len(block) if lead + size <= len(block) else max(lead, 1)


def skip_to(f, offset: int) -> None:
    """Read ``f`` to byte ``offset``: a file seeks; a compressed stream that cannot is read to there."""
    if offset == 0:
        return
    try:
        if f.seek(offset) == offset:
            return
    except (OSError, io.UnsupportedOperation, ValueError):
        pass
    left = offset - f.tell() if f.seekable() else offset
    while left > 0:
        got = f.read(min(left, 1 << 20))
        if not got:
            raise DataError("the source is shorter than when this preparation started; prepare it again in a new --out")
        left -= len(got)


def dataset_documents(source: str, start: Cursor) -> Iterator[tuple[Cursor, str, int]]:
    """(the cursor after it, the row's text and a blank line, its bytes) for every row of the
    HuggingFace dataset ``source`` (``hf:NAME[:CONFIG][:SPLIT][:COLUMN]``: its splits one after the
    other unless one is named; the column named, else ``text``, else the only string column), from
    row ``start.file`` on. Rows are separated by a blank line, as the text path joins them. Nothing is
    held whole: a local Parquet file is read a batch of rows at a time, a saved dataset or a local
    JSON/CSV/Arrow file through ``datasets``' memory-mapped Arrow, a hub dataset in streaming mode."""
    spec = hf.HFSpec.parse(source)
    row = start.file
    for text in dataset_texts(spec, row):
        if not isinstance(text, str):
            continue  # (a missing value: no text in that row)
        row += 1
        text += "\n\n"
        yield Cursor(row, 0, start.document + row - start.file), text, len(text.encode("utf-8"))


def dataset_texts(spec: hf.HFSpec, start: int) -> Iterator:
    """The text column's value in every row of ``spec`` from row ``start`` on (the splits chained);
    a bad name, split or column is refused before the first row is read."""
    path = Path(spec.name).expanduser()
    if path.suffix.lower() == ".parquet" and path.is_file() and spec.split in (None, "train"):
        return parquet_column(path, spec, start)
    if path.exists() or path.suffix.lower() in hf.LOCAL_FORMATS:  # (local: memory-mapped Arrow)
        splits = hf.load_splits(spec)
        columns = [(split, hf.text_column(split, spec)) for split in splits.values()]
        rows = (text for split, column in columns for batch in split.select_columns([column]).iter(batch_size=1024)
                for text in batch[column])  # fmt: skip
    else:
        rows = streamed_column(spec)
    return itertools.islice(rows, start, None)


def streamed_column(spec: hf.HFSpec) -> Iterator:
    """The text column of every row of a hub dataset, through ``datasets``' streaming mode."""
    datasets = hf.datasets_library()
    try:
        stream = datasets.load_dataset(spec.name, spec.config, split=spec.split, streaming=True)
    except Exception as e:  # (no such dataset, offline: datasets' own reasons, in one line)
        raise DataError(
            f"--data {spec.label}: HuggingFace datasets could not read it as a stream ({type(e).__name__}: "
            f"{str(e).splitlines()[0][:150] if str(e) else ''})"
        ) from None
    splits = dict(stream) if isinstance(stream, datasets.IterableDatasetDict) else {spec.split: stream}
    for split in splits.values():
        features = split.features  # (None when the stream does not declare them: the text column is "text")
        column = hf.text_column(split, spec) if features else spec.column or "text"
        for item in split:
            if column not in item:
                raise DataError(f"--data {spec.label}: no column {column!r}; it has {', '.join(item)}")
            yield item[column]


def parquet_column(path: Path, spec: hf.HFSpec, start: int) -> Iterator:
    """The text column's value in every row of a local Parquet file from row ``start`` on, a batch
    of rows at a time. Read with pyarrow itself, without pre-buffering: ``datasets``' streaming reads
    Parquet through dataset fragments, whose memory grows with every batch read
    (apache/arrow#39808), and pre-buffering keeps every range read until the file is closed."""
    try:
        import pyarrow.parquet as pq
    except ImportError:
        raise DataError(f"{path} is Parquet: pip install pyarrow (or attnlab[hub]) to read it") from None
    try:
        table = pq.ParquetFile(path, pre_buffer=False)
    except Exception as e:  # (pyarrow's ArrowInvalid and kin: not a Parquet file)
        raise DataError(f"--data {spec.label}: {path} cannot be read as Parquet ({type(e).__name__}: {e})") from None
    column = hf.column_of({f.name: str(f.type) for f in table.schema_arrow}, spec)
    groups, first = [], 0  # the row groups from the one holding row ``start`` on, and that group's first row
    for g in range(table.num_row_groups):
        rows = table.metadata.row_group(g).num_rows
        if groups or first + rows > start:
            groups.append(g)
        else:
            first += rows
    if not groups:
        return iter(())
    batches = table.iter_batches(batch_size=1024, row_groups=groups, columns=[column])
    values = (value for batch in batches for value in batch.column(0).to_pylist())
    return itertools.islice(values, start - first, None)


def documents(source: str, start: Cursor | None = None) -> Iterator[tuple[Cursor, str, int]]:
    """Every document of ``source`` from ``start`` on: (the cursor after it, its text, its bytes)."""
    start = start or Cursor()
    if hf.is_hf(source):
        return dataset_documents(source, start)
    return file_documents(source_files(source), start)


def document_batches(source: str, start: Cursor | None = None) -> Iterator[list[tuple[Cursor, str, int]]]:
    """The documents of ``source`` (from ``start`` on) in batches of about :data:`BATCH_BYTES`
    bytes: what is tokenised at once."""
    batch, size = [], 0
    for document in documents(source, start):
        batch.append(document)
        size += document[2]
        if size >= BATCH_BYTES:
            yield batch
            batch, size = [], 0
    if batch:
        yield batch


COMPRESSED = (".gz", ".bz2", ".xz", ".lzma", ".zst")


def source_bytes(source: str) -> int | None:
    """The bytes of text in ``source``, for the progress line's share and ETA; None where they are
    not known before reading it (a streamed dataset, compressed files)."""
    if hf.is_hf(source):
        return None
    files = source_files(source)
    if any(p.suffix.lower() in COMPRESSED for p in files):
        return None
    return sum(p.stat().st_size for p in files)


# ---- the vocabulary ---------------------------------------------------------------------------------------
def sample(source: str, megabytes: float) -> Iterator[str]:
    """The first ``megabytes`` MB of documents of ``source``, one at a time: what BPE and WordPiece
    are trained on (their trainers count words as the documents stream by)."""
    size = 0
    for _, text, _ in documents(source):
        yield text
        size += len(text)
        if size >= megabytes * 1e6:
            return


def char_vocabulary(source: str) -> list[str]:
    """Every character of ``source``, sorted. An ASCII document is scanned at memory speed: the
    bytes seen already are deleted (``bytes.translate``) and only what is left, usually nothing, is
    looked at; a document beyond ASCII is read character by character."""
    seen = bytearray()
    others: set[str] = set()
    for _, text, _ in documents(source):
        if text.isascii():
            new = text.encode("ascii").translate(None, seen)
            if new:
                seen += bytes(sorted(set(new)))
        else:
            others.update(text)
    chars = {chr(b) for b in seen} | others
    if not chars:
        raise DataError(f"{source} holds no text to prepare")
    return sorted(chars)


def token_dtype(vocab_size: int) -> str:
    """The narrowest unsigned integer that holds every id: a character vocabulary of ASCII text in
    one byte a token (half the disk and page cache of uint16), BPE in two, large vocabularies in four."""
    return "uint8" if vocab_size <= 1 << 8 else "uint16" if vocab_size <= 1 << 16 else "uint32"


class CharEncoder:
    """Characters -> ids of ``dtype`` through a lookup table: an ASCII document never leaves C
    (``bytes.translate`` when the ids are bytes, else a NumPy gather)."""

    def __init__(self, chars: list[str], dtype) -> None:
        import numpy as np

        self.dtype = np.dtype(dtype)
        self.chars = chars
        codes = np.array([ord(c) for c in chars], dtype=np.int64)
        known = np.zeros(max(int(codes.max()) + 1, 256), dtype=bool)
        known[codes] = True
        self.known = known
        self.table = np.zeros(len(known), dtype=self.dtype)
        self.table[codes] = np.arange(len(chars))
        self.ascii_table = self.table[:256].astype(np.uint8).tobytes() if self.dtype.itemsize == 1 else None
        self.unknown_ascii = bytes(np.flatnonzero(~known[:128]).astype(np.uint8))  # (ASCII bytes with no id)

    def __call__(self, texts: list[str]) -> list[np.ndarray]:
        import numpy as np

        out = []
        for text in texts:
            if text.isascii():
                data = text.encode("ascii")
                if len(data.translate(None, self.unknown_ascii)) != len(data):
                    self.refuse(text)
                if self.ascii_table is not None:
                    ids = np.frombuffer(data.translate(self.ascii_table), dtype=np.uint8)
                else:
                    ids = self.table[np.frombuffer(data, dtype=np.uint8)]
            else:
                codes = np.frombuffer(text.encode("utf-32-le"), dtype="<u4")
                inside = codes < len(self.known)
                if not inside.all() or not self.known[codes].all():
                    self.refuse(text)
                ids = self.table[codes]
            out.append(ids)
        return out

    def refuse(self, text: str) -> None:
        bad = next(c for c in text if ord(c) >= len(self.known) or not self.known[ord(c)])
        raise UnknownTokenError(
            f"character {bad!r} (U+{ord(bad):04X}) is not in the vocabulary of {len(self.chars)} characters: the "
            "text is not the one the vocabulary was built from; give that text, or build a vocabulary that holds it"
        )


def encoder_for(tokenizer, dtype) -> Callable[[list[str]], list[np.ndarray]]:
    """texts -> one array of ``dtype`` ids per text, for an attnlab tokenizer (its batch encoding
    where it has one)."""
    import numpy as np

    if tokenizer.kind == "char" and tokenizer.unk is None:
        return CharEncoder(tokenizer.chars, dtype)
    if hasattr(tokenizer, "encode_batch"):
        return lambda texts: [np.array(ids, dtype=dtype) for ids in tokenizer.encode_batch(texts)]
    return lambda texts: [np.array(tokenizer.encode(t), dtype=dtype) for t in texts]


# ---- writing shards ---------------------------------------------------------------------------------------
def is_validation(document: int, seed: int, fraction: float) -> bool:
    """Whether document number ``document`` goes to the validation split (a hash, fixed by ``seed``)."""
    digest = hashlib.blake2b(f"{seed}:{document}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") < fraction * 2**64


class ShardWriter:
    """Appends one split's documents to its shards; ``state`` (``{"shards": [...]}``) is what
    index.json keeps of them: each shard's file, token and document counts, and its SHA-256 once
    full (None while open)."""

    def __init__(self, out: Path, split: str, dtype: np.dtype, shard_tokens: int, state: dict) -> None:
        import numpy as np

        self.out, self.split, self.shard_tokens = out, split, shard_tokens
        self.dtype = np.dtype(dtype).newbyteorder("<")
        self.shards: list[dict] = state.setdefault("shards", [])
        self.tokens = self.docs = None  # the open shard's files
        self.digest = hashlib.sha256()
        if self.shards and self.shards[-1]["sha256"] is None:  # a stopped preparation: back to the index's counts
            last = self.shards[-1]
            self._open_files(last, tokens=last["tokens"] * self.dtype.itemsize, docs=last["documents"] * 8)

    def _open_files(self, shard: dict, tokens: int = 0, docs: int = 0) -> None:
        """Open the shard's files for appending, cut to ``tokens`` and ``docs`` bytes (0: new, empty)."""
        files = []
        for name, size in ((shard["file"], tokens), (docs_file(shard["file"]), docs)):
            path = self.out / name
            f = open(path, "r+b" if size and path.exists() else "w+b")  # noqa: SIM115
            f.truncate(size)
            files.append(f)
        self.tokens, self.docs = files
        self.digest = hashlib.sha256()
        self.tokens.seek(0)
        for block in iter(lambda: self.tokens.read(1 << 22), b""):  # (what the shard holds already, hashed once)
            self.digest.update(block)
        self.docs.seek(0, os.SEEK_END)

    def _shard(self) -> dict:
        """The open shard, a new one when there is none."""
        if self.tokens is None:
            shard = {"file": f"{self.split}_{len(self.shards):05d}.bin", "tokens": 0, "documents": 0, "sha256": None}
            self.shards.append(shard)
            self._open_files(shard)
        return self.shards[-1]

    def write(self, ids: np.ndarray) -> None:
        """One document: its start recorded, its ids appended across as many shards as it fills."""
        shard = self._shard()
        self.docs.write(shard["tokens"].to_bytes(8, "little"))
        shard["documents"] += 1
        ids = ids.astype(self.dtype, copy=False)
        while len(ids):
            shard = self._shard()
            part = ids[: self.shard_tokens - shard["tokens"]]
            data = part.tobytes()
            self.tokens.write(data)
            self.digest.update(data)
            shard["tokens"] += len(part)
            ids = ids[len(part) :]
            if shard["tokens"] == self.shard_tokens:
                self._close(shard)

    def _close(self, shard: dict) -> None:
        shard["sha256"] = self.digest.hexdigest()
        for f in (self.tokens, self.docs):
            f.close()
        self.tokens = self.docs = None

    def commit(self) -> None:
        """What was written reaches the files (before the index that counts it is written)."""
        for f in (self.tokens, self.docs):
            if f is not None:
                f.flush()

    def finish(self) -> None:
        if self.tokens is not None:
            self._close(self.shards[-1])


def docs_file(shard: str) -> str:
    return shard[: -len(".bin")] + ".docs"


@checked
def prepare(
    source: Annotated[
        str,
        Arg(
            "a text file, a folder of them, a glob ('logs/*.txt.gz'), or hf:NAME[:CONFIG][:SPLIT][:COLUMN]",
            flags=("source",),
        ),
    ],
    out: Annotated[str | Path, Arg("the folder of shards to write (or to finish, when a preparation stopped)")],
    *,
    tokenizer: Annotated[
        Literal["char", "bpe", "wordpiece"],
        Arg("character-level, byte-level BPE, or WordPiece (BERT's: [CLS] document [SEP])"),
    ] = "char",
    vocab_size: Annotated[
        int | None, Arg("bpe, wordpiece: vocabulary size (default 1024 for bpe, 4096 for wordpiece)", vocab_size(257))
    ] = None,
    sample_mb: Annotated[
        float,
        Arg(
            "bpe, wordpiece: train the vocabulary on the first this many MB of documents",
            number(float, 0.0, False, what="above 0"),
        ),
    ] = 64.0,
    shard_tokens: Annotated[int, Arg("tokens per shard", at_least(1024))] = 1 << 24,
    val_fraction: Annotated[float, Arg("share of the documents in the validation split", below_one)] = 0.01,
    seed: Annotated[int, Arg("which documents go to validation", at_least(0))] = 0,
    progress: Annotated[bool, Arg("a progress line with throughput and ETA on stderr")] = True,
) -> dict:
    """Prepare ``source`` into token shards in ``out`` (see the module's docstring) and return the
    index. A folder that holds an unfinished preparation of the same source and settings is
    finished; a finished one is returned as it is; one with other settings is refused."""
    from ..tokens import BPETokenizer, CharTokenizer, WordPieceTokenizer

    source = str(source)
    if not source.strip():
        raise OptionError("source '' names no text; give a file, a folder, a glob or hf:NAME to prepare")
    settings = dict(source=source, tokenizer=tokenizer, vocab_size=vocab_size, sample_mb=sample_mb,
                    shard_tokens=shard_tokens, val_fraction=val_fraction, seed=seed)  # fmt: skip
    say = (lambda m: print(m, file=sys.stderr, flush=True)) if progress else (lambda m: None)  # noqa: E731

    def vocabulary():
        if tokenizer == "char":
            say(f"prepare: counting the characters of {source}")
            return CharTokenizer(char_vocabulary(source))
        trained = {"bpe": (BPETokenizer, "BPE", 1024), "wordpiece": (WordPieceTokenizer, "WordPiece", 4096)}
        kind, name, default_size = trained[tokenizer]
        say(f"prepare: training a {vocab_size or default_size}-token {name} on the first {sample_mb:g} MB of {source}")
        return kind.train(sample(source, sample_mb), vocab_size or default_size)

    return prepared(Path(out), settings, vocabulary, progress)


def prepared(out: Path, settings: dict, vocabulary: Callable, progress: bool) -> dict:
    """The preparation ``settings`` describe in ``out``: started with the tokenizer
    ``vocabulary()`` returns, finished when it stopped, returned when it is done; a folder that
    holds another preparation is refused."""
    from ..tokens import tokenizer_from_dict

    index = read_index(out) if (out / INDEX).is_file() else None
    if index is not None:
        if index["settings"] != settings:
            changed = sorted(k for k in settings if index["settings"].get(k) != settings[k])
            raise OptionError(
                f"{out} holds a preparation with other settings ({', '.join(changed)}); give the same ones to "
                "finish it, or another --out"
            )
        if index["done"]:
            return index
        tok = tokenizer_from_dict(index["tokenizer"])
    else:
        if out.exists() and (not out.is_dir() or any(out.iterdir())):
            raise OptionError(f"--out {out} is not an empty folder and holds no preparation; give an empty or new one")
        next(iter(documents(settings["source"])), None)  # (a bad source is refused before anything is written)
        out.mkdir(parents=True, exist_ok=True)
        tok = vocabulary()
        index = {"format": FORMAT, "version": 1, "settings": settings, "tokenizer": tok.to_dict(),
                 "dtype": token_dtype(tok.vocab_size), "cursor": vars(Cursor()),
                 "splits": {s: {"shards": []} for s in SPLITS}, "done": False}  # fmt: skip
        write_index(out, index)
    run_preparation(out, index, tok, progress)
    return index


def run_preparation(out: Path, index: dict, tok, progress: bool) -> None:
    """Tokenise the source from the index's cursor on, a batch at a time, committing the index after each."""
    import numpy as np

    settings = index["settings"]
    writers = {
        s: ShardWriter(out, s, np.dtype(index["dtype"]), settings["shard_tokens"], index["splits"][s]) for s in SPLITS
    }
    encode = encoder_for(tok, np.dtype(index["dtype"]))
    start = Cursor(**index["cursor"])
    batches: queue.Queue = queue.Queue(maxsize=2)  # the next batch is read while this one is tokenised

    def read() -> None:
        try:
            for batch in document_batches(settings["source"], start):
                batches.put(batch)
            batches.put(None)
        except BaseException as e:  # (raised in the main thread)
            batches.put(e)

    threading.Thread(target=read, daemon=True).start()
    meter = Meter(source_bytes(settings["source"]), progress)
    while (batch := batches.get()) is not None:
        if isinstance(batch, BaseException):
            raise batch
        for (cursor, _, n_bytes), ids in zip(batch, encode([text for _, text, _ in batch])):
            split = "val" if is_validation(cursor.document - 1, settings["seed"], settings["val_fraction"]) else "train"
            writers[split].write(ids)
            meter.add(n_bytes, len(ids))
        for writer in writers.values():
            writer.commit()
        index["cursor"] = vars(batch[-1][0])
        write_index(out, index)  # the commit: a preparation stopped after it resumes from here
    for writer in writers.values():
        writer.finish()
    for split in SPLITS:
        if not any(s["tokens"] for s in index["splits"][split]["shards"]):
            raise DataError(
                f"no document went to the {'validation' if split == 'val' else 'training'} split of "
                f"{settings['source']}; give more text"
                + (" or a larger --val-fraction" if split == "val" else " or a smaller --val-fraction")
            )
    index["done"] = True
    write_index(out, index)
    meter.end(index)


class Meter:
    """The progress line: bytes read (of the total, when known), MB/s, ETA and tokens written."""

    def __init__(self, total: int | None, shown: bool) -> None:
        self.total, self.shown = total, shown
        self.start = self.last = time.perf_counter()
        self.bytes = self.tokens = 0

    def add(self, n_bytes: int, n_tokens: int) -> None:
        self.bytes += n_bytes
        self.tokens += n_tokens
        now = time.perf_counter()
        if self.shown and now - self.last >= 2.0:
            self.last = now
            rate = self.bytes / max(now - self.start, 1e-9)
            where = f"{self.bytes / 1e6:,.0f} MB"
            if self.total:
                done = min(self.bytes / self.total, 1.0)
                where += f" of {self.total / 1e6:,.0f} MB ({100 * done:.0f} %), ETA {(self.total - self.bytes) / rate:,.0f} s"
            print(f"prepare: {where}, {rate / 1e6:,.1f} MB/s, {self.tokens:,} tokens", file=sys.stderr, flush=True)

    def end(self, index: dict) -> None:
        if self.shown:
            seconds = time.perf_counter() - self.start
            counts = {s: sum(x["tokens"] for x in index["splits"][s]["shards"]) for s in SPLITS}
            print(
                f"prepare: done in {seconds:,.1f} s ({self.bytes / 1e6 / max(seconds, 1e-9):,.1f} MB/s this run): "
                f"{counts['train']:,} train and {counts['val']:,} val tokens in "
                f"{sum(len(index['splits'][s]['shards']) for s in SPLITS)} shards",
                file=sys.stderr,
                flush=True,
            )


def write_index(out: Path, index: dict) -> None:
    from ..outputs import atomic_write_text

    atomic_write_text(out / INDEX, json.dumps(index, ensure_ascii=False))


def read_index(out: Path) -> dict:
    try:
        index = json.loads((Path(out) / INDEX).read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise DataError(f"{out}/{INDEX} cannot be read ({e}); prepare the corpus again in a new --out") from None
    if not isinstance(index, dict) or index.get("format") != FORMAT:
        raise DataError(f"{out}/{INDEX} is not an attnlab token-shard index")
    return index


# ---- reading shards ---------------------------------------------------------------------------------------
def is_shard_folder(spec) -> bool:
    """Whether ``spec`` names a folder written by :func:`prepare`."""
    if not isinstance(spec, (str, Path)) or hf.is_hf(str(spec)):
        return False
    path = Path(spec).expanduser()
    if not (path / INDEX).is_file():
        return False
    try:
        return json.loads((path / INDEX).read_text(encoding="utf-8")).get("format") == FORMAT
    except (OSError, UnicodeDecodeError, json.JSONDecodeError, AttributeError):
        return False


class ShardedTokens:
    """One split's shards as one sequence of ids, memory-mapped (nothing is read until sliced):
    ``len()`` and slices ``[a:b]``, as the training windows read a 1-D array."""

    def __init__(self, folder: Path, shards: list[dict], dtype: str) -> None:
        import numpy as np

        self.parts = [np.memmap(folder / s["file"], dtype=np.dtype(dtype).newbyteorder("<"), mode="r")
                      for s in shards if s["tokens"]]  # fmt: skip
        self.starts = np.cumsum([0] + [len(p) for p in self.parts])

    def __len__(self) -> int:
        return int(self.starts[-1])

    @property
    def dtype(self):
        import numpy as np

        return self.parts[0].dtype if self.parts else np.dtype(np.uint16)

    def __getitem__(self, key):
        import numpy as np

        if isinstance(key, (int, np.integer)):
            i = int(key) + (len(self) if key < 0 else 0)
            part = int(np.searchsorted(self.starts, i, side="right")) - 1
            return self.parts[part][i - self.starts[part]]
        if not isinstance(key, slice) or key.step not in (None, 1):
            raise TypeError("token shards are read by index or by contiguous slice")
        a, b, _ = key.indices(len(self))
        if b <= a:
            return np.empty(0, dtype=self.dtype)
        first = int(np.searchsorted(self.starts, a, side="right")) - 1
        pieces = []
        while a < b:
            part, lo = self.parts[first], int(self.starts[first])
            pieces.append(part[a - lo : min(b, lo + len(part)) - lo])
            a = lo + len(part)
            first += 1
        return pieces[0] if len(pieces) == 1 else np.concatenate(pieces)

    def __array__(self, dtype=None, copy=None):
        import numpy as np

        whole = self[0 : len(self)]
        return np.asarray(whole, dtype=dtype)


def open_shards(folder: str | Path, existing_tokenizer: dict | None = None):
    """A prepared folder as :class:`attnlab.data.text.TokenData` (train and val memory-mapped); with
    ``existing_tokenizer`` (a run's), refused unless the shards were prepared with it."""
    from .text import TokenData

    from ..tokens import tokenizer_from_dict

    folder = Path(folder).expanduser()
    index = read_index(folder)
    if not index.get("done"):
        raise DataError(f"{folder} is a preparation that has not finished; run attnlab data prepare again to finish it")
    if existing_tokenizer is not None and existing_tokenizer != index["tokenizer"]:
        raise DataError(
            f"{folder} was prepared with another tokenizer than this run's; prepare the corpus with the run's "
            "tokenizer, or start a new run on it"
        )
    splits = {s: ShardedTokens(folder, index["splits"][s]["shards"], index["dtype"]) for s in SPLITS}
    name = f"{index['settings']['source']} (prepared in {folder})"
    return TokenData(splits["train"], splits["val"], tokenizer_from_dict(index["tokenizer"]), name)


def token_data(spec, cache: Path, *, progress: bool = False, **options) -> TokenData:
    """A GPT's data. A folder of token shards is opened as it is (memory-mapped, with the tokenizer
    it was prepared with: ``options["existing_tokenizer"]``, when given, must be it). A HuggingFace
    dataset (``hf:...``) is prepared into shards in ``cache`` once (streamed, in bounded memory:
    :func:`dataset_shards`). Anything else is read and tokenised by
    :func:`attnlab.data.text.prepare` (``options``: its keywords)."""
    from .text import prepare as prepare_text

    if is_shard_folder(spec):
        return open_shards(spec, options.get("existing_tokenizer"))
    if hf.is_hf(spec):
        return dataset_shards(spec, cache, progress=progress, **options)
    return prepare_text(spec, cache, **options)


DATASET_VAL_FRACTION = 0.1  # (the text path's share: the last 10 % of a corpus)


def dataset_shards(
    spec: str,
    cache: Path,
    *,
    tokenizer: str = "char",
    vocab_size: int | None = None,
    existing_tokenizer: dict | None = None,
    progress: bool = False,
    **_: object,
) -> TokenData:
    """A HuggingFace dataset prepared into token shards under ``cache`` (a folder per dataset and
    tokenizer, finished when a run stopped while preparing it), with ``existing_tokenizer`` (a
    resumed or fine-tuned run's) when given, else a vocabulary of its own; 10 % of the rows go to
    the validation split. The processes of a torchrun job take a lock: one prepares, the others
    open what it wrote."""
    from ..tokens import tokenizer_from_dict

    cache = Path(cache)
    if existing_tokenizer is not None:  # (a resumed run: the shards it prepared, when they hold this dataset)
        for folder in sorted(cache.glob("shards-*")):
            index = read_index(folder) if is_shard_folder(folder) else {}
            if index.get("done") and index["settings"]["source"] == spec and index["tokenizer"] == existing_tokenizer:
                return open_shards(folder, existing_tokenizer)
    key = json.dumps([spec, tokenizer, vocab_size, existing_tokenizer], sort_keys=True)
    folder = cache / f"shards-{hashlib.sha256(key.encode()).hexdigest()[:16]}"
    cache.mkdir(parents=True, exist_ok=True)
    with file_lock(cache / f".{folder.name}.lock"):
        if existing_tokenizer is None:
            prepare(spec, folder, tokenizer=tokenizer, vocab_size=vocab_size, val_fraction=DATASET_VAL_FRACTION,
                    progress=progress)  # fmt: skip
        else:
            tok = tokenizer_from_dict(existing_tokenizer)
            settings = dict(source=spec, tokenizer=tok.kind, vocab_size=tok.vocab_size, sample_mb=0.0,
                            shard_tokens=1 << 24, val_fraction=DATASET_VAL_FRACTION, seed=0)  # fmt: skip
            prepared(folder, settings, lambda: tok, progress)
    return open_shards(folder, existing_tokenizer)


@contextlib.contextmanager
def file_lock(path: Path):
    """An exclusive lock on ``path`` for the block (flock; where there is none, no lock)."""
    try:
        import fcntl
    except ImportError:  # (Windows: one process at a time is the user's to keep)
        yield
        return
    with open(path, "a") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def encoded_text(source: str, tokenizer) -> np.ndarray:
    """Every document of the files ``source`` names (a file, a folder, a glob), encoded with
    ``tokenizer`` a batch at a time into a temporary file, memory-mapped: a held-out file of any
    size, read in bounded memory (the file is unlinked at once; the mapping keeps its pages)."""
    import numpy as np

    import tempfile

    dtype = np.dtype(token_dtype(tokenizer.vocab_size)).newbyteorder("<")
    encode = encoder_for(tokenizer, dtype)
    with tempfile.NamedTemporaryFile(prefix="attnlab-ids-", suffix=".bin", delete=False) as f:
        path = Path(f.name)
        for batch in document_batches(source):
            texts = [text for _, text, _ in batch]
            f.writelines(ids.astype(dtype, copy=False).tobytes() for ids in encode(texts))
    try:
        return np.memmap(path, dtype=dtype, mode="r") if path.stat().st_size else np.empty(0, dtype=dtype)
    finally:
        try:
            path.unlink()
        except OSError:  # (a system that cannot unlink a mapped file: it stays in the temporary folder)
            pass


def shards_fingerprint(folder: str | Path) -> dict:
    """What a run on a prepared folder records of its data: the SHA-256 of its index, which holds
    every shard's own (the shards themselves are not read again)."""
    path = Path(folder)
    digest = hashlib.sha256((path / INDEX).read_bytes()).hexdigest()
    return {"path": str(folder), "files": 1, "bytes": (path / INDEX).stat().st_size, "sha256": digest}
