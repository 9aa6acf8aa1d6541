"""Where data comes from: the data directory (``--data-dir`` or ``ATTNLAB_DATA``), a cache of
downloads checked against SHA-256 (the user cache folder, ``ATTNLAB_CACHE`` to move it), or what
ships with the installation. :func:`get` fetches a named dataset (``attnlab data get``): resumable,
each file checked, and where there is no network, which file to put where with its checksum."""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from ..errors import DataError


# the synthetic sequence tasks generated from a seed (attnlab.data.parallel makes them; no file)
SYNTHETIC = ("copy", "reverse", "sort", "addition", "dates", "reorder")


@dataclass(frozen=True)
class RemoteFile:
    relpath: str  # path inside the data directory / cache
    url: str
    sha256: str | None = None
    md5: str | None = None  # where only the publisher's MD5 is known
    # a file made from what ``url`` serves: the published file's SHA-256, and how this one is made from it
    source_sha256: str | None = None
    derive: Callable[[bytes], bytes] | None = None

    @property
    def checksum(self) -> str:
        return f"sha256 {self.sha256}" if self.sha256 else f"md5 {self.md5}"

    def check(self, path: Path) -> str | None:
        """None when the file matches its checksum, else what was found."""
        got = file_digest(path, "sha256" if self.sha256 else "md5")
        return None if got == (self.sha256 or self.md5) else got

    def source_path(self, dest: Path) -> Path:
        """Where the published file a derived one is made from is kept (beside its folder, so that a
        reader of the folder does not take it for the derived file)."""
        return dest.parent / "published" / self.url.rsplit("/", 1)[-1]


@dataclass(frozen=True)
class Dataset:
    """A named dataset: what it is, which command reads it, where it comes from."""

    about: str
    kind: str  # text | images | pairs | captions: the ``--data`` of which trainer it is
    use: str  # a command that reads it
    source: str  # its publisher and licence, in a few words


def _coco_subset(published: bytes) -> bytes:
    """COCO-MINI's val2017 captions, kept to the images whose licence allows redistribution (CC BY 2.0,
    id 4; CC BY-SA 2.0, id 5), sorted by id, as ``../shared/data/coco_captions_mini`` holds them."""
    coco = json.loads(published)
    keep = {4, 5}
    images = sorted((i for i in coco["images"] if i["license"] in keep), key=lambda i: i["id"])
    ids = {i["id"] for i in images}
    subset = {
        "info": coco["info"],
        "licenses": sorted((x for x in coco["licenses"] if x["id"] in keep), key=lambda x: x["id"]),
        "images": images,
        "annotations": sorted((a for a in coco["annotations"] if a["image_id"] in ids), key=lambda a: a["id"]),
    }
    return json.dumps(subset, indent=1).encode()


_COCO_MINI = "https://raw.githubusercontent.com/Obmutescence/COCO-MINI/644f29e7c1d2eefd9c4412d39bc5b0ee6fd0afd4"
_COCO_IMAGES = [
    ("000000062554", "2b9444ef969f3b95e53ba3e78ddd329c41c03fbc3c8e7e07034cdd6cb8bc9f41"),
    ("000000099053", "a4e8405077a8f93115116f548e7d59b29a092a6ac2f749732a525e7b82c2f35a"),
    ("000000126107", "deb91b4988babf28cc289521d785b3f4c4e3ae03c50f946ec5a8420484b514d3"),
    ("000000160012", "b660ce7ce72dcfa459181967524c53f9360318652c0014790da9fa096ccf1ae2"),
    ("000000165518", "733bdae7be5bccea44a0e4b6e6f079d9da9439f94d721db53694e3c01eb70f47"),
    ("000000183709", "89dabb8b6940b9c08d005d03f0a22573eea72896f8314fbb0d4c128a99c261a1"),
    ("000000205401", "19878c6e51fa8bcfc1205bbd2ecc506e436fd3ca7c6b57e06fb84bb885ad0491"),
    ("000000214753", "cbf50318249d78406eeee4f1e91693acc0f8e05dc9e745632354369caae57777"),
    ("000000229358", "2c8d100ab71de8b3ef22f3d0999aec2174bf10a911712e1d7bb3de1e2def6eb7"),
    ("000000229997", "9c62105390761ac4adf9cb96e80652b55f64866c897cb5d6b3de405fe92db5f8"),
    ("000000255165", "f7e0fd0c8f9c0bd753be75b504f0e41e3b3109259107bf7a8f27c7c950bccbe7"),
    ("000000349860", "f07d8b177d8f2b0a9fa4dd06eaec034e5c52adec952caeb504eb794edf963da7"),
    ("000000359219", "621420fd7414fed8900286441c019ea1c8fd7ba9a6793b7139096baee01ca319"),
    ("000000377575", "18d7b9ea545f1561bb844213652194047a19fff86ff6e23a2bd7d10262bd72f3"),
    ("000000397133", "09e1d25c75f7879bdaa69c327fece5cabacd53939c8c2ef9e87f1c97a2e478c4"),
    ("000000403353", "6c775b14fadf4e5ca3fc236117ce0aece4dc1503c8264e54b32578ab36592b18"),
    ("000000423617", "ce5546bb400da57646e0de544763fc44c925fc5495e764083f2bcfebba5c76f0"),
    ("000000434204", "b0580bb47eee47184ec9aeef06ff9c7fd9e4b17c1187343069245d3e425e9744"),
    ("000000460229", "af84abd8715c5acb599da83f03174ca57bd0974ce00b6aa581c45bf7f92b6c8c"),
    ("000000475678", "90536452d9eab598526aca535f1e7894e1668b05ea51c32738b37d2c260f3753"),
    ("000000519208", "251ea96f960403b82085683813326671034e3dfa5171887bd155fb14528a9534"),
    ("000000551780", "3d4490937783d48c381caf35e9901cb099ef4bf5a9d1bbd36db9b11ab7ebcb5e"),
    ("000000553664", "69d32a91d82468a3c3140cc844586f1fe790d780afa7b44fc2391f2082de7f18"),
    ("000000557172", "71201f7f2e82854eaa174837e88217c4b3c6a3b01c54e23671ea31b4dbdad508"),
    ("000000568290", "116519cb932504866058215a0cca5e5d03b4af04a71e540db38c5caefb8d4725"),
]

# Files a named dataset needs; the relative paths are the data directory's layout (../shared/data's).
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
    "coco-mini": [
        RemoteFile(
            "coco_captions_mini/captions_val2017_subset.json",
            f"{_COCO_MINI}/annotations/captions_val2017.json",
            "f6ecaf0aadd7c5136e03e30c89c417097ddb6d43eb6f9e1971471b556deaa92d",
            source_sha256="1e7ca2a0d0ebe94d60ada0747bf9ba0accac281785dfdba771b2d47b0b11e135",
            derive=_coco_subset,
        ),
        *(
            RemoteFile(f"coco_captions_mini/val2017/{n}.jpg", f"{_COCO_MINI}/val2017/{n}.jpg", sha)
            for n, sha in _COCO_IMAGES
        ),
    ],
    "cifar10": [
        RemoteFile(
            "cifar-10-python.tar.gz",
            "https://www.cs.toronto.edu/~kriz/cifar-10-python.tar.gz",
            md5="c58f30108f718f92721af3b95e74349a",
        )
    ],
}


DATASETS: dict[str, Dataset] = {
    "shakespeare": Dataset(
        "Tiny Shakespeare: 1.1 MB of plays (char-rnn, nanoGPT)",
        "text",
        "attnlab train gpt --data shakespeare",
        "karpathy/char-rnn, MIT; the text is in the public domain",
    ),
    "mnist": Dataset(
        "MNIST's 10,000 test digits, 28x28 (1.7 MB)",
        "images",
        "attnlab train vit --data mnist",
        "LeCun and Cortes, CC BY-SA 3.0",
    ),
    "multi30k": Dataset(
        "Multi30k: 31,014 English-German sentence pairs (1.3 MB)",
        "pairs",
        "attnlab train seq2seq --data multi30k",
        "multi30k/dataset (Elliott et al. 2016), research and education",
    ),
    "coco-mini": Dataset(
        "25 COCO photos, 5 captions each, CC BY/BY-SA (4 MB)",
        "captions",
        "attnlab train caption --data coco-mini",
        "Obmutescence/COCO-MINI; captions CC BY 4.0, each photo its Flickr licence",
    ),
    "cifar10": Dataset(
        "CIFAR-10: 60,000 colour images, 32x32 (170 MB)",
        "images",
        "attnlab train vit --data cifar10",
        "Krizhevsky 2009 (www.cs.toronto.edu/~kriz/cifar.html)",
    ),
}


def named(kind: str) -> list[str]:
    """The named datasets of one kind (``text``, ``images``, ``pairs``, ``captions``)."""
    return [name for name, d in DATASETS.items() if d.kind == kind and name in NAMED]


def data_dir(explicit: str | os.PathLike | None = None) -> Path | None:
    d = explicit or os.environ.get("ATTNLAB_DATA")
    return Path(d).expanduser() if d else None


def cache_dir() -> Path:
    """Where downloads go when no data folder is set: ``ATTNLAB_CACHE``, else the user's cache folder
    (``~/.cache/attnlab`` on Linux, ``~/Library/Caches/attnlab`` on macOS, ``%LOCALAPPDATA%`` on Windows)."""
    if os.environ.get("ATTNLAB_CACHE"):
        return Path(os.environ["ATTNLAB_CACHE"]).expanduser()
    import platformdirs

    return Path(platformdirs.user_cache_dir("attnlab", appauthor=False))


def destination(explicit: str | os.PathLike | None = None) -> Path:
    """The folder a download is written to: the data folder when one is set, else the cache."""
    return data_dir(explicit) or cache_dir()


def where_looked(explicit: str | os.PathLike | None = None) -> str:
    """The folders a named dataset is looked for in, and whether each exists (for error messages)."""
    d = data_dir(explicit)
    origin = "--data-dir" if explicit else "ATTNLAB_DATA"
    first = (
        "no data folder (ATTNLAB_DATA is not set)"
        if d is None
        else f"the data folder {d} ({origin}{'' if d.is_dir() else ', which does not exist'})"
    )
    c = cache_dir()
    return f"{first} and the download cache {c}{'' if c.is_dir() else ' (not made yet)'}"


def file_digest(path: Path, algorithm: str = "sha256") -> str:
    h = hashlib.new(algorithm)
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


class DataMissing(DataError):
    """Files that could not be downloaded: ``missing`` lists (url, path to put it at, checksum)."""

    def __init__(self, message: str, missing: list[tuple[str, Path, str]]):
        super().__init__(message)
        self.missing = missing


Progress = Callable[[str, int, "int | None"], None]  # (file, bytes so far, bytes in all when known)


def _download(url: str, target: Path, expected: str, algorithm: str, progress: Progress | None) -> None:
    """``url`` to ``target`` through ``target.part``, which a later call resumes (an HTTP range
    request); renamed into place only once its checksum is the published one."""
    import urllib.error
    import urllib.request

    target.parent.mkdir(parents=True, exist_ok=True)
    part = target.with_name(target.name + ".part")
    have = part.stat().st_size if part.is_file() else 0
    request = urllib.request.Request(url, headers={"Range": f"bytes={have}-"} if have else {})
    try:
        with urllib.request.urlopen(request, timeout=60) as response:
            resumed = have and getattr(response, "status", None) == 206
            length = response.headers.get("Content-Length")
            total = (int(length) + (have if resumed else 0)) if length and length.isdigit() else None
            done = have if resumed else 0
            with open(part, "ab" if resumed else "wb") as f:
                for chunk in iter(lambda: response.read(1 << 20), b""):
                    f.write(chunk)
                    done += len(chunk)
                    if progress is not None:
                        progress(target.name, done, total)
    except urllib.error.HTTPError as e:
        if not (e.code == 416 and have):  # (416 to a range: the part file is already whole)
            raise DataMissing(
                f"{url} answered {e.code} {e.reason}", [(url, target, f"{algorithm} {expected}")]
            ) from None
    except (OSError, ValueError) as e:  # (no network, refused, timed out; a malformed URL)
        reason = getattr(e, "reason", None) or e
        raise DataMissing(f"could not download {url} ({reason})", [(url, target, f"{algorithm} {expected}")]) from None
    got = file_digest(part, algorithm)
    if got != expected:
        part.unlink()
        raise DataError(
            f"{url} sent a file with {algorithm} {got}, not the published {expected} (deleted); run the command "
            f"again, or put the right file at {target} yourself"
        )
    os.replace(part, target)


def fetch(rf: RemoteFile, root: Path, mirror: str | None = None, progress: Progress | None = None) -> Path:
    """``rf`` into ``root`` (checked; resumed where an earlier try stopped). ``mirror``: a URL laid out
    like the data folder (``file:///srv/attnlab-data``, a teacher's server), read in place of the
    publisher's. A file made from a published one (the COCO subset) is made from the published file,
    which is kept, so it can be put there by hand too."""
    dest = root / rf.relpath
    derived = rf.derive is not None and not mirror
    url = f"{mirror.rstrip('/')}/{rf.relpath}" if mirror else rf.url
    target = rf.source_path(dest) if derived else dest
    algorithm = "sha256" if (derived or rf.sha256) else "md5"
    expected = str(rf.source_sha256 if derived else (rf.sha256 or rf.md5))
    if not (target.is_file() and file_digest(target, algorithm) == expected):  # (else: put there by hand)
        _download(url, target, expected, algorithm, progress)
    if derived:
        assert rf.derive is not None
        made = dest.with_name(dest.name + ".part")
        made.write_bytes(rf.derive(target.read_bytes()))
        if rf.check(made) is not None:
            made.unlink()
            raise DataError(f"{dest} made from {target} does not have the published {rf.checksum}; please report it")
        os.replace(made, dest)
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


def find(rf: RemoteFile, explicit_dir=None) -> Path | None:
    """``rf``'s checked copy in the data folder, else in the cache; None when neither holds it."""
    d = data_dir(explicit_dir)
    if d is not None and (d / rf.relpath).is_file():
        return verify_local(rf, d / rf.relpath)
    cached = cache_dir() / rf.relpath
    if cached.is_file() and rf.check(cached) is None:
        return cached
    return None


def files_of(name: str) -> list[RemoteFile]:
    """The files of the named dataset (a DataError naming the known ones for another name)."""
    if name not in NAMED:
        raise DataError(f"no dataset named {name!r}; one of {', '.join(NAMED)} (attnlab data list)")
    return NAMED[name]


def resolve(name: str, explicit_dir=None, allow_download: bool = True) -> list[Path]:
    """Local paths of a named dataset's files: data folder first, then the download cache, then a
    checked download into the data folder when one is set, else into the cache."""
    out = []
    for rf in files_of(name):
        found = find(rf, explicit_dir)
        if found is None and not allow_download:
            raise DataError(f"{rf.relpath} is not in {where_looked(explicit_dir)}; run: attnlab data get {name}")
        if found is None:
            try:
                found = fetch(rf, destination(explicit_dir), os.environ.get("ATTNLAB_DATA_MIRROR"))
            except DataMissing as e:
                raise DataError(
                    f"{rf.relpath} is not in {where_looked(explicit_dir)}, and {e}; run `attnlab data get {name}` "
                    "to see which file to put where"
                ) from None
        out.append(found)
    return out


@dataclass(frozen=True)
class Held:
    """How much of a named dataset this machine holds, and where."""

    name: str
    present: int
    files: int
    folder: Path | None  # where the first file found is (None: none is)


def held(name: str, explicit_dir=None) -> Held:
    """Which of ``name``'s files are here (checked against their checksums, as a load would)."""
    files = files_of(name)
    found = []
    for rf in files:
        try:
            found.append(find(rf, explicit_dir))
        except DataError:  # (a damaged copy counts as missing)
            found.append(None)
    first = next((p for p in found if p is not None), None)
    return Held(name, sum(p is not None for p in found), len(files), first.parent if first is not None else None)


def get(name: str, explicit_dir=None, mirror: str | None = None, progress: Progress | None = None) -> list[Path]:
    """Every file of the named dataset, fetched where missing into the data folder (``explicit_dir`` or
    ``ATTNLAB_DATA``), else into the cache; each checked. Raises :class:`DataMissing` naming every
    file it could not download, where to put it and its checksum, once it has tried them all."""
    mirror = mirror or os.environ.get("ATTNLAB_DATA_MIRROR")
    root = destination(explicit_dir)
    out, missing, reasons = [], [], []
    for rf in files_of(name):
        found = find(rf, explicit_dir)
        if found is None:
            try:
                found = fetch(rf, root, mirror, progress)
            except DataMissing as e:
                missing += e.missing
                reasons.append(str(e))
                continue
        out.append(found)
    if missing:
        what = "that file" if len(missing) == 1 else f"those {len(missing)} files"
        raise DataMissing(
            f"{reasons[0]}{f' (and {len(reasons) - 1} more)' if len(reasons) > 1 else ''}; put {what} at "
            f"{missing[0][1] if len(missing) == 1 else 'the paths above'} ({missing[0][2] if len(missing) == 1 else 'checksums above'}), "
            f"then run attnlab data get {name} again to check",
            missing,
        )
    return out
