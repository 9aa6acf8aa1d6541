"""--data hf:NAME[:CONFIG][:SPLIT][:COLUMN]: HuggingFace datasets (saved folders and local files
here; tests never download) as GPT corpora and as labelled texts."""

import json

import pytest

import attnlab
from attnlab.cli import main
from attnlab.data.hf import HFSpec
from attnlab.recipes import recipes
from helpers import PINNED_TRAINING

datasets = pytest.importorskip("datasets")

LINES = [f"line {i}: the cat sat on the mat and looked at the dog." for i in range(200)]


@pytest.fixture
def saved(tmp_path):
    ds = datasets.DatasetDict(
        {
            "train": datasets.Dataset.from_dict({"content": LINES[:180], "n": list(range(180))}),
            "test": datasets.Dataset.from_dict({"content": LINES[180:], "n": list(range(20))}),
        }
    )
    ds.save_to_disk(str(tmp_path / "ds"))
    ds["train"].to_parquet(str(tmp_path / "c.parquet"))
    return tmp_path


def gpt_options():
    opts = dict(next(r for r in recipes() if r.name == "gpt").tiny)
    return {**opts, **PINNED_TRAINING}


@pytest.mark.parametrize("spec", ["hf:{d}/ds", "hf:{d}/ds::train:content", "hf:{d}/c.parquet:::content"])
def test_a_gpt_trains_on_a_dataset(spec, saved, tmp_path):
    spec = spec.format(d=saved)
    run = attnlab.train("gpt", data=spec, out=tmp_path / "run", **gpt_options())
    # streamed into token shards in the run's folder (rows: every split's, in order)
    (folder,) = (run.out / "data").glob("shards-*")
    index = json.loads((folder / "index.json").read_text())
    assert index["settings"]["source"] == spec and index["done"]
    rows = sum(s["documents"] for split in index["splits"].values() for s in split["shards"])
    assert rows == (180 if HFSpec.parse(spec).split == "train" or spec.endswith(".parquet:::content") else 200)
    chars = set(json.loads((run.out / "last" / "config.json").read_text())["tokenizer"]["chars"])
    assert chars == set("".join(LINES)) | {"\n"}  # its text and the blank lines between rows, nothing else
    assert attnlab.evaluate(run.out, max_batches=1)["loss"] > 0  # (the run's own shards, read again)
    attnlab.train("gpt", data=spec, out=tmp_path / "run", resume=True, **{**gpt_options(), "max_iters": 3})
    assert list((run.out / "data").glob("shards-*")) == [folder]  # resumed on the shards it prepared


def test_labelled_texts_from_a_dataset(tmp_path):
    labels = datasets.ClassLabel(names=["cats", "dogs"])
    texts = [
        f"the cat number {i} purrs softly" if i % 2 == 0 else f"the dog number {i} barks loudly" for i in range(60)
    ]
    ds = datasets.Dataset.from_dict(
        {"text": texts, "label": [i % 2 for i in range(60)]},
        features=datasets.Features({"text": datasets.Value("string"), "label": labels}),
    )
    ds.save_to_disk(str(tmp_path / "ds"))
    opts = dict(next(r for r in recipes() if r.name == "encoder").tiny)
    opts.update(task="classify", **PINNED_TRAINING)
    run = attnlab.train("encoder", data=f"hf:{tmp_path / 'ds'}", out=tmp_path / "run", **opts)
    assert json.loads((run.out / "last" / "config.json").read_text())["model"]["labels"] == ["cats", "dogs"]
    whole, first = attnlab.evaluate(run.out), attnlab.evaluate(run.out, max_batches=1, batch_size=2)
    assert first["texts"] == 2 and whole["texts"] == 6  # 10 % of 60 texts: the test split


@pytest.mark.parametrize(
    "spec, message",
    [
        ("hf:{d}/ds::train:nope", "no column 'nope'; it has content, n"),
        ("hf:{d}/ds::validation", "no split 'validation'; it has train, test"),
        ("hf:{d}/missing.parquet", "does not exist"),
        ("hf:a:b:c:d:e", "write hf:NAME[:CONFIG][:SPLIT][:COLUMN]"),
        ("hf:not-cached-dataset-xyz", "HuggingFace datasets could not read it"),
    ],
)
def test_bad_dataset_specs_get_one_line(spec, message, saved, tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    argv = ["train", "gpt", "--data", spec.format(d=saved), "--out", str(tmp_path / "run"), "--max-iters", "1"]
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert message in err and len(err.splitlines()) == 1, err


def test_an_image_classifier_trains_on_an_image_dataset(tmp_path):
    from PIL import Image

    pytest.importorskip("sklearn")
    import numpy as np

    rng = np.random.default_rng(0)
    images, labels = [], []
    for i in range(80):  # bright squares top-left vs bottom-right
        arr = (rng.random((8, 8)) * 60).astype(np.uint8)
        if i % 2:
            arr[:4, :4] = 255
        else:
            arr[4:, 4:] = 255
        images.append(Image.fromarray(arr))
        labels.append(i % 2)
    features = datasets.Features({"image": datasets.Image(), "label": datasets.ClassLabel(names=["tl", "br"])})
    datasets.Dataset.from_dict({"image": images, "label": labels}, features=features).save_to_disk(str(tmp_path / "ds"))
    opts = dict(next(r for r in recipes() if r.name == "vit").tiny)
    opts.pop("data", None)
    run = attnlab.train("vit", data=f"hf:{tmp_path / 'ds'}", out=tmp_path / "run", **{**opts, **PINNED_TRAINING})
    saved = json.loads((run.out / "last" / "config.json").read_text())
    assert saved["model"]["labels"] == ["tl", "br"] and saved["model"]["image_size"] == 8
    assert saved["model"]["in_chans"] == 1
    model = attnlab.load(run.out)
    assert model.predict(images[1], top_k=1)[0][0] in ("br", "tl")


def test_a_translation_dataset_trains_a_seq2seq_model(tmp_path):
    pytest.importorskip("sacrebleu")
    words = ["cat", "dog", "house", "tree", "car", "sun", "moon", "book"]
    german = ["Katze", "Hund", "Haus", "Baum", "Auto", "Sonne", "Mond", "Buch"]
    rows = [{"de": f"ein {g} ist hier", "en": f"a {e} is here"} for e, g in zip(words, german)] * 5
    datasets.Dataset.from_dict({"translation": rows}).save_to_disk(str(tmp_path / "wmt"))
    opts = dict(next(r for r in recipes() if r.name == "seq2seq").tiny)
    opts.pop("data", None)
    opts.update(tokenizer="char", separate_vocab=True, **PINNED_TRAINING)
    run = attnlab.train("seq2seq", data=f"hf:{tmp_path / 'wmt'}", out=tmp_path / "run", **opts)
    saved = json.loads((run.out / "last" / "config.json").read_text())
    assert saved["data_spec"] == f"hf:{tmp_path / 'wmt'}"
    vocab = saved["vocab"]
    assert "K" in vocab["src"]["chars"] and "K" not in vocab["tgt"]["chars"]  # German on the source side
    # one column per language works too, and the wrong languages are named
    datasets.Dataset.from_dict({"fr": ["un chat"] * 20, "en": ["a cat"] * 20}).save_to_disk(str(tmp_path / "cols"))
    with pytest.raises(Exception, match="no translation column and no de / en columns"):
        attnlab.train("seq2seq", data=f"hf:{tmp_path / 'cols'}", out=tmp_path / "r2", **opts)
    ok = attnlab.train("seq2seq", data=f"hf:{tmp_path / 'cols'}", src="fr", out=tmp_path / "r3", **opts)
    assert ok.step == opts["max_iters"]
