"""Models by their HuggingFace hub names, read from the hub cache (built here: tests never
download), in attnlab.load, --ckpt and --init; a missing one is one line saying how to fetch it."""

import json
from pathlib import Path

import pytest
import torch

import attnlab
from attnlab.cli import main
from attnlab.hub import is_hub_id
from attnlab.models.gpt import GPT, GPTConfig
from attnlab.tokens import BPETokenizer
from helpers import PINNED_TRAINING

TEXT = "the quick brown fox jumps over the lazy dog; " * 100


def cache_model(cache: Path, repo: str, folder: Path) -> Path:
    """Put ``folder``'s files where huggingface_hub's cache keeps ``repo`` (a snapshot and refs/main)."""
    commit = "0123456789abcdef0123456789abcdef01234567"
    root = cache / f"models--{repo.replace('/', '--')}"
    snapshot = root / "snapshots" / commit
    snapshot.mkdir(parents=True)
    for f in folder.iterdir():
        (snapshot / f.name).write_bytes(f.read_bytes())
    (root / "refs").mkdir()
    (root / "refs" / "main").write_text(commit)
    return snapshot


@pytest.fixture
def hub_cache(tmp_path, monkeypatch):
    pytest.importorskip("huggingface_hub")
    cache = tmp_path / "hub"
    monkeypatch.setenv("HF_HUB_CACHE", str(cache))
    monkeypatch.setattr("huggingface_hub.constants.HF_HUB_CACHE", str(cache))
    # a small GPT-2 checkpoint with its tokenizer, as the hub holds "gpt2"
    torch.manual_seed(0)
    tok = BPETokenizer.train(TEXT, 300)
    model = GPT(GPTConfig(vocab_size=tok.vocab_size, context=32, layers=2, heads=2, dim=32))
    attnlab.export_hf(model, tmp_path / "export", tokenizer=tok)
    cache_model(cache, "tiny-org/tiny-gpt2", tmp_path / "export")
    return model, tok


def test_load_and_commands_take_a_hub_name(hub_cache, tmp_path, capsys):
    model, tok = hub_cache
    loaded = attnlab.load("tiny-org/tiny-gpt2")
    ids = torch.tensor([tok.encode("the quick brown")])
    torch.testing.assert_close(loaded(ids), model.eval()(ids))
    assert loaded.generate("the", 5, temperature=0) == loaded.generate("the", 5, temperature=0)
    assert main(["sample", "--ckpt", "tiny-org/tiny-gpt2", "--prompt", "the", "--max-new-tokens", "5"]) == 0
    assert capsys.readouterr().out.startswith("the")


def test_fine_tuning_starts_from_a_hub_name(hub_cache, tmp_path):
    corpus = tmp_path / "c.txt"
    corpus.write_text(TEXT)
    run = attnlab.train(
        "gpt",
        data=str(corpus),
        out=tmp_path / "ft",
        init="tiny-org/tiny-gpt2",
        max_iters=2,
        eval_interval=2,
        eval_iters=1,
        batch_size=2,
        progress=False,
        **PINNED_TRAINING,
    )
    saved = json.loads((run.out / "last" / "config.json").read_text())
    assert saved["model"]["layers"] == 2 and saved["model"]["dim"] == 32 and "tiny-gpt2" in saved["init"]


def test_a_name_missing_from_the_cache_says_how_to_fetch_it(hub_cache, tmp_path, capsys):
    assert main(["sample", "--ckpt", "not-cached/model", "--prompt", "x"]) == 2
    err = capsys.readouterr().err.strip()
    assert "does not exist here, nor in the HuggingFace cache" in err and "hf download not-cached/model" in err
    assert len(err.splitlines()) == 1


def test_paths_are_not_taken_for_hub_names(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "runs").mkdir()
    assert is_hub_id("gpt2") and is_hub_id("google/vit-base-patch16-224")
    assert not is_hub_id("runs/gpt")  # runs/ is a folder here: a missing run, not a hub model
    assert not is_hub_id("/abs/path") and not is_hub_id("./gpt2") and not is_hub_id("a/b/c")
    assert not is_hub_id("config.json") and not is_hub_id("../x")
