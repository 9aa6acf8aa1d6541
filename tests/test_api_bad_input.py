"""Hostile calls to the Python API (issue 47): each ends in one AttnlabError line that names the
argument and what it accepts, as the command line and the server do; never a raw Python or torch
error, never silently accepted."""

import json
import re

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
        (dict(top_k=2.5), ["top_k=2.5", "not an integer"]),
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


def test_a_huggingface_config_too_large_for_memory(tmp_path, gpt):
    """A config asking for 40 TB of weights got torch's allocator message."""
    from attnlab.interop import export_hf

    folder = tmp_path / "hf"
    export_hf(gpt, folder)
    config = json.loads((folder / "config.json").read_text())
    config.update(n_embd=2**20, n_layer=800, n_head=1)  # 800 layers of 12 * 2**40 weights: about 40 TB in fp32
    (folder / "config.json").write_text(json.dumps(config))
    message = refused(lambda: attnlab.load(folder), "does not fit in memory")
    assert re.search(r"gpt2 model", message)
