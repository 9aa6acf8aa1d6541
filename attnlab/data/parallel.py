"""Parallel text for sequence-to-sequence models: aligned files, TSV, Multi30k, and synthetic
tasks generated on the fly (copy, reverse, sort, addition, dates, reorder)."""

from __future__ import annotations

import gzip
import random
import warnings
import zlib
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import Tensor

from ..errors import DataError, Note
from . import hf, sources
from .sources import SYNTHETIC

PAD, BOS, EOS, UNK = "<pad>", "<bos>", "<eos>", "<unk>"
SPECIALS = [PAD, BOS, EOS, UNK]
LANGS = ("de", "en")


# ---- reading ---------------------------------------------------------------------------------
def read_lines(path: Path) -> list[str]:
    if not path.is_file():
        raise DataError(f"{path} does not exist")
    try:
        raw = gzip.open(path).read() if path.suffix == ".gz" else path.read_bytes()
    except (OSError, EOFError, zlib.error) as e:
        raise DataError(f"{path} is a corrupt gzip file ({e}); download or copy it again") from None
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise DataError(f"{path} is not UTF-8 text (bad byte at offset {e.start})") from None
    lines = text.split("\n")
    if lines and lines[-1] == "":
        lines.pop()
    return [line.rstrip("\r") for line in lines]


def read_pairs(src: Path, tgt: Path) -> list[tuple[str, str]]:
    a, b = read_lines(src), read_lines(tgt)
    if len(a) != len(b):
        n = min(len(a), len(b))
        raise DataError(
            f"{src} has {len(a)} lines but {tgt} has {len(b)}; the files stop being aligned at line {n + 1}"
        )
    return _drop_empty(list(zip(a, b)), f"{src.name}/{tgt.name}")


def read_tsv(path: Path) -> list[tuple[str, str]]:
    pairs = []
    for i, line in enumerate(read_lines(path), 1):
        parts = line.split("\t")
        if len(parts) != 2:
            found = "no tab" if len(parts) < 2 else f"{len(parts)} columns"
            raise DataError(f"{path} line {i} has {found}; a TSV needs 'source<TAB>target' on every line")
        pairs.append((parts[0], parts[1]))
    return _drop_empty(pairs, path.name)


def _drop_empty(pairs, name):
    kept = [(s, t) for s, t in pairs if s.strip() and t.strip()]
    if len(kept) < len(pairs):
        bad = next(i for i, (s, t) in enumerate(pairs, 1) if not (s.strip() and t.strip()))
        warnings.warn(
            f"{name}: skipped {len(pairs) - len(kept)} pair(s) with an empty side (first at line {bad})",
            Note,
            stacklevel=3,
        )
    if not kept:
        raise DataError(f"{name} holds no sentence pairs")
    return kept


def multi30k(src_lang: str, tgt_lang: str, data_dir: str | None = None) -> dict[str, list[tuple[str, str]]]:
    """Multi30k task 1 (train / val / test_2016_flickr) from <data dir>/multi30k, or downloaded
    (SHA-256 checked) into the cache when the data directory does not hold it."""
    if {src_lang, tgt_lang} != set(LANGS):
        raise DataError(
            f"Multi30k here is German–English; unknown language pair {src_lang}-{tgt_lang} "
            "(use --src de --tgt en or --src en --tgt de)"
        )
    # the data directory first, then the download cache, then a checked download
    files = {p.name: p for p in sources.resolve("multi30k", data_dir)}
    splits = {"train": "train", "val": "val", "test": "test_2016_flickr"}
    return {k: read_pairs(files[f"{v}.{src_lang}.gz"], files[f"{v}.{tgt_lang}.gz"]) for k, v in splits.items()}


# ---- synthetic tasks -------------------------------------------------------------------------
# the reorder task's toy language: nouns and adjectives; its "translation" upper-cases every word and puts
# each adjective after its noun, as French does ("black cat" -> "chat noir")
NOUNS, ADJECTIVES = "abcdefghijklm", "nopqrstuvwxyz"


def reorder_alignment(src: str) -> list[int]:
    """For the reorder task: the source position each target symbol translates, in target order
    (the reference alignment: an adjective-noun pair swaps, a lone noun stays)."""
    order, i = [], 0
    while i < len(src):
        if src[i] in ADJECTIVES and i + 1 < len(src):
            order += [i + 1, i]
            i += 2
        else:
            order.append(i)
            i += 1
    return order


def synthetic_pair(task: str, rng: random.Random, min_len: int, max_len: int) -> tuple[str, str]:
    """One (source, target) example; lengths in symbols."""
    n = rng.randint(min_len, max_len)
    if task == "reorder":  # a noun alone or after an adjective (as long as it fits), until n symbols
        src = ""
        while len(src) < n:
            adjective = rng.random() < 0.5 and len(src) + 2 <= n
            src += (rng.choice(ADJECTIVES) if adjective else "") + rng.choice(NOUNS)
        return src, "".join(src[j].upper() for j in reorder_alignment(src))
    if task in ("copy", "reverse", "sort"):
        s = "".join(rng.choice("abcdefghijklmnopqrstuvwxyz") for _ in range(n))
        return s, {"copy": s, "reverse": s[::-1], "sort": "".join(sorted(s))}[task]
    if task == "addition":
        da = max(1, (n - 1) // 2)
        a, b = rng.randint(0, 10**da - 1), rng.randint(0, 10 ** max(1, n - 1 - da) - 1)
        return f"{a}+{b}", str(a + b)
    if task == "dates":
        months = [
            "January",
            "February",
            "March",
            "April",
            "May",
            "June",
            "July",
            "August",
            "September",
            "October",
            "November",
            "December",
        ]
        y, m, d = rng.randint(1900, 2099), rng.randint(1, 12), rng.randint(1, 28)
        style = rng.randrange(3)
        src = [f"{d} {months[m - 1]} {y}", f"{months[m - 1][:3]} {d}, {y}", f"{d:02d}/{m:02d}/{y}"][style]
        return src, f"{y}-{m:02d}-{d:02d}"
    raise DataError(f"unknown synthetic task {task!r}; choose one of {SYNTHETIC}")


# ---- vocabulary and batches ------------------------------------------------------------------
class Vocab:
    """Token <-> id with the seq2seq specials at 0..3 (pad, bos, eos, unk). Wraps a character,
    BPE or word tokenizer; ``encode`` maps text to ids without specials."""

    def __init__(self, tokenizer) -> None:
        self.tokenizer = tokenizer

    @classmethod
    def build(cls, texts: list[str], kind: str, vocab_size: int = 8000, min_frequency: int = 1) -> "Vocab":
        from ..tokens import BPETokenizer, CharTokenizer

        if kind == "char":
            return cls(CharTokenizer(SPECIALS + sorted(set("".join(texts)) - set(SPECIALS))))
        if kind == "word":
            from ..tokens import WordTokenizer

            return cls(WordTokenizer.train(texts, SPECIALS, min_frequency=min_frequency))
        return cls(BPETokenizer.train(texts, vocab_size, special_tokens=SPECIALS))

    pad_id, bos_id, eos_id, unk_id = (SPECIALS.index(t) for t in (PAD, BOS, EOS, UNK))  # first in every vocabulary

    @classmethod
    def special_ids(cls) -> dict[str, int]:
        """The ids a model's config keeps (:class:`attnlab.config.SpecialTokens`)."""
        return {"pad_id": cls.pad_id, "bos_id": cls.bos_id, "eos_id": cls.eos_id}

    @property
    def size(self) -> int:
        return self.tokenizer.vocab_size

    def encode(self, text: str) -> list[int]:
        if self.tokenizer.kind == "char":
            stoi = self.tokenizer.stoi
            return [stoi.get(c, self.unk_id) for c in text]
        return self.tokenizer.encode(text)

    def unknown(self, text: str) -> list[str]:
        """The pieces of ``text`` this vocabulary reads as <unk> (in order, once each): characters
        of a character vocabulary it never saw; byte-level BPE has none."""
        if self.tokenizer.kind == "char":
            return list(dict.fromkeys(c for c in text if c not in self.tokenizer.stoi))
        if hasattr(self.tokenizer, "id_to_token"):
            ids = self.tokenizer.encode(text)
            unk = getattr(self.tokenizer, "unk_id", None)
            return [] if unk is None else ["<unk>"] * ids.count(unk)
        return []

    def decode(self, ids) -> str:
        ids = [int(i) for i in ids if int(i) >= self.unk_id]  # drop pad, bos, eos
        return self.tokenizer.decode(ids)

    def to_dict(self) -> dict:
        return self.tokenizer.to_dict()

    @classmethod
    def from_dict(cls, d: dict) -> "Vocab":
        from ..tokens import tokenizer_from_dict

        return cls(tokenizer_from_dict(d))


def pad_batch(seqs: list[list[int]], pad_id: int = Vocab.pad_id) -> tuple[Tensor, Tensor]:
    """Right-pad to the longest: ids (B, T) and mask (B, T), True = real token."""
    width = max(len(s) for s in seqs)
    ids = torch.full((len(seqs), width), pad_id, dtype=torch.long)
    for i, s in enumerate(seqs):
        ids[i, : len(s)] = torch.as_tensor(s, dtype=torch.long)
    return ids, ids != pad_id


@dataclass
class ParallelData:
    """Encoded sentence pairs per split (or a synthetic generator) and the vocabularies."""

    name: str
    src_vocab: Vocab
    tgt_vocab: Vocab
    pairs: dict[str, list[tuple[list[int], list[int]]]]
    texts: dict[str, list[tuple[str, str]]]
    max_len: int
    synthetic: dict | None = None  # {"task", "min_len", "max_len", "seed"}
    held_out: frozenset = frozenset()  # synthetic: the val and test sources, never in the training stream

    def _synth(self, n: int, gen: torch.Generator, min_len=None, max_len=None):
        s = self.synthetic
        rng = random.Random(int(torch.randint(2**31 - 1, (1,), generator=gen)))
        lo, hi = min_len or s["min_len"], max_len or s["max_len"]
        out = [synthetic_pair(s["task"], rng, lo, hi) for _ in range(n)]
        return [(self.src_vocab.encode(a), self.tgt_vocab.encode(b)) for a, b in out], out

    def _fresh(self, n: int, gen: torch.Generator) -> list:
        """``n`` synthetic training pairs whose source is not held out for validation or test."""
        chosen: list = []
        for _ in range(1000):
            enc, raw = self._synth(n, gen)
            chosen += [e for e, (src, _) in zip(enc, raw) if src not in self.held_out]
            if len(chosen) >= n:
                return chosen[:n]
        raise DataError(
            f"the {self.synthetic['task']} task with lengths {self.synthetic['min_len']}-{self.synthetic['max_len']} "
            "has too few distinct inputs besides the held-out ones; use a larger --max-length"
        )

    def batch(self, split: str, batch_size: int, gen: torch.Generator):
        """(src, src_mask, tgt_in, tgt_out): tgt_in starts with <bos>, tgt_out ends with <eos>.
        Real data is bucketed by length: a random anchor picks sentences of similar length."""
        if self.synthetic is not None and split == "train":
            chosen = self._fresh(batch_size, gen)  # a fresh stream of examples, none held out
        else:
            pairs = self.pairs[split]  # synthetic val/test: a fixed held-out set
            anchor = int(torch.randint(len(pairs), (1,), generator=gen))
            window = max(batch_size * 8, 1)
            lo = max(0, min(anchor - window // 2, len(pairs) - window))
            idx = torch.randint(lo, min(len(pairs), lo + window), (batch_size,), generator=gen).tolist()
            chosen = [pairs[i] for i in idx]
        return collate(chosen, self.max_len)


def collate(pairs, max_len: int):
    v = Vocab
    srcs = [s[:max_len] for s, _ in pairs]
    tgts = [t[: max_len - 1] for _, t in pairs]
    src, src_mask = pad_batch(srcs, v.pad_id)
    tgt_in, _ = pad_batch([[v.bos_id] + t for t in tgts], v.pad_id)
    tgt_out, _ = pad_batch([t + [v.eos_id] for t in tgts], v.pad_id)
    return src, src_mask, tgt_in, tgt_out


def load_parallel(
    spec: str,
    *,
    src_lang: str = "de",
    tgt_lang: str = "en",
    tokenizer: str | None = None,
    vocab_size: int = 8000,
    joint: bool = True,
    data_dir: str | None = None,
    min_len: int = 5,
    max_len: int = 20,
    seq_max_len: int = 128,
    vocab: dict | None = None,
) -> ParallelData:
    """``spec``: a synthetic task name, 'multi30k', 'SRC_FILE:TGT_FILE', a .tsv file, or a
    HuggingFace dataset ``hf:NAME[:CONFIG][:SPLIT]`` (a ``translation`` column, or ``src_lang`` and
    ``tgt_lang`` columns)."""
    if spec in SYNTHETIC:
        rng = random.Random(0)
        sample = [synthetic_pair(spec, rng, min_len, max_len) for _ in range(2000)]
        if vocab:
            sv, tv = Vocab.from_dict(vocab["src"]), Vocab.from_dict(vocab["tgt"])
        else:
            chars = [a + b for a, b in sample] + ["abcdefghijklmnopqrstuvwxyz0123456789+-/, "]
            sv = tv = Vocab.build(chars, "char")
        data = ParallelData(
            spec,
            sv,
            tv,
            {},
            {},
            max(seq_max_len, 2 * max_len + 2),
            synthetic={"task": spec, "min_len": min_len, "max_len": max_len},
        )
        # fixed validation and test sets of distinct inputs, disjoint from each other and (see
        # _fresh) from the training stream
        g = torch.Generator().manual_seed(12345)
        seen: dict[str, tuple] = {}
        for _ in range(20):
            for e, r in zip(*data._synth(1000, g)):
                seen.setdefault(r[0], (e, r))
            if len(seen) >= 1000:
                break
        held = list(seen.values())[:1000]
        if len(held) < 20:
            raise DataError(
                f"the {spec} task with lengths {min_len}-{max_len} has only {len(held)} distinct inputs; too few to "
                "hold out validation and test sets: use a larger --max-length"
            )
        half = len(held) // 2
        for split, part in (("val", held[:half]), ("test", held[half:])):
            data.pairs[split], data.texts[split] = [e for e, _ in part], [r for _, r in part]
        data.held_out = frozenset(r[0] for _, r in held)
        return data
    if spec == "multi30k":
        texts = multi30k(src_lang, tgt_lang, data_dir)
        name = f"multi30k {src_lang}-{tgt_lang}"
    elif hf.is_hf(spec):  # (before SRC:TGT: the spec holds colons)
        name, all_pairs = hf.parallel(spec, src_lang, tgt_lang)
        texts = _split_pairs(all_pairs)
    elif spec.endswith(".tsv") or spec.endswith(".tsv.gz"):
        all_pairs = read_tsv(Path(spec))
        texts, name = _split_pairs(all_pairs), Path(spec).name
    elif ":" in spec:
        a, b = spec.split(":", 1)
        texts, name = _split_pairs(read_pairs(Path(a), Path(b))), f"{Path(a).name}:{Path(b).name}"
    else:
        raise DataError(
            f"unknown parallel data {spec!r}; use {', '.join(SYNTHETIC)}, multi30k, SRC_FILE:TGT_FILE or a .tsv file"
        )
    if vocab:
        sv, tv = Vocab.from_dict(vocab["src"]), Vocab.from_dict(vocab["tgt"])
    else:
        kind = tokenizer or "bpe"
        train = texts["train"]
        if joint:
            sv = tv = Vocab.build([s for s, _ in train] + [t for _, t in train], kind, vocab_size)
        else:
            sv = Vocab.build([s for s, _ in train], kind, vocab_size)
            tv = Vocab.build([t for _, t in train], kind, vocab_size)
    pairs = {}
    for split, prs in texts.items():
        src_ids = (
            sv.tokenizer.encode_batch([s for s, _ in prs])
            if hasattr(sv.tokenizer, "encode_batch")
            else [sv.encode(s) for s, _ in prs]
        )
        tgt_ids = (
            tv.tokenizer.encode_batch([t for _, t in prs])
            if hasattr(tv.tokenizer, "encode_batch")
            else [tv.encode(t) for _, t in prs]
        )
        enc = list(zip(src_ids, tgt_ids))
        if split == "train":  # sort by length so that batches are drawn from length buckets
            order = sorted(range(len(enc)), key=lambda i: (len(enc[i][0]), len(enc[i][1])))
            enc = [enc[i] for i in order]
        pairs[split] = enc
    too_long = sum(len(s) > seq_max_len for s, _ in pairs["train"])
    if too_long:
        warnings.warn(
            f"{too_long} training sentences are longer than {seq_max_len} tokens and will be truncated",
            Note,
            stacklevel=2,
        )
    return ParallelData(name, sv, tv, pairs, texts, seq_max_len)


def _split_pairs(pairs):
    """80 / 10 / 10 after a fixed shuffle."""
    rng = random.Random(0)
    pairs = pairs[:]
    rng.shuffle(pairs)
    n = len(pairs)
    a, b = int(n * 0.8), int(n * 0.9)
    if n < 10:
        raise DataError(f"only {n} sentence pairs; need at least 10 to make train/val/test splits")
    return {"train": pairs[:a], "val": pairs[a:b], "test": pairs[b:]}
