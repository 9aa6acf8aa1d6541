"""The README's first hour (issue 68): every `attnlab` command in it parses with the live command
line as written (its command, its flags, their values), so a renamed flag or command cannot leave
the path a newcomer follows broken. (The path itself was run and timed from a fresh clone; its
times are in the README.)"""

import re
import shlex
from pathlib import Path

import pytest

README = Path(__file__).resolve().parents[1] / "README.md"


def first_hour_commands() -> list[str]:
    text = README.read_text(encoding="utf-8")
    section = text[text.index("## Your first hour") :]
    block = re.search(r"```bash\n(.*?)```", section, re.S).group(1)
    lines = [line.split("  #")[0].strip() for line in block.splitlines()]
    return [line for line in lines if line.startswith("attnlab ")]


def test_the_first_hour_covers_the_path():
    commands = " ".join(first_hour_commands())
    for step in (
        "data get",
        "train gpt",
        "sample",
        "inspect attention",
        "inspect lens",
        "explore",
        "train vit",
        "reproduce",
    ):
        assert f"attnlab {step}" in commands, step


@pytest.mark.parametrize("line", first_hour_commands())
def test_every_first_hour_command_parses_as_written(line):
    from attnlab.cli import parse

    command, _ = parse(shlex.split(line)[1:])  # (a bad flag or value raises: the test fails)
    assert command is not None, line
