"""The shape of the code base: the package in layers, each importing only from its own layer and
those below it (every import, inside functions too), the command line on top, no circle of imports,
no private name imported across modules, and the Python API complete without the command line."""

import ast
import re
from pathlib import Path

import attnlab

ROOT = Path(attnlab.__file__).parent


def _modules() -> dict[str, ast.Module]:
    out = {}
    for f in ROOT.rglob("*.py"):
        parts = f.relative_to(ROOT.parent).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        out[name] = (ast.parse(f.read_text()), f.name == "__init__.py")
    return out


def _imports(name: str, tree: ast.Module, is_pkg: bool, top_level_only: bool):
    """(imported module, imported names, line) of every import in ``tree``."""
    package = name if is_pkg else name.rpartition(".")[0]
    nodes = tree.body if top_level_only else list(ast.walk(tree))
    for node in nodes:
        if isinstance(node, ast.Import):
            for a in node.names:
                yield a.name, [], node.lineno
        elif isinstance(node, ast.ImportFrom):
            base = package
            for _ in range(node.level - 1):
                base = base.rpartition(".")[0]
            mod = f"{base}.{node.module}" if node.level and node.module else (base if node.level else node.module)
            yield mod, [a.name for a in node.names], node.lineno


def _in_cli(name: str) -> bool:
    return name in ("attnlab.cli", "attnlab.__main__") or name.startswith("attnlab.cli.")


def test_nothing_below_the_command_line_imports_it():
    for name, (tree, is_pkg) in _modules().items():
        if _in_cli(name):
            continue
        for mod, names, line in _imports(name, tree, is_pkg, top_level_only=False):
            assert not _in_cli(mod) and not (mod == "attnlab" and "cli" in names), f"{name}:{line} imports the CLI"


def test_no_argparse_anywhere_and_cyclopts_in_the_command_line_only():
    """Options are declared as data (attnlab.options); cyclopts, a maintained library, makes the
    command line from them in attnlab.cli alone, and no module parses arguments by hand."""
    for name, (tree, is_pkg) in _modules().items():
        for mod, _, line in _imports(name, tree, is_pkg, top_level_only=False):
            assert mod != "argparse", f"{name}:{line} imports argparse"
            assert _in_cli(name) or not (mod or "").startswith("cyclopts"), f"{name}:{line} imports cyclopts"


def test_no_circle_of_module_level_imports():
    mods = _modules()
    graph = {}
    for name, (tree, is_pkg) in mods.items():
        deps = set()
        for mod, names, _ in _imports(name, tree, is_pkg, top_level_only=True):
            # `from . import sub` needs the submodule sub, not the rest of the package
            subs = [f"{mod}.{n}" for n in names if f"{mod}.{n}" in mods]
            for target in subs if subs and len(subs) == len(names) else [mod, *subs]:
                if target in mods and target != name:
                    deps.add(target)
        graph[name] = deps
    seen, stack = set(), []

    def visit(n):
        if n in stack:
            raise AssertionError("import circle: " + " -> ".join(stack[stack.index(n) :] + [n]))
        if n in seen:
            return
        stack.append(n)
        for d in graph[n]:
            visit(d)
        stack.pop()
        seen.add(n)

    for n in graph:
        visit(n)


def test_no_private_name_is_imported_from_another_module():
    for name, (tree, is_pkg) in _modules().items():
        for mod, names, line in _imports(name, tree, is_pkg, top_level_only=False):
            private = [n for n in names if n.startswith("_") and not n.startswith("__")]
            assert not private, f"{name}:{line} imports {private} from {mod}"


# The package's layers, lowest first (docs/layout.md says what each holds). A unit is a top-level
# module or subpackage of attnlab; "attnlab" is the package's own __init__ (the public names).
LAYERS = [
    # what every layer uses: errors, option declarations and checks, configs, files on disk, figures
    {
        "errors",
        "outputs",
        "syncs",
        "config",
        "options",
        "runoptions",
        "checkpoint",
        "hub",
        "figures",
        "compat",
        "__version__",
    },
    {"tokens", "attention", "position", "blocks", "hooks", "losses"},  # the model core
    {"models"},  # the models, built from the core
    # what is done with a model: data in, training, generation and decoding, conversion
    {"data", "training", "generate", "interop"},
    {"inspect"},  # looking inside a model
    {"recipes"},  # the families: a model, its data, its training, its verbs
    {"api", "sae", "serve", "experiments", "bench"},  # applications of the families
    {"cli", "__main__", "attnlab"},  # the command line and the package's public names
]


def _unit(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "attnlab"


def test_every_import_runs_down_the_layers():
    """No import, at the top of a module or inside a function, reaches a higher layer."""
    layer = {unit: i for i, units in enumerate(LAYERS) for unit in units}
    mods = _modules()
    units = {_unit(name) for name in mods}
    assert units <= set(layer), f"units in no layer: {sorted(units - set(layer))} (add them to LAYERS and layout.md)"
    upward = []
    for name, (tree, is_pkg) in mods.items():
        for mod, names, line in _imports(name, tree, is_pkg, top_level_only=False):
            if not mod or not mod.startswith("attnlab"):
                continue
            # `from . import sub` / `from .. import name`: the submodule's unit when it is one
            targets = [f"{mod}.{n}" for n in names if f"{mod}.{n}" in mods or n == "__version__"] or [mod]
            for target in targets:
                if layer[_unit(target)] > layer[_unit(name)]:
                    upward.append(f"{name}:{line} imports {target}")
    assert not upward, "imports up a layer:\n" + "\n".join(upward)


def test_the_docs_extra_holds_what_the_site_build_imports():
    """`pip install '.[docs]'` then `mkdocs build` works: every package docs/hooks.py imports (but
    attnlab and the standard library) is in the docs extra (jupytext was not)."""
    import sys
    import tomllib

    root = ROOT.parent
    extra = tomllib.loads((root / "pyproject.toml").read_text())["project"]["optional-dependencies"]["docs"]
    declared = {re.split(r"[<>=\[ ]", r, maxsplit=1)[0].lower().replace("-", "_") for r in extra}
    tree = ast.parse((root / "docs" / "hooks.py").read_text())
    imported = {m.split(".")[0] for m, _, _ in _imports("docs.hooks", tree, False, top_level_only=False) if m}
    third_party = {m for m in imported if m not in sys.stdlib_module_names and m not in ("attnlab", "docs")}
    assert third_party and third_party <= declared, f"docs/hooks.py imports {sorted(third_party - declared)}"


def test_the_generation_modules_old_names_import_the_same_modules():
    """Generation lives together in attnlab.generate; the old top-level module names (docs and user
    code of 0.1 import them) give the same module objects, so a class is one class under both: one
    table (attnlab.compat.OLD_MODULES), served in a fresh interpreter too, where nothing was imported."""
    import importlib
    import subprocess
    import sys

    from attnlab.compat import OLD_MODULES

    moved = {"fast_decode": "fast", "batching": "batching", "decode": "beam", "quantize": "quantize"}
    assert OLD_MODULES == {f"attnlab.{old}": f"attnlab.generate.{new}" for old, new in moved.items()}
    for old, new in OLD_MODULES.items():
        assert importlib.import_module(old) is importlib.import_module(new)
        assert not (ROOT / f"{old.split('.')[1]}.py").exists()  # (no module file: the table is the one place)
    code = "import attnlab.fast_decode as a, attnlab.generate.fast as b; from attnlab.decode import beam_search; print(a is b)"
    assert subprocess.run([sys.executable, "-c", code], capture_output=True, text=True).stdout.strip() == "True"
    from attnlab.batching import ContinuousBatcher
    from attnlab.generate.batching import ContinuousBatcher as same

    assert ContinuousBatcher is same
