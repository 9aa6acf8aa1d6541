"""Text for encoders: paragraphs for masked-LM pretraining, and labelled texts for classification.

The embedded classification task needs no download and is not trivial: which part of the
Python documentation a paragraph of the interpreter's help pages (pydoc_data, shipped with
every CPython) comes from — statements, expressions, lexical analysis, the data model, the
execution model, or the built-in types. Topics are split by their source chapter, paragraphs
of one topic never straddle two splits, so a model cannot just recognise a topic it has seen.
"""

from __future__ import annotations

import random
import re
from dataclasses import dataclass
from pathlib import Path

from ..errors import DataError
from . import hf
from .parallel import pad_batch, read_lines

EMBEDDED_TASK = "python-docs-sections"

# the reference chapter (or library page) each help topic is taken from
SECTIONS = {
    "statements": [
        "assert",
        "assignment",
        "async",
        "augassign",
        "break",
        "class",
        "compound",
        "continue",
        "del",
        "else",
        "for",
        "function",
        "global",
        "if",
        "import",
        "nonlocal",
        "pass",
        "raise",
        "return",
        "try",
        "while",
        "with",
        "yield",
    ],
    "expressions": [
        "atom-identifiers",
        "atom-literals",
        "attribute-references",
        "await",
        "binary",
        "bitwise",
        "booleans",
        "calls",
        "comparisons",
        "conversions",
        "exprlists",
        "in",
        "lambda",
        "operator-summary",
        "power",
        "shifting",
        "slicings",
        "subscriptions",
        "unary",
    ],
    "lexical analysis": [
        "floating",
        "formatstrings",
        "id-classes",
        "identifiers",
        "imaginary",
        "integers",
        "numbers",
        "strings",
    ],
    "data model": [
        "attribute-access",
        "callable-types",
        "context-managers",
        "customization",
        "numeric-types",
        "objects",
        "sequence-types",
        "specialattrs",
        "specialnames",
        "types",
    ],
    "execution model": ["dynamic-features", "exceptions", "execmodel", "naming"],
    "built-in types": [
        "bltin-code-objects",
        "bltin-ellipsis-object",
        "bltin-null-object",
        "bltin-type-objects",
        "debugger",
        "dict",
        "lists",
        "string-methods",
        "truth",
        "typesfunctions",
        "typesmapping",
        "typesmethods",
        "typesmodules",
        "typesseq",
        "typesseq-mutable",
    ],
}


@dataclass
class LabelledTexts:
    name: str
    texts: dict[str, list[str]]  # split -> texts
    labels: dict[str, list[str]]  # split -> label of each text
    classes: list[str]


def paragraphs(text: str, min_chars: int = 40) -> list[str]:
    """Blank-line separated paragraphs, whitespace folded, shorter ones dropped."""
    out = [re.sub(r"\s+", " ", p).strip() for p in re.split(r"\n\s*\n", text)]
    return [p for p in out if len(p) >= min_chars]


def python_docs_topics() -> dict[str, str]:
    try:
        from pydoc_data.topics import topics
    except ImportError:
        raise DataError("this Python has no pydoc_data (the help topics); give --data FILE.tsv") from None
    return dict(topics)


def python_docs_sections(seed: int = 0) -> LabelledTexts:
    """The embedded task: paragraphs labelled with their documentation section; topics (not
    paragraphs) are split 80/10/10 within each section. Help topics quote each other (``compound``
    holds ``while`` and ``with``), so a paragraph is kept once, in the first split that has it
    (test, then val, then train): no test or validation paragraph appears in training."""
    topics = python_docs_topics()
    rng = random.Random(seed)
    chosen = {"train": [], "val": [], "test": []}  # (topic, section) per split
    for section, names in SECTIONS.items():
        names = [n for n in names if n in topics]
        rng.shuffle(names)
        n_val = n_test = max(1, len(names) // 8)
        parts = {"test": names[:n_test], "val": names[n_test : n_test + n_val], "train": names[n_test + n_val :]}
        for split, part in parts.items():
            chosen[split] += [(n, section) for n in part]
    texts = {"train": [], "val": [], "test": []}
    labels = {"train": [], "val": [], "test": []}
    seen: set[str] = set()
    for split in ("test", "val", "train"):
        for name, section in chosen[split]:
            for p in paragraphs(topics[name]):
                if p not in seen:
                    seen.add(p)
                    texts[split].append(p)
                    labels[split].append(section)
    return LabelledTexts(EMBEDDED_TASK, texts, labels, list(SECTIONS))


def read_two_columns(path: Path, second: str, hint: str = "") -> list[tuple[int, str, str]]:
    """(line number, text, second column) of each non-empty ``text<TAB>second`` line of ``path``;
    a missing file, or a line without exactly one tab, is refused in one line (``hint``: what
    the message adds about the second column)."""
    if not path.is_file():
        raise DataError(f"{path} does not exist; give a text<TAB>{second} file")
    rows = []
    for n, line in enumerate(read_lines(path), 1):
        if not line.strip():
            continue
        if line.count("\t") != 1:
            what = f"no {second}" if "\t" not in line else f"{line.count(chr(9)) + 1} columns"
            raise DataError(f"{path}:{n} has {what}: each line is text<TAB>{second}{hint}")
        text, right = line.split("\t")
        rows.append((n, text, right))
    return rows


def split_test_val_train(items: list) -> dict[str, list]:
    """The first tenth (at least one item) for test, the next for validation, the rest for training."""
    n_val = n_test = max(1, len(items) // 10)
    return {"test": items[:n_test], "val": items[n_test : n_test + n_val], "train": items[n_test + n_val :]}


def read_labelled(path: Path, seed: int = 0) -> LabelledTexts:
    """``text<TAB>label`` lines, split 80/10/10 at random (fixed seed)."""
    pairs = []
    for n, text, label in read_two_columns(path, "label"):
        if not text.strip() or not label.strip():
            raise DataError(f"{path}:{n} has an empty {'text' if not text.strip() else 'label'}")
        pairs.append((text.strip(), label.strip()))
    return split_labelled(path.name, pairs, seed)


def split_labelled(name: str, pairs: list[tuple[str, str]], seed: int = 0) -> LabelledTexts:
    """(text, label) pairs split 80/10/10 at random (fixed seed), the classes those of train."""
    if len(pairs) < 3:
        raise DataError(f"{name} has {len(pairs)} labelled texts; give at least 3 (train, validation, test)")
    random.Random(seed).shuffle(pairs)
    parts = split_test_val_train(pairs)
    classes = sorted({lab for _, lab in parts["train"]})
    return LabelledTexts(
        name,
        {k: [t for t, _ in v] for k, v in parts.items()},
        {k: [lab for _, lab in v] for k, v in parts.items()},
        classes,
    )


def load_labelled(spec: str | None) -> LabelledTexts:
    if spec in (None, "", EMBEDDED_TASK):
        return python_docs_sections()
    if hf.is_hf(spec):
        return split_labelled(*hf.labelled(spec))
    return read_labelled(Path(spec).expanduser())


def load_pretraining_texts(spec: str | None, data_dir: str | None = None) -> tuple[str, dict[str, list[str]]]:
    """Paragraphs for masked-LM pretraining: the embedded help pages (default), a named corpus,
    a text file or a folder; the last 10 % of paragraphs are the validation split."""
    from .text import load_corpus, split_ids

    if spec in (None, "", "python-docs"):
        topics = python_docs_topics()
        # without the classification task's validation and test paragraphs: pretraining on them
        # would let the fine-tuned encoder recognise its test set
        held_out = {p for split in ("val", "test") for p in python_docs_sections().texts[split]}
        paras = list(dict.fromkeys(p for name in sorted(topics) for p in paragraphs(topics[name])))
        paras = [p for p in paras if p not in held_out]
        name = "python-docs"
    else:
        name, text = load_corpus(spec, data_dir)
        paras = paragraphs(text) or [line for line in text.splitlines() if line.strip()]
    if len(paras) < 10:
        raise DataError(f"{name} has {len(paras)} paragraphs; masked-LM pretraining needs at least 10")
    train, val = split_ids(paras)
    return name, {"train": list(train), "val": list(val)}


@dataclass
class TokenizedTexts:
    """Texts encoded as ``[CLS] text [SEP]`` (truncated to ``context``), per split, with class ids
    for classification (empty for pretraining)."""

    name: str
    tokenizer: object
    ids: dict[str, list[list[int]]]
    label_ids: dict[str, list[int]]
    classes: list[str]
    truncated: int = 0  # how many texts were longer than the context

    @property
    def avg_len(self) -> int:
        train = self.ids["train"]
        return max(1, sum(map(len, train)) // max(1, len(train)))

    def _pad(self, seqs: list[list[int]]):
        return pad_batch(seqs, self.tokenizer.pad_id)

    def batch(self, split: str, batch_size: int, generator):
        """Random examples: (ids, mask) for pretraining, (ids, mask, labels) for classification."""
        import torch

        idx = torch.randint(len(self.ids[split]), (batch_size,), generator=generator).tolist()
        ids, mask = self._pad([self.ids[split][i] for i in idx])
        if not self.label_ids:
            return ids, mask
        return ids, mask, torch.tensor([self.label_ids[split][i] for i in idx])

    def batches(self, split: str, batch_size: int):
        """Every example of a split, in order: (ids, mask) batches."""
        seqs = self.ids[split]
        for i in range(0, len(seqs), batch_size):
            yield self._pad(seqs[i : i + batch_size])


def encode_truncated(tokenizer, text: str, context: int) -> tuple[list[int], bool]:
    """(ids of ``[CLS] text [SEP]``, whether it was cut): a text longer than ``context`` tokens
    keeps its first context - 1 tokens and a final [SEP]."""
    e = tokenizer.encode(text)
    return (e, False) if len(e) <= context else (e[: context - 1] + [tokenizer.sep_id], True)


def tokenize(
    name: str,
    tokenizer,
    texts: dict[str, list[str]],
    context: int,
    labels: dict[str, list[str]] | None = None,
    classes: list[str] | None = None,
) -> TokenizedTexts:
    """Encode every split; texts longer than ``context`` tokens keep their first context - 1 tokens
    and a final [SEP] (counted in ``truncated``). Labels outside ``classes`` are refused."""
    ids, truncated = {}, 0
    for split, items in texts.items():
        encoded = [encode_truncated(tokenizer, t, context) for t in items]
        ids[split] = [e for e, _ in encoded]
        truncated += sum(cut for _, cut in encoded)
    label_ids = {}
    if labels is not None:
        index = {c: i for i, c in enumerate(classes)}
        for split, labs in labels.items():
            unknown = sorted({lab for lab in labs if lab not in index})
            if unknown:
                raise DataError(
                    f"the {split} split of {name} has labels the model does not know: {unknown[:5]} "
                    f"(it knows {classes[:10]})"
                )
            label_ids[split] = [index[lab] for lab in labs]
    return TokenizedTexts(name, tokenizer, ids, label_ids, list(classes or []), truncated)
