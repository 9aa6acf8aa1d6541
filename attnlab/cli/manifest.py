"""The command line as plain data: what ``attnlab --help``, ``--version``, ``attnlab COMMAND --help``
and shell completion need, without importing torch.

Building the real parser imports every recipe, and so torch and matplotlib: seconds before the
first line of help. The tree of commands and options it builds is written once to
``commands.json`` beside this module (:func:`describe`); help, version and completion requests
rebuild an argparse parser from that file (:func:`rebuild`), which prints the same text in a
fraction of the time. ``tests/test_cli_help.py`` keeps the file equal to the live parser; after
changing an option, regenerate it with ``python -m attnlab.cli.manifest``.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

MANIFEST = Path(__file__).with_name("commands.json")
FORMATTERS = {
    "HelpFormatter": argparse.HelpFormatter,
    "RawDescriptionHelpFormatter": argparse.RawDescriptionHelpFormatter,
}


def _kind(action: argparse.Action) -> str:
    for kind, cls in (
        ("help", argparse._HelpAction),
        ("version", argparse._VersionAction),
        ("subcommands", argparse._SubParsersAction),
        ("flag", argparse._StoreTrueAction),
        ("bool", argparse.BooleanOptionalAction),
        ("append", argparse._AppendAction),
        ("value", argparse._StoreAction),
    ):
        if isinstance(action, cls):
            return kind
    raise TypeError(f"the command-line manifest does not know argparse's {type(action).__name__}")


def _plain(value: Any) -> Any:
    """``value`` if JSON keeps it as it is, else None (a default only the real parser needs)."""
    if isinstance(value, list):
        return value if all(_plain(v) == v for v in value) else None
    return value if isinstance(value, (str, int, float, bool, type(None))) else None


def describe(parser: argparse.ArgumentParser) -> dict:
    """``parser``, its options and its subcommands, all levels down, as JSON-able data."""
    groups = parser._action_groups
    actions = []
    for action in parser._actions:
        kind = _kind(action)
        group = next(i for i, g in enumerate(groups) if action in g._group_actions)
        entry: dict[str, Any] = {"kind": kind, "group": group, "dest": action.dest, "help": action.help}
        if kind == "subcommands":
            helps = {a.dest: a.help for a in action._choices_actions}
            entry["metavar"] = action.metavar
            entry["commands"] = {
                name: {"help": helps.get(name), "parser": describe(sub)} for name, sub in action.choices.items()
            }
        else:
            strings = list(action.option_strings)
            if kind == "bool":  # argparse adds each --no-x itself
                strings = [s for s in strings if not s.startswith("--no-")]
            entry.update(
                option_strings=strings,
                metavar=action.metavar,
                choices=list(action.choices) if action.choices is not None else None,
                nargs=action.nargs if kind in ("value", "append") else None,
                required=action.required,
                default=_plain(action.default),
                version=getattr(action, "version", None),
            )
        actions.append(entry)
    return {
        "prog": parser.prog,
        "description": parser.description,
        "epilog": parser.epilog,
        "formatter": parser.formatter_class.__name__,
        "groups": [{"title": g.title, "description": g.description} for g in groups],
        "actions": actions,
    }


def rebuild(data: dict, parser: argparse.ArgumentParser | None = None) -> argparse.ArgumentParser:
    """An argparse parser from :func:`describe`'s data: the same help and usage text, the same
    subcommands and options, and no value checks (it serves help, version and completion)."""
    from .parser import Parser

    if parser is None:
        parser = Parser(
            prog=data["prog"],
            description=data["description"],
            epilog=data["epilog"],
            formatter_class=FORMATTERS[data["formatter"]],
            add_help=False,
        )
    groups = list(parser._action_groups[:2])  # argparse's own: positional arguments, options
    for g in data["groups"][2:]:
        groups.append(parser.add_argument_group(g["title"], g["description"]))
    for a in data["actions"]:
        target = groups[a["group"]]
        kind = a["kind"]
        if kind == "subcommands":
            sub = parser.add_subparsers(dest=a["dest"], metavar=a["metavar"], parser_class=Parser)
            for name, c in a["commands"].items():
                p = c["parser"]
                child = sub.add_parser(
                    name,
                    help=c["help"],
                    description=p["description"],
                    epilog=p["epilog"],
                    formatter_class=FORMATTERS[p["formatter"]],
                    add_help=False,
                )
                rebuild(p, child)
            continue
        strings = a["option_strings"]
        kw: dict[str, Any] = {"help": a["help"]}
        if kind == "help":
            kw["action"] = "help"
        elif kind == "version":
            kw.update(action="version", version=a["version"])
        else:
            kw["default"] = a["default"]
            if strings:
                kw.update(dest=a["dest"], required=a["required"])
            if kind == "flag":
                kw["action"] = "store_true"
            elif kind == "bool":
                kw["action"] = argparse.BooleanOptionalAction
            else:
                kw.update(action="append" if kind == "append" else "store", metavar=a["metavar"], choices=a["choices"])
                if a["nargs"] is not None:
                    kw["nargs"] = a["nargs"]
        action = target.add_argument(*(strings or [a["dest"]]), **kw)
        action.required = a.get("required", action.required)  # (argparse takes it only for options)
    return parser


def load() -> dict:
    """The manifest written with this version of attnlab."""
    return json.loads(MANIFEST.read_text(encoding="utf-8"))


def write() -> Path:
    """(Re)write ``commands.json`` from the live parser."""
    from . import build_parser

    MANIFEST.write_text(json.dumps(describe(build_parser()), indent=1, ensure_ascii=False) + "\n", encoding="utf-8")
    return MANIFEST


if __name__ == "__main__":
    print(f"wrote {write()}")
