"""Datasets: text corpora (and, in later modules, images and parallel text)."""

from .text import TokenData, embedded_corpus, load_corpus, prepare

__all__ = ["TokenData", "embedded_corpus", "load_corpus", "prepare"]
