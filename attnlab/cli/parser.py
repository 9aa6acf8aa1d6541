"""argparse for attnlab: the declared options (:mod:`attnlab.options`) as flags, and a parser
that reports a bad option in one line. The only place attnlab uses argparse."""

from __future__ import annotations

import argparse
import typing

from ..options import OptionSpecs

EPILOG = "Every command has --help. Data directory: --data-dir or the ATTNLAB_DATA environment variable."


class Parser(argparse.ArgumentParser):
    """argparse that reports a bad option in one line (what is wrong, where to look, and for a
    misspelled option the nearest real ones) and exits 2."""

    def error(self, message: str) -> typing.NoReturn:
        if message.startswith("unrecognized arguments:"):
            message += did_you_mean(message.split(":", 1)[1].split(), self.option_strings())
        self.exit(2, f"error: {message} (see {self.prog} --help)\n")

    def option_strings(self) -> set[str]:
        """Every --flag of this parser and of its subcommands, all levels down."""
        found = set()
        for action in self._actions:
            found.update(action.option_strings)
            if isinstance(action, argparse._SubParsersAction):
                for sub in action.choices.values():
                    found |= sub.option_strings() if isinstance(sub, Parser) else set()
        return found


def did_you_mean(words: list[str], options: set[str]) -> str:
    """ "; did you mean --lr?" for the words that look like a misspelled option, else ""."""
    import difflib

    guesses = []
    for word in words:
        flag = word.split("=", 1)[0]
        if flag.startswith("--"):
            guesses += difflib.get_close_matches(flag, sorted(options), n=1, cutoff=0.75)
    return f"; did you mean {' / '.join(dict.fromkeys(guesses))}?" if guesses else ""


def flag_type(check):
    """A declared checker as an argparse type: its ValueError becomes argparse's one-line message."""
    if check is None or check in (int, float, str):
        return check

    def parse(text: str):
        try:
            return check(text)
        except ValueError as e:
            raise argparse.ArgumentTypeError(str(e)) from None

    parse.__name__ = getattr(check, "__name__", "value")  # argparse names the type in its messages
    return parse


def add_options(parser: argparse.ArgumentParser, specs: OptionSpecs) -> None:
    """Every option of ``specs`` as a flag (or positional argument) of ``parser``, in its --help group."""
    groups: dict[str, typing.Any] = {}
    for spec in specs:
        target = parser
        if spec.group is not None:
            if spec.group not in groups:
                groups[spec.group] = parser.add_argument_group(spec.group)
            target = groups[spec.group]
        kw: dict[str, typing.Any] = dict(help=spec.help or None, default=spec.default)
        if spec.kind == "flag":
            kw["action"] = "store_true"
        elif spec.kind == "bool":
            kw["action"] = argparse.BooleanOptionalAction
        else:
            if spec.kind == "append":
                kw["action"] = "append"
            kw.update(type=flag_type(spec.type), choices=spec.choices, metavar=spec.metavar)
            if spec.nargs is not None:
                kw["nargs"] = spec.nargs
        if spec.positional:
            target.add_argument(spec.dest, **kw)
        else:
            target.add_argument(*spec.flags, dest=spec.dest, required=spec.required, **kw)


def option_parser(sub, name: str, specs: OptionSpecs, **kw) -> argparse.ArgumentParser:
    """A subcommand ``name`` of ``sub`` taking the options ``specs``."""
    p = sub.add_parser(name, epilog=EPILOG, **kw)
    add_options(p, specs)
    return p
