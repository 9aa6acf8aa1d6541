"""Hostile calls to the Python API (issue 47): each ends in one AttnlabError line that names the
argument and what it accepts, as the command line and the server do; never a raw Python or torch
error, never silently accepted."""

import json

import pytest
import torch

import attnlab
from attnlab.errors import AttnlabError


@pytest.fixture(scope="module")
def gpt(tiny_run):
    return tiny_run("gpt").load()


@pytest.fixture(scope="module")
def vit(tiny_run):
    return tiny_run("vit").load()


def refused(call, *words: str) -> str:
    """``call()`` raises one AttnlabError line holding every one of ``words``; its message."""
    with pytest.raises(AttnlabError) as e:
        call()
    message = str(e.value)
    assert "\n" not in message and all(w in message for w in words), message
    return message


@pytest.mark.parametrize("ids", [[[0, 10_000]], [[-1, 0]]])
def test_token_ids_outside_the_vocabulary_to_run_with_cache(gpt, ids):
    """Was torch's ``IndexError: index out of range in self``."""
    last = gpt.config.vocab_size - 1
    refused(lambda: gpt.run_with_cache(torch.tensor(ids)), f"from {min(ids[0])} to {max(ids[0])}", f"0 to {last}")
    gpt.run_with_cache(torch.tensor([[0, last]]))  # the edges of the vocabulary are ids like any other


def test_an_int_where_images_are_expected(vit):
    """Was ``'int' object is not iterable``."""
    refused(lambda: vit.predict(3), "images must be a file path", "got int")


def test_image_tensors_outside_0_1_are_refused(vit):
    """A tensor of 1000.0 (bytes not divided by 255, or an image normalised already) was accepted."""
    c = vit.config
    refused(lambda: vit.predict(torch.full((1, c.in_chans, c.image_size, c.image_size), 1000.0)), "from 1000 to 1000")
    refused(lambda: vit.predict(torch.full((c.in_chans, c.image_size, c.image_size), -0.5)), "[0, 1]")
    assert len(vit.predict(torch.ones(c.in_chans, c.image_size, c.image_size))) == 3  # 1.0 itself is a pixel


@pytest.mark.parametrize(
    "kw, words",
    [
        (dict(stop=3), ["stop=3", "must be a string"]),  # was "'int' object is not iterable"
        (dict(seed=2**80), ["seed=", "from 0 to 2**63 - 1"]),  # was "Overflow when unpacking long long"
        (dict(temperature=float("nan")), ["temperature=nan", "not a finite number"]),
        (dict(max_new_tokens=None), ["max_new_tokens=None", "give a value"]),
        (dict(top_k=2.5), ["top_k=2.5", "must be an integer"]),
    ],
)
def test_generate_checks_its_arguments_as_the_sample_command_does(gpt, kw, words):
    refused(lambda: gpt.generate("ab", **{"max_new_tokens": 3, **kw}), *words)


def test_a_model_of_another_family_as_the_draft(gpt, vit):
    """Was ``AttributeError: 'ViTConfig' object has no attribute 'vocab_size'``."""
    refused(lambda: gpt.generate("ab", 3, draft=vit), "draft=", "must be a GPT", "a ViT")
    refused(lambda: gpt.generate("ab", 3, draft=3), "draft=", "got int")


def test_resume_must_be_a_bool(tmp_path):
    """resume="no" was read as true."""
    refused(lambda: attnlab.train("gpt", out=tmp_path / "r", resume="no", max_iters=1), "resume='no'", "True")
    assert not (tmp_path / "r").exists()


def test_a_huggingface_config_too_large_for_its_weights(tmp_path, gpt):
    """A config asking for 40 TB of weights got torch's allocator message; the model is now built
    without memory of its own (its parameters are the checkpoint's), so the config is refused for
    naming weights the folder lacks, before anything is allocated."""
    from attnlab.interop import export_hf

    folder = tmp_path / "hf"
    export_hf(gpt, folder)
    config = json.loads((folder / "config.json").read_text())
    config.update(n_embd=2**20, n_layer=800, n_head=1)  # 800 layers of 12 * 2**40 weights: about 40 TB in fp32
    (folder / "config.json").write_text(json.dumps(config))
    refused(lambda: attnlab.load(folder), "lacks transformer.h.2.ln_1.weight", "incomplete")


@pytest.mark.parametrize("bad", [None, 3, True, [], {}])
def test_paths_must_be_paths(bad, tmp_path, gpt):
    """A number or a list as a path was a TypeError from pathlib, or a run folder named "True"."""
    refused(lambda: attnlab.load(bad), "must be a file or folder path")
    if bad is not None:  # (out=None is the family's default folder)
        refused(lambda: attnlab.train("gpt", out=bad, max_iters=1), "out=", "path")
        refused(lambda: gpt.inspect("lens", bad, text="ab"), "give a file name ending in .png")


@pytest.mark.parametrize("bad", [None, 0, 2.5, True, 2**80])
def test_counts_must_be_whole_numbers_in_range(bad, gpt):
    """top_k=None or 2.5 reached torch.topk; a batch of 2**80 rows reached torch.empty."""
    refused(lambda: gpt.logit_lens("ab", top_k=bad), "top_k=")
    if bad is not None:
        refused(lambda: gpt.generate(["ab", "b"], 2, batch_size=bad), "batch_size=")


@pytest.mark.parametrize("bad", [10_000, -1])
def test_a_prompt_of_token_ids_stays_inside_the_vocabulary(bad, gpt):
    """An id past the vocabulary reached the embedding (an index error); -1 would wrap to the last token."""
    last = gpt.config.vocab_size - 1
    message = refused(lambda: gpt.generate([0, bad], 2), f"prompt token id {bad} is outside the vocabulary")
    assert message.endswith(f"(0..{last})")
    assert len(gpt.generate([0, last], 2, temperature=0.0)) > 0


@pytest.mark.parametrize("bad", [3, 2.5, {}, torch.zeros(2), [1.5], [10_000]])
def test_to_str_tokens_takes_text_or_token_ids(bad, gpt):
    refused(lambda: gpt.to_str_tokens(bad), "to_str_tokens" if not bad == [10_000] else "token ids")
    assert gpt.to_str_tokens([0, 1]) == gpt.to_str_tokens(torch.tensor([[0, 1]]))


@pytest.mark.parametrize("bad", [3, [], {}, torch.zeros(2)])
def test_what_a_hook_filter_takes(bad, gpt):
    """names=3 was "'int' object is not iterable"; a tensor as the input was an AttributeError."""
    ids = torch.tensor([[0, 1]])
    message = refused(lambda: gpt.run_with_cache(ids, names=bad), "names=" if bad != [] else "no hook point")
    assert "hook" in message
    refused(lambda: gpt.run_with_cache(bad if not isinstance(bad, torch.Tensor) else "ab"), "run_with_cache takes")


def test_the_families_verbs_refuse_in_one_attnlab_line(gpt, vit, tiny_run):
    """Each was a raw TypeError or ValueError before."""
    refused(lambda: gpt.patch("ab", "ba", "a", over=[]), "over=[]", "must be a string")
    refused(lambda: gpt.inspect([], "x.png"), "inspect")
    refused(lambda: gpt.evaluate(ablate=3, max_tokens=100), "ablate=3")
    refused(lambda: gpt.explore(text="ab", generate=2**80), "context")  # (was a ValueError)
    refused(lambda: vit.explore(image=None), "explore a ViT with --image")
    # an input another family's explorer reads was silently ignored; one none declares was a TypeError
    refused(lambda: gpt.explore(text="ab", image="x.png"), "image= is not read by gpt models; give text=")
    refused(lambda: vit.explore(query="ab"), "query= is no explorer input of any family; give image=")
    refused(lambda: gpt.explore(src=3), "src=3", "must be a string")
    refused(lambda: tiny_run("caption").load().explore(image="x.png"), "does not show caption models")
    refused(lambda: tiny_run("seq2seq").load().translate(3), "translate needs a string or a list", "int")
    refused(lambda: tiny_run("encoder").load().embed(None), "embed needs a string or a list", "NoneType")
    refused(lambda: attnlab.sae.train(gpt, [], steps=1), "hook=[]", "must be a string")


def test_serve_takes_a_model_loaded_from_its_run(gpt):
    """A model built in Python has no run to serve (it was an AttributeError); a loaded one's
    family answers the server."""
    pytest.importorskip("starlette")
    from attnlab.models import GPT
    from attnlab.serve import create_app, serve

    plain = GPT(gpt.config)
    refused(lambda: serve(plain, port=0), "attnlab.load(run)", "'GPT'")
    refused(lambda: create_app(plain), "attnlab.load(run)")
    refused(lambda: serve(gpt, "image", port=0), "kind='image'", "'text'")
