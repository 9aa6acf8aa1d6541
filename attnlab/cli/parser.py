"""argparse for attnlab: the declared options (:mod:`attnlab.options`) as flags, and a parser
that reports a bad option in one line. The only place attnlab uses argparse."""

from __future__ import annotations

import argparse
import difflib
import re
import typing

from ..options import OptionSpecs

EPILOG = "Every command has --help. Data directory: --data-dir or the ATTNLAB_DATA environment variable."


class Parser(argparse.ArgumentParser):
    """argparse that reports a bad option in one line (what is wrong, where to look: the help of
    the command it was given to, and for a misspelled command or option the nearest real ones) and
    exits 2. A flag is never taken from a prefix of it (``--max-iter`` is not ``--max-iters``)."""

    def __init__(self, *args, **kwargs) -> None:
        kwargs.setdefault("allow_abbrev", False)
        super().__init__(*args, **kwargs)
        self.given: list[str] = []

    def parse_known_args(self, args=None, namespace=None):  # (remembered: an error names its command's help)
        self.given = list(args) if args is not None else []
        return super().parse_known_args(args, namespace)

    def error(self, message: str) -> typing.NoReturn:
        command = self.command_of(self.given)
        if message.startswith("unrecognized arguments:"):
            message += did_you_mean(message.split(":", 1)[1].split(), command.option_strings())
        choice = re.match(r"argument (\w+): invalid choice: '(.*)' \(choose from (.*)\)$", message)
        if choice:
            # (Python quotes the choices up to 3.13 and lists them bare from 3.14: either is read)
            word, choices = choice.group(2), [c.strip().strip("'") for c in choice.group(3).split(",")]
            near = difflib.get_close_matches(word, choices, n=1, cutoff=0.6)
            hint = f"; did you mean {near[0]}?" if near else f"; one of {', '.join(choices)}"
            what = {"COMMAND": "command", "MODEL": "model"}.get(choice.group(1), "choice")
            message = f"unknown {what} {word!r}{hint}"
        self.exit(2, f"error: {message} (see {command.prog} --help)\n")

    def command_of(self, words: list[str]) -> "Parser":
        """The (sub)command ``words`` name, as deep as they go (this parser when they name none)."""
        for action in self._actions:
            if isinstance(action, argparse._SubParsersAction):
                for i, word in enumerate(words):
                    sub = action.choices.get(word)
                    if isinstance(sub, Parser):
                        return sub.command_of(words[i + 1 :])
        return self

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
    guesses = []
    for word in words:
        flag = word.split("=", 1)[0]
        if flag.startswith("--"):  # (a flag's start is not taken for it, but named: --max-new -> --max-new-tokens)
            starts = sorted(o for o in options if o.startswith(flag))
            guesses += (
                starts[:1] if len(starts) == 1 else difflib.get_close_matches(flag, sorted(options), n=1, cutoff=0.75)
            )
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
