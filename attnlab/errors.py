"""Errors that reach the user as one line: what is wrong and what to do."""

from __future__ import annotations


class AttnlabError(Exception):
    """Base class; the CLI prints ``error: <message>`` and exits with status 2."""


class DataError(AttnlabError, ValueError):
    """A corpus, dataset or input file that cannot be used."""


class CheckpointError(AttnlabError):
    """A missing, truncated, corrupt or mismatched checkpoint."""


class UnknownTokenError(AttnlabError, ValueError):
    """Text contains a symbol the tokenizer has no id for."""
