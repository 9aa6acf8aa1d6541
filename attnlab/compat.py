"""The one table of old names that keep working: modules of attnlab 0.1 that moved. ``import
attnlab.batching`` gives :mod:`attnlab.generate.batching` itself (the same module object, so a
class is one class under both names), served by a finder on ``sys.meta_path`` that ``import
attnlab`` installs. (Old run folders are read through the configs' own tables of old field names,
``Config.ALIASES``.)"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.util
import sys
from typing import Callable

# old module -> the module it is now
OLD_MODULES = {
    "attnlab.batching": "attnlab.generate.batching",
    "attnlab.decode": "attnlab.generate.beam",
    "attnlab.fast_decode": "attnlab.generate.fast",
    "attnlab.quantize": "attnlab.generate.quantize",
}


class OldModuleNames(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Imports an old module name (:data:`OLD_MODULES`) as the module it is now."""

    def find_spec(self, fullname, path, target=None):
        return importlib.util.spec_from_loader(fullname, self) if fullname in OLD_MODULES else None

    def create_module(self, spec):
        return importlib.import_module(OLD_MODULES[spec.name])

    def exec_module(self, module) -> None:
        """(the module is the one it names, already run)"""


def install() -> None:
    """Serve the old names (once)."""
    if not any(isinstance(f, OldModuleNames) for f in sys.meta_path):
        sys.meta_path.append(OldModuleNames())


def lazy_names(package: str, names: dict[str, str]) -> Callable[[str], object]:
    """A package's ``__getattr__`` (PEP 562) for its public ``names`` (name -> the submodule
    defining it, relative: ".gpt", or ".shards:prepare" where its name there differs): each is
    imported on first use. Importing a package for one light module in it (the models' configs,
    the trainer's options) so imports no torch."""

    def __getattr__(name: str) -> object:
        if name not in names:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        module, _, attribute = names[name].partition(":")
        value = getattr(importlib.import_module(module, package), attribute or name)
        setattr(sys.modules[package], name, value)  # (looked up once)
        return value

    return __getattr__
