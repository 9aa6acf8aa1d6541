"""Command-line option helpers shared by the parser and the recipes: typed, range-checked
values, one-line errors, and one option per config field (with its old names as aliases)."""

from __future__ import annotations

import argparse
import dataclasses
import math
import typing

EPILOG = "Every command has --help. Data directory: --data-dir or the ATTNLAB_DATA environment variable."


class Parser(argparse.ArgumentParser):
    """argparse that reports a bad option in one line (what is wrong, where to look) and exits 2."""

    def error(self, message: str) -> typing.NoReturn:
        self.exit(2, f"error: {message} (see {self.prog} --help)\n")


def number(kind, low, low_ok: bool, high=None, what: str = ""):
    """An argparse type: ``kind`` (int or float) in the range from ``low`` (inclusive when
    ``low_ok``) up to ``high`` (inclusive)."""

    def parse(text: str):
        try:
            v = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not {'an integer' if kind is int else 'a number'}") from None
        if kind is float and not math.isfinite(v):
            raise argparse.ArgumentTypeError(f"{text!r} is not a finite number")
        if (v < low if low_ok else v <= low) or (high is not None and v > high):
            raise argparse.ArgumentTypeError(f"{text} is out of range: must be {what}")
        return v

    parse.__name__ = kind.__name__  # argparse names the type in its messages
    return parse


def at_least(n: int):
    return number(int, n, True, what=f"at least {n}")


positive_int = at_least(1)
nonneg_int = number(int, 0, True, what="0 or more")
nonneg_float = number(float, 0.0, True, what="0 or more")
positive_float = number(float, 0.0, False, what="more than 0")
probability = number(float, 0.0, False, 1.0, what="in (0, 1]")
fraction = number(float, 0.0, True, 1.0, what="in [0, 1]")
below_one = number(float, 0.0, True, 0.99, what="in [0, 1)")


def device_name(text: str) -> str:
    from .training.trainer import check_device_name

    try:
        check_device_name(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e).replace("--device ", "")) from None
    return text


def input_lines(texts: list[str], file: str | None) -> list[str]:
    """A command's input lines: its arguments, else the lines of ``--file``, else standard input."""
    import sys
    from pathlib import Path

    if texts:
        return list(texts)
    if file:
        path = Path(file)
        if not path.is_file():
            raise ValueError(f"--file {path} does not exist")
        try:
            return path.read_text(encoding="utf-8").splitlines()
        except UnicodeDecodeError as e:
            raise ValueError(f"--file {path} is not UTF-8 text (byte {e.start}); convert it to UTF-8") from None
    return sys.stdin.read().splitlines()


class SharedOptions:
    """A parser that several families add options to (``eval``, ``inspect``): an option that is
    already there (two classifier families both read --out) is added once."""

    def __init__(self, parser) -> None:
        self.parser = parser

    def add_argument(self, *flags, **kw) -> None:
        if not any(f in self.parser._option_string_actions for f in flags):
            self.parser.add_argument(*flags, **kw)


def field_options(parser, cls, skip=(), group=None, defaults: dict | None = None) -> list[str]:
    """One --option per dataclass field (default None = 'not given'), with the field's old names
    (``cls.ALIASES``) as aliases; returns the field names. Fields already added are skipped."""
    hints = typing.get_type_hints(cls)
    aliases: dict[str, list[str]] = {}
    for old, new in getattr(cls, "ALIASES", {}).items():
        aliases.setdefault(new, []).append(old)
    names = []
    for f in dataclasses.fields(cls):
        if f.name in skip:
            continue
        flags = ["--" + n.replace("_", "-") for n in (f.name, *aliases.get(f.name, []))]
        if flags[0] in parser._option_string_actions:  # a field two configs share (seq2seq)
            names.append(f.name)
            action = parser._option_string_actions[flags[0]]
            for alias in flags[1:]:  # the other config's old names for it
                if alias not in parser._option_string_actions:
                    action.option_strings.append(alias)
                    parser._option_string_actions[alias] = action
            continue
        typ = hints[f.name]
        args = typing.get_args(typ)
        base = next((a for a in args if a is not type(None)), typ) if args else typ
        if base not in (int, float, str, bool):  # lists and tuples (CNN widths) are set in Python, not flags
            continue
        default = (defaults or {}).get(f.name, f.default if f.default is not dataclasses.MISSING else None)
        also = f"; also {', '.join(flags[1:])}" if flags[1:] else ""
        helptext = f"{cls.__name__}.{f.name} (default: {default}{also})"
        if "help" in f.metadata:
            helptext = f"{f.metadata['help']}{also}"
        if base is bool:
            group.add_argument(*flags, dest=f.name, action=argparse.BooleanOptionalAction, default=None, help=helptext)
        else:
            group.add_argument(*flags, dest=f.name, type=base, default=None, metavar=base.__name__.upper(),
                               help=helptext)
        names.append(f.name)
    return names
