"""Named datasets: data directory first, then a SHA-256-checked download into the cache.

Downloads are served from file:// URLs of files generated here, so no network is used."""

import gzip
import hashlib

import pytest

from attnlab.data import parallel, sources
from attnlab.errors import DataError


def _serve(tmp_path, files: dict[str, bytes], corrupt: str | None = None) -> list[sources.RemoteFile]:
    """Write files to a fake server folder; return RemoteFiles pointing at them."""
    server = tmp_path / "server"
    server.mkdir()
    out = []
    for name, data in files.items():
        (server / name).write_bytes(data)
        sha = hashlib.sha256(b"other bytes" if name == corrupt else data).hexdigest()
        out.append(sources.RemoteFile(f"multi30k/{name}", (server / name).as_uri(), sha))
    return out


def _multi30k_files() -> dict[str, bytes]:
    text = {"de": "Ein Hund läuft.\nZwei Männer.\n", "en": "A dog runs.\nTwo men.\n"}
    return {
        f"{split}.{lang}.gz": gzip.compress(text[lang].encode())
        for split in ("train", "val", "test_2016_flickr")
        for lang in ("de", "en")
    }


@pytest.fixture
def no_data_dir(tmp_path, monkeypatch):
    monkeypatch.delenv("ATTNLAB_DATA", raising=False)
    monkeypatch.setenv("ATTNLAB_CACHE", str(tmp_path / "cache"))


def test_multi30k_downloads_into_cache_and_reuses_it(tmp_path, monkeypatch, no_data_dir):
    monkeypatch.setitem(sources.NAMED, "multi30k", _serve(tmp_path, _multi30k_files()))
    pairs = parallel.multi30k("de", "en")
    assert pairs["test"] == [("Ein Hund läuft.", "A dog runs."), ("Zwei Männer.", "Two men.")]
    assert (tmp_path / "cache" / "multi30k" / "train.de.gz").is_file()
    for f in (tmp_path / "server").iterdir():  # second call reads the cache, not the server
        f.unlink()
    assert parallel.multi30k("en", "de")["train"][0] == ("A dog runs.", "Ein Hund läuft.")


def test_download_with_wrong_checksum_is_refused(tmp_path, monkeypatch, no_data_dir):
    monkeypatch.setitem(sources.NAMED, "multi30k", _serve(tmp_path, _multi30k_files(), corrupt="val.en.gz"))
    with pytest.raises(DataError, match="checksum"):
        parallel.multi30k("de", "en")
    assert not (tmp_path / "cache" / "multi30k" / "val.en.gz").exists()
    assert not list((tmp_path / "cache" / "multi30k").glob("*.part-*"))  # no partial file left


def test_unreachable_download_says_where_to_put_the_file(tmp_path, monkeypatch, no_data_dir):
    missing = sources.RemoteFile("multi30k/train.de.gz", (tmp_path / "nowhere.gz").as_uri(), "0" * 64)
    monkeypatch.setitem(sources.NAMED, "multi30k", [missing])
    with pytest.raises(DataError, match="ATTNLAB_DATA"):
        parallel.multi30k("de", "en")


def test_data_dir_wins_over_download(tmp_path, monkeypatch):
    root = tmp_path / "data" / "multi30k"
    root.mkdir(parents=True)
    for name, data in _multi30k_files().items():
        (root / name).write_bytes(data)
    monkeypatch.setenv("ATTNLAB_CACHE", str(tmp_path / "cache"))
    files = _multi30k_files()
    unreachable = [
        sources.RemoteFile(f"multi30k/{name}", (tmp_path / "nowhere").as_uri(), hashlib.sha256(data).hexdigest())
        for name, data in files.items()
    ]
    monkeypatch.setitem(sources.NAMED, "multi30k", unreachable)
    assert parallel.multi30k("de", "en", data_dir=str(tmp_path / "data"))["val"][1] == ("Zwei Männer.", "Two men.")


def test_data_dir_files_are_checksum_checked_once(tmp_path, monkeypatch):
    monkeypatch.setenv("ATTNLAB_CACHE", str(tmp_path / "cache"))
    good = b"the published bytes"
    rf = sources.RemoteFile("x/file.txt", (tmp_path / "nowhere").as_uri(), hashlib.sha256(good).hexdigest())
    path = tmp_path / "file.txt"
    path.write_bytes(b"another copy")
    with pytest.raises(DataError, match="not the published"):
        sources.verify_local(rf, path)
    monkeypatch.setenv("ATTNLAB_TRUST_DATA", "1")
    assert sources.verify_local(rf, path) == path  # the user's own copy, on request
    monkeypatch.delenv("ATTNLAB_TRUST_DATA")
    path.write_bytes(good)
    assert sources.verify_local(rf, path) == path
    calls = []
    monkeypatch.setattr(sources, "file_digest", lambda *a: calls.append(a) or "")
    assert sources.verify_local(rf, path) == path and calls == []  # remembered: not hashed again
