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


class Note(UserWarning):
    """Something a user should know in passing (an input resized, a text cut at the model's
    context, a word the vocabulary never saw): a warning in Python, one ``warning:`` line on the
    command line, every time it happens."""


def one_line(e: BaseException) -> str:
    """The first line of an exception's message; OS errors name the file they are about."""
    if isinstance(e, OSError) and not isinstance(e, AttnlabError) and e.filename is not None:
        text = f"{e.strerror or type(e).__name__}: {e.filename}"
    else:
        text = str(e).strip()
        text = text.splitlines()[0] if text else type(e).__name__
    # a file name or text that is not valid Unicode (bytes from a shell) is shown escaped, never a crash
    return text.encode("utf-8", "backslashreplace").decode("utf-8")


def a(noun: str) -> str:
    """``noun`` with its indefinite article, for messages: "an encoder", "a gpt"."""
    return ("an " if str(noun)[:1].lower() in "aeiou" else "a ") + str(noun)


def does_not_fit(what: str, e: BaseException) -> CheckpointError:
    """The error for a model whose config passes its checks but whose weights cannot be allocated
    (torch's allocator message, shortened, says how much was asked)."""
    return CheckpointError(f"the {what} model this config describes does not fit in memory ({one_line(e)[:120]})")
