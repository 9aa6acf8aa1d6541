"""Shell completion scripts for bash, zsh and fish, generated from the live command line
(:func:`describe`): commands, options, and the values of options with choices; the other values
complete as file names."""

from __future__ import annotations

import argparse
import shlex
from dataclasses import dataclass, field
from typing import Any

SHELLS = ("bash", "zsh", "fish")


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
    raise TypeError(f"completion does not know argparse's {type(action).__name__}")


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


@dataclass
class Level:
    """One command (``()``, ``("train",)``, ``("train", "gpt")``): what may follow it."""

    path: tuple[str, ...]
    commands: dict[str, str] = field(default_factory=dict)  # subcommand -> its help
    options: list[dict] = field(default_factory=list)  # the actions with option strings (:func:`describe`)
    arguments: list[str] = field(default_factory=list)  # the choices of its positional arguments


def levels(data: dict, path: tuple[str, ...] = ()) -> list[Level]:
    """Every command of ``data`` (:func:`describe`), depth first."""
    level = Level(path)
    found = [level]
    for action in data["actions"]:
        if action["kind"] == "subcommands":
            for name, command in action["commands"].items():
                level.commands[name] = command["help"] or ""
                found += levels(command["parser"], (*path, name))
        elif action["option_strings"]:
            level.options.append(action)
        elif action["choices"]:
            level.arguments += map(str, action["choices"])
    return found


def option_words(action: dict) -> list[str]:
    """What may be typed for an option: its strings, and --no-x beside each --x of an on/off one."""
    words = list(action["option_strings"])
    if action["kind"] == "bool":
        words += ["--no-" + w[2:] for w in action["option_strings"] if w.startswith("--")]
    return words


def takes_value(action: dict) -> bool:
    return action["kind"] in ("value", "append")


def script(shell: str, data: dict) -> str:
    """The completion script for ``shell`` (bash, zsh or fish)."""
    if shell not in SHELLS:
        raise ValueError(f"no completion for {shell!r}; choose one of {', '.join(SHELLS)}")
    found = levels(data)
    if shell == "fish":
        return _fish(found)
    text = _bash(found)
    if shell == "zsh":  # zsh runs bash's completion functions through bashcompinit
        text = "autoload -U +X compinit && compinit\nautoload -U +X bashcompinit && bashcompinit\n" + text
    return text


def _bash(found: list[Level]) -> str:
    q = shlex.quote
    steps, values, words = [], [], []
    for level in found:
        here = " ".join(level.path)
        steps += [f"{q(here + '|' + name)}) path={q((here + ' ' + name).strip())} ;;" for name in level.commands]
        for action in level.options:
            keys = "|".join(q(f"{here}|{w}") for w in action["option_strings"])
            if action["choices"]:
                choices = " ".join(map(str, action["choices"]))
                values.append(f'{keys}) COMPREPLY=($(compgen -W {q(choices)} -- "$cur")); return ;;')
            elif takes_value(action):
                values.append(f"{keys}) COMPREPLY=(); return ;;  # a file or a value: the shell's default")
        offered = [*level.commands, *level.arguments, *(w for a in level.options for w in option_words(a))]
        words.append(f"{q(here)}) words={q(' '.join(offered))} ;;")
    indent = "\n" + " " * 12
    return f"""# attnlab completion for bash: eval "$(attnlab completion bash)" in ~/.bashrc
_attnlab_complete() {{
    local cur="${{COMP_WORDS[COMP_CWORD]}}" prev="${{COMP_WORDS[COMP_CWORD-1]}}"
    local path="" words="" i
    for ((i = 1; i < COMP_CWORD; i++)); do  # the command typed so far: train, then gpt, ...
        case "$path|${{COMP_WORDS[i]}}" in{indent}{indent.join(steps)}
        esac
    done
    case "$path|$prev" in{indent}{indent.join(values)}
    esac
    case "$path" in{indent}{indent.join(words)}
    esac
    COMPREPLY=($(compgen -W "$words" -- "$cur"))
}}
complete -o default -F _attnlab_complete attnlab
"""


def _fish(found: list[Level]) -> str:
    q = shlex.quote
    lines = ["# attnlab completion for fish: attnlab completion fish > ~/.config/fish/completions/attnlab.fish"]
    for level in found:
        if not level.path:
            here = "__fish_use_subcommand"
        else:
            here = "; and ".join(f"__fish_seen_subcommand_from {name}" for name in level.path)
        if level.commands:
            below = " ".join(level.commands)
            at = here if not level.path else f"{here}; and not __fish_seen_subcommand_from {below}"
            for name, helptext in level.commands.items():
                lines.append(f"complete -c attnlab -f -n {q(at)} -a {q(name)} -d {q(_short(helptext))}")
        if level.arguments:
            lines.append(f"complete -c attnlab -f -n {q(here)} -a {q(' '.join(level.arguments))}")
        for action in level.options:
            flags = []
            for w in action["option_strings"]:
                flags.append(f"-l {q(w[2:])}" if w.startswith("--") else f"-s {q(w[1:])}")
            if action["kind"] == "bool":
                flags += [f"-l {q('no-' + w[2:])}" for w in action["option_strings"] if w.startswith("--")]
            value = ""
            if action["choices"]:
                value = f" -x -a {q(' '.join(map(str, action['choices'])))}"
            elif takes_value(action):
                value = " -r"
            cond = here if level.path else "__fish_use_subcommand"
            lines.append(
                f"complete -c attnlab -n {q(cond)} {' '.join(flags)}{value} -d {q(_short(action['help'] or ''))}"
            )
    return "\n".join(lines) + "\n"


def _short(text: str, width: int = 70) -> str:
    """A help text cut to one short line, for fish's descriptions."""
    text = " ".join(text.split())
    return text if len(text) <= width else text[: width - 1].rstrip() + "…"
