"""A base for the configuration dataclasses: to and from plain JSON-able dicts, checked.

Every config is strict: unknown fields, values of the wrong type and sizes that are not
positive (or absurdly large: validated before anything is allocated) are refused with a
``ValueError`` that names the field.
"""

from __future__ import annotations

import typing
from dataclasses import asdict, fields

# The largest value any size field (vocabulary, width, context, layers) may take: far beyond
# any model attnlab can train, small enough that a corrupt config fails here and not in malloc.
MAX_SIZE = 1 << 24


def _type_ok(value, typ) -> bool:
    origin, args = typing.get_origin(typ), typing.get_args(typ)
    if origin is typing.Union or (origin is not None and type(None) in args):
        return any(_type_ok(value, a) for a in args)
    if typ is type(None):
        return value is None
    if typ is bool:
        return isinstance(value, bool)
    if typ is int:
        return isinstance(value, int) and not isinstance(value, bool)
    if typ is float:
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    if typ in (list, tuple) or origin in (list, tuple):
        return isinstance(value, (list, tuple))
    if isinstance(typ, type):
        return isinstance(value, typ)
    return True


class Config:
    """Mixin for @dataclass configs. ``from_dict`` refuses unknown fields (a checkpoint of another
    model, or a typo) unless ``strict=False``. Subclasses list their size fields in ``SIZES``
    (each must be an integer in 1..MAX_SIZE) and call ``super().__post_init__()``."""

    SIZES: typing.ClassVar[tuple[str, ...]] = ()

    def __post_init__(self) -> None:
        hints = typing.get_type_hints(type(self))
        for f in fields(self):
            value = getattr(self, f.name)
            if not _type_ok(value, hints[f.name]):
                want = str(hints[f.name]).replace("typing.", "").replace("<class '", "").replace("'>", "")
                raise ValueError(f"{type(self).__name__}.{f.name} must be {want}, got {value!r}")
        for name in self.SIZES:
            v = getattr(self, name)
            if v is not None and not 1 <= v <= MAX_SIZE:
                raise ValueError(f"{name} must be an integer from 1 to {MAX_SIZE}, got {v}")

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict, strict: bool = True):
        if not isinstance(d, dict):
            raise ValueError(f"a {cls.__name__} must be a JSON object, got {type(d).__name__}")
        known = {f.name for f in fields(cls)}
        unknown = set(d) - known
        if unknown and strict:
            raise ValueError(f"unknown {cls.__name__} fields {sorted(unknown)}")
        return cls(**{k: v for k, v in d.items() if k in known})
