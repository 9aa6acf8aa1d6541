"""Token ids given by a user (a prompt of ids, ids to decode), checked against a vocabulary."""

from __future__ import annotations

from collections.abc import Iterable

from ..errors import UnknownTokenError


def checked_token_ids(ids: Iterable, vocab_size: int) -> list[int]:
    """``ids`` as ints, refused in one line when any lies outside a vocabulary of ``vocab_size``
    tokens (ids 0..vocab_size-1): an embedding lookup would fail on it with an index error, and
    ``tokenizers`` would skip it silently."""
    ids = [int(i) for i in ids]
    bad = next((i for i in ids if not 0 <= i < vocab_size), None)
    if bad is not None:
        raise UnknownTokenError(f"token id {bad} is outside the vocabulary (0..{vocab_size - 1})")
    return ids
