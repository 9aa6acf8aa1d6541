"""Where data comes from: the data directory (``--data-dir`` or ``ATTNLAB_DATA``), a cache of
downloads checked against SHA-256, or what ships with the installation."""

from __future__ import annotations

import hashlib
import os
import tempfile
import urllib.request
from dataclasses import dataclass
from pathlib import Path

from ..errors import DataError


@dataclass(frozen=True)
class RemoteFile:
    relpath: str  # path inside the data directory / cache
    url: str
    sha256: str


# Files a named dataset needs; the relative paths match ../shared/data's layout.
NAMED: dict[str, list[RemoteFile]] = {
    "shakespeare": [
        RemoteFile(
            "tinyshakespeare/input.txt",
            "https://raw.githubusercontent.com/karpathy/char-rnn/master/data/tinyshakespeare/input.txt",
            "86c4e6aa9db7c042ec79f339dcb96d42b0075e16b8fc2e86bf0ca57e2dc565ed",
        )
    ],
}


def data_dir(explicit: str | os.PathLike | None = None) -> Path | None:
    d = explicit or os.environ.get("ATTNLAB_DATA")
    return Path(d).expanduser() if d else None


def cache_dir() -> Path:
    base = os.environ.get("ATTNLAB_CACHE") or os.path.join(os.environ.get("XDG_CACHE_HOME", "~/.cache"), "attnlab")
    return Path(base).expanduser()


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def download(rf: RemoteFile, dest: Path) -> Path:
    """Download to a temp file, check the SHA-256, then rename into place (never a partial file)."""
    dest.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=dest.parent, prefix=dest.name + ".part-")
    os.close(fd)
    try:
        try:
            urllib.request.urlretrieve(rf.url, tmp)
        except OSError as e:
            raise DataError(
                f"could not download {rf.url} ({e}); put the file at <data dir>/{rf.relpath} and set ATTNLAB_DATA"
            ) from None
        got = sha256_file(Path(tmp))
        if got != rf.sha256:
            raise DataError(f"download of {rf.url} has SHA-256 {got}, expected {rf.sha256}; try again later")
        os.replace(tmp, dest)
    finally:
        if os.path.exists(tmp):
            os.remove(tmp)
    return dest


def resolve(name: str, explicit_dir=None, allow_download: bool = True) -> list[Path]:
    """Local paths of a named dataset's files: data directory first, then the download cache."""
    out = []
    for rf in NAMED[name]:
        d = data_dir(explicit_dir)
        if d is not None and (d / rf.relpath).is_file():
            out.append(d / rf.relpath)
            continue
        cached = cache_dir() / rf.relpath
        if cached.is_file() and sha256_file(cached) == rf.sha256:
            out.append(cached)
            continue
        if not allow_download:
            raise DataError(f"{rf.relpath} not found; set ATTNLAB_DATA to a folder that holds it")
        out.append(download(rf, cached))
    return out
