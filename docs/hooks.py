"""MkDocs hooks: the pages generated at build time, so that nothing is written twice.

- ``index.md`` is the README, its links made relative to ``docs/``;
- ``benchmarks.md`` is ``benchmarks/README.md``, likewise;
- ``cli.md`` is every ``attnlab`` command's ``--help``, from the parser itself.
"""

from __future__ import annotations

import argparse
import re
from pathlib import Path

from mkdocs.structure.files import File

ROOT = Path(__file__).resolve().parent.parent


def _relink(text: str, base: str) -> str:
    """Links of a Markdown file in ``base`` (relative to the repository) made relative to docs/."""

    def fix(m: re.Match) -> str:
        target = m.group(2)
        if re.match(r"[a-z]+:|#", target):
            return m.group(0)
        path, _, anchor = target.partition("#")
        resolved = (ROOT / base / path).resolve().relative_to(ROOT).as_posix()
        if resolved.startswith("docs/"):
            new = resolved[len("docs/") :]
        elif resolved == "benchmarks/README.md":
            new = "benchmarks.md"
        else:  # outside the site (a notebook, a script): the path as text
            return f"{m.group(1)} (`{resolved}`)" if m.group(1) != f"[{resolved}]" else f"`{resolved}`"
        return f"{m.group(1)}({new}{'#' + anchor if anchor else ''})"

    return re.sub(r"(!?\[[^\]]*\])\(([^)\s]+)\)", fix, text)


def _cli_page() -> str:
    from attnlab.cli import build_parser

    parser = build_parser()
    parser.prog = "attnlab"
    out = [
        "# Command line reference",
        "",
        "Generated from the parser at build time: each command's `--help`.",
        "",
        "```text",
        parser.format_help().rstrip(),
        "```",
    ]
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    for name, cmd in sub.choices.items():
        out += ["", f"## attnlab {name}", "", "```text", cmd.format_help().rstrip(), "```"]
        inner = [a for a in cmd._actions if isinstance(a, argparse._SubParsersAction)]
        for family, fcmd in (inner[0].choices.items() if inner else []):
            out += ["", f"### attnlab {name} {family}", "", "```text", fcmd.format_help().rstrip(), "```"]
    return "\n".join(out) + "\n"


def on_files(files, config):
    pages = {
        "index.md": _relink((ROOT / "README.md").read_text(), "."),
        "benchmarks.md": _relink((ROOT / "benchmarks" / "README.md").read_text(), "benchmarks"),
        "cli.md": _cli_page(),
    }
    for name, content in pages.items():
        files.append(File.generated(config, name, content=content))
    return files


def on_page_content(html, page, config, files):
    """The docstrings use reStructuredText roles (``:func:`x```) and ``::`` before code blocks:
    on the site the role names and the second colon go."""
    html = re.sub(r":(?:class|func|mod|meth|attr|data|exc|obj):(<code)", r"\1", html)
    return html.replace("::</p>", ":</p>")
