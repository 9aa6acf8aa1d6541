"""The command line on cyclopts: each declared option (:mod:`attnlab.options`) is a parameter of
its command's signature, from which cyclopts makes the flags, ``--help``, the choices, "did you
mean" and the shell completion scripts. What is attnlab's own here: the signature made from the
declarations (one parameter per option: its flags, help, check and choices), which options were
typed (those the parse bound), and the one-line error.
"""

from __future__ import annotations

import inspect
from typing import Annotated, Any, Callable, Literal, Optional

from cyclopts import App, Group, Parameter
from cyclopts.exceptions import CycloptsError

from ..options import Command, Option, OptionSpecs

EPILOG = (
    "Every command has --help. Data: attnlab data list (--data-dir or ATTNLAB_DATA: your own folder). Words "
    "(nats, logit lens, must-fail control, items/s): docs/glossary.md"
)
HELP_STYLE = dict(help_format="plaintext", help_epilogue=EPILOG)


def new_app(name: str, help: str, description: str = "", **kw: Any) -> App:
    """A command (or a group of them) named ``name``: ``help`` in its parent's list of commands,
    ``description`` (the help when none) above its options."""
    text = help if not description else f"{help}\n\n{description}"
    return App(name=name, help=text, **HELP_STYLE, **kw)


def _converter(check: Callable[[str], Any], many: bool) -> Callable:
    """A declared checker (text -> value, or ValueError saying why) as cyclopts' converter."""

    def convert(type_, tokens):
        values = [check(t.value if hasattr(t, "value") else t) for t in tokens]
        return values if many else values[0]

    return convert


def _parameter(spec: Option, groups: dict[str, Group]) -> inspect.Parameter:
    """``spec`` as one parameter of a command's signature (default None: not given)."""
    names = [f for f in spec.flags if f.startswith("-")] or [spec.dest]
    kw: dict[str, Any] = dict(help=spec.help or None, show_default=False, allow_repeating=True)  # (the last wins)
    if not spec.positional:
        kw["name"] = names
    bounds = getattr(spec.type, "bounds", None)
    if spec.metavar or (bounds and not spec.choices):
        kw["metavar"] = spec.metavar or {int: "INT", float: "FLOAT"}.get(bounds[0], "VALUE")
    if spec.group is not None:
        kw["group"] = groups.setdefault(spec.group, Group(spec.group, sort_key=len(groups) + 1))
    many = spec.kind == "append" or spec.nargs in ("+", "*")
    if spec.kind in ("flag", "bool"):
        kind: Any = bool
        if spec.kind == "flag":
            kw["negative"] = ()  # (on when given; there is no --no-x)
    else:
        kind = Literal[tuple(spec.choices)] if spec.choices else str
        if spec.type not in (None, str):
            kw["converter"] = _converter(spec.type, many)
            kind = Any if not spec.choices else kind
        if many:
            kind = tuple[kind, ...]
            kw["consume_multiple"] = spec.nargs in ("+", "*")  # (--stop a --stop b, or NAME NAME ...)
            kw["negative"] = ()
        kw["allow_leading_hyphen"] = spec.type not in (None, str)  # (--temperature -1: a value to refuse)
    required = spec.required or (spec.positional and spec.nargs not in ("*", "?"))
    return inspect.Parameter(
        spec.dest,
        inspect.Parameter.POSITIONAL_ONLY if spec.positional else inspect.Parameter.KEYWORD_ONLY,
        default=inspect.Parameter.empty if required else None,
        annotation=Annotated[kind if required else Optional[kind], Parameter(**kw)],
    )


def add_command(parent: App, command: Command, full: bool, call: Callable[[dict[str, Any]], int | None]) -> None:
    """``command`` as a subcommand of ``parent``: its options as the parameters of a function that
    calls ``call`` with the options typed (name -> value; a repeated or several-valued one as a
    list; ``run.typed(...)`` returns them without running). ``full`` False: its name and help only
    (a command the words parsed do not name)."""
    app = new_app(command.name, command.help, command.description)
    parent.command(app)
    if not full:
        return
    options = command.options
    groups: dict[str, Group] = {}
    parameters = [_parameter(spec, groups) for spec in options]
    parameters.sort(key=lambda p: p.kind)  # (positional ones first, in their order)
    signature = inspect.Signature(parameters)

    def typed(*args: Any, **kwargs: Any) -> dict[str, Any]:
        given = {}
        for name, value in signature.bind(*args, **kwargs).arguments.items():
            if value is not None:  # (None: not given; no word parses to None)
                given[name] = list(value) if isinstance(value, tuple) else value
        return given

    def run(*args: Any, **kwargs: Any) -> int | None:
        return call(typed(*args, **kwargs))

    run.__signature__ = signature  # type: ignore[attr-defined]
    run.__doc__ = None
    run.declaration, run.typed = command, typed  # type: ignore[attr-defined]
    app.default(run)


def with_defaults(options: OptionSpecs, given: dict[str, Any]) -> dict[str, Any]:
    """Every option of ``options`` -> the value typed, else its default."""
    return {name: given.get(name, spec.default) for name, spec in options.specs.items()}


def error_line(e: CycloptsError) -> str:
    """A parse error in one line: what is wrong, and the help of the command it was given to."""
    text = " ".join(str(e).split())
    chain = list(e.command_chain or [])
    where = " ".join(["attnlab", *chain[1:]] if chain and chain[0] == "attnlab" else ["attnlab", *chain])
    return f"{text} (see {where} --help)"
