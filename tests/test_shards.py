"""Corpora larger than memory (issue 50): a source streamed into token shards, read back as the
training data. The shards are checked against the source itself (every document's ids decode to
its text, in order), against a preparation never stopped (kill -9, then again: the same bytes),
and through training and evaluation on them."""

import gzip
import hashlib
import json
import os
import signal
import subprocess
import sys
import time

import numpy as np
import pytest

from attnlab.cli import main
from attnlab.data import shards
from attnlab.errors import AttnlabError, OptionError

SMALL = {"DOC_BYTES": 4096, "BATCH_BYTES": 16384}
SAMPLE = shards.sample  # many documents and batches from a small corpus


@pytest.fixture
def small_blocks(monkeypatch):
    for name, value in SMALL.items():
        monkeypatch.setattr(shards, name, value)


def corpus(folder, seed: int = 0):
    """Three files: plain ASCII lines, text with characters beyond ASCII (gzip-compressed), and one
    line longer than a document (so a cut falls between characters, not after a newline)."""
    rng = np.random.default_rng(seed)
    words = ["the", "cat", "sat", "on", "a", "mat", "and", "saw", "it", "then", "ran"]
    folder.mkdir(parents=True, exist_ok=True)
    lines = [" ".join(rng.choice(words, 8)) for _ in range(3000)]
    (folder / "a.txt").write_text("\n".join(lines) + "\n", encoding="utf-8")
    accented = "\n".join(f"{i}: café naïve — Ünïcødé ✓ {' '.join(rng.choice(words, 5))}" for i in range(1500))
    with gzip.open(folder / "b.txt.gz", "wt", encoding="utf-8") as f:
        f.write(accented + "\n")
    (folder / "c.txt").write_text("é" * 5000 + "x" * 3001 + "\nend\n", encoding="utf-8")
    return (
        (folder / "a.txt").read_text(encoding="utf-8")
        + gzip.open(folder / "b.txt.gz", "rt", encoding="utf-8").read()
        + (folder / "c.txt").read_text(encoding="utf-8")
    )


def documents_back(folder) -> list[np.ndarray]:
    """Every document's ids, in the source's order, read from the shards through their .docs
    files and the split each document went to."""
    index = json.loads((folder / "index.json").read_text())
    settings = index["settings"]
    streams = {}
    for split in ("train", "val"):
        ids, starts, at = [], [], 0
        for s in index["splits"][split]["shards"]:
            ids.append(np.fromfile(folder / s["file"], dtype=np.dtype(index["dtype"]).newbyteorder("<")))
            starts += [at + int(x) for x in np.fromfile(folder / s["file"].replace(".bin", ".docs"), dtype="<u8")]
            at += s["tokens"]
        ids = np.concatenate(ids) if ids else np.empty(0, dtype=np.int64)
        streams[split] = [ids[a:b] for a, b in zip(starts, [*starts[1:], len(ids)])]
    out, taken = [], {"train": 0, "val": 0}
    for doc in range(sum(len(v) for v in streams.values())):
        split = "val" if shards.is_validation(doc, settings["seed"], settings["val_fraction"]) else "train"
        out.append(streams[split][taken[split]])
        taken[split] += 1
    assert taken == {k: len(v) for k, v in streams.items()}
    return out


def test_every_documents_ids_decode_to_its_text_in_order(tmp_path, small_blocks):
    text = corpus(tmp_path / "src")
    index = shards.prepare(str(tmp_path / "src"), tmp_path / "out", shard_tokens=5000, val_fraction=0.2, progress=False)
    from attnlab.tokens import tokenizer_from_dict

    tok = tokenizer_from_dict(index["tokenizer"])
    assert tok.chars == sorted(set(text))  # the vocabulary: every character of the source, from the stream
    docs = documents_back(tmp_path / "out")
    assert "".join(tok.decode(d) for d in docs) == text and len(docs) > 30
    for split in ("train", "val"):
        listed = index["splits"][split]["shards"]
        assert listed and all(s["tokens"] == 5000 for s in listed[:-1]) and 0 < listed[-1]["tokens"] <= 5000
        for s in listed:
            assert hashlib.sha256((tmp_path / "out" / s["file"]).read_bytes()).hexdigest() == s["sha256"]
    assert index["dtype"] == "uint8" and index["done"]  # (fewer than 257 characters: a byte a token)
    # a document is never cut inside a character, and a long line is cut between characters
    assert all(len(d) <= shards.DOC_BYTES for d in docs)
    # the split is by whole documents, the same for a seed, another for another seed
    val_docs = [i for i in range(len(docs)) if shards.is_validation(i, 0, 0.2)]
    assert 0 < len(val_docs) < len(docs)
    assert val_docs != [i for i in range(len(docs)) if shards.is_validation(i, 1, 0.2)]


@pytest.mark.parametrize("wide", [False, True])
def test_the_character_encoder_on_both_sides_of_a_byte(wide):
    """ASCII and beyond, with ids of one byte (bytes.translate) and of two (a NumPy gather) once
    the vocabulary passes 256 characters; a character the vocabulary lacks is refused."""
    chars = sorted(set("hello world\nçé✓") | ({chr(0x400 + i) for i in range(300)} if wide else set()))
    dtype = shards.token_dtype(len(chars))
    assert dtype == ("uint16" if wide else "uint8")
    encode = shards.CharEncoder(chars, dtype)
    texts = ["hello world\n", "çé ✓ hello", "".join(chars)]
    for text, ids in zip(texts, encode(texts)):
        assert ids.dtype == np.dtype(dtype) and [chars[i] for i in ids] == list(text)
    for unknown in ("hello!", "hello ß", "hello \U0001f600"):
        with pytest.raises(AttnlabError, match="is not in the vocabulary of"):
            encode([unknown])


def test_the_shards_read_back_as_one_sequence_across_their_boundaries(tmp_path, small_blocks):
    corpus(tmp_path / "src")
    shards.prepare(str(tmp_path / "src"), tmp_path / "out", shard_tokens=1500, val_fraction=0.2, progress=False)
    data = shards.open_shards(tmp_path / "out")
    whole = np.concatenate([np.fromfile(tmp_path / "out" / s["file"], dtype="u1") for s in
                            json.loads((tmp_path / "out" / "index.json").read_text())["splits"]["train"]["shards"]])  # fmt: skip
    assert len(data.train) == len(whole)
    for a, b in ((0, 10), (1490, 1510), (0, len(whole)), (2999, 4501), (len(whole) - 3, len(whole)), (5, 5)):
        assert np.array_equal(data.train[a:b], whole[a:b]), (a, b)
    assert data.train[1500] == whole[1500] and data.train[-1] == whole[-1]
    assert np.array_equal(np.asarray(data.val), np.concatenate([data.val[0 : len(data.val)]]))


KILLED = """
import sys
from attnlab.data import shards
shards.DOC_BYTES, shards.BATCH_BYTES = 4096, 16384
shards.prepare(sys.argv[1], sys.argv[2], tokenizer=sys.argv[3], vocab_size=300 if sys.argv[3] == "bpe" else None,
               shard_tokens=2000, val_fraction=0.2, sample_mb=0.05, progress=False)
"""


@pytest.mark.parametrize("tokenizer", ["char", "bpe"])
def test_a_preparation_killed_at_any_point_finishes_with_the_same_bytes(tmp_path, small_blocks, tokenizer):
    corpus(tmp_path / "src")
    source = str(tmp_path / "src")
    options = dict(tokenizer=tokenizer, vocab_size=300 if tokenizer == "bpe" else None, shard_tokens=2000,
                   val_fraction=0.2, sample_mb=0.05, progress=False)  # fmt: skip
    shards.prepare(source, tmp_path / "whole", **options)
    rng = np.random.default_rng(0)
    for attempt in range(3):  # kill -9 after a random number of committed batches, then finish in this process
        out = tmp_path / f"killed{attempt}"
        proc = subprocess.Popen([sys.executable, "-c", KILLED, source, str(out), tokenizer])
        stop_after = int(rng.integers(1, 12))
        deadline = time.monotonic() + 60
        while proc.poll() is None and time.monotonic() < deadline:
            try:
                if json.loads((out / "index.json").read_text())["cursor"]["document"] >= stop_after * 4:
                    break
            except (OSError, ValueError, KeyError):
                pass
            time.sleep(0.002)
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
        index = shards.prepare(source, out, **options)
        assert index["done"]
        names = sorted(p.name for p in (tmp_path / "whole").iterdir())
        assert names == sorted(p.name for p in out.iterdir() if not p.name.startswith("."))
        for name in names:
            assert (out / name).read_bytes() == (tmp_path / "whole" / name).read_bytes(), (attempt, name)


@pytest.mark.parametrize("tokenizer", ["bpe", "wordpiece"])
def test_trained_vocabularies_shards_are_the_tokenizers_own_ids(tmp_path, small_blocks, tokenizer, monkeypatch):
    """BPE and WordPiece trained on the sample alone (the trainer sees the first 0.05 MB of
    documents, streamed), and every document's ids are what the tokenizer itself gives it."""
    corpus(tmp_path / "src")
    seen: list[str] = []
    monkeypatch.setattr(shards, "sample", lambda source, mb: (seen.append(t) or t for t in SAMPLE(source, mb)))
    index = shards.prepare(str(tmp_path / "src"), tmp_path / "out", tokenizer=tokenizer, vocab_size=400,
                           sample_mb=0.05, val_fraction=0.2, progress=False)  # fmt: skip
    from attnlab.tokens import tokenizer_from_dict

    tok = tokenizer_from_dict(index["tokenizer"])
    assert tok.kind == tokenizer and (256 if tokenizer == "bpe" else 5) < tok.vocab_size <= 400
    assert 0.05e6 <= sum(map(len, seen)) < 0.05e6 + shards.DOC_BYTES  # (the sample, not the corpus)
    texts = [text for _, text, _ in shards.documents(str(tmp_path / "src"))]
    assert sum(map(len, seen)) < sum(map(len, texts)) / 2
    docs = documents_back(tmp_path / "out")
    assert [d.tolist() for d in docs] == [tok.encode(t) for t in texts]


def test_a_streamed_dataset_is_prepared_row_by_row(tmp_path):
    pytest.importorskip("datasets")
    rows = [{"text": f"row {i}: " + "abc " * (i % 7), "n": i} for i in range(200)]
    path = tmp_path / "rows.jsonl"
    path.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    index = shards.prepare(f"hf:{path}", tmp_path / "out", val_fraction=0.1, progress=False)
    from attnlab.tokens import tokenizer_from_dict

    tok = tokenizer_from_dict(index["tokenizer"])
    # a row a document, each followed by a blank line (as the text path joins rows)
    assert [tok.decode(d) for d in documents_back(tmp_path / "out")] == [r["text"] + "\n\n" for r in rows]
    with pytest.raises(AttnlabError, match="no column 'body'; it has text, n"):
        shards.prepare(f"hf:{path}:::body", tmp_path / "out2", progress=False)
    assert not (tmp_path / "out2").exists()  # (refused before anything is written)


def test_a_hub_dataset_streams_split_after_split(tmp_path, monkeypatch):
    """A hub name goes through datasets' streaming mode (here a local stand-in for the hub, which
    tests never reach): every split in turn, its text column, from any row on."""
    datasets = pytest.importorskip("datasets")
    from attnlab.data import hf

    files = {}
    for split, n in (("train", 30), ("test", 5)):
        files[split] = tmp_path / f"{split}.jsonl"
        files[split].write_text("".join(json.dumps({"body": f"{split} {i}", "n": i}) + "\n" for i in range(n)))

    class Hub:
        IterableDatasetDict = datasets.IterableDatasetDict

        def load_dataset(self, name, config, split=None, streaming=False):
            assert name == "someone/corpus" and streaming
            whole = datasets.load_dataset("json", data_files={k: str(v) for k, v in files.items()}, streaming=True)
            return whole if split is None else whole[split]

    monkeypatch.setattr(hf, "datasets_library", lambda: Hub())
    spec = hf.HFSpec.parse("hf:someone/corpus:::body")
    texts = [text for _, text, _ in shards.dataset_documents(spec.label, shards.Cursor())]
    assert texts == [f"train {i}\n\n" for i in range(30)] + [f"test {i}\n\n" for i in range(5)]
    later = [text for _, text, _ in shards.dataset_documents(spec.label, shards.Cursor(file=28, document=28))]
    assert later == texts[28:]
    only_test = hf.HFSpec.parse("hf:someone/corpus::test:body").label
    assert [t for _, t, _ in shards.dataset_documents(only_test, shards.Cursor())] == texts[30:]
    unnamed = [t for _, t, _ in shards.dataset_documents("hf:someone/corpus", shards.Cursor())]
    assert unnamed == texts  # (no column named, no "text": the only string column)
    with pytest.raises(AttnlabError, match="no column 'title'; it has body, n"):
        list(shards.dataset_documents("hf:someone/corpus:::title", shards.Cursor()))


def parquet_file(path, megabytes: float, rows_per_group: int = 4096) -> tuple[str, int, int]:
    """A Parquet file of rows of about 2.5 KB of ASCII text (a "text" and an "id" column) until
    ``megabytes`` MB of text: the first row's text, the characters of all rows, and the rows."""
    pa, pq = pytest.importorskip("pyarrow"), pytest.importorskip("pyarrow.parquet")
    rng = np.random.default_rng(0)
    words = np.array("the of and to in is was that for it with as his on be at by had are but".split())
    pieces = [" ".join(rng.choice(words, 700)) for _ in range(64)]
    n, size, first = 0, 0, None
    with pq.ParquetWriter(path, pa.schema([("text", pa.string()), ("id", pa.int64())])) as w:
        while size < megabytes * 1e6:
            texts = [f"{n + i}: " + pieces[j] for i, j in enumerate(rng.integers(0, 64, rows_per_group))]
            size += sum(len(t) for t in texts)
            first = first or texts[0]
            w.write_table(pa.table({"text": texts, "id": np.arange(n, n + rows_per_group)}))
            n += rows_per_group
    return first, size, n


def test_parquet_rows_are_read_from_any_row_on(tmp_path):
    from attnlab.data.hf import HFSpec

    parquet_file(tmp_path / "d.parquet", 0.5, rows_per_group=50)
    spec = HFSpec.parse(f"hf:{tmp_path / 'd.parquet'}")
    every = list(shards.parquet_column(tmp_path / "d.parquet", spec, 0))
    assert len(every) == 200 and every[0].startswith("0: ") and every[-1].startswith("199: ")
    for start in (1, 49, 50, 51, 199, 200, 250):  # (inside, at the edges of and past the row groups)
        assert list(shards.parquet_column(tmp_path / "d.parquet", spec, start)) == every[start:]
    with pytest.raises(AttnlabError, match="no column 'body'; it has text, id"):
        shards.parquet_column(tmp_path / "d.parquet", HFSpec.parse(f"{spec.label}:::body"), 0)


LIMITED = """
import resource, sys
from attnlab.data import shards
import pyarrow.parquet  # (imported before the limit is set: the limit is on what the preparation allocates)

def kb(key):
    return int(next(line for line in open("/proc/self/status") if line.startswith(key)).split()[1])

limit = kb("VmData") * 1024 + int(sys.argv[3]) * (1 << 20)
resource.setrlimit(resource.RLIMIT_DATA, (limit, limit))
shards.prepare("hf:" + sys.argv[1], sys.argv[2], progress=False)
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="RLIMIT_DATA caps allocations on Linux")
def test_a_parquet_dataset_larger_than_the_memory_limit_prepares(tmp_path):
    """400 MB of text in a Parquet file, prepared by a process that may allocate 256 MB more than
    it holds after its imports (RLIMIT_DATA: malloc and anonymous maps beyond it fail): the
    dataset streams through in constant memory, where reading it whole could not."""
    first, size, rows = parquet_file(tmp_path / "big.parquet", 400)
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    r = subprocess.run([sys.executable, "-c", LIMITED, str(tmp_path / "big.parquet"), str(tmp_path / "out"), "256"],
                       capture_output=True, text=True, env=env, timeout=300)  # fmt: skip
    assert r.returncode == 0, r.stderr[-2000:]
    data = shards.open_shards(tmp_path / "out")
    assert len(data.train) + len(data.val) == size + 2 * rows  # every character of every row, once, and "\n\n"
    assert size > 400e6
    first_document = data.train if not shards.is_validation(0, 0, 0.01) else data.val
    assert data.tokenizer.decode(np.asarray(first_document[: len(first)])) == first


def test_training_and_evaluation_read_the_shards(tmp_path, small_blocks, capsys):
    import attnlab

    corpus(tmp_path / "src")
    assert main(["data", "prepare", str(tmp_path / "src"), "--out", str(tmp_path / "shards"), "--shard-tokens",
                 "3000", "--val-fraction", "0.2", "--no-progress"]) == 0  # fmt: skip
    assert "train gpt --data" in capsys.readouterr().out
    run = attnlab.train("gpt", data=str(tmp_path / "shards"), out=tmp_path / "run", preset="nano", context=32,
                        max_iters=3, eval_interval=3, eval_iters=1, batch_size=4, device="cpu", dtype="fp32")  # fmt: skip
    assert run.step == 3
    meta = json.loads((tmp_path / "run" / "last" / "config.json").read_text())
    index_sha = hashlib.sha256((tmp_path / "shards" / "index.json").read_bytes()).hexdigest()
    assert meta["data_fingerprint"]["sha256"] == index_sha  # (the shards are not read again)
    scores = attnlab.evaluate(tmp_path / "run", max_batches=2)
    assert np.isfinite(scores["loss"])
    assert main(["train", "gpt", "--data", str(tmp_path / "shards"), "--out", str(tmp_path / "run"), "--resume",
                 "--max-iters", "4", "--device", "cpu", "--no-progress", "--sample-chars", "0"]) == 0  # fmt: skip


HELD_OUT_EVAL = """
import resource, sys
import attnlab

model = attnlab.load(sys.argv[1])  # (loaded before the limit is set: the limit is on what the evaluation allocates)
data_kb = int(next(line for line in open("/proc/self/status") if line.startswith("VmData")).split()[1])
limit = data_kb * 1024 + 256 * (1 << 20)
resource.setrlimit(resource.RLIMIT_DATA, (limit, limit))
print(model.evaluate(sys.argv[2], max_batches=1)["loss"])
"""


def test_evaluation_streams_a_held_out_file(tmp_path, small_blocks):
    """eval --data FILE encodes the file a batch of documents at a time into a memory-mapped
    array: the same ids as the whole text encoded at once, and a 300 MB file evaluates in a process
    that may allocate only 256 MB more than it holds after loading the model."""
    import attnlab
    from attnlab.data.text import split_ids

    text = corpus(tmp_path / "src")
    shards.prepare(str(tmp_path / "src"), tmp_path / "shards", val_fraction=0.2, progress=False)
    run = attnlab.train("gpt", data=str(tmp_path / "shards"), out=tmp_path / "run", preset="nano", context=16,
                        max_iters=1, eval_interval=1, eval_iters=1, batch_size=2, device="cpu", dtype="fp32",
                        progress=False)  # fmt: skip
    model = attnlab.load(run.out)
    (tmp_path / "held.txt").write_text(text, encoding="utf-8")
    for split in ("train", "val"):
        name, ids = model.corpus_ids(split, str(tmp_path / "held.txt"))
        whole = split_ids(model.tokenizer.encode(text))[split == "val"]
        assert isinstance(ids, np.memmap) and ids.tolist() == list(whole), split
    with pytest.raises(AttnlabError, match="not in the vocabulary of"):
        (tmp_path / "other.txt").write_text("the cat \u263a")
        model.corpus_ids("val", str(tmp_path / "other.txt"))
    if sys.platform.startswith("linux"):
        line = (text.splitlines()[0] + "\n").encode()
        with open(tmp_path / "big.txt", "wb") as f:
            f.write(line * (300_000_000 // len(line)))
        r = subprocess.run([sys.executable, "-c", HELD_OUT_EVAL, str(run.out), str(tmp_path / "big.txt")],
                           capture_output=True, text=True, env={**os.environ, "OMP_NUM_THREADS": "1"}, timeout=300)  # fmt: skip
        assert r.returncode == 0 and float(r.stdout.strip().splitlines()[-1]) > 0, r.stderr[-2000:]


def test_bad_preparations_are_refused_in_one_line(tmp_path, small_blocks, capsys):
    corpus(tmp_path / "src")
    source = str(tmp_path / "src")
    shards.prepare(source, tmp_path / "out", val_fraction=0.2, progress=False)
    with pytest.raises(OptionError, match="other settings"):
        shards.prepare(source, tmp_path / "out", val_fraction=0.3, progress=False)
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "x").write_text("x")
    with pytest.raises(OptionError, match="not an empty folder"):
        shards.prepare(source, tmp_path / "full", progress=False)
    with pytest.raises(AttnlabError, match="no such file"):
        shards.prepare(str(tmp_path / "missing"), tmp_path / "o2", progress=False)
    (tmp_path / "bin.txt").write_bytes(b"\x00\x01" * 100)
    with pytest.raises(AttnlabError, match="binary"):
        shards.prepare(str(tmp_path / "bin.txt"), tmp_path / "o3", progress=False)
    with pytest.raises(AttnlabError, match="validation split"):
        shards.prepare(source, tmp_path / "o4", val_fraction=0.0, progress=False)
    assert main(["data", "prepare", source, "--out", str(tmp_path / "o5"), "--shard-tokens", "3"]) == 2
    assert "--shard-tokens" in capsys.readouterr().err
