"""The Python API, used as a notebook would: no command line anywhere in this file."""

import numpy as np
import pytest
import torch

import attnlab
from attnlab.errors import AttnlabError, OptionError
from attnlab.recipes import recipes
from helpers import image_png

FAMILIES = [r.name for r in recipes()]
QUICK_EVAL = {"gpt": {"max_tokens": 500}, "seq2seq": {"max_sentences": 10}}  # seconds, not minutes


@pytest.mark.parametrize("family", FAMILIES)
def test_every_family_trains_loads_evaluates_and_explores_from_python(family, tmp_path, tiny_run):
    """One test over the registry: a new family with ``tiny`` options is tested without new code."""
    recipe = next(r for r in recipes() if r.name == family)
    assert recipe.tiny, f"recipe {family} has no tiny options"
    opts = dict(recipe.tiny)
    run = tiny_run(family)
    assert run.step == opts["max_iters"] and run.checkpoint.is_dir()
    assert [m["step"] for m in run.metrics if "loss" in m][-1] == opts["max_iters"]
    model = run.load()
    assert (
        isinstance(model, type(run.model))
        and type(model) in [k.loaded_class for k in recipe.models.values()]
        and not model.training
    )
    torch.testing.assert_close(dict(model.state_dict()), {k: v.cpu() for k, v in run.model.state_dict().items()})
    quick = QUICK_EVAL.get(family, {})
    metrics = model.evaluate(**quick)
    assert any(k in metrics for k in ("loss", "accuracy", "bleu", "perplexity")), metrics
    again = attnlab.evaluate(run.out, **quick)
    timing = ("decode_s", "sentences_per_s", "seconds")
    assert {k: v for k, v in metrics.items() if k not in timing} == {k: v for k, v in again.items() if k not in timing}
    # --max-batches: the first batch only, counted in the family's own unit
    one = model.evaluate(max_batches=1, batch_size=2, **quick)
    counted = {"vit": ("images", 2), "cnn": ("images", 2), "seq2seq": ("sentences", 2), "caption": ("images", 2)}
    if family == "gpt":
        counted["gpt"] = ("tokens", 2 * model.config.context)
    if family in counted:
        key, n = counted[family]
        assert one[key] == n and metrics[key] > n, (one, metrics)
    assert model.hook_points()  # the hook points are there on a loaded model
    if recipe.explore_kind is not None:
        inputs = {"text": {"text": "ab ab"}, "cross": {"src": "abc"}}.get(recipe.explore_kind)
        if recipe.explore_kind == "image":
            (tmp_path / "x.png").write_bytes(image_png(model))
            inputs = {"image": tmp_path / "x.png"}
        page = model.explore(**inputs)
        assert page["attention"].ndim == 4
        html = page._repr_html_()
        assert html.startswith("<iframe") and "srcdoc" in html
        assert page.save(tmp_path / "page.html").read_text().lower().startswith("<!doctype html>")


@pytest.mark.parametrize("family", FAMILIES)
def test_a_loaded_models_verbs_act_on_its_weights_in_memory(family, tmp_path, tiny_run):
    """evaluate(), inspect() and explore() read the loaded model as it is now, not its folder again:
    after the weights are zeroed in memory they report what a folder holding the zeroed weights
    reports, the run's folder is unchanged, and the model's own train/eval mode is left as it was."""
    from attnlab.checkpoint import write_checkpoint

    run = tiny_run(family)
    model = run.load()
    quick = QUICK_EVAL.get(family, {})
    before = model.evaluate(**quick)
    on_disk = {k: v.clone() for k, v in attnlab.load(run.out).state_dict().items()}
    with torch.no_grad():
        for p in model.parameters():
            p.zero_()
    model.train()  # a user's model in training mode: the verbs evaluate in eval mode and leave it so
    after = model.evaluate(**quick)
    assert model.training
    # the reference: the same zeroed weights written to a run folder of their own and evaluated from there
    write_checkpoint(tmp_path / "zeroed" / "best", model, model.run_meta)
    reference = attnlab.evaluate(tmp_path / "zeroed", **quick)
    varies = ("decode_s", "sentences_per_s", "seconds", "checkpoint", "confusion_png")
    assert {k: v for k, v in after.items() if k not in varies} == {
        k: v for k, v in reference.items() if k not in varies
    }
    if "loss" in before:  # (an accuracy may tie by chance; a loss does not)
        assert after["loss"] != before["loss"], (before, after)
    if family == "gpt":  # all-zero weights: uniform logits, so the loss is exactly log(vocabulary)
        assert after["loss"] == pytest.approx(np.log(model.config.vocab_size), abs=1e-5)
    # which="best" asks for the checkpoint on disk, which is unchanged
    again = model.evaluate(which="best", **quick)
    assert {k: v for k, v in again.items() if k not in varies} == {k: v for k, v in before.items() if k not in varies}
    torch.testing.assert_close(dict(attnlab.load(run.out).state_dict()), on_disk)
    if family == "gpt":  # the inspections too: the lens of an all-zero GPT gives every token alike
        model.inspect("lens", tmp_path / "lens.png", text="ab ab")
        probs = np.load(tmp_path / "lens.npz")["top_probs"]
        assert np.allclose(probs, 1 / model.config.vocab_size, atol=1e-5)


@pytest.mark.parametrize("family", FAMILIES)
def test_every_command_reads_the_model_through_the_one_loader(family, tiny_run):
    """load_model (what eval, inspect, explore and the families' helpers read a checkpoint with) gives
    what attnlab.load gives: the family's class with its verbs, its folder and config.json, and what
    the verbs read from it (the same tokenizer or vocabularies), with the same weights."""
    from attnlab.recipes import load_model

    run = tiny_run(family)
    read, loaded = load_model(run.out, device="cpu"), attnlab.load(run.out)
    assert type(read) is type(loaded) and isinstance(read, type(run.model))
    assert read.checkpoint == loaded.checkpoint and read.run_meta == loaded.run_meta
    for name in ("tokenizer", "vocab", "src_vocab", "tgt_vocab"):  # (each encodes text alike)
        if getattr(loaded, name, None) is not None:
            assert getattr(read, name).encode("ab ab") == getattr(loaded, name).encode("ab ab"), name
    for name in ("mean", "std", "labels"):  # (image statistics, class names)
        assert getattr(read, name, None) == getattr(loaded, name, None), name
    torch.testing.assert_close(dict(read.state_dict()), dict(loaded.state_dict()))


def test_verbs_resume_and_hooks_from_python(tmp_path, monkeypatch, tiny_run):
    import shutil

    monkeypatch.setenv("ATTNLAB_FAST_BF16", "0")
    gpt_opts = dict(next(r for r in recipes() if r.name == "gpt").tiny)
    run = tiny_run("gpt")
    shutil.copytree(run.out, tmp_path / "gpt")  # (the shared run stays as it is)
    more = attnlab.train("gpt", out=tmp_path / "gpt", resume=True, **{**gpt_opts, "max_iters": 4})
    assert more.step == 4 and [m["step"] for m in more.metrics if "loss" in m][-2:] == [3, 4]
    model = attnlab.load(run.out)
    a = model.generate("ab", 12, seed=3)
    assert isinstance(a, str) and a == model.generate("ab", 12, seed=3)  # a seed makes sampling repeatable
    assert model.generate("ab", 12, temperature=0) == model.generate("ab", 12, temperature=0, use_cache=False)
    ids = torch.tensor([model.tokenizer.encode("ab ab ab")])
    logits, cache = model.run_with_cache(ids)
    assert cache["blocks.0.attn.hook_pattern"].shape[-2:] == (8, 8)
    assert torch.allclose(logits, model(ids), atol=1e-5)  # the reference path (pattern cached) vs the fused one


def test_image_text_and_translation_verbs(tmp_path, tiny_run):
    vit = tiny_run("vit").load()
    img = torch.rand(1, 8, 8)
    top = vit.predict(img, top_k=2)
    assert len(top) == 2 and top[0][1] >= top[1][1] and top[0][0] in vit.labels
    assert vit.predict(torch.stack([img, img]))[1] == vit.predict(img)
    # the same image as NumPy (H, W uint8, and H, W, 1 floats), as a PIL image, and as a PNG file
    from PIL import Image

    pixels = (img[0].numpy() * 255).round().astype(np.uint8)
    quantized = vit.predict(torch.from_numpy(pixels.astype(np.float32) / 255.0)[None])
    Image.fromarray(pixels).save(tmp_path / "img.png")
    for same in (pixels, pixels[..., None] / 255.0, Image.fromarray(pixels), str(tmp_path / "img.png")):
        assert vit.predict(same) == quantized, type(same)
    assert len(vit.predict(np.stack([pixels, pixels])[..., None])) == 2  # (N, H, W, C): one list per image
    with pytest.raises(AttnlabError, match="values in"):
        vit.predict(pixels * 2.0)
    with pytest.raises(AttnlabError, match="cannot read an image from dict"):
        vit.predict([{}])
    assert vit.inspect("positions", tmp_path / "pos.png").is_file()  # `attnlab inspect`, from Python
    assert (tmp_path / "pos.npz").is_file()
    with pytest.raises(AttnlabError, match="offer"):
        vit.inspect("alignment", tmp_path / "a.png")
    s2s = tiny_run("seq2seq").load()
    assert isinstance(s2s.translate("abc", beam=2), str)
    assert len(s2s.translate(["abc", "cba"])) == 2
    enc = tiny_run("encoder").load()
    vectors = enc.embed(["hello world", "the cat"])
    assert vectors.shape == (2, 16) and np.allclose(enc.embed("the cat"), vectors[1], atol=1e-5)
    page = enc.explore(text="the cat sat")  # the neuron view of an encoder: softmax of q·k/√d_k is the pattern
    q, k, scores = (torch.as_tensor(page[n]) for n in ("q", "k", "scores"))
    assert torch.allclose(scores, q @ k.transpose(-1, -2) / q.shape[-1] ** 0.5, atol=1e-5)
    assert torch.allclose(scores.softmax(-1), torch.as_tensor(page["attention"]), atol=1e-5)
    assert set(page["detectors"]) == {"previous_token", "duplicate_token", "induction"}
    enc.inspect("lens", tmp_path / "lens.png", text="the [MASK] sat")  # the masked-LM lens: its last row is the head's
    raw = np.load(tmp_path / "lens.npz")
    ids = torch.tensor([enc.tokenizer.encode("the [MASK] sat")])
    with torch.no_grad():
        final = enc(ids, torch.ones_like(ids, dtype=torch.bool), head="mlm").softmax(-1)[0].topk(3).values
    assert list(raw["tokens"])[2] == "[MASK]" and np.allclose(raw["top_probs"][-1], final.numpy(), atol=1e-5)
    cap = tiny_run("caption").load()
    assert isinstance(cap.caption(torch.rand(3, 32, 32)), str)


def test_bad_options_are_one_line_attnlab_errors(tmp_path):
    out = tmp_path / "never"
    cases = [
        (dict(lr=float("nan")), "--lr"),
        (dict(preset="huge"), "choose one of"),
        (dict(max_iters="x"), "must be an integer"),
        (dict(max_iters="10"), "must be an integer"),  # (a number from Python is a number, as the server's JSON)
        (dict(lr="0.1"), "must be a number"),
        (dict(bogus=1), "no option 'bogus'"),
        (dict(max_iters=True), "must be an integer"),
        (dict(tokenizer="xx"), "choose one of"),
        (dict(lr=-1.0), "lr"),
    ]
    for kw, words in cases:
        with pytest.raises(AttnlabError) as e:
            attnlab.train("gpt", out=out, **kw)
        assert words in str(e.value) and "\n" not in str(e.value), kw
    assert not out.exists()  # refused before anything was written
    with pytest.raises(OptionError, match="unknown model family"):
        attnlab.train("lstm")


def test_python_refuses_text_where_a_number_is_declared_as_the_server_does(tiny_run):
    """``generate("The", "10")``, ``top_k="5"`` and ``batch_size="2"`` were taken as numbers where
    the server refuses "10" (issue 81): a declared number takes an int (or, for a float, a float)."""
    model = tiny_run("gpt").load()
    for kw in (dict(max_new_tokens="10"), dict(top_k="5"), dict(batch_size="2"), dict(max_new_tokens=2.0)):
        with pytest.raises(OptionError, match=r"must be an integer$"):
            model.generate("The", **kw)
    with pytest.raises(OptionError, match=r"^temperature='0.5' \(--temperature\): must be a number$"):
        model.generate("The", 2, temperature="0.5")
    assert isinstance(model.generate("The", 2, temperature=1, top_k=5, seed=0), str)  # (an int for a float: taken)


def test_a_prompt_longer_than_the_context_is_said_not_silently_cut(tiny_run, capsys):
    """`attnlab sample` dropped the start of a prompt longer than the context without a word (issue
    81): the model still reads its last tokens (the window slides), and says so, in Python as a
    Note and on the command line as one warning line."""
    from attnlab.cli import main
    from attnlab.errors import Note

    run = tiny_run("gpt")
    model = run.load()
    c, text = model.config.context, "ab " * model.config.context
    with pytest.warns(
        Note, match=rf"^the prompt is {3 * c} tokens, more than the model's context of {c}: it reads the last {c}$"
    ):
        assert isinstance(model.generate(text, 2, seed=0), str)
    capsys.readouterr()  # (what training the run said)
    assert main(["sample", "--ckpt", str(run.out), "--prompt", text, "--max-new-tokens", "2", "--device", "cpu"]) == 0
    assert (
        capsys.readouterr().err
        == f"warning: the prompt is {3 * c} tokens, more than the model's context of {c}: it reads the last {c}\n"
    )
