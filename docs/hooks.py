"""MkDocs hooks: the pages generated at build time, so that nothing is written twice.

- ``index.md`` is the README, its links made relative to ``docs/``;
- ``benchmarks.md`` is ``benchmarks/README.md``, likewise;
- ``cli.md`` is every ``attnlab`` command's ``--help``, from the parser itself;
- ``notebooks/*.md`` are the notebooks (``notebooks/*.py``, jupytext's percent format) as pages;
- on ``equations.md`` every ``attnlab.…`` name links to its entry in the API reference.
"""

from __future__ import annotations

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
        elif resolved.startswith("notebooks/") and resolved.endswith(".py"):
            new = resolved[: -len(".py")] + ".md"
        else:  # outside the site (a notebook, a script): the path as text
            return f"{m.group(1)} (`{resolved}`)" if m.group(1) != f"[{resolved}]" else f"`{resolved}`"
        return f"{m.group(1)}({new}{'#' + anchor if anchor else ''})"

    return re.sub(r"(!?\[[^\]]*\])\(([^)\s]+)\)", fix, text)


def _help(words: list[str]) -> str:
    """What ``attnlab WORDS --help`` prints, 100 columns wide."""
    import contextlib
    import io
    import os

    from attnlab.cli import main

    out, width = io.StringIO(), os.environ.get("COLUMNS")
    os.environ["COLUMNS"] = "100"
    try:
        with contextlib.redirect_stdout(out):
            main([*words, "--help"])
    finally:
        os.environ.pop("COLUMNS") if width is None else os.environ.__setitem__("COLUMNS", width)
    return out.getvalue().rstrip()


def _cli_page() -> str:
    from attnlab.cli import commands

    out = [
        "# Command line reference",
        "",
        "Generated from the declarations at build time: each command's `--help`.",
        "",
        "```text",
        _help([]),
        "```",
    ]
    done = set()
    for words in sorted(commands()):
        path = words.split()
        if len(path) > 1 and path[0] not in done:  # (a group: train, sae, data)
            done.add(path[0])
            out += ["", f"## attnlab {path[0]}", "", "```text", _help(path[:1]), "```"]
        level = "###" if len(path) > 1 else "##"
        out += ["", f"{level} attnlab {words}", "", "```text", _help(path), "```"]
    return "\n".join(out) + "\n"


def on_files(files, config):
    pages = {
        "index.md": _relink((ROOT / "README.md").read_text(), "."),
        "benchmarks.md": _relink((ROOT / "benchmarks" / "README.md").read_text(), "benchmarks"),
        "cli.md": _cli_page(),
    }
    for notebook in sorted((ROOT / "notebooks").glob("[0-9]*.py")):
        pages[f"notebooks/{notebook.stem}.md"] = _notebook_page(notebook)
    for name, content in pages.items():
        files.append(File.generated(config, name, content=content))
    return files


def _notebook_page(path: Path) -> str:
    """A notebook's markdown and code cells as a page (not executed: run it for the outputs)."""
    import jupytext

    notebook = jupytext.reads(path.read_text(), fmt="py:percent")
    out = []
    for cell in notebook.cells:
        if cell.cell_type == "markdown":
            out.append(_relink(cell.source, "notebooks"))
        elif cell.source.strip():
            out.append(f"```python\n{cell.source.rstrip()}\n```")
    note = (
        f"*The notebook `notebooks/{path.name}` (jupytext; `make notebooks` writes the `.ipynb`), shown "
        "without its outputs: run it in Jupyter to see them.*"
    )
    return "\n\n".join([out[0], note, *out[1:]]) + "\n" if out else note + "\n"


def _documented_modules() -> set[str]:
    """The modules the API reference renders (``::: module`` lines of api.md)."""
    text = (ROOT / "docs" / "api.md").read_text()
    return set(re.findall(r"^::: (attnlab[\w.]*)", text, flags=re.M))


def _api_target(name: str, modules: set[str]) -> str | None:
    """The API reference entry for ``attnlab.x.Y[.z]``: the object (or, for a member of a class,
    the class) when its module is rendered there and the name is public; else None."""
    import importlib

    parts = name.split(".")
    for cut in range(len(parts), 0, -1):
        module = ".".join(parts[:cut])
        if module in modules:
            rest = parts[cut:]
            if not rest:
                return module
            try:
                obj = importlib.import_module(module)
            except ImportError:
                return None
            if not hasattr(obj, rest[0]) or rest[0].startswith("_"):
                return None
            owner = getattr(obj, rest[0])
            if getattr(owner, "__module__", module) != module:  # (re-exported: documented where it is defined)
                return _api_target(f"{owner.__module__}.{rest[0]}", modules) if hasattr(owner, "__module__") else None
            return f"{module}.{rest[0]}"
    return None


def on_page_markdown(markdown, page, config, files):
    """On the equations page, each `attnlab.…` name becomes a link to the API reference."""
    if page.file.src_uri != "equations.md":
        return markdown
    modules = _documented_modules()

    def link(m: re.Match) -> str:
        target = _api_target(m.group(1), modules)
        return f"[`{m.group(1)}`][{target}]" if target else m.group(0)

    return re.sub(r"(?<!\[)`(attnlab\.[\w.]+)`", link, markdown)


def on_page_content(html, page, config, files):
    """The docstrings use reStructuredText roles (``:func:`x```) and ``::`` before code blocks:
    on the site the role names and the second colon go."""
    html = re.sub(r":(?:class|func|mod|meth|attr|data|exc|obj):(<code)", r"\1", html)
    return html.replace("::</p>", ":</p>")
