"""Where data comes from: the data directory (``--data-dir`` or ``ATTNLAB_DATA``), a cache of
downloads checked against SHA-256, or what ships with the installation."""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass
from pathlib import Path

from ..errors import DataError


# the synthetic sequence tasks generated from a seed (attnlab.data.parallel makes them; no file)
SYNTHETIC = ("copy", "reverse", "sort", "addition", "dates", "reorder")


@dataclass(frozen=True)
class RemoteFile:
    relpath: str  # path inside the data directory / cache
    url: str
    sha256: str | None = None
    md5: str | None = None  # where only the publisher's MD5 is known

    def check(self, path: Path) -> str | None:
        """None when the file matches its checksum, else what was found."""
        got = file_digest(path, "sha256" if self.sha256 else "md5")
        return None if got == (self.sha256 or self.md5) else got


# Files a named dataset needs; the relative paths match ../shared/data's layout.
NAMED: dict[str, list[RemoteFile]] = {
    "shakespeare": [
        RemoteFile(
            "tinyshakespeare/input.txt",
            "https://raw.githubusercontent.com/karpathy/char-rnn/master/data/tinyshakespeare/input.txt",
            "86c4e6aa9db7c042ec79f339dcb96d42b0075e16b8fc2e86bf0ca57e2dc565ed",
        )
    ],
    "mnist": [
        RemoteFile(
            "mnist/t10k-images-idx3-ubyte.gz",
            "https://ossci-datasets.s3.amazonaws.com/mnist/t10k-images-idx3-ubyte.gz",
            "8d422c7b0a1c1c79245a5bcf07fe86e33eeafee792b84584aec276f5a2dbc4e6",
        ),
        RemoteFile(
            "mnist/t10k-labels-idx1-ubyte.gz",
            "https://ossci-datasets.s3.amazonaws.com/mnist/t10k-labels-idx1-ubyte.gz",
            "f7ae60f92e00ec6debd23a6088c31dbd2371eca3ffa0defaefb259924204aec6",
        ),
    ],
    # Multi30k task 1, raw (cased, untokenised) files, pinned to a commit of multi30k/dataset
    "multi30k": [
        RemoteFile(
            f"multi30k/{name}",
            f"https://raw.githubusercontent.com/multi30k/dataset/"
            f"a3d2e0d26b56f3846f66a952536ffed4e401d05a/data/task1/raw/{name}",
            sha,
        )
        for name, sha in [
            ("train.de.gz", "726e39b2fa9eb9ffb6dc763fb35a179f80fae06ffc5d28b6ace5faa883de28a6"),
            ("train.en.gz", "d79cfa999dd4c51d2cb42499b6796d5a882c3a8a961923c25a898c90f8bbd56f"),
            ("val.de.gz", "f0cba2f995189cf5770f29a8a9a537a3ad3f51657ad873405082ff6863a5e75a"),
            ("val.en.gz", "14f7d25ddd868909a9213e361768460edcacdd6ab9d1e77b92560dc10c10dc28"),
            ("test_2016_flickr.de.gz", "9204244e408ccb38d2a55cfcd344df15005fc42a07a6e55ca6c52b6ababb8cc8"),
            ("test_2016_flickr.en.gz", "611d361c6334bc7246101d48097c13cf5c4413c5befc793cc629934359d532d9"),
        ]
    ],
    "cifar10": [
        RemoteFile(
            "cifar-10-python.tar.gz",
            "https://www.cs.toronto.edu/~kriz/cifar-10-python.tar.gz",
            md5="c58f30108f718f92721af3b95e74349a",
        )
    ],
}


def data_dir(explicit: str | os.PathLike | None = None) -> Path | None:
    d = explicit or os.environ.get("ATTNLAB_DATA")
    return Path(d).expanduser() if d else None


def cache_dir() -> Path:
    base = os.environ.get("ATTNLAB_CACHE") or os.path.join(os.environ.get("XDG_CACHE_HOME", "~/.cache"), "attnlab")
    return Path(base).expanduser()


def file_digest(path: Path, algorithm: str = "sha256") -> str:
    h = hashlib.new(algorithm)
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def download(rf: RemoteFile, dest: Path) -> Path:
    """Download to a temp file, check the SHA-256, then rename into place (never a partial file)."""
    import tempfile
    import urllib.request

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
        got = rf.check(Path(tmp))
        if got is not None:
            raise DataError(f"download of {rf.url} has checksum {got}, expected {rf.sha256 or rf.md5}; try again later")
        os.replace(tmp, dest)
    finally:
        if os.path.exists(tmp):
            os.remove(tmp)
    return dest


def verify_local(rf: RemoteFile, path: Path) -> Path:
    """Check a file found in the data directory against its published checksum, as downloads
    are. The result is remembered by path, size and modification time (``<cache>/verified.json``)
    so each file is hashed once. ``ATTNLAB_TRUST_DATA=1`` skips the check (a file you changed)."""
    if os.environ.get("ATTNLAB_TRUST_DATA") == "1":
        return path
    st = path.stat()
    key = f"{path.resolve()}:{st.st_size}:{st.st_mtime_ns}"
    memo = cache_dir() / "verified.json"
    try:
        seen = json.loads(memo.read_text())
    except (OSError, ValueError):
        seen = {}
    if seen.get(key) == (rf.sha256 or rf.md5):
        return path
    got = rf.check(path)
    if got is not None:
        raise DataError(
            f"{path} has checksum {got}, not the published {rf.sha256 or rf.md5}: it is another or a "
            "damaged copy; replace it (or set ATTNLAB_TRUST_DATA=1 to use it anyway)"
        )
    seen[key] = rf.sha256 or rf.md5
    try:
        memo.parent.mkdir(parents=True, exist_ok=True)
        tmp = memo.with_name(f"verified.json.{os.getpid()}")
        tmp.write_text(json.dumps(seen))
        os.replace(tmp, memo)
    except OSError:
        pass  # a read-only cache only costs hashing again next time
    return path


def resolve(name: str, explicit_dir=None, allow_download: bool = True) -> list[Path]:
    """Local paths of a named dataset's files: data directory first, then the download cache."""
    out = []
    for rf in NAMED[name]:
        d = data_dir(explicit_dir)
        if d is not None and (d / rf.relpath).is_file():
            out.append(verify_local(rf, d / rf.relpath))
            continue
        cached = cache_dir() / rf.relpath
        if cached.is_file() and rf.check(cached) is None:
            out.append(cached)
            continue
        if not allow_download:
            raise DataError(f"{rf.relpath} not found; set ATTNLAB_DATA to a folder that holds it")
        out.append(download(rf, cached))
    return out
