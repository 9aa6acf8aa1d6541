"""Texts with one tag per word, for token classification (``attnlab train encoder --task tag``).

A file holds ``text<TAB>tags`` lines: the words of the text and the tags separated by spaces,
one tag per word (``the cat sat<TAB>DET NOUN VERB``). Words are then split into WordPiece
tokens; the first token of each word carries the word's tag and the others are not scored
(label -100), as HuggingFace's token-classification examples do.

The embedded task, ``synthetic-pos``, needs no download and cannot be solved word by word:
sentences from a small grammar where ten words are both nouns and verbs ("the old man saw a
duck", "the dogs duck"); only the context says which. :func:`unigram_baseline` measures what a
tagger that looks at each word alone reaches, so a model's accuracy on those words can be
compared with it.
"""

from __future__ import annotations

import random
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

from ..errors import DataError
from .labelled import read_two_columns, split_test_val_train
from .parallel import pad_batch

EMBEDDED_TAGGING = "synthetic-pos"
IGNORE = -100  # a token without a tag of its own (a word's later pieces, [CLS], [SEP], padding)

_DET = ["the", "a", "every", "this", "my", "no"]
_ADJ = ["old", "big", "small", "red", "quiet", "happy", "green", "tired", "clever", "young"]
_NOUN = ["man", "dog", "cat", "bird", "child", "farmer", "teacher", "horse", "river", "house", "garden", "boat"]
_VERB = ["sees", "finds", "likes", "follows", "paints", "hears", "wants", "carries", "meets", "helps"]
_ADV = ["slowly", "often", "today", "again", "quickly", "rarely"]
_PRON = ["she", "he", "they", "we", "someone"]
_PREP = ["near", "under", "behind", "beside", "past"]
# both nouns and verbs: only the words around them tell which
_BOTH = ["duck", "fish", "watch", "saw", "park", "book", "ring", "train", "light", "saws"]


@dataclass
class TaggedTexts:
    """Words and their tags per split (``train``, ``val``, ``test``), and the tag set."""

    name: str
    words: dict[str, list[list[str]]]
    tags: dict[str, list[list[str]]]
    classes: list[str]


def _noun_phrase(rng: random.Random, out: list[tuple[str, str]]) -> None:
    out.append((rng.choice(_DET), "DET"))
    for _ in range(rng.choice((0, 0, 1, 2))):
        out.append((rng.choice(_ADJ), "ADJ"))
    out.append((rng.choice(_NOUN + _BOTH), "NOUN"))


def _sentence(rng: random.Random) -> list[tuple[str, str]]:
    """subject (a pronoun or a noun phrase), a verb, an optional object, prepositional phrase and
    adverb, a full stop: the words of ``_BOTH`` appear as nouns and as verbs."""
    out: list[tuple[str, str]] = []
    if rng.random() < 0.3:
        out.append((rng.choice(_PRON), "PRON"))
    else:
        _noun_phrase(rng, out)
    out.append((rng.choice(_VERB + _BOTH), "VERB"))
    if rng.random() < 0.7:
        _noun_phrase(rng, out)
    if rng.random() < 0.4:
        out.append((rng.choice(_PREP), "PREP"))
        _noun_phrase(rng, out)
    if rng.random() < 0.3:
        out.append((rng.choice(_ADV), "ADV"))
    out.append((".", "PUNCT"))
    return out


def synthetic_pos(sentences: int = 4000, seed: int = 0) -> TaggedTexts:
    """The embedded tagging task: ``sentences`` sentences split 80/10/10, each split drawn apart
    (no sentence of the test split is in training)."""
    rng = random.Random(seed)
    seen: set[tuple[str, ...]] = set()
    rows: list[list[tuple[str, str]]] = []
    while len(rows) < sentences:
        s = _sentence(rng)
        key = tuple(w for w, _ in s)
        if key not in seen:
            seen.add(key)
            rows.append(s)
    return _split(EMBEDDED_TAGGING, rows)


def _split(name: str, rows: list[list[tuple[str, str]]]) -> TaggedTexts:
    parts = split_test_val_train(rows)
    classes = sorted({t for r in parts["train"] for _, t in r})
    return TaggedTexts(
        name,
        {k: [[w for w, _ in r] for r in v] for k, v in parts.items()},
        {k: [[t for _, t in r] for r in v] for k, v in parts.items()},
        classes,
    )


def read_tagged(path: Path, seed: int = 0) -> TaggedTexts:
    """``text<TAB>tags`` lines, one tag per word (both split on spaces), split 80/10/10 at random
    (fixed seed)."""
    rows = []
    for n, line_text, line_tags in read_two_columns(path, "tags", ", one tag per word"):
        text, tags = line_text.split(), line_tags.split()
        if len(text) != len(tags) or not text:
            raise DataError(
                f"{path}:{n} has {len(text)} words but {len(tags)} tags: the tags are not aligned with the "
                "words (give one tag per space-separated word)"
            )
        rows.append(list(zip(text, tags)))
    if len(rows) < 3:
        raise DataError(f"{path} has {len(rows)} tagged lines; give at least 3 (train, validation, test)")
    random.Random(seed).shuffle(rows)
    return _split(path.name, rows)


def load_tagged(spec: str | None) -> TaggedTexts:
    if spec in (None, "", EMBEDDED_TAGGING):
        return synthetic_pos()
    return read_tagged(Path(spec).expanduser())


def unigram_baseline(data: TaggedTexts, split: str = "test") -> dict:
    """What tagging each word alone reaches: every word gets its most frequent training tag (an
    unseen word the most frequent tag overall). Returns its accuracy on all words of ``split``
    and on the *ambiguous* ones (seen with more than one tag in training), and how many of those
    there are."""
    by_word: dict[str, Counter] = {}
    overall: Counter = Counter()
    for words, tags in zip(data.words["train"], data.tags["train"]):
        for w, t in zip(words, tags):
            by_word.setdefault(w.lower(), Counter())[t] += 1
            overall[t] += 1
    fallback = overall.most_common(1)[0][0]
    ambiguous = {w for w, c in by_word.items() if len(c) > 1}
    hits = total = amb_hits = amb_total = 0
    for words, tags in zip(data.words[split], data.tags[split]):
        for w, t in zip(words, tags):
            guess = by_word[w.lower()].most_common(1)[0][0] if w.lower() in by_word else fallback
            hits += guess == t
            total += 1
            if w.lower() in ambiguous:
                amb_hits += guess == t
                amb_total += 1
    return {
        "accuracy": hits / max(total, 1),
        "ambiguous_accuracy": amb_hits / max(amb_total, 1),
        "ambiguous_words": amb_total,
        "ambiguous": ambiguous,
    }


def encode_tagged(tokenizer, words: list[str], tags: list[str] | None, index: dict[str, int], context: int):
    """(token ids of ``[CLS] words [SEP]``, a label per token (the word's tag id on its first
    piece, -100 elsewhere), the index of the first token of each word kept, whether the text was
    cut to ``context`` tokens)."""
    ids, word_ids = tokenizer.encode_words(words)
    cut = len(ids) > context
    if cut:
        ids, word_ids = ids[: context - 1] + [tokenizer.sep_id], word_ids[: context - 1] + [None]
    labels, firsts, previous = [], [], None
    for i, w in enumerate(word_ids):
        first = w is not None and w != previous
        labels.append(index[tags[w]] if first and tags is not None else IGNORE)
        if first:
            firsts.append(i)
        previous = w
    if len(firsts) < len(words) and not cut:  # a word the tokenizer drops (only spaces or control characters)
        raise DataError(f"the tokenizer gives no token for a word of {' '.join(words)[:60]!r}; remove that word")
    return ids, labels, firsts, cut


@dataclass
class TokenizedTags:
    """Tagged texts as token ids and per-token labels, per split (see :func:`tokenize_tagged`)."""

    name: str
    tokenizer: object
    ids: dict[str, list[list[int]]]
    labels: dict[str, list[list[int]]]
    classes: list[str]
    truncated: int = 0

    def _batch(self, split: str, rows: list[int]):
        import torch

        ids, mask = pad_batch([self.ids[split][i] for i in rows], self.tokenizer.pad_id)
        labels = torch.full(ids.shape, IGNORE, dtype=torch.long)
        for r, i in enumerate(rows):
            labels[r, : len(self.labels[split][i])] = torch.tensor(self.labels[split][i])
        return ids, mask, labels

    def batch(self, split: str, batch_size: int, generator):
        """Random examples: ids (B, T), mask (B, T), labels (B, T) with -100 where nothing is scored."""
        import torch

        return self._batch(split, torch.randint(len(self.ids[split]), (batch_size,), generator=generator).tolist())

    def batches(self, split: str, batch_size: int):
        """Every example of a split, in order."""
        n = len(self.ids[split])
        for i in range(0, n, batch_size):
            yield self._batch(split, list(range(i, min(i + batch_size, n))))


def tokenize_tagged(data: TaggedTexts, tokenizer, context: int, classes: list[str]) -> TokenizedTags:
    """Encode every split; tags outside ``classes`` are refused, texts longer than the context
    are cut (their last words lose their tags; counted in ``truncated``)."""
    index = {c: i for i, c in enumerate(classes)}
    for split, rows in data.tags.items():
        unknown = sorted({t for r in rows for t in r if t not in index})
        if unknown:
            raise DataError(
                f"the {split} split of {data.name} has tags the model does not know: {unknown[:5]} "
                f"(it knows {classes[:10]})"
            )
    ids, labels, truncated = {}, {}, 0
    for split in data.words:
        encoded = [encode_tagged(tokenizer, w, t, index, context) for w, t in zip(data.words[split], data.tags[split])]
        ids[split] = [e[0] for e in encoded]
        labels[split] = [e[1] for e in encoded]
        truncated += sum(e[3] for e in encoded)
    return TokenizedTags(data.name, tokenizer, ids, labels, list(classes), truncated)
