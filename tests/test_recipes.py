"""The recipe registry, the one vocabulary with its aliases, and run folders written before both."""

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

import attnlab
from attnlab.cli import main, parse
from attnlab.models import GPTConfig, RNNConfig, TransformerConfig, ViTConfig
from helpers import tiny_run_flags

FIXTURE = Path(__file__).parent / "fixtures" / "runs_v0_1"  # written by attnlab 0.1 (see its expected_*.*)
FAST = tiny_run_flags()


@pytest.fixture
def old_runs(tmp_path, monkeypatch):
    root = tmp_path / "runs"
    shutil.copytree(FIXTURE, root)
    monkeypatch.chdir(root)  # the GPT run was trained on ./tiny.txt
    return root


def test_old_run_folders_give_the_same_outputs(old_runs):
    """Weights saved under the old names (ViT `pos_embed`, Transformer `decoder_blocks`) and
    configs with the old field names load into the refactored models, which compute the same."""
    expected = json.loads((old_runs / "expected_outputs.json").read_text())
    gpt = attnlab.load(old_runs / "gpt")
    assert gpt.config.layers == 1 and gpt.config.n_layer == 1  # the old name still reads
    x = torch.arange(12).reshape(2, 6) % gpt.config.vocab_size
    got = {"gpt": gpt(x)[:, -1, :5]}
    got["vit"] = attnlab.load(old_runs / "vit")(torch.linspace(-1, 1, 64).reshape(1, 1, 8, 8))
    for name in ("s2s", "rnn"):
        got[name] = attnlab.load(old_runs / name)(torch.tensor([[4, 5, 6, 7, 2]]), torch.tensor([[1, 8, 9]]))[0, :, :5]
    for name, out in got.items():
        np.testing.assert_allclose(out.detach().numpy(), np.array(expected[name]), atol=1e-5, err_msg=name)


def test_old_run_folders_answer_commands_as_before(old_runs, capsys):
    assert (
        main(["sample", "--ckpt", "gpt", "--prompt", "The", "--max-new-tokens", "20", "--seed", "1", "--device", "cpu"])
        == 0
    )
    assert capsys.readouterr().out == (old_runs / "gpt.sample.txt").read_text()
    for name, extra in (
        ("gpt", []),
        ("vit", ["--out", "conf.png"]),
        # (the synthetic test set was redrawn in 0.2 to be disjoint from validation and training: the
        # seq2seq numbers are 0.2's on the same weights, their BLEU over characters as synthetic
        # tasks are scored since; the outputs above and below are 0.1's)
        ("s2s", ["--max-sentences", "20"]),
        ("rnn", ["--max-sentences", "20"]),
    ):
        assert main(["eval", "--ckpt", name, "--json", "--device", "cpu", *extra]) == 0
        got = json.loads(capsys.readouterr().out)
        want = json.loads((old_runs / f"{name}.eval.json").read_text())
        for key in ("loss", "accuracy", "bleu", "exact_match", "tokens", "sentences", "images"):
            if key in want:
                assert got[key] == pytest.approx(want[key], abs=1e-6), (name, key)
    for name in ("s2s", "rnn"):
        assert main(["translate", "--ckpt", name, "--beam", "2", "abcde", "hello"]) == 0
        assert capsys.readouterr().out == (old_runs / f"{name}.translate.txt").read_text()


@pytest.mark.parametrize("family,run", [("gpt", "gpt"), ("vit", "vit"), ("seq2seq", "s2s"), ("seq2seq", "rnn")])
def test_old_run_folders_resume(old_runs, family, run, capsys):
    extra = ["--sample-chars", "0"] if family == "gpt" else []
    assert main(["train", family, "--out", run, "--resume", *FAST[:1], "5", *FAST[2:], *extra]) == 0
    metrics = [json.loads(line) for line in (old_runs / run / "metrics.jsonl").read_text().splitlines()]
    assert metrics[-1]["step"] == 5
    cfg = json.loads((old_runs / run / "last" / "config.json").read_text())
    assert "n_layer" not in cfg["model"] and "max_len" not in cfg["model"]  # rewritten in the new vocabulary


def test_config_aliases():
    new = GPTConfig(layers=2, heads=2, dim=32, context=16, pos="rope")
    old = GPTConfig(n_layer=2, n_head=2, n_embd=32, block_size=16, position="rope")
    assert new == old and (old.n_layer, old.n_head, old.n_embd, old.block_size, old.position) == (2, 2, 32, 16, "rope")
    assert GPTConfig.from_dict({"n_layer": 3, "n_embd": 48, "n_head": 3}).layers == 3
    assert ViTConfig(depth=3).layers == 3
    assert TransformerConfig(ff_dim=64, max_len=32).to_dict()["mlp_dim"] == 64
    assert RNNConfig(hidden=24).dim == 24
    with pytest.raises(ValueError, match="both layers=2 and its old name n_layer=3"):
        GPTConfig(layers=2, n_layer=3)
    with pytest.raises(ValueError, match=r"context \(block_size\) must be"):
        GPTConfig(block_size=0)


def test_old_and_new_flags_give_the_same_model(tmp_path):
    corpus = tmp_path / "c.txt"
    corpus.write_text("to be or not to be, that is the question. " * 60)
    common = ["train", "gpt", "--data", str(corpus), *FAST, "--sample-chars", "0"]
    assert (
        main(
            [
                *common,
                "--out",
                str(tmp_path / "a"),
                "--layers",
                "1",
                "--heads",
                "2",
                "--dim",
                "16",
                "--context",
                "8",
                "--pos",
                "alibi",
            ]
        )
        == 0
    )
    assert (
        main(
            [
                *common,
                "--out",
                str(tmp_path / "b"),
                "--n-layer",
                "1",
                "--n-head",
                "2",
                "--n-embd",
                "16",
                "--block-size",
                "8",
                "--position",
                "alibi",
            ]
        )
        == 0
    )
    a, b = (json.loads((tmp_path / r / "last" / "config.json").read_text()) for r in ("a", "b"))
    assert a["model"] == b["model"] and a["model"]["pos"] == "alibi" and a["model"]["context"] == 8


def test_seq2seq_resume_refuses_model_changes_like_every_family(tmp_path, capsys):
    """The three copies of resume had drifted: seq2seq ignored changed model options."""
    out = tmp_path / "r"
    base = [
        "train",
        "seq2seq",
        "--data",
        "copy",
        "--dim",
        "16",
        "--heads",
        "2",
        "--enc-layers",
        "1",
        "--dec-layers",
        "1",
        "--mlp-dim",
        "16",
        "--out",
        str(out),
        *FAST,
    ]
    assert main(base) == 0
    capsys.readouterr()
    assert main([*base[: -len(FAST)], "--resume", *FAST[:1], "3", *FAST[2:]]) == 0  # same options: fine
    assert main(["train", "seq2seq", "--out", str(out), "--resume", "--dim", "32"]) == 2
    assert "--dim 32" in capsys.readouterr().err
    assert main(["train", "seq2seq", "--out", str(out), "--resume", "--lr", "1e-4", *FAST[:1], "4", *FAST[2:]]) == 0
    assert "training options changed" in capsys.readouterr().err


def test_a_new_family_is_one_recipe(tmp_path):
    """Registering a recipe adds `attnlab train NAME` and makes its checkpoints loadable."""
    from attnlab.models import GPT, GPTConfig
    from attnlab.recipes import _REGISTRY, ModelKind, recipe_for, register
    from attnlab.recipes.gpt import GPTRecipe, GPTVerbs

    class TinyLM(GPT):
        model_type = "tiny-lm"

    @register
    class TinyRecipe(GPTRecipe):
        name = "tiny"
        help = "a test family"
        # its config, its model (a class, or "module:Class" to import it when a model is built) and
        # the verbs of the model attnlab.load builds
        models = {"tiny-lm": ModelKind(GPTConfig, TinyLM, GPTVerbs)}

        def prepare(self, o, saved, model_over, tcfg, out):
            run = super().prepare(o, saved, model_over, tcfg, out)
            run.model_type = "tiny-lm"
            return run

    try:
        assert parse(["train", "tiny"])[0].name == "tiny"
        corpus = tmp_path / "c.txt"
        corpus.write_text("abcdefgh " * 300)
        assert (
            main(
                [
                    "train",
                    "tiny",
                    "--data",
                    str(corpus),
                    "--out",
                    str(tmp_path / "t"),
                    "--layers",
                    "1",
                    "--dim",
                    "16",
                    "--heads",
                    "2",
                    "--context",
                    "8",
                    "--sample-chars",
                    "0",
                    *FAST,
                ]
            )
            == 0
        )
        assert recipe_for("tiny-lm") is _REGISTRY["tiny"]
        assert isinstance(attnlab.load(tmp_path / "t"), TinyLM)
    finally:
        _REGISTRY.pop("tiny", None)


def test_training_stops_once_the_target_metric_is_reached(tmp_path, capsys):
    out = tmp_path / "s"
    assert (
        main(
            [
                "train",
                "seq2seq",
                "--data",
                "copy",
                "--dim",
                "16",
                "--heads",
                "2",
                "--enc-layers",
                "1",
                "--dec-layers",
                "1",
                "--mlp-dim",
                "16",
                "--out",
                str(out),
                "--max-iters",
                "10",
                "--eval-interval",
                "2",
                "--eval-iters",
                "1",
                "--batch-size",
                "4",
                "--no-progress",
                "--target",
                "0",
            ]
        )
        == 0
    )
    metrics = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert metrics[-1]["step"] == 2 and "val_exact" in metrics[-1]  # the first evaluation already meets 0
    assert "stopping early" in capsys.readouterr().out
    out2 = tmp_path / "s2"  # a target not reached changes nothing (10 steps do not copy perfectly)
    assert (
        main(
            [
                "train",
                "seq2seq",
                "--data",
                "copy",
                "--dim",
                "16",
                "--heads",
                "2",
                "--enc-layers",
                "1",
                "--dec-layers",
                "1",
                "--mlp-dim",
                "16",
                "--out",
                str(out2),
                "--max-iters",
                "4",
                "--eval-interval",
                "2",
                "--eval-iters",
                "1",
                "--batch-size",
                "4",
                "--no-progress",
                "--target",
                "1",
            ]
        )
        == 0
    )
    assert json.loads((out2 / "metrics.jsonl").read_text().splitlines()[-1])["step"] == 4


def test_a_language_model_stops_once_its_validation_loss_is_at_or_below_the_target(tmp_path, capsys):
    """--target on a GPT is a loss: reached from above (a loss of 100 at once; a loss of 0 never)."""
    base = ["train", "gpt", "--preset", "nano", "--context", "16", "--batch-size", "4", "--max-iters", "6"]
    base += ["--eval-interval", "2", "--eval-iters", "1", "--no-progress", "--sample-chars", "0", "--device", "cpu"]
    assert main([*base, "--out", str(tmp_path / "a"), "--target", "100"]) == 0
    metrics = [json.loads(line) for line in (tmp_path / "a" / "metrics.jsonl").read_text().splitlines()]
    assert metrics[-1]["step"] == 2 and metrics[-1]["val_loss"] <= 100
    assert "val loss" in capsys.readouterr().out
    assert main([*base, "--out", str(tmp_path / "b"), "--target", "0"]) == 0
    assert json.loads((tmp_path / "b" / "metrics.jsonl").read_text().splitlines()[-1])["step"] == 6


def test_the_embedded_default_announces_its_time(tmp_path, capsys, monkeypatch):
    """Only a plain default run prints the expected wall time (here cut short by monkeypatching fit)."""
    from attnlab.training import Trainer

    monkeypatch.setattr(Trainer, "fit", lambda self: {"step": 0, "best_val": 0.0, "seconds": 0.0})
    monkeypatch.setattr("attnlab.recipes.vit.ViTRecipe.finish", lambda *a: [])
    from attnlab.recipes.vit import ViTRecipe

    assert main(["train", "vit", "--out", str(tmp_path / "v")]) == 0
    low, high = ViTRecipe.default_seconds  # (alone, busy: what benchmarks/first_hour.py measured)
    assert f"expect {low}-{high} seconds on 2 CPU cores" in capsys.readouterr().err
    assert main(["train", "vit", "--out", str(tmp_path / "w"), "--max-iters", "5"]) == 0
    assert "expect" not in capsys.readouterr().err


def test_sample_with_bf16_weights(old_runs, capsys):
    assert (
        main(
            [
                "sample",
                "--ckpt",
                "gpt",
                "--prompt",
                "The",
                "--max-new-tokens",
                "12",
                "--dtype",
                "bf16",
                "--temperature",
                "0",
                "--device",
                "cpu",
            ]
        )
        == 0
    )
    out = capsys.readouterr().out
    assert out.startswith("The") and len(out.strip()) > 3


def test_training_defaults_follow_the_data_and_preset_and_options_win(tmp_path, monkeypatch):
    """The embedded digits ViT and the shakespeare-cpu GPT get their fast recipes; other data and
    presets keep TrainConfig's; an option given on the command line always wins."""
    from attnlab.training import Trainer

    seen = {}

    def fit(self):
        seen["cfg"], seen["task"] = self.cfg, self.task
        return {"step": 0, "best_val": 0.0, "seconds": 0.0}

    monkeypatch.setattr(Trainer, "fit", fit)
    monkeypatch.setattr("attnlab.recipes.vit.ViTRecipe.finish", lambda *a: [])
    monkeypatch.setattr("attnlab.recipes.gpt.GPTRecipe.finish", lambda *a: [])

    def run(*argv):
        assert main(["train", *argv, "--out", str(tmp_path / str(len(list(tmp_path.iterdir()))))]) == 0
        return seen["cfg"], seen["task"]

    cfg, task = run("vit")
    assert (cfg.batch_size, cfg.lr, cfg.max_iters, task.label_smoothing, task.pad) == (64, 2e-3, 1000, 0.1, 0)
    cfg, task = run("vit", "--lr", "1e-3", "--label-smoothing", "0")
    assert (cfg.batch_size, cfg.lr, task.label_smoothing) == (64, 1e-3, 0.0)
    folder = tmp_path / "imgs"
    for label in ("a", "b"):
        (folder / label).mkdir(parents=True)
        for i in range(10):
            Image.new("L", (8, 8), 20 * i).save(folder / label / f"{i}.png")
    cfg, task = run("vit", "--data", str(folder))
    assert (cfg.batch_size, cfg.lr, cfg.max_iters, task.label_smoothing) == (128, 1e-3, 2000, 0.0)

    cfg, _ = run("gpt")  # shakespeare-cpu, the default preset
    assert (cfg.lr, cfg.min_lr, cfg.max_iters, cfg.warmup_iters) == (5e-3, 5e-4, 1000, 50)
    cfg, _ = run("gpt", "--preset", "nano")
    assert (cfg.lr, cfg.max_iters) == (1e-3, 2000)
    cfg, _ = run("gpt", "--max-iters", "300")
    assert (cfg.lr, cfg.max_iters) == (5e-3, 300)
