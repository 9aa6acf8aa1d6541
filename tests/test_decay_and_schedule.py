"""Which parameters decay (as timm and nanoGPT decide), seq2seq validation on the plain NLL, and the
learning-rate schedule of a resumed run."""

import json

import pytest
import torch
import torch.nn.functional as F

from attnlab.cli import main
from attnlab.models import GPT, GPTConfig, ViT, ViTConfig
from attnlab.training.optim import adamw, decay_groups


def _names(model, params):
    ids = {id(p) for p in params}
    return {n for n, p in model.named_parameters() if id(p) in ids}


def test_vit_does_not_decay_class_token_and_positions_like_timm():
    vit = ViT(ViTConfig(image_size=8, patch_size=2, in_chans=1, dim=16, depth=1, heads=2))
    decay, no_decay = decay_groups(vit)
    assert {"cls_token", "pos.weight"} <= _names(vit, no_decay)
    assert "patch_embed.proj.weight" in _names(vit, decay) and "head.weight" in _names(vit, decay)
    assert not any(n.endswith(".bias") or ".ln" in n or "norm" in n for n in _names(vit, decay))
    opt = adamw(vit, 1e-3, 0.05)
    assert opt.param_groups[0]["weight_decay"] == 0.05 and opt.param_groups[1]["weight_decay"] == 0.0


def test_gpt_keeps_nanogpts_rule():
    gpt = GPT(GPTConfig(vocab_size=10, block_size=8, n_layer=1, n_head=2, n_embd=16))
    decay, no_decay = decay_groups(gpt)
    assert {"tok_emb.weight", "pos_emb.weight"} <= _names(gpt, decay)  # nanoGPT decays both embeddings
    assert all(p.dim() < 2 for p in no_decay)


def test_seq2seq_validation_loss_is_the_unsmoothed_nll(tmp_path, capsys):
    out = tmp_path / "run"
    assert (
        main(
            [
                "train",
                "seq2seq",
                "--data",
                "copy",
                "--min-length",
                "3",
                "--max-length",
                "5",
                "--dim",
                "32",
                "--heads",
                "2",
                "--enc-layers",
                "1",
                "--dec-layers",
                "1",
                "--ff-dim",
                "32",
                "--max-iters",
                "3",
                "--eval-interval",
                "3",
                "--eval-iters",
                "2",
                "--batch-size",
                "8",
                "--label-smoothing",
                "0.3",
                "--no-progress",
                "--out",
                str(out),
            ]
        )
        == 0
    )
    logged = json.loads((out / "metrics.jsonl").read_text().splitlines()[-1])["val_loss"]
    # recompute: the same validation batches, plain cross-entropy, no smoothing
    from attnlab.recipes import load_model
    from attnlab.data.parallel import load_parallel

    model, meta = load_model(out / "last", with_meta=True)
    data = load_parallel(meta["data_spec"], vocab=meta["vocab"], **meta["data_opts"])
    g = torch.Generator().manual_seed(meta["train"]["seed"] + 2)
    plain, smoothed = [], []
    with torch.no_grad():
        for _ in range(2):
            src, mask, tin, tout = data.batch("val", 8, g)
            logits = model(src, tin, mask).flatten(0, 1)
            plain.append(F.cross_entropy(logits, tout.flatten(), ignore_index=0).item())
            smoothed.append(F.cross_entropy(logits, tout.flatten(), ignore_index=0, label_smoothing=0.3).item())
    assert logged == pytest.approx(sum(plain) / 2, rel=1e-5)
    assert abs(logged - sum(smoothed) / 2) > 1e-3


def test_resume_with_more_iterations_keeps_the_schedule(tmp_path, capsys):
    corpus = tmp_path / "c.txt"
    corpus.write_text("the quick brown fox jumps over the lazy dog. " * 100)
    out = tmp_path / "run"
    base = [
        "train",
        "gpt",
        "--data",
        str(corpus),
        "--out",
        str(out),
        "--preset",
        "nano",
        "--block-size",
        "16",
        "--eval-interval",
        "4",
        "--eval-iters",
        "1",
        "--warmup-iters",
        "1",
        "--log-interval",
        "1",
        "--no-progress",
        "--sample-chars",
        "0",
    ]
    assert main([*base, "--max-iters", "8"]) == 0
    assert main([*base, "--resume", "--max-iters", "12"]) == 0
    assert "keeping the run's schedule" in capsys.readouterr().err
    from attnlab.training.state import read_metrics

    lrs = [r["lr"] for r in read_metrics(out / "metrics.jsonl")]
    min_lr = 1e-4
    assert len(lrs) == 12
    assert lrs[8:] == pytest.approx([min_lr] * 4)  # decayed by step 8 as first planned, and stays there
    assert lrs[7] > min_lr  # (stretched to 12, steps 9-11 would still be decaying)
    cfg = json.loads((out / "last" / "config.json").read_text())
    assert cfg["train"]["lr_decay_iters"] == 8 and cfg["train"]["max_iters"] == 12
