"""One declaration, every surface (issue 47): each option of `attnlab sample` and of `attnlab train
FAMILY` is declared once, and the surfaces derived from it agree with it. For sample: the command
line's flag, ``generate()``'s keyword and the server's request field refuse the same values just out
of range and take the same values at the edge of it; for train: the flag, ``attnlab.train``'s
keyword (``train_options``) and the run's ``options.json`` entry exist together, and the flag's
choices are the declaration's."""

import argparse
import inspect
import json

import pytest

import attnlab
from attnlab.cli import build_parser, main
from attnlab.errors import AttnlabError
from attnlab.recipes import recipes
from attnlab.recipes.gpt import GPTVerbs, sample_specs
from attnlab.runoptions import NOT_REPLAYED

SAMPLE = sample_specs()
# generate()'s keywords that have a `sample` flag (the others are Python's own: prompt, use_cache, draft, compile)
GENERATE = [n for n in inspect.signature(GPTVerbs.generate).parameters if n in SAMPLE.specs]
# where Python's default differs from the command line's, on purpose: a call returns text to a
# program (200 tokens, no fixed seed), where a command prints a sample to read (500 tokens, seed 1337)
PYTHON_DEFAULT_DIFFERS = {"max_new_tokens": (200, 500), "seed": (None, 1337)}


def subparser(parser: argparse.ArgumentParser, *path: str) -> argparse.ArgumentParser:
    """The parser of ``attnlab PATH...`` (``"train", "gpt"``)."""
    for name in path:
        parser = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction)).choices[name]
    return parser


def edges(name: str):
    """(values the declaration refuses, values at its edges that it takes) for a bounded option."""
    kind, low, low_ok, high = SAMPLE.specs[name].type.bounds
    step = 1 if kind is int else 1e-6
    bad = [low - step if low_ok else low] + ([high + step] if high is not None else [])
    good = [low if low_ok else low + step] + ([high] if high is not None else [])
    return bad, good


BOUNDED = [
    n for n in GENERATE if getattr(SAMPLE.specs[n].type, "bounds", None) and SAMPLE.specs[n].type.bounds[1] is not None
]


def test_generate_takes_every_sampling_option_under_the_flags_name_and_default():
    assert {"max_new_tokens", "temperature", "top_k", "top_p", "seed", "stop", "batch_size", "draft_tokens"} <= set(
        GENERATE
    )
    signature = inspect.signature(GPTVerbs.generate).parameters
    for name in GENERATE:
        python, cli = signature[name].default, SAMPLE.specs[name].default
        if name in PYTHON_DEFAULT_DIFFERS:
            assert (python, cli) == PYTHON_DEFAULT_DIFFERS[name]
        elif name == "stop":
            assert list(python) == cli == []
        else:
            assert python == cli, (name, python, cli)


@pytest.mark.parametrize("name", BOUNDED)
def test_the_flag_the_keyword_and_the_server_field_refuse_the_same_values(name, tiny_run, capsys):
    pytest.importorskip("pydantic")
    from pydantic import ValidationError

    from attnlab.serve import _models

    bad, good = edges(name)
    gpt = tiny_run("gpt").load()
    _, generate_body, _ = _models()
    flag = SAMPLE.specs[name].flags[0]
    for value in bad:
        assert main(["sample", "--ckpt", "unused", flag, str(value)]) == 2  # (refused while parsing)
        assert flag in capsys.readouterr().err
        with pytest.raises(AttnlabError, match=f"{name}="):
            gpt.generate("ab", **{"max_new_tokens": 2, name: value})
        if name in generate_body.model_fields:
            with pytest.raises(ValidationError):
                generate_body(**{name: value})
    for value in good:
        if name not in ("max_new_tokens", "batch_size", "draft_tokens") or value < 10_000:  # (not a long run)
            gpt.generate("ab", **{"max_new_tokens": 2, name: value})
        if name in generate_body.model_fields:
            generate_body(**{name: value})


@pytest.mark.parametrize("family", [r.name for r in recipes()])
def test_every_train_option_is_a_flag_a_keyword_and_an_options_json_entry(family, tiny_run):
    recipe = next(r for r in recipes() if r.name == family)
    specs = recipe.train_specs()
    flags = {a.dest: a for a in subparser(build_parser(), "train", family)._actions}
    keywords = attnlab.train_options(family)
    run = tiny_run(family)
    written = json.loads((run.out / "options.json").read_text())["options"]
    assert set(written) <= set(specs.specs), f"{family}'s options.json has undeclared {set(written) - set(specs.specs)}"
    model_fields = set(recipe.model_fields())
    for name, spec in specs.specs.items():
        assert name in flags, f"train {family}: {name} has no flag"
        assert tuple(flags[name].choices or ()) == tuple(spec.choices or ()), name
        if name not in ("out", "resume", "config"):
            assert name in keywords, f"attnlab.train({family!r}) does not take {name}"
        # a model option is written when the run's model has it (a Transformer has no RNN's emb_dim)
        applies = name not in model_fields or hasattr(run.model.config, name)
        if name not in (*NOT_REPLAYED, "config") and applies:
            assert name in written, f"{family}'s options.json has no {name}"
