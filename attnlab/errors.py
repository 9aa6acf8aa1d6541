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


class OptionError(AttnlabError, ValueError):
    """An option (a command-line flag or a keyword argument of the Python API) with a bad value."""


def one_line(e: BaseException) -> str:
    """The first line of an exception's message; OS errors name the file they are about."""
    if isinstance(e, OSError) and not isinstance(e, AttnlabError) and e.filename is not None:
        return f"{e.strerror or type(e).__name__}: {e.filename}"
    text = str(e).strip()
    return text.splitlines()[0] if text else type(e).__name__


def a(noun: str) -> str:
    """``noun`` with its indefinite article, for messages: "an encoder", "a gpt"."""
    return ("an " if str(noun)[:1].lower() in "aeiou" else "a ") + str(noun)
