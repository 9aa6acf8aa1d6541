"""Datasets: text corpora (:mod:`.text`), images (:mod:`.images`), parallel text and synthetic
sequence tasks (:mod:`.parallel`), and the files they come from (:mod:`.sources`)."""

from .shards import open_shards
from .shards import prepare as prepare_shards
from .text import TokenData, embedded_corpus, load_corpus, prepare

__all__ = ["TokenData", "embedded_corpus", "load_corpus", "open_shards", "prepare", "prepare_shards"]
