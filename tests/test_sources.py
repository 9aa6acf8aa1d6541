"""Named datasets: data directory first, then a SHA-256-checked download into the cache.

Downloads are served from file:// URLs of files generated here, so no network is used."""

import gzip
import hashlib
import http.server
import json
import os
import threading
from pathlib import Path

import pytest

from attnlab.cli import main
from attnlab.data import captions, parallel, sources
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
    with pytest.raises(DataError, match="sent a file with sha256 [0-9a-f]{64}, not the published"):
        parallel.multi30k("de", "en")
    assert not (tmp_path / "cache" / "multi30k" / "val.en.gz").exists()
    assert not list((tmp_path / "cache" / "multi30k").glob("*.part"))  # no partial file left


def test_unreachable_download_says_where_to_put_the_file(tmp_path, monkeypatch, no_data_dir):
    missing = sources.RemoteFile("multi30k/train.de.gz", (tmp_path / "nowhere.gz").as_uri(), "0" * 64)
    monkeypatch.setitem(sources.NAMED, "multi30k", [missing])
    with pytest.raises(DataError, match=r"ATTNLAB_DATA is not set.*attnlab data get multi30k"):
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


# ---- attnlab data get / list ---------------------------------------------------------------------
SHAKESPEARE = sources.NAMED["shakespeare"][0]


def test_data_get_without_network_says_where_to_put_the_file_and_its_checksum(tmp_path, no_data_dir, capsys):
    # (a closed port stands for no network: the publisher's URL is not tried)
    assert main(["data", "get", "shakespeare", "--mirror", "http://127.0.0.1:9"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1, err  # one file: the error line says it all
    where = tmp_path / "cache" / "tinyshakespeare" / "input.txt"
    assert f"put that file at {where} (sha256 {SHAKESPEARE.sha256})" in err[0]
    assert "then run attnlab data get shakespeare again" in err[0]


def test_data_get_lists_each_missing_file_of_a_dataset(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("ATTNLAB_DATA", str(tmp_path / "data"))  # downloads go to the data folder when set
    monkeypatch.setenv("ATTNLAB_CACHE", str(tmp_path / "cache"))
    assert main(["data", "get", "mnist", "--mirror", "http://127.0.0.1:9"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    for rf, line in zip(sources.NAMED["mnist"], err[:2]):
        assert (
            line.strip()
            == f"put http://127.0.0.1:9/{rf.relpath} at {tmp_path / 'data' / rf.relpath} (sha256 {rf.sha256})"
        )
    assert err[2].startswith("error: could not download") and "the paths above" in err[2]


def test_data_get_from_a_file_mirror_then_list_and_train_read_it(shared_data, tmp_path, no_data_dir, capsys):
    assert main(["data", "get", "shakespeare", "--mirror", Path(shared_data).as_uri()]) == 0
    got = tmp_path / "cache" / "tinyshakespeare" / "input.txt"
    assert got.read_bytes() == (Path(shared_data) / "tinyshakespeare" / "input.txt").read_bytes()
    assert f"1 file checked in {got.parent}" in capsys.readouterr().out
    assert main(["data", "list"]) == 0
    rows = {line.split()[0]: line for line in capsys.readouterr().out.splitlines()}
    assert rows["shakespeare"].split()[1] == "1/1" and rows["shakespeare"].endswith(str(got.parent))
    assert rows["mnist"].split()[1] == "0/2" and rows["mnist"].endswith("attnlab data get mnist")
    assert sources.resolve("shakespeare") == [got]  # what --data shakespeare reads


class _RangeServer(http.server.BaseHTTPRequestHandler):
    """Serves ``files`` (path -> bytes), honouring a Range request when ``ranges``; records the requests."""

    files: dict[str, bytes] = {}
    ranges = True
    seen: list[str | None] = []

    def do_GET(self):
        data = self.files.get(self.path)
        if data is None:
            self.send_error(404)
            return
        start = 0
        wanted = self.headers.get("Range")
        type(self).seen.append(wanted)
        if wanted and self.ranges:
            start = int(wanted.split("=")[1].rstrip("-"))
            self.send_response(206)
            self.send_header("Content-Range", f"bytes {start}-{len(data) - 1}/{len(data)}")
        else:
            self.send_response(200)
        self.send_header("Content-Length", str(len(data) - start))
        self.end_headers()
        self.wfile.write(data[start:])

    def log_message(self, *args):
        pass


@pytest.fixture
def range_server():
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _RangeServer)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield server
    server.shutdown()
    server.server_close()


@pytest.mark.parametrize("ranges", [True, False])
def test_data_get_resumes_a_stopped_download(tmp_path, monkeypatch, no_data_dir, range_server, ranges, capsys):
    data = os.urandom(300_000)
    rf = sources.RemoteFile("toy/file.bin", "http://unused", hashlib.sha256(data).hexdigest())
    monkeypatch.setitem(sources.NAMED, "toy", [rf])
    monkeypatch.setitem(sources.DATASETS, "toy", sources.Dataset("a toy", "text", "attnlab train gpt --data toy", "-"))
    monkeypatch.setattr(_RangeServer, "files", {"/toy/file.bin": data})
    monkeypatch.setattr(_RangeServer, "ranges", ranges)
    monkeypatch.setattr(_RangeServer, "seen", [])
    part = tmp_path / "cache" / "toy" / "file.bin.part"
    part.parent.mkdir(parents=True)
    part.write_bytes(data[:100_000])  # an earlier try stopped a third of the way
    mirror = f"http://127.0.0.1:{range_server.server_address[1]}"
    assert main(["data", "get", "toy", "--mirror", mirror]) == 0, capsys.readouterr().err
    assert (tmp_path / "cache" / "toy" / "file.bin").read_bytes() == data and not part.exists()
    assert _RangeServer.seen == ["bytes=100000-"]  # asked for the rest; a server without ranges sent it whole


def test_a_corrupt_download_is_deleted_and_named(tmp_path, monkeypatch, no_data_dir, range_server, capsys):
    rf = sources.RemoteFile("toy/file.bin", "http://unused", "0" * 64)
    monkeypatch.setitem(sources.NAMED, "toy", [rf])
    monkeypatch.setitem(sources.DATASETS, "toy", sources.Dataset("a toy", "text", "-", "-"))
    monkeypatch.setattr(_RangeServer, "files", {"/toy/file.bin": b"not the published bytes"})
    mirror = f"http://127.0.0.1:{range_server.server_address[1]}"
    assert main(["data", "get", "toy", "--mirror", mirror]) == 2
    err = capsys.readouterr().err
    assert f"sent a file with sha256 {hashlib.sha256(b'not the published bytes').hexdigest()}, not the published" in err
    assert not list((tmp_path / "cache" / "toy").iterdir())


def test_unknown_dataset_names_the_known_ones(capsys):
    assert main(["data", "get", "shakespear"]) == 2
    assert "no dataset named 'shakespear'; one of shakespeare, mnist" in capsys.readouterr().err


def test_a_missing_dataset_names_the_folders_looked_in_and_whether_they_exist(tmp_path, monkeypatch):
    monkeypatch.setenv("ATTNLAB_DATA", str(tmp_path / "nowhere"))
    monkeypatch.setenv("ATTNLAB_CACHE", str(tmp_path / "cache"))
    with pytest.raises(DataError) as e:
        sources.resolve("shakespeare", allow_download=False)
    assert str(e.value) == (
        f"tinyshakespeare/input.txt is not in the data folder {tmp_path / 'nowhere'} (ATTNLAB_DATA, which does not "
        f"exist) and the download cache {tmp_path / 'cache'} (not made yet); run: attnlab data get shakespeare"
    )


def test_coco_subset_keeps_the_redistributable_images_and_their_captions(tmp_path, monkeypatch, no_data_dir):
    published = {
        "info": {"year": 2017},
        "licenses": [{"id": i, "name": f"licence {i}"} for i in (5, 1, 4)],
        "images": [{"id": 30, "license": 4, "file_name": "c.jpg"}, {"id": 10, "license": 1, "file_name": "a.jpg"},
                   {"id": 20, "license": 5, "file_name": "b.jpg"}],
        "annotations": [{"id": 3, "image_id": 20, "caption": "B"}, {"id": 1, "image_id": 10, "caption": "A"},
                        {"id": 2, "image_id": 30, "caption": "C"}],
    }  # fmt: skip
    raw = json.dumps(published).encode()
    subset = json.loads(sources.NAMED["coco-mini"][0].derive(raw))
    assert [i["id"] for i in subset["images"]] == [20, 30] and [x["id"] for x in subset["licenses"]] == [4, 5]
    assert [(a["image_id"], a["caption"]) for a in subset["annotations"]] == [(30, "C"), (20, "B")]
    # the published file, fetched and kept under published/, the subset made from it and checked
    server = tmp_path / "server"
    server.mkdir()
    (server / "captions_val2017.json").write_bytes(raw)
    (server / "b.jpg").write_bytes(b"jpeg")
    made = sources.RemoteFile(
        "coco/captions_subset.json",
        (server / "captions_val2017.json").as_uri(),
        hashlib.sha256(sources.NAMED["coco-mini"][0].derive(raw)).hexdigest(),
        source_sha256=hashlib.sha256(raw).hexdigest(),
        derive=sources.NAMED["coco-mini"][0].derive,
    )
    got = sources.fetch(made, tmp_path / "root")
    assert got == tmp_path / "root" / "coco" / "captions_subset.json"
    assert (tmp_path / "root" / "coco" / "published" / "captions_val2017.json").read_bytes() == raw


def test_coco_mini_by_name_reads_the_data_folder(shared_data):
    items = captions.find_captions("coco-mini", str(shared_data))
    assert len(items) == 25 and all(len(caps) == 5 and path.is_file() for path, caps in items)
