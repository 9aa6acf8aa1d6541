"""A base for the configuration dataclasses: to and from plain JSON-able dicts."""

from __future__ import annotations

from dataclasses import asdict, fields


class Config:
    """Mixin for @dataclass configs. ``from_dict`` refuses unknown fields (a checkpoint of another
    model, or a typo) unless ``strict=False``."""

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict, strict: bool = True):
        known = {f.name for f in fields(cls)}
        unknown = set(d) - known
        if unknown and strict:
            raise ValueError(f"unknown {cls.__name__} fields {sorted(unknown)}")
        return cls(**{k: v for k, v in d.items() if k in known})
