"""Logit lens, direct logit attribution, ablation, activation patching and head detectors, each
against a hand computation on a small random GPT (fp32)."""

import importlib.util
from pathlib import Path

import pytest
import torch

from attnlab.inspect.detectors import detection_mask, head_scores, repeated_random_tokens, score
from attnlab.inspect.lens import direct_logit_attribution, logit_lens
from attnlab.inspect.patching import ablated, logit_difference, patch_activations
from attnlab.models import GPT, GPTConfig


@pytest.fixture(scope="module")
def gpt():
    torch.manual_seed(0)
    model = GPT(GPTConfig(vocab_size=23, context=16, layers=3, heads=4, dim=32, dropout=0.0)).eval()
    with torch.no_grad():  # random, not GPT-2's small init: the terms below are far from zero
        for p in model.parameters():
            p.normal_(0, 0.3)
    return model


def test_logit_lens_equals_stopping_the_model_after_each_block(gpt):
    idx = torch.randint(23, (2, 10), generator=torch.Generator().manual_seed(1))
    lens = logit_lens(gpt, idx)
    assert lens.shape == (4, 2, 10, 23)
    with torch.no_grad():
        x = gpt.tok_emb(idx) + gpt.pos_emb.weight[:10]
        assert torch.allclose(lens[0], gpt.lm_head(gpt.ln_f(x)), atol=1e-5)
        for i, block in enumerate(gpt.blocks):
            x = block(x)
            assert torch.allclose(lens[i + 1], gpt.lm_head(gpt.ln_f(x)), atol=1e-4)
        assert torch.allclose(lens[-1], gpt(idx), atol=1e-4)


def test_direct_logit_attribution_sums_to_the_logit(gpt):
    idx = torch.randint(23, (3, 9), generator=torch.Generator().manual_seed(2))
    for token, position in ((5, -1), (17, 4)):
        parts = direct_logit_attribution(gpt, idx, token, position)
        assert len([k for k in parts if ".H" in k]) == 3 * 4 and "L2.mlp" in parts
        total = torch.stack(list(parts.values())).sum(0)
        with torch.no_grad():
            logit = gpt(idx)[:, position, token]
        assert torch.allclose(total, logit, atol=1e-4), (total, logit)
    with pytest.raises(ValueError, match="not in the vocabulary"):
        direct_logit_attribution(gpt, idx, 23)


def test_mean_ablation_is_the_head_replaced_by_a_constant(gpt):
    """Mean-ablating head 1.2 = zeroing its W_O columns and adding W_O,h · mean(z_h) to the bias."""
    import copy

    ref = torch.randint(23, (8, 12), generator=torch.Generator().manual_seed(3))
    idx = torch.randint(23, (2, 12), generator=torch.Generator().manual_seed(4))
    _, cache = gpt.run_with_cache(ref, names="blocks.1.attn.hook_z")
    mean_z = cache["blocks.1.attn.hook_z"][:, 2].mean(dim=(0, 1))  # (d_v,)
    with ablated(gpt, [(1, 2)], how="mean", reference=(ref,)), torch.no_grad():
        got = gpt(idx)
    edited = copy.deepcopy(gpt)
    attn = edited.blocks[1].attn
    d = attn.d_v
    with torch.no_grad():
        cols = attn.out_proj.weight[:, 2 * d : 3 * d].clone()
        attn.out_proj.weight[:, 2 * d : 3 * d] = 0
        attn.out_proj.bias += cols @ mean_z
        assert torch.allclose(got, edited(idx), atol=1e-4)
        with ablated(gpt, [(1, 2)]):
            zeroed = gpt(idx)
        attn.out_proj.bias -= cols @ mean_z
        assert torch.allclose(zeroed, edited(idx), atol=1e-4)
    with pytest.raises(ValueError, match="head 1.4 does not exist"):
        with ablated(gpt, [(1, 4)]):
            pass


def test_patching_one_changed_token_restores_exactly_there(gpt):
    """Clean and corrupt differ at position 3 only: at layer 0 patching position 3 restores all
    (the inputs become equal) and any other position nothing."""
    clean = torch.tensor([[1, 2, 3, 4, 5, 6, 7, 8]])
    corrupt = clean.clone()
    corrupt[0, 3] = 9
    with torch.no_grad():
        logits = gpt(clean)[0, -1]
    answer, wrong = int(logits.argmax()), int(logits.argmin())
    restored = patch_activations(gpt, (clean,), (corrupt,), logit_difference(answer, wrong))
    assert restored.shape == (3, 8)
    assert abs(restored[0, 3] - 1) < 1e-4 and restored[0, [0, 1, 2, 4, 5, 6, 7]].abs().max() < 1e-4
    assert restored[:, :3].abs().max() < 1e-4  # positions before the change never differ (causal)
    heads = patch_activations(gpt, (clean,), (corrupt,), logit_difference(answer, wrong), over="head")
    assert heads.shape == (3, 4) and torch.isfinite(heads).all()
    with pytest.raises(ValueError, match="same metric"):
        patch_activations(gpt, (clean,), (clean,), logit_difference(answer, wrong))


def test_detection_masks_and_scores_by_hand():
    tokens = torch.tensor([7, 3, 5, 7, 3, 5])
    prev = detection_mask(tokens, "previous_token")
    assert prev[1, 0] == 1 and prev[0].sum() == 0 and prev.sum() == 5
    dup = detection_mask(tokens, "duplicate_token")
    assert dup[3, 0] == 1 and dup[4, 1] == 1 and dup.sum() == 3
    ind = detection_mask(tokens, "induction")  # at the second 7 (i=3), attend to what followed the first: 3 (j=1)
    assert ind[3, 1] == 1 and ind[4, 2] == 1 and ind[5, 3] == 1 and ind.sum() == 3
    perfect_prev = torch.zeros(6, 6)
    perfect_prev[0, 0] = 1
    perfect_prev[torch.arange(1, 6), torch.arange(0, 5)] = 1
    assert abs(score(perfect_prev, prev) - 5 / 6) < 1e-6 and score(perfect_prev, ind) == 0


def test_head_scores_of_a_model(gpt):
    idx = repeated_random_tokens(2, 6, 23, torch.Generator().manual_seed(5))
    assert torch.equal(idx[:, :6], idx[:, 6:])
    scores = head_scores(gpt, idx)
    assert set(scores) == {"previous_token", "duplicate_token", "induction"}
    assert all(s.shape == (3, 4) and ((s >= 0) & (s <= 1)).all() for s in scores.values())


RUNS = __import__("pathlib").Path(__file__).parent / "fixtures" / "runs_v0_1"


def test_patch_and_ablate_from_python_and_the_command_line(tmp_path, capsys):
    import json

    import attnlab
    from attnlab.cli import main

    gpt = attnlab.load(RUNS / "gpt")
    res = gpt.patch("The cat sat", "The cat sit", "a", "e")
    assert res["restored"].shape == (1, 11) and res["tokens"][-1] == "t"
    assert abs(res["restored"][0, 9] - 1) < 1e-4  # the changed character, at the embeddings: all restored
    scores = gpt.attribute("The cat s", "a", steps=16)
    assert [t for t, _ in scores] == list("The cat s") and all(isinstance(v, float) for _, v in scores)
    lens = gpt.logit_lens("The cat", top_k=2)
    assert len(lens["layers"]) == 2 and len(lens["top_tokens"][0]) == 7 and lens["top_probs"].shape == (2, 7, 2)
    out = tmp_path / "patch.png"
    argv = ["patch", "--ckpt", str(RUNS / "gpt"), "--clean", "The cat sat", "--corrupt", "The cat sit"]
    assert main([*argv, "--answer", "a", "--wrong", "e", "--out", str(out)]) == 0
    assert (
        out.is_file()
        and out.with_suffix(".npz").is_file()
        and "layer 0 position 9 'a': +1.000" in capsys.readouterr().out
    )
    for bad, words in (
        (["--answer", "ab", "--out", str(out)], "is 2 tokens"),
        (["--answer", "a", "--out", str(tmp_path)], "is a folder"),
    ):
        assert main([*argv, *bad]) == 2 and words in capsys.readouterr().err
    short = ["patch", "--ckpt", str(RUNS / "gpt"), "--clean", "The cat", "--corrupt", "The dogs", "--answer", "a"]
    assert main([*short, "--out", str(out)]) == 2 and "same number" in capsys.readouterr().err

    before = gpt.evaluate(max_tokens=400)
    after = gpt.evaluate(max_tokens=400, ablate="0.1")
    assert after["loss"] != before["loss"]
    assert main(["ablate", "--ckpt", str(RUNS / "gpt"), "--heads", "0.1", "--max-tokens", "400", "--json"]) == 0
    shown = json.loads(capsys.readouterr().out)
    assert abs(shown["change"]["loss"] - (after["loss"] - before["loss"])) < 1e-6
    assert main(["ablate", "--ckpt", str(RUNS / "vit"), "--heads", "0.0,0.1", "--how", "mean"]) == 0
    assert "accuracy" in capsys.readouterr().out
    for heads, words in (("0.2", "head 0.2 does not exist"), ("1.0", "layer 1 does not exist"), ("x", "LAYER.HEAD")):
        assert main(["ablate", "--ckpt", str(RUNS / "gpt"), "--heads", heads]) == 2
        assert words in capsys.readouterr().err
    # neurons and whole sublayers: the same grammar from Python as text or keyword lists, and the command line
    width = gpt.blocks[0].mlp.fc.out_features
    neuron = gpt.evaluate(max_tokens=400, ablate="0.mlp.3,0.attn")
    assert neuron == gpt.evaluate(max_tokens=400, ablate={"neurons": [(0, 3)], "outputs": [(0, "attn")]})
    assert neuron["loss"] != before["loss"]
    argv = ["ablate", "--ckpt", str(RUNS / "gpt"), "--max-tokens", "400", "--json"]
    assert main([*argv, "--neurons", "0.3", "--sublayers", "0.attn"]) == 0
    shown = json.loads(capsys.readouterr().out)
    assert shown["ablated"] == "0.mlp.3,0.attn" and abs(shown["after"]["loss"] - neuron["loss"]) < 1e-6
    for bad, words in (
        (["--neurons", f"0.{width}"], f"has {width} neurons"),
        (["--neurons", "0.mlp.3"], "LAYER.NEURON"),
        (["--sublayers", "0.ffn"], "LAYER.attn or LAYER.mlp"),
        ([], "needs --heads, --neurons or --sublayers"),
    ):
        assert main(["ablate", "--ckpt", str(RUNS / "gpt"), *bad]) == 2
        assert words in capsys.readouterr().err


def test_an_attention_only_gpt(tmp_path):
    """--no-mlp: blocks without an MLP (resid_post = resid_mid); the attribution still sums, and
    GPT-2 export refuses it (GPT-2 has MLPs)."""
    import attnlab
    from attnlab.errors import CheckpointError

    torch.manual_seed(0)
    model = GPT(GPTConfig(vocab_size=11, context=8, layers=2, heads=2, dim=16, mlp=False)).eval()
    assert all(b.mlp is None for b in model.blocks) and sum(p.numel() for p in model.parameters()) < 3000
    idx = torch.randint(11, (2, 8))
    _, cache = model.run_with_cache(idx)
    assert torch.equal(cache["blocks.0.hook_resid_mid"], cache["blocks.0.hook_resid_post"])
    assert not any("mlp" in k for k in cache)
    parts = direct_logit_attribution(model, idx, 3)
    with torch.no_grad():
        assert torch.allclose(torch.stack(list(parts.values())).sum(0), model(idx)[:, -1, 3], atol=1e-4)
    with pytest.raises(CheckpointError, match="mlp=False"):
        attnlab.export_hf(model, tmp_path / "hf")


def test_class_lens_of_a_vit_ends_at_its_logits():
    from attnlab.inspect.lens import class_lens
    from attnlab.models import ViT, ViTConfig

    torch.manual_seed(0)
    vit = ViT(ViTConfig(image_size=8, patch_size=2, in_chans=1, num_classes=5, dim=16, layers=3, heads=2)).eval()
    with torch.no_grad():
        vit.head.weight.normal_()
        images = torch.rand(4, 1, 8, 8)
        lens = class_lens(vit, images)
        assert lens.shape == (3, 4, 5) and torch.allclose(lens[-1], vit(images), atol=1e-5)
        x = vit.hook_embed(vit.pos(torch.cat([vit.cls_token.expand(4, 1, 16), vit.patch_embed(images)], 1)))
        x = vit.encoder.blocks[0](x)
        if vit.peg is not None:
            x = vit.peg(x, vit.grid, vit.n_prefix)
        assert torch.allclose(lens[0], vit.head(vit.encoder.ln_f(x)[:, 0]), atol=1e-5)


def test_integrated_gradients_are_complete_and_equal_captums(gpt):
    """Completeness: the token attributions sum to f(x) − f(zero embeddings) within 1 %; the wrapper
    equals captum's IntegratedGradients called on the same function."""
    pytest.importorskip("captum")
    from captum.attr import IntegratedGradients

    from attnlab.inspect.attribution import image_attributions, text_attributions
    from attnlab.models import ViT, ViTConfig

    idx = torch.randint(23, (2, 7), generator=torch.Generator().manual_seed(6))
    res = text_attributions(gpt, idx, target=4, steps=64)
    _, cache = gpt.run_with_cache(idx, names="hook_embed")
    e = cache["hook_embed"]

    def f(x):
        with gpt.hooks([("hook_embed", lambda v, hook: x)]):
            return gpt(idx.repeat(x.shape[0] // 2, 1))[:, -1, 4]

    with torch.no_grad():
        gap = f(e) - f(torch.zeros_like(e))
    assert torch.allclose(res["tokens"].sum(-1), gap, rtol=0.01, atol=1e-3), (res["tokens"].sum(-1), gap)
    direct = IntegratedGradients(f).attribute(e, baselines=torch.zeros_like(e), n_steps=64).sum(-1)
    assert torch.allclose(res["tokens"], direct, atol=1e-5)
    gxi = text_attributions(gpt, idx, target=4, method="gradient_x_input")
    assert gxi["tokens"].shape == (2, 7) and gxi["delta"] is None

    torch.manual_seed(0)
    vit = ViT(ViTConfig(image_size=8, patch_size=2, in_chans=1, num_classes=3, dim=16, layers=1, heads=2)).eval()
    with torch.no_grad():
        vit.head.weight.normal_()
    images = torch.randn(2, 1, 8, 8)
    px = image_attributions(vit, images, target=1, steps=64)
    with torch.no_grad():
        gap = vit(images)[:, 1] - vit(torch.zeros_like(images))[:, 1]
    assert px["pixels"].shape == (2, 8, 8)
    assert torch.allclose(px["pixels"].sum((1, 2)), gap, rtol=0.01, atol=1e-3)


def _transformer_lens_and_attnlab(tmp_path, monkeypatch, layers=2, heads=4, dim=32, init=0.02):
    """A random HuggingFace GPT-2 (vocabulary of 50 words t0 … t49) booted by TransformerLens (4.x,
    TransformerBridge, offline from a local folder) and loaded by attnlab: (theirs, ours)."""
    pytest.importorskip("transformer_lens")
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import GPT2Config, GPT2LMHeadModel, PreTrainedTokenizerFast

    import attnlab

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    import transformer_lens.model_bridge.sources.transformers  # noqa: F401 (attaches boot_transformers)
    from transformer_lens.model_bridge import TransformerBridge

    torch.manual_seed(0)
    folder = tmp_path / "gpt2"
    config = GPT2Config(
        vocab_size=50,
        n_positions=32,
        n_embd=dim,
        n_layer=layers,
        n_head=heads,
        bos_token_id=0,
        eos_token_id=0,
        initializer_range=init,
    )
    GPT2LMHeadModel(config).eval().save_pretrained(folder)
    words = Tokenizer(models.WordLevel({f"t{i}": i for i in range(50)}, unk_token="t0"))
    words.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    PreTrainedTokenizerFast(tokenizer_object=words, unk_token="t0", bos_token="t0", eos_token="t0").save_pretrained(
        folder
    )
    return TransformerBridge.boot_transformers(str(folder), device="cpu"), attnlab.load(folder)  # eager attention


def test_the_same_as_transformer_lens(tmp_path, monkeypatch):
    """A random GPT-2 in TransformerLens and in attnlab: the same activations, logits,
    residual-stream decomposition and activation-patching result."""
    tl_model, ours = _transformer_lens_and_attnlab(tmp_path, monkeypatch)
    from transformer_lens import patching

    ids = torch.randint(50, (2, 10), generator=torch.Generator().manual_seed(1))
    tl_logits, tl = tl_model.run_with_cache(ids)
    logits, cache = ours.run_with_cache(ids)
    assert torch.allclose(logits, tl_logits, atol=1e-4)
    for i in range(2):
        for name in (
            "hook_resid_pre",
            "hook_resid_mid",
            "hook_resid_post",
            "hook_attn_out",
            "hook_mlp_out",
            "attn.hook_pattern",
            "mlp.hook_pre",
            "mlp.hook_post",
        ):
            key = f"blocks.{i}.{name}"
            assert torch.allclose(cache[key], tl[key], atol=1e-4), key
        for name in (
            "attn.hook_q",
            "attn.hook_k",
            "attn.hook_v",
            "attn.hook_z",
        ):  # TL: (B, T, H, d); attnlab (B, H, T, d)
            key = f"blocks.{i}.{name}"
            assert torch.allclose(cache[key].transpose(1, 2), tl[key], atol=1e-4), key
    assert torch.allclose(cache["hook_embed"], tl["hook_embed"] + tl["hook_pos_embed"], atol=1e-5)
    stream = torch.stack([cache["hook_embed"], cache["blocks.0.hook_resid_post"], cache["blocks.1.hook_resid_post"]])
    assert torch.allclose(stream, tl.accumulated_resid(), atol=1e-4)  # what the logit lens reads
    # direct logit attribution, per layer: TransformerLens's decomposition through the final LN's scale
    token = 7
    comps, labels = tl.decompose_resid(layer=-1, apply_ln=True, pos_slice=-1, return_labels=True)
    theirs = dict(zip(labels, comps @ (ours.lm_head.weight[token] * ours.ln_f.weight)))
    parts = direct_logit_attribution(ours, ids, token)
    assert torch.allclose(parts["embed"], theirs["embed"] + theirs["pos_embed"], atol=1e-4)
    for i in range(2):
        attn = sum(v for k, v in parts.items() if k.startswith(f"L{i}.H") or k == f"L{i}.attn_bias")
        assert torch.allclose(attn, theirs[f"{i}_attn_out"], atol=1e-4)
        assert torch.allclose(parts[f"L{i}.mlp"], theirs[f"{i}_mlp_out"], atol=1e-4)
    # activation patching of the residual stream, layer x position
    clean = ids[:1, :8]
    corrupt = clean.clone()
    corrupt[0, 2] = (clean[0, 2] + 1) % 50
    with torch.no_grad():
        last = ours(clean)[0, -1]
    metric = logit_difference(int(last.argmax()), int(last.argmin()))
    clean_logits, clean_cache = tl_model.run_with_cache(clean)
    m_clean, m_corrupt = metric(clean_logits).mean(), metric(tl_model(corrupt)).mean()
    theirs = patching.get_act_patch_resid_pre(
        tl_model, corrupt, clean_cache, lambda lg: (metric(lg).mean() - m_corrupt) / (m_clean - m_corrupt)
    )
    assert torch.allclose(patch_activations(ours, (clean,), (corrupt,), metric), theirs, atol=2e-4)


def test_ablate_refuses_families_whose_evaluation_cannot_apply_it(capsys):
    from attnlab.cli import main

    assert main(["ablate", "--ckpt", str(RUNS / "s2s"), "--heads", "0.0"]) == 2
    assert "not supported yet" in capsys.readouterr().err


def test_ablating_neurons_and_sublayers_equals_editing_the_weights(gpt):
    """Zeroing neuron 1.7 = zeroing column 7 of that MLP's output projection; zeroing layer 2's
    MLP output = zeroing the whole projection (weights and bias); mean-ablating layer 0's
    attention output = a constant added in its place."""
    import copy

    idx = torch.randint(23, (2, 9), generator=torch.Generator().manual_seed(7))
    edited = copy.deepcopy(gpt)
    with torch.no_grad():
        with ablated(gpt, neurons=[(1, 7)]):
            got = gpt(idx)
        edited.blocks[1].mlp.proj.weight[:, 7] = 0
        assert torch.allclose(got, edited(idx), atol=1e-4)
        edited = copy.deepcopy(gpt)
        with ablated(gpt, outputs=[(2, "mlp")]):
            got = gpt(idx)
        edited.blocks[2].mlp.proj.weight.zero_()
        edited.blocks[2].mlp.proj.bias.zero_()
        assert torch.allclose(got, edited(idx), atol=1e-4)
        ref = torch.randint(23, (6, 9), generator=torch.Generator().manual_seed(8))
        _, cache = gpt.run_with_cache(ref, names="blocks.0.hook_attn_out")
        mean = cache["blocks.0.hook_attn_out"].mean(dim=(0, 1))
        with ablated(gpt, outputs=[(0, "attn")], how="mean", reference=(ref,)):
            got = gpt(idx)
        with gpt.hooks([("blocks.0.hook_attn_out", lambda x, hook: mean.expand_as(x))]):
            assert torch.allclose(got, gpt(idx), atol=1e-5)
    for kw, words in ((dict(neurons=[(1, 128)]), "has 128 neurons"), (dict(outputs=[(0, "ffn")]), "attn or mlp")):
        with pytest.raises(ValueError, match=words):
            with ablated(gpt, **kw):
                pass


def test_patching_two_images_of_a_vit(tmp_path, capsys):
    """Images differing in one patch: at the embeddings (layer 0) that patch's token restores all,
    every other token nothing; the same through `attnlab patch` with two image files."""
    import numpy as np
    from PIL import Image

    import attnlab
    from attnlab.cli import main

    from attnlab.recipes import recipes

    tiny = {r.name: dict(r.tiny) for r in recipes()}["vit"]
    run = attnlab.train("vit", out=tmp_path / "vit", **{**tiny, "max_iters": 40, "eval_interval": 40, "lr": 3e-3})
    vit = attnlab.load(run.out)
    clean = torch.rand(1, 8, 8, generator=torch.Generator().manual_seed(0))
    corrupt = clean.clone()
    corrupt[0, :2, :2] = 1 - corrupt[0, :2, :2]  # patch 0 (2x2 pixels)
    with torch.no_grad():
        from attnlab.data.images import normalize

        logits = vit(normalize(clean[None], vit.mean, vit.std))[0]
    answer, wrong = vit.labels[int(logits.argmax())], vit.labels[int(logits.argmin())]
    res = vit.patch(clean, corrupt, answer, wrong)
    r = res["restored"]
    first = vit.n_prefix  # patch 0's token comes after the class token
    assert r.shape[1] == vit.n_prefix + 16 and abs(r[0, first] - 1) < 1e-4
    assert r[0, [j for j in range(r.shape[1]) if j != first]].abs().max() < 1e-4
    for name, img in (("a.png", clean), ("b.png", corrupt)):
        Image.fromarray((img[0].numpy() * 255).round().astype(np.uint8)).save(tmp_path / name)
    out = tmp_path / "p.png"
    argv = [
        "patch",
        "--ckpt",
        str(run.out),
        "--clean",
        str(tmp_path / "a.png"),
        "--corrupt",
        str(tmp_path / "b.png"),
    ]
    assert main([*argv, "--answer", answer, "--wrong", wrong, "--out", str(out)]) == 0 and out.is_file()
    assert main([*argv, "--answer", "cat", "--out", str(out)]) == 2 and "is not a class" in capsys.readouterr().err
    assert (
        main(
            ["patch", "--ckpt", str(RUNS / "s2s"), "--clean", "a", "--corrupt", "b", "--answer", "a", "--out", str(out)]
        )
        == 2
    )
    assert "reads GPTs and ViTs" in capsys.readouterr().err


@pytest.mark.parametrize("norm_first", [False, True])
def test_mlm_lens_ends_at_the_masked_lm_logits(norm_first):
    from attnlab.inspect.lens import mlm_lens
    from attnlab.models.encoder import TextEncoder, TextEncoderConfig

    torch.manual_seed(0)
    enc = TextEncoder(
        TextEncoderConfig(
            vocab_size=30, context=12, layers=2, heads=2, dim=16, mlp_dim=32, dropout=0.0, norm_first=norm_first
        )
    ).eval()
    ids = torch.randint(5, 30, (2, 9))
    mask = torch.ones_like(ids)
    mask[1, 6:] = 0
    lens = mlm_lens(enc, ids, mask)
    with torch.no_grad():
        assert lens.shape == (3, 2, 9, 30) and torch.allclose(lens[-1], enc(ids, mask, head="mlm"), atol=1e-5)
        _, cache = enc.run_with_cache(ids, mask, names="encoder.blocks.0.hook_resid_post")
        assert torch.allclose(lens[1], enc.mlm(enc.encoder.ln_f(cache["encoder.blocks.0.hook_resid_post"])), atol=1e-6)


def test_gradient_weighted_rollout_by_hand_on_one_block():
    from attnlab.inspect.attribution import gradient_rollout
    from attnlab.models import ViT, ViTConfig

    torch.manual_seed(0)
    vit = ViT(ViTConfig(image_size=8, patch_size=2, in_chans=1, num_classes=3, dim=16, layers=1, heads=2)).eval()
    with torch.no_grad():
        vit.head.weight.normal_()
    images = torch.rand(2, 1, 8, 8)
    maps = gradient_rollout(vit, images, target=2)
    pattern = {}

    def keep(a, hook):
        a.retain_grad()
        pattern["a"] = a

    with vit.hooks([("encoder.blocks.0.attn.hook_pattern", keep)]):
        vit(images)[:, 2].sum().backward()
    a = pattern["a"]
    by_hand = torch.eye(a.shape[-1]) + (a.grad * a).clamp(min=0).mean(1)  # R = I + Ā I
    assert maps.shape == (2, 4, 4) and torch.allclose(maps, by_hand[:, 0, 1:].reshape(2, 4, 4), atol=1e-6)
    assert not torch.allclose(maps, gradient_rollout(vit, images, target=0))  # class-specific


def test_head_detectors_match_transformer_lens(gpt):
    """The detection masks and scores equal TransformerLens's ``head_detector`` functions."""
    pytest.importorskip("transformer_lens")
    from transformer_lens import head_detector as hd

    tokens = torch.tensor([3, 7, 3, 9, 7, 3, 9, 1, 7, 3])
    theirs = {
        "previous_token": hd.get_previous_token_head_detection_pattern(tokens[None]),
        "duplicate_token": hd.get_duplicate_token_head_detection_pattern(tokens[None]),
        "induction": hd.get_induction_head_detection_pattern(tokens[None]),
    }
    _, cache = gpt.run_with_cache(tokens[None], names="blocks.*.attn.hook_pattern")
    for kind, mask in theirs.items():
        assert torch.equal(detection_mask(tokens, kind), mask), kind
    # a pattern of one's own: attend two tokens back
    theirs["two_back"] = torch.diag(torch.ones(8), -2)
    for bos, current, measure in [(False, False, "mul"), (True, False, "mul"), (True, True, "mul"), (True, True, "abs"),
                                  (False, False, "abs")]:  # fmt: skip
        options = dict(exclude_bos=bos, exclude_current_token=current, error_measure=measure)
        ours = head_scores(gpt, tokens[None], custom={"two_back": theirs["two_back"]}, **options)
        for kind, mask in theirs.items():
            for layer in range(3):
                for head in range(4):
                    pattern = cache[f"blocks.{layer}.attn.hook_pattern"][0, head]
                    ref = hd.compute_head_attention_similarity_score(pattern, mask, **options)
                    tol = 1e-5 if measure == "mul" else 6e-4  # (TransformerLens rounds "abs" to 3 decimals)
                    assert abs(ours[kind][layer, head].item() - ref) < tol, (kind, layer, head, options)


def test_gpt_inspections_draw_what_the_python_api_computes(tmp_path, capsys):
    """`attnlab inspect lens|attribution|logit-attribution|heads` on a GPT run (and the same from
    Python, model.inspect) write the numbers of the library functions, and refuse bad input in one line."""
    import numpy as np

    import attnlab
    from attnlab.cli import main
    from attnlab.inspect.attribution import text_attributions

    run, text = RUNS / "gpt", "The cat sat"
    model = attnlab.load(run)
    idx = model.token_ids(text, "text")
    out = tmp_path / "x.png"
    base = ["inspect", "--ckpt", str(run), "--out", str(out)]

    assert main([base[0], "lens", *base[1:], "--text", text]) == 0
    raw = np.load(out.with_suffix(".npz"))
    np.testing.assert_allclose(raw["top_probs"], model.logit_lens(text, top_k=3)["top_probs"], atol=1e-6)

    argv = [base[0], "attribution", *base[1:], "--text", text, "--answer", "e", "--method", "gradient_x_input"]
    assert main(argv) == 0
    want = text_attributions(model, idx, model.one_token("e", "answer"), method="gradient_x_input")["tokens"][0]
    np.testing.assert_allclose(np.load(out.with_suffix(".npz"))["scores"], want.numpy(), atol=1e-6)
    if importlib.util.find_spec("captum") is not None:  # --steps and --baseline reach integrated gradients
        argv = [base[0], "attribution", *base[1:], "--text", text, "--answer", "e", "--steps", "8", "--baseline", " "]
        assert main(argv) == 0
        space = model.one_token(" ", "baseline")
        want = text_attributions(model, idx, model.one_token("e", "answer"), steps=8, baseline=space)["tokens"][0]
        np.testing.assert_allclose(np.load(out.with_suffix(".npz"))["scores"], want.numpy(), atol=1e-5)
        assert model.attribute(text, "e", steps=8, baseline=" ")[0][1] == pytest.approx(float(want[0]), abs=1e-5)

    model.inspect("logit-attribution", out, text=text, answer="e")  # the Python surface of the same
    raw = np.load(out.with_suffix(".npz"))
    with torch.no_grad():
        logit = model(idx)[0, -1, model.one_token("e", "answer")].item()
    rest = sum(float(raw[k]) for k in raw.files if k != "contributions")
    assert raw["contributions"].shape == (1, 3) and abs(raw["contributions"].sum() + rest - logit) < 1e-4

    assert main([base[0], "heads", *base[1:]]) == 0  # default: random tokens repeated
    raw = np.load(out.with_suffix(".npz"))
    assert set(raw.files) == {"previous_token", "duplicate_token", "induction"} and raw["induction"].shape == (1, 2)
    capsys.readouterr()
    for bad, words in (
        ([base[0], "lens", *base[1:]], 'needs --text "some text"'),
        ([base[0], "attribution", *base[1:], "--text", text, "--answer", "at"], "is 2 tokens"),
        ([base[0], "lens", *base[1:], "--text", "café"], "U+00E9"),
        ([base[0], "rollout", *base[1:]], "needs a vit checkpoint"),
    ):
        assert main(bad) == 2
        err = capsys.readouterr().err
        assert words in err and len(err.strip().splitlines()) == 1, err


def test_vit_inspections_lens_and_attribution(tmp_path, capsys):
    """The class lens's last block is the model's own prediction; the attribution maps are
    image_attributions' and the gradient-weighted rollout's; an unknown --target is refused."""
    import numpy as np
    from PIL import Image

    import attnlab
    from attnlab.cli import main
    from attnlab.data.images import load_image, normalize
    from attnlab.inspect.attribution import gradient_rollout, image_attributions

    run = RUNS / "vit"
    model = attnlab.load(run)
    png = tmp_path / "digit.png"
    size = model.config.image_size
    Image.fromarray((np.arange(size * size).reshape(size, size) * 255 // (size * size)).astype(np.uint8)).save(png)
    x = normalize(load_image(png, 1, size)[0][None], model.mean, model.std)
    out = tmp_path / "v.png"
    base = ["--ckpt", str(run), "--image", str(png), "--out", str(out)]
    assert main(["inspect", "lens", *base]) == 0
    with torch.no_grad():
        final = model(x).softmax(-1)[0]
    np.testing.assert_allclose(np.load(out.with_suffix(".npz"))["probs"][-1], final.numpy(), atol=1e-5)

    assert main(["inspect", "attribution", *base, "--target", "3", "--method", "gradient_x_input"]) == 0
    raw = np.load(out.with_suffix(".npz"))
    want = image_attributions(model, x, 3, method="gradient_x_input")["pixels"][0].abs()
    np.testing.assert_allclose(raw["gradient_x_input"], want.numpy(), atol=1e-6)
    np.testing.assert_allclose(raw["gradient-weighted_rollout"], gradient_rollout(model, x, 3)[0].numpy(), atol=1e-6)
    res = model.attribute(png, method="gradient_x_input")  # the predicted class by default
    assert res["target"] == model.labels[int(final.argmax())] and res["pixels"].shape == (size, size)
    capsys.readouterr()
    assert main(["inspect", "attribution", *base, "--target", "cat"]) == 2
    assert "'cat' is not a class of this model" in capsys.readouterr().err


def test_gradient_weighted_rollout_builds_on_the_models_device_and_dtype():
    """The identity it starts from was a CPU float32 tensor (a CUDA model failed): built like the
    patterns now; a float64 ViT (which failed the same way) gives the float32 map to rounding."""
    from attnlab.inspect.attribution import gradient_rollout
    from attnlab.models import ViT, ViTConfig

    torch.manual_seed(0)
    vit = ViT(ViTConfig(image_size=8, patch_size=2, in_chans=1, num_classes=3, dim=16, layers=2, heads=2)).eval()
    images = torch.rand(2, 1, 8, 8)
    single = gradient_rollout(vit, images, target=1)
    double = gradient_rollout(vit.double(), images.double(), target=1)
    assert double.dtype == torch.float64 and torch.allclose(double.float(), single, atol=1e-5)


def test_integrated_gradients_from_another_baseline_in_batches(gpt):
    """baseline= a token (text) or the blurred image: the attributions sum to f(x) − f(baseline),
    differ from the zero baseline's, and internal_batch_size gives the same numbers in pieces."""
    pytest.importorskip("captum")
    from attnlab.inspect.attribution import blurred, image_attributions, text_attributions
    from attnlab.models import ViT, ViTConfig

    idx = torch.randint(23, (2, 7), generator=torch.Generator().manual_seed(6))
    res = text_attributions(gpt, idx, target=4, steps=64, baseline=5)
    pieces = text_attributions(gpt, idx, target=4, steps=64, baseline=5, internal_batch_size=16)
    with torch.no_grad():
        gap = gpt(idx)[:, -1, 4] - gpt(torch.full_like(idx, 5))[:, -1, 4]
    assert torch.allclose(res["tokens"].sum(-1), gap, rtol=0.01, atol=1e-3), (res["tokens"].sum(-1), gap)
    assert torch.allclose(pieces["tokens"], res["tokens"], atol=1e-5)
    assert not torch.allclose(res["tokens"], text_attributions(gpt, idx, target=4, steps=64)["tokens"], atol=1e-2)

    torch.manual_seed(0)
    vit = ViT(ViTConfig(image_size=8, patch_size=2, in_chans=1, num_classes=3, dim=16, layers=1, heads=2)).eval()
    with torch.no_grad():
        vit.head.weight.normal_()
    images = torch.randn(2, 1, 8, 8)
    px = image_attributions(vit, images, target=1, steps=64, baseline="blur")
    with torch.no_grad():
        gap = vit(images)[:, 1] - vit(blurred(images))[:, 1]
    assert torch.allclose(px["pixels"].sum((1, 2)), gap, rtol=0.01, atol=1e-3)
    flat = torch.full((1, 3, 16, 16), 0.7)
    assert torch.allclose(blurred(flat), flat, atol=1e-6)  # a blur keeps a flat image (and its colour)
    assert blurred(images).std() < images.std()  # and removes detail
    with pytest.raises(Exception, match="steps=0"):
        text_attributions(gpt, idx, target=4, steps=0)
    with pytest.raises(Exception, match="image baseline 'noise'"):
        image_attributions(vit, images, target=1, baseline="noise")


def test_patching_reports_its_span_and_warns_when_it_is_small(gpt, tmp_path, capsys):
    """The restored fractions divide by clean − corrupt: the span is reported, and below SMALL_SPAN
    a warning says the fractions magnify noise (before: "+4.29" for a span of 0.041, unexplained)."""
    import warnings

    import attnlab
    from attnlab.cli import main
    from attnlab.inspect.patching import SMALL_SPAN, logit_difference, patch_activations, patching_span

    clean, corrupt = torch.randint(23, (1, 6), generator=torch.Generator().manual_seed(1)), None
    corrupt = clean.clone()
    corrupt[0, 2] = (corrupt[0, 2] + 1) % 23
    metric = logit_difference(3, 4)
    span = patching_span(gpt, (clean,), (corrupt,), metric)
    with torch.no_grad():
        want = (metric(gpt(clean)) - metric(gpt(corrupt))).item()
    assert span["span"] == pytest.approx(want, abs=1e-5) and span["clean"] - span["corrupt"] == pytest.approx(want)
    tiny = lambda logits: metric(logits) * (0.5 * SMALL_SPAN / abs(want))  # noqa: E731  (the same, scaled down)
    with pytest.warns(UserWarning, match="fractions magnify noise"):
        small = patch_activations(gpt, (clean,), (corrupt,), tiny)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # an ordinary span: no warning
        big = patch_activations(gpt, (clean,), (corrupt,), lambda logits: metric(logits) * (2 * SMALL_SPAN / abs(want)))
    torch.testing.assert_close(small, big)  # (the fractions themselves do not depend on the scale)
    run = attnlab.load(RUNS / "gpt")
    assert set(run.patch("The cat sat", "The cat sit", "a", "e")) >= {"clean", "corrupt", "span"}
    argv = ["patch", "--ckpt", str(RUNS / "gpt"), "--clean", "The cat sat", "--corrupt", "The cat sit", "--answer", "a"]
    capsys.readouterr()
    assert main([*argv, "--wrong", "e", "--out", str(tmp_path / "p.png")]) == 0
    shown = capsys.readouterr().out
    assert "metric clean" in shown and "clean − corrupt = " in shown and "each fraction is" in shown


def test_weights_circuits_and_residual_helpers_match_transformer_lens(tmp_path, monkeypatch):
    """TransformerLens's analysis kit on the same random GPT-2 (3 layers x 3 heads, shapes the other
    tests do not use): W_Q … W_U, composition scores (Q, K, V), accumulated_resid,
    decompose_resid, stack_head_results and apply_ln_to_stack, stop_at_layer / start_at_layer and
    to_str_tokens agree; the factored circuits' norms and singular values equal the dense ones."""
    from attnlab.inspect.circuits import composition_scores, ov_circuit, qk_circuit
    from attnlab.inspect.residual import (
        accumulated_resid,
        apply_ln_to_stack,
        decompose_resid,
        logit_diff,
        stack_head_results,
    )

    tl_model, ours = _transformer_lens_and_attnlab(tmp_path, monkeypatch, layers=3, heads=3, dim=24)
    for name in ("W_Q", "W_K", "W_V", "W_O", "b_Q", "b_K", "b_V", "b_O", "W_E", "W_pos", "W_U"):
        torch.testing.assert_close(getattr(ours, name), getattr(tl_model, name), atol=1e-6, rtol=1e-5, msg=name)
    for kind in "qkv":
        theirs = tl_model.all_composition_scores(kind.upper()).scores
        torch.testing.assert_close(composition_scores(ours, kind), theirs, atol=1e-5, rtol=1e-4, msg=kind)
    ov, qk = ov_circuit(ours), qk_circuit(ours)
    torch.testing.assert_close(ov.norm(), torch.linalg.matrix_norm(ov.AB))
    torch.testing.assert_close(qk.svdvals(), torch.linalg.svdvals(qk.AB)[..., : qk.A.shape[-1]], atol=1e-5, rtol=1e-4)

    ids = torch.randint(50, (2, 9), generator=torch.Generator().manual_seed(3))
    _, tl = tl_model.run_with_cache(ids)
    logits, cache = ours.run_with_cache(ids)
    mine, labels = accumulated_resid(ours, cache, incl_mid=True, return_labels=True)
    theirs, their_labels = tl.accumulated_resid(incl_mid=True, return_labels=True)
    assert labels == their_labels
    torch.testing.assert_close(mine, theirs, atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(
        accumulated_resid(ours, cache, apply_ln=True), tl.accumulated_resid(apply_ln=True), atol=1e-4, rtol=1e-4
    )
    torch.testing.assert_close(
        accumulated_resid(ours, cache, 1, apply_ln=True, pos_slice=-1),
        tl.accumulated_resid(1, apply_ln=True, pos_slice=-1),
        atol=1e-4,
        rtol=1e-4,
    )
    parts, labels = decompose_resid(ours, cache, return_labels=True)
    theirs, their_labels = tl.decompose_resid(return_labels=True)
    assert labels[1:] == their_labels[2:] and their_labels[:2] == ["embed", "pos_embed"]
    torch.testing.assert_close(parts[0], theirs[0] + theirs[1], atol=1e-5, rtol=1e-5)  # (tokens and positions: one)
    torch.testing.assert_close(parts[1:], theirs[2:], atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(parts.sum(0), cache["blocks.2.hook_resid_post"], atol=1e-4, rtol=1e-4)
    heads, labels = stack_head_results(ours, cache, return_labels=True, incl_remainder=True)
    theirs, their_labels = tl.stack_head_results(return_labels=True, incl_remainder=True)
    assert labels == their_labels and labels[:2] == ["L0H0", "L0H1"]
    torch.testing.assert_close(heads, theirs, atol=1e-4, rtol=1e-4)
    stack = decompose_resid(ours, cache, 2, mlp_input=True, apply_ln=True)  # through block 2's second norm
    theirs = tl.decompose_resid(2, mlp_input=True, apply_ln=True)
    torch.testing.assert_close(stack[0], theirs[0] + theirs[1], atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(stack[1:], theirs[2:], atol=1e-4, rtol=1e-4)
    # the final stream through the final norm (frozen scale) and the unembedding is the logits
    normed = apply_ln_to_stack(ours, cache, parts).sum(0) * ours.ln_f.weight + ours.ln_f.bias
    torch.testing.assert_close(normed @ ours.W_U, logits, atol=1e-4, rtol=1e-4)

    for layer in (0, 2, -1):
        resid = ours(ids, stop_at_layer=layer)
        torch.testing.assert_close(resid, tl_model(ids, stop_at_layer=layer), atol=1e-4, rtol=1e-4)
        torch.testing.assert_close(ours(resid, start_at_layer=layer), logits, atol=1e-5, rtol=1e-5)
    assert ours.to_str_tokens("t3 t7 t1") == tl_model.to_str_tokens("t3 t7 t1", prepend_bos=False)
    answers = torch.tensor([[3, 4], [5, 6]])
    want = (logits[0, -1, 3] - logits[0, -1, 4] + logits[1, -1, 5] - logits[1, -1, 6]) / 2
    torch.testing.assert_close(logit_diff(logits, answers), want)


def test_every_patching_target_matches_transformer_lens(tmp_path, monkeypatch):
    """attn_out, mlp_out (layer x position), head outputs by position (layer x head x position), and
    queries, keys, values and patterns (layer x head): attnlab's restored fractions equal
    TransformerLens's get_act_patch_* on the same GPT-2 weights; resid_mid and resid_post against
    resid_pre, by hand."""
    from transformer_lens import patching

    from attnlab.cli import commands
    from attnlab.inspect.patching import PATCH_TARGETS

    # (weights of std 0.3, not GPT-2's 0.02: a clean − corrupt span of nats, not thousandths)
    tl_model, ours = _transformer_lens_and_attnlab(tmp_path, monkeypatch, layers=2, heads=3, dim=24, init=0.3)
    clean = torch.randint(50, (1, 7), generator=torch.Generator().manual_seed(4))
    corrupt = clean.clone()
    corrupt[0, 3] = (clean[0, 3] + 1) % 50
    with torch.no_grad():
        last = ours(clean)[0, -1]
    metric = logit_difference(int(last.argmax()), int(last.argmin()))
    clean_logits, clean_cache = tl_model.run_with_cache(clean)
    m_clean, m_corrupt = metric(clean_logits).mean(), metric(tl_model(corrupt)).mean()

    def their_metric(logits):
        return (metric(logits).mean() - m_corrupt) / (m_clean - m_corrupt)

    theirs = {
        "attn_out": patching.get_act_patch_attn_out,
        "mlp_out": patching.get_act_patch_mlp_out,
        "q": patching.get_act_patch_attn_head_q_all_pos,
        "k": patching.get_act_patch_attn_head_k_all_pos,
        "v": patching.get_act_patch_attn_head_v_all_pos,
        "pattern": patching.get_act_patch_attn_head_pattern_all_pos,
    }
    for over, fn in theirs.items():
        want = fn(tl_model, corrupt, clean_cache, their_metric)
        got = patch_activations(ours, (clean,), (corrupt,), metric, over=over)
        torch.testing.assert_close(got, want, atol=2e-4, rtol=1e-3, msg=over)
    by_position = patching.get_act_patch_attn_head_out_by_pos(tl_model, corrupt, clean_cache, their_metric)
    got = patch_activations(ours, (clean,), (corrupt,), metric, over="head_position")  # (L, H, T); theirs (L, T, H)
    torch.testing.assert_close(got, by_position.transpose(1, 2), atol=2e-4, rtol=1e-3)
    # resid_mid by hand (TransformerLens 4.3's bridge hooks resid_mid beside the path, not on it: its
    # patch does not reach the MLP): the MLP works position by position, so patching the middle of
    # block l at one position is patching the stream after it there, i.e. the input of block l + 1
    pre = patch_activations(ours, (clean,), (corrupt,), metric, over="resid_pre")
    mid = patch_activations(ours, (clean,), (corrupt,), metric, over="resid_mid")
    post = patch_activations(ours, (clean,), (corrupt,), metric, over="resid_post")
    torch.testing.assert_close(mid[0], pre[1])
    torch.testing.assert_close(post[0], pre[1])
    assert abs(post[-1, -1] - 1) < 1e-4 and abs(mid[-1, -1] - 1) < 1e-4  # the last stream carries everything
    over = commands()["patch"].options.specs["over"]  # (every target but head_position, whose result is 3-D)
    assert list(over.choices) == [k for k in PATCH_TARGETS if k != "head_position"]


def test_attribution_patching_estimates_activation_patching(tmp_path, monkeypatch):
    """One forward and one backward pass estimate every cell of activation patching. It is the
    metric's derivative along clean − corrupt (checked by a finite difference, for a stream at the
    embeddings too); for heads and sublayer outputs of a GPT-2 at small initialisation it matches
    the patched values (correlation ≥ 0.99, measured 0.999-1.000), while at the embeddings, where
    swapping a token is far from linear, it does not (as Nanda 2023 warns)."""
    from attnlab.inspect.patching import attribution_patching

    _, ours = _transformer_lens_and_attnlab(tmp_path, monkeypatch, layers=2, heads=3, dim=24, init=0.05)
    clean = torch.randint(50, (2, 7), generator=torch.Generator().manual_seed(4))
    corrupt = clean.clone()
    corrupt[:, 3] = (clean[:, 3] + 1) % 50
    with torch.no_grad():
        last = ours(clean)[0, -1]
        metric = logit_difference(int(last.argmax()), int(last.argmin()))
    for over in ("attn_out", "mlp_out", "head", "head_position", "v"):
        exact = patch_activations(ours, (clean,), (corrupt,), metric, over=over)
        estimate = attribution_patching(ours, (clean,), (corrupt,), metric, over=over)
        assert estimate.shape == exact.shape, over
        assert torch.corrcoef(torch.stack([estimate.flatten(), exact.flatten()]))[0, 1] > 0.99, over
    # the derivative itself: move layer 1's input at position 3 a little towards and away from its clean
    # value (float64, a central difference: float32's forward difference over a 1e-3 step was 13 % off
    # on an Intel Xeon, within 2 % on an AMD EPYC)
    ours = ours.double()
    with torch.no_grad():
        span = metric(ours(clean)).mean() - metric(ours(corrupt)).mean()
    estimate = attribution_patching(ours, (clean,), (corrupt,), metric, over="resid_pre")
    _, clean_cache = ours.run_with_cache(clean, names="blocks.1.hook_resid_pre")
    step = 1e-2  # a central difference: its error is the step squared

    def moved(by: float) -> torch.Tensor:
        def nudge(x, hook):
            x = x.clone()
            x[:, 3] += by * (clean_cache["blocks.1.hook_resid_pre"][:, 3] - x[:, 3])
            return x

        with torch.no_grad(), ours.hooks([("blocks.1.hook_resid_pre", nudge)]):
            return metric(ours(corrupt)).mean()

    slope = (moved(step) - moved(-step)) / (2 * step) / span
    assert abs(slope - estimate[1, 3]) < 0.02 * abs(estimate[1, 3]) + 1e-3, (slope, estimate[1, 3])


def test_path_patching_by_hand(gpt):
    """Senders in the last layer reach the logits only directly: their path-patching fractions are
    their activation-patching ones. A path from a layer-0 head into one layer-2 head's queries,
    recomputed here step by step with hooks, gives the same number; senders at or after the
    receiver's layer score 0."""
    from attnlab.inspect.patching import path_patching

    clean = torch.randint(23, (2, 8), generator=torch.Generator().manual_seed(2))
    corrupt = clean.clone()
    corrupt[:, 4] = (clean[:, 4] + 1) % 23
    with torch.no_grad():
        last = gpt(clean)[0, -1]
    metric = logit_difference(int(last.argmax()), int(last.argmin()))
    direct = path_patching(gpt, (clean,), (corrupt,), metric)
    heads = patch_activations(gpt, (clean,), (corrupt,), metric, over="head")
    torch.testing.assert_close(direct[2], heads[2], atol=1e-5, rtol=1e-4)
    assert not torch.allclose(direct[0], heads[0], atol=1e-3)  # earlier heads also act through later ones

    receivers = [(2, 1, "q")]
    paths = path_patching(gpt, (clean,), (corrupt,), metric, receivers)
    assert torch.all(paths[2] == 0)
    z = [f"blocks.{i}.attn.hook_z" for i in range(3)]
    with torch.no_grad():
        _, c = gpt.run_with_cache(clean, names=z)
        corrupt_logits, k = gpt.run_with_cache(corrupt, names=z)

        def frozen(x, hook):  # every head's output from the corrupted run, but head 0.3's from the clean one
            x = k[hook.name].clone()
            if hook.name == "blocks.0.attn.hook_z":
                x[:, 3] = c[hook.name][:, 3]
            return x

        with gpt.hooks([(z, frozen)]):
            _, got = gpt.run_with_cache(corrupt, names="blocks.2.attn.hook_q")

        def deliver(x, hook):
            x = x.clone()
            x[:, 1] = got["blocks.2.attn.hook_q"][:, 1]
            return x

        with gpt.hooks([("blocks.2.attn.hook_q", deliver)]):
            moved = metric(gpt(corrupt)).mean()
        span = metric(gpt(clean)).mean() - metric(corrupt_logits).mean()
    assert abs(paths[0, 3] - (moved - metric(corrupt_logits).mean()) / span) < 1e-5


def test_layer_norm_scales_per_head_results_and_weight_processing_match_transformer_lens(tmp_path, monkeypatch):
    """hook_scale / hook_normalized of every LayerNorm, attn.hook_result (each head's z W_O), and
    TransformerLens's weight processing (fold_ln, center_writing_weights, center_unembed,
    fold_value_biases) on the same random GPT-2, 2 layers x 3 heads: the same values and weights,
    and a processed model whose log-probabilities are the original's."""
    from attnlab.inspect.weights import process_weights

    tl_model, ours = _transformer_lens_and_attnlab(tmp_path, monkeypatch, layers=2, heads=3, dim=24, init=0.2)
    with torch.no_grad():  # norms that are not the identity, so that folding them matters
        for name, p in ours.named_parameters():
            if ".ln" in name or name.startswith("ln_f"):
                p.add_(torch.randn_like(p) * 0.3)
    tl_model, ours = _retied(tl_model, ours)
    tl_model.set_use_attn_result(True)
    ids = torch.randint(50, (2, 7), generator=torch.Generator().manual_seed(4))
    tl_logits, tl = tl_model.run_with_cache(ids)
    logits, cache = ours.run_with_cache(ids)
    torch.testing.assert_close(logits, tl_logits, atol=1e-4, rtol=1e-4)
    for i in range(2):
        for norm in ("ln1", "ln2"):
            for hook in ("hook_scale", "hook_normalized"):
                key = f"blocks.{i}.{norm}.{hook}"
                torch.testing.assert_close(cache[key], tl[key], atol=1e-5, rtol=1e-4, msg=key)
        key = f"blocks.{i}.attn.hook_result"  # attnlab (B, H, T, D), TransformerLens (B, T, H, D)
        torch.testing.assert_close(cache[key].transpose(1, 2), tl[key], atol=1e-5, rtol=1e-4, msg=key)
        torch.testing.assert_close(
            cache[key].sum(1) + ours.blocks[i].attn.out_proj.bias, cache[f"blocks.{i}.hook_attn_out"]
        )
    torch.testing.assert_close(cache["ln_f.hook_scale"], tl["ln_final.hook_scale"], atol=1e-5, rtol=1e-4)
    # freezing the final norm's scale (patching it with the clean run's) is what makes DLA linear
    frozen = cache["ln_f.hook_scale"]
    with ours.hooks([("ln_f.hook_scale", lambda s, h: frozen)]):
        torch.testing.assert_close(ours(ids), logits)

    processed = process_weights(ours)
    tl_model.enable_compatibility_mode(disable_warnings=True)
    for name in ("W_Q", "W_K", "W_V", "W_O", "b_Q", "b_K", "b_V", "b_O", "W_E", "W_pos", "W_U", "b_U"):
        torch.testing.assert_close(getattr(processed, name), getattr(tl_model, name), atol=1e-5, rtol=1e-4, msg=name)
    new_logits = processed(ids)
    torch.testing.assert_close(new_logits.log_softmax(-1), logits.log_softmax(-1), atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(new_logits, tl_model(ids), atol=1e-4, rtol=1e-4)
    assert torch.allclose(processed.blocks[0].ln1.weight, torch.ones(24)) and not processed.config.tie_output
    # each step alone keeps the function; the original is untouched
    for step in ("fold_ln", "center_writing_weights", "center_unembed", "fold_value_biases"):
        only = process_weights(
            ours, **{s: s == step for s in ("fold_ln", "center_writing_weights", "center_unembed", "fold_value_biases")}
        )
        torch.testing.assert_close(only(ids).log_softmax(-1), logits.log_softmax(-1), atol=1e-5, rtol=1e-5, msg=step)
    torch.testing.assert_close(ours(ids), logits)


def _retied(tl_model, ours):
    """The same changed weights in TransformerLens: the attnlab model exported and booted again."""
    import attnlab
    import transformer_lens.model_bridge.sources.transformers  # noqa: F401
    from transformer_lens.model_bridge import TransformerBridge

    folder = Path(ours.checkpoint).parent / "changed"
    attnlab.export_hf(ours, folder)
    for name in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"):
        source = Path(ours.checkpoint) / name
        if source.is_file():
            (folder / name).write_bytes(source.read_bytes())
    return TransformerBridge.boot_transformers(str(folder), device="cpu"), attnlab.load(folder)


@pytest.mark.parametrize("family", ["vit", "encoder"])
def test_head_weights_under_transformer_lens_names_in_every_family(family):
    """W_Q … b_O exist for the ViT and the text encoder too (TransformerLens has no such models):
    checked by recomputing each head's q, k, v and output from them and the cached activations."""
    from attnlab.models import ViT, ViTConfig
    from attnlab.models.encoder import TextEncoder, TextEncoderConfig

    torch.manual_seed(0)
    if family == "vit":
        model = ViT(ViTConfig(image_size=8, patch_size=2, in_chans=1, num_classes=3, dim=24, layers=2, heads=3)).eval()
        inputs = (torch.rand(2, 1, 8, 8),)
    else:
        model = TextEncoder(TextEncoderConfig(vocab_size=30, context=16, layers=2, heads=3, dim=24, mlp_dim=48)).eval()
        inputs = (torch.randint(30, (2, 9)),)
    _, cache = model.run_with_cache(*inputs)
    prefix = "encoder.blocks"
    for i, block in enumerate(model.attention_blocks()):
        x = (
            cache[f"{prefix}.{i}.ln1.hook_normalized"] * block.ln1.weight + block.ln1.bias
            if block.norm_first
            else cache[f"{prefix}.{i}.hook_resid_pre"]
        )
        for name, weight, bias in (
            ("q", model.W_Q, model.b_Q),
            ("k", model.W_K, model.b_K),
            ("v", model.W_V, model.b_V),
        ):
            mine = torch.einsum("btd,hde->bhte", x, weight[i]) + bias[i][None, :, None]
            torch.testing.assert_close(
                mine, cache[f"{prefix}.{i}.attn.hook_{name}"], atol=1e-5, rtol=1e-4, msg=f"{family} {name}"
            )
        out = torch.einsum("bhte,hed->btd", cache[f"{prefix}.{i}.attn.hook_z"], model.W_O[i]) + model.b_O[i]
        torch.testing.assert_close(out, cache[f"{prefix}.{i}.hook_attn_out"], atol=1e-5, rtol=1e-4)


@pytest.mark.parametrize("family", ["vit", "encoder"])
def test_residual_helpers_take_a_vit_and_an_encoder_apart(family):
    """decompose_resid, accumulated_resid, stack_head_results and apply_ln_to_stack on the other
    families (TransformerLens has none): the parts sum to the final stream, the accumulated stream
    through the final norm is the model's own normalised output, the heads sum to the attention
    outputs; a post-LN encoder is refused, its stream being no sum of parts."""
    from attnlab.errors import OptionError
    from attnlab.inspect.residual import accumulated_resid, apply_ln_to_stack, decompose_resid, stack_head_results
    from attnlab.models import ViT, ViTConfig
    from attnlab.models.encoder import TextEncoder, TextEncoderConfig

    torch.manual_seed(0)
    if family == "vit":
        model = ViT(ViTConfig(image_size=8, patch_size=2, in_chans=1, num_classes=3, dim=24, layers=2, heads=3)).eval()
        inputs = (torch.rand(2, 1, 8, 8),)
    else:
        config = dict(vocab_size=30, context=16, layers=2, heads=3, dim=24, mlp_dim=48)
        post = TextEncoder(TextEncoderConfig(**config)).eval()
        _, post_cache = post.run_with_cache(torch.randint(30, (2, 9)))
        with pytest.raises(OptionError, match="post-LN"):
            decompose_resid(post, post_cache)
        model = TextEncoder(TextEncoderConfig(**config, norm_first=True)).eval()
        inputs = (torch.randint(30, (2, 9)),)
    _, cache = model.run_with_cache(*inputs)
    parts, labels = decompose_resid(model, cache, return_labels=True)
    assert labels == ["embed", "0_attn_out", "0_mlp_out", "1_attn_out", "1_mlp_out"]
    torch.testing.assert_close(parts.sum(0), cache["encoder.blocks.1.hook_resid_post"], atol=1e-5, rtol=1e-5)
    stream = accumulated_resid(model, cache, apply_ln=True)  # each stream through the final norm
    torch.testing.assert_close(stream[-1], cache["encoder.hook_final"], atol=1e-5, rtol=1e-5)
    heads = stack_head_results(model, cache)
    for i in range(2):
        mine = heads[3 * i : 3 * i + 3].sum(0) + model.encoder.blocks[i].attn.out_proj.bias
        torch.testing.assert_close(mine, cache[f"encoder.blocks.{i}.hook_attn_out"], atol=1e-5, rtol=1e-5)
    norm = model.encoder.ln_f
    frozen = apply_ln_to_stack(model, cache, parts).sum(0) * norm.weight + norm.bias  # the scale the forward used
    torch.testing.assert_close(frozen, cache["encoder.hook_final"], atol=1e-5, rtol=1e-5)
