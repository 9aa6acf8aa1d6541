"""Where a command writes: the file ``--out`` names, checked before any work is done."""

from __future__ import annotations

import tempfile
from pathlib import Path

from .errors import OptionError


def is_path(value) -> bool:
    """A non-empty string or a Path (True, a number or a list is not a path to anyone)."""
    return isinstance(value, (str, Path)) and bool(str(value).strip())


def output_file(path: str | Path, suffix: str, option: str = "--out", also: tuple[str, ...] = ()) -> Path:
    """The file to write for ``option path``: ``path`` itself when it ends in ``suffix`` (or one of
    ``also``: ``.htm`` beside ``.html``), or with ``suffix`` added when it has none (the command's
    "wrote ..." line then names it). Refused, in one line and before any work: a directory,
    another suffix (a PNG under a .txt name), a folder that cannot be written."""
    if not is_path(path):
        raise OptionError(f"{option} {path!r}: give a file name ending in {suffix}")
    p = Path(path)
    if p.is_dir():
        raise OptionError(f"{option} {p} is a folder; give a file name ending in {suffix}")
    if not p.suffix:
        p = p.with_suffix(suffix)
    elif p.suffix.lower() not in (suffix, *also):
        raise OptionError(f"{option} {p} should end in {suffix}: that is the kind of file written there")
    folder = p.parent
    existing = next((f for f in (folder, *folder.parents) if f.exists()), Path("."))
    if not existing.is_dir() or not _can_create_in(existing):
        raise OptionError(f"{option} {p}: {existing} is not a folder this user can write to; choose another path")
    return p


def _can_create_in(folder: Path) -> bool:
    """Whether a file can be created in ``folder`` (tried: permission bits do not tell for root, /proc)."""
    try:
        with tempfile.NamedTemporaryFile(dir=folder, prefix=".attnlab-probe-"):
            return True
    except OSError:
        return False


def atomic_write_text(path: str | Path, text: str) -> Path:
    """Write ``text`` to ``path`` whole or not at all: a temporary file beside it, renamed over it
    (a kill mid-write leaves the old file, never half of the new one)."""
    import os

    path = Path(path)
    tmp = path.with_name(f".{path.name}.tmp{os.getpid()}")
    tmp.write_text(text, encoding="utf-8")
    os.replace(tmp, path)
    return path
