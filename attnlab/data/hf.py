"""HuggingFace ``datasets`` as a data source: ``--data hf:NAME[:CONFIG][:SPLIT][:COLUMN]``.

``NAME`` is a hub dataset (read from the ``datasets`` cache; downloaded by ``datasets`` when not
offline), a folder written by ``Dataset.save_to_disk``, or a local ``.parquet`` / ``.json`` /
``.jsonl`` / ``.csv`` / ``.arrow`` file. Empty parts take their defaults: every split, and the
column ``text`` (or the dataset's only text column)::

    attnlab train gpt --data hf:karpathy/tiny_shakespeare           # the hub's, its train split's text
    attnlab train gpt --data hf:wikitext:wikitext-2-raw-v1:train:text
    attnlab train gpt --data hf:corpus.parquet::train:content        # a local file, column "content"
    attnlab train encoder --task classify --data hf:imdb             # text + label columns

GPT corpora, parallel text for seq2seq (a ``translation`` column of {lang: sentence}, as WMT
and Multi30k on the hub, or one column per language: ``--src``, ``--tgt``), the text encoder's corpora (masked-LM, classification) and image classification
(an ``image`` column of PIL images and a ``label`` column: ``train vit --data hf:mnist``) read it.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from ..errors import DataError

PREFIX = "hf:"
LOCAL_FORMATS = {".parquet": "parquet", ".json": "json", ".jsonl": "json", ".csv": "csv", ".arrow": "arrow"}


def is_hf(spec: str | None) -> bool:
    return isinstance(spec, str) and spec.startswith(PREFIX)


@dataclass(frozen=True)
class HFSpec:
    name: str
    config: str | None = None
    split: str | None = None
    column: str | None = None

    @classmethod
    def parse(cls, spec: str) -> "HFSpec":
        parts = spec[len(PREFIX) :].split(":")
        if not parts[0] or len(parts) > 4:
            raise DataError(f"--data {spec}: write hf:NAME[:CONFIG][:SPLIT][:COLUMN] (empty parts take defaults)")
        parts += [""] * (4 - len(parts))
        return cls(*(p or None for p in parts))  # type: ignore[arg-type]

    @property
    def label(self) -> str:
        return PREFIX + ":".join(p or "" for p in (self.name, self.config, self.split, self.column)).rstrip(":")


def datasets_library():
    try:
        import datasets
    except ImportError:
        raise DataError("--data hf:... reads HuggingFace datasets: pip install datasets") from None
    datasets.logging.set_verbosity_error()
    datasets.disable_progress_bars()
    return datasets


def load_splits(spec: HFSpec) -> dict:
    """{split name: Dataset} of ``spec`` (one entry when ``spec.split`` is given)."""
    datasets = datasets_library()
    path = Path(spec.name).expanduser()
    try:
        if path.is_dir():
            loaded = datasets.load_from_disk(str(path))
        elif path.suffix.lower() in LOCAL_FORMATS and path.is_file():
            loaded = datasets.load_dataset(LOCAL_FORMATS[path.suffix.lower()], data_files=str(path))
        elif path.suffix.lower() in LOCAL_FORMATS:
            raise DataError(f"--data {spec.label}: {path} does not exist")
        else:
            loaded = datasets.load_dataset(spec.name, spec.config)
    except DataError:
        raise
    except Exception as e:  # (not in the cache offline, no such dataset, a bad file: datasets' own reasons)
        raise DataError(
            f"--data {spec.label}: HuggingFace datasets could not read it ({type(e).__name__}: "
            f"{str(e).splitlines()[0][:150] if str(e) else ''})"
        ) from None
    splits = dict(loaded) if isinstance(loaded, datasets.DatasetDict) else {"train": loaded}
    if spec.split is not None:
        if spec.split not in splits:
            raise DataError(f"--data {spec.label}: no split {spec.split!r}; it has {', '.join(splits)}")
        splits = {spec.split: splits[spec.split]}
    return splits


def text_column(dataset, spec: HFSpec, what: str = "text") -> str:
    """The column of ``dataset`` to read (see :func:`column_of`)."""
    return column_of({n: getattr(f, "dtype", None) for n, f in dataset.features.items()}, spec, what)


def column_of(types: dict, spec: HFSpec, what: str = "text") -> str:
    """The column to read, of columns ``types`` ({name: type name}): ``spec.column``, else
    ``text``, else the only string column."""
    if spec.column is not None:
        if spec.column not in types:
            raise DataError(f"--data {spec.label}: no column {spec.column!r}; it has {', '.join(types)}")
        return spec.column
    if "text" in types:
        return "text"
    strings = [n for n, t in types.items() if t in ("string", "large_string")]
    if len(strings) != 1:
        raise DataError(
            f"--data {spec.label}: which column holds the {what}? it has {', '.join(types)}; "
            "name it: hf:NAME:CONFIG:SPLIT:COLUMN"
        )
    return strings[0]


def corpus(spec_text: str) -> tuple[str, str]:
    """(name, text) of a text corpus: the column's rows of every split read, joined by blank lines
    (the splits in the dataset's order; attnlab takes its own validation split from the end)."""
    spec = HFSpec.parse(spec_text)
    rows = []
    for split in load_splits(spec).values():
        rows += [t for t in split[text_column(split, spec)] if isinstance(t, str) and t.strip()]
    if not rows:
        raise DataError(f"--data {spec.label} holds no text")
    return spec.label, "\n\n".join(rows)


def labelled(spec_text: str) -> tuple[str, list[tuple[str, str]]]:
    """(name, [(text, label)]) of a classification dataset: the text column and ``label`` (class
    names when the column is a ClassLabel)."""
    spec = HFSpec.parse(spec_text)
    pairs = []
    for split in load_splits(spec).values():
        column = text_column(split, spec)
        if "label" not in split.features:
            raise DataError(f"--data {spec.label}: no 'label' column; it has {', '.join(split.features)}")
        names = getattr(split.features["label"], "names", None)
        for text, label in zip(split[column], split["label"]):
            if isinstance(text, str) and text.strip() and label is not None and label != -1:
                pairs.append((text.strip(), str(names[label] if names else label)))
    return spec.label, pairs


def labelled_images(spec_text: str, limit: int = 200_000):
    """(name, [PIL image], [label name], classes) of an image classification dataset: the ``image``
    column (or ``spec.column``) and ``label``; the classes in the ClassLabel's order (else sorted),
    every split read."""
    spec = HFSpec.parse(spec_text)
    images, labels, classes = [], [], None
    for split in load_splits(spec).values():
        column = spec.column or ("image" if "image" in split.features else "img" if "img" in split.features else None)
        if column is None or column not in split.features:
            raise DataError(f"--data {spec.label}: which column holds the images? it has {', '.join(split.features)}")
        if "label" not in split.features:
            raise DataError(f"--data {spec.label}: no 'label' column; it has {', '.join(split.features)}")
        names = getattr(split.features["label"], "names", None)
        classes = classes or names
        for row in split:
            if len(images) >= limit:
                raise DataError(
                    f"--data {spec.label} holds more than {limit:,} images; attnlab keeps image data in memory"
                )
            if row["label"] is not None and row["label"] != -1:
                images.append(row[column])
                labels.append(str(names[row["label"]] if names else row["label"]))
    if not images:
        raise DataError(f"--data {spec.label} holds no labelled images")
    present = set(labels)
    ordered = [c for c in classes if c in present] if classes else sorted(present)
    return spec.label, images, labels, ordered


def parallel(spec_text: str, src: str, tgt: str) -> tuple[str, list[tuple[str, str]]]:
    """(name, [(source, target)]) of a translation dataset, every split read: a ``translation``
    column of {language: sentence} dicts (or ``spec.column``), or columns named ``src`` and ``tgt``."""
    spec = HFSpec.parse(spec_text)
    pairs = []
    for split in load_splits(spec).values():
        features = split.features
        column = spec.column or ("translation" if "translation" in features else None)
        if column is not None:
            if column not in features:
                raise DataError(f"--data {spec.label}: no column {column!r}; it has {', '.join(features)}")
            for row in split[column]:
                if not isinstance(row, dict) or src not in row or tgt not in row:
                    langs = ", ".join(row) if isinstance(row, dict) else type(row).__name__
                    raise DataError(
                        f"--data {spec.label}: its {column} rows hold {langs}, not --src {src} and --tgt {tgt}"
                    )
                pairs.append((row[src], row[tgt]))
        elif src in features and tgt in features:
            pairs += list(zip(split[src], split[tgt]))
        else:
            raise DataError(
                f"--data {spec.label}: no translation column and no {src} / {tgt} columns (it has "
                f"{', '.join(features)}); give --src and --tgt, or name the column"
            )
    pairs = [
        (a.strip(), b.strip())
        for a, b in pairs
        if isinstance(a, str) and isinstance(b, str) and a.strip() and b.strip()
    ]
    return spec.label, pairs
