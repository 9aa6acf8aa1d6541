"""One declaration, every surface (issue 47): each option of every command is declared once (an
OptionSpecs beside the verb that uses it), and the surfaces derived from it agree with it: the command
line's flag (name, default, choices), the Python call's keyword (name, default, required or not), the
run's ``options.json`` entry and ``--config`` key (train), the server's request field (sample); a value
the declaration refuses is refused by the flag and the keyword alike, naming both."""

import argparse
import functools
import inspect
import json
from pathlib import Path

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

    from attnlab.serve import generation_models

    bad, good = edges(name)
    gpt = tiny_run("gpt").load()
    generate_body, _ = generation_models()
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


# ---- every other command: its flags and its Python call's keywords from one declaration -----------------
from attnlab import bench, sae  # noqa: E402
from attnlab.data import shards  # noqa: E402
from attnlab.errors import OptionError  # noqa: E402
from attnlab.experiments import reproduce  # noqa: E402
from attnlab.recipes.base import Verbs  # noqa: E402
from attnlab.recipes.caption import CaptionerVerbs  # noqa: E402
from attnlab.recipes.classifier import ImageClassifierVerbs  # noqa: E402
from attnlab.recipes.encoder import TextEncoderVerbs  # noqa: E402
from attnlab.recipes.seq2seq import Seq2SeqVerbs  # noqa: E402
from attnlab.serve import serve  # noqa: E402

# every command but train, eval, ablate and inspect (whose options are each family's: the tests
# above and below) -> the Python calls that take its options as keywords
VERBS = {
    "sample": [GPTVerbs.generate],
    "caption": [CaptionerVerbs.caption],
    "translate": [Seq2SeqVerbs.translate],
    "embed": [TextEncoderVerbs.embed],
    "predict": [ImageClassifierVerbs.predict, TextEncoderVerbs.predict],
    "patch": [GPTVerbs.patch, ImageClassifierVerbs.patch],
    "explore": [Verbs.explore],
    "serve": [serve],
    "reproduce": [reproduce],
    "bench": [bench.run],
    "sae train": [sae.train],
    "sae eval": [sae.evaluate],
    "sae features": [sae.features],
    "data prepare": [shards.prepare],
}
# options that are no keyword of the Python call, and why
CLI_ONLY = {
    "ckpt": "the call is the loaded model's method, or takes the model (or its run) first",
    "device": "the call runs where the model is",
    "json": "the call returns the values",
    "file": "the call takes the texts themselves",
    "num_samples": "a list of prompts (or several calls) gives several samples",
    "prompts_file": "the call takes the prompts themselves",
    "no_cache": "use_cache=False",
    "dtype": "the model's own dtype (model.to(torch.bfloat16))",
    "sae": "the SAE itself (attnlab.sae.load)",
}
# ... and those that are a keyword of some commands' calls but not of this one's
CLI_ONLY_HERE = {("serve", "quantize"): "serve() serves the model as given: quantize(model, how) it first"}
OUTPUT_FILE = ("patch", "explore", "embed", "sae features")  # the call returns what the command writes to --out
COMMANDS_WITHOUT_A_CALL = {"train", "eval", "ablate", "inspect", "completion"}


def test_every_command_has_its_python_call():
    commands = set()
    for name, parser in subparsers(build_parser()).items():
        inner = subparsers(parser)
        commands |= {f"{name} {n}" for n in inner} if inner and name != "train" else {name}
    assert commands - COMMANDS_WITHOUT_A_CALL == set(VERBS)


def subparsers(parser: argparse.ArgumentParser) -> dict:
    return next((a.choices for a in parser._actions if isinstance(a, argparse._SubParsersAction)), {})


@pytest.mark.parametrize("command", list(VERBS))
def test_a_commands_flags_and_its_calls_keywords_agree_with_its_one_declaration(command, capsys):
    parser = subparser(build_parser(), *command.split())
    for verb in VERBS[command]:
        declared = verb.declaration()
        flags = {a.dest: a for a in parser._actions if a.dest != "help"}
        assert set(flags) == set(declared.specs), command  # the flags are the declaration's
        keywords = inspect.signature(verb).parameters
        for name, spec in declared.specs.items():
            flag = flags[name]
            assert (flag.default, tuple(flag.choices or ()) or None) == (spec.default, spec.choices), name
            if spec.positional or name in CLI_ONLY or (command, name) in CLI_ONLY_HERE:
                continue
            if name == "out" and command in OUTPUT_FILE:
                continue
            assert name in keywords, f"{verb.__qualname__} has no keyword {name} (attnlab {command} --{name})"
            python = keywords[name].default
            if spec.required and (command, name) != ("sae train", "out"):  # (Python saves it when out= is given)
                assert python is inspect.Parameter.empty, (command, name)
            elif (command, name) in PYTHON_DEFAULT_DIFFERS_BY_COMMAND:
                assert (python, spec.default) == PYTHON_DEFAULT_DIFFERS_BY_COMMAND[command, name]
            elif spec.kind != "append":
                assert python == spec.default, (command, name, python, spec.default)
        # a value the declaration refuses is refused by the flag and by the keyword, naming both
        positional = [p for p in keywords.values() if p.default is p.empty and p.kind not in (p.VAR_KEYWORD,)]
        first = positional[1 if "self" in keywords else 0 :]
        for name, spec in declared.specs.items():
            if name not in keywords or spec.positional:
                continue
            bad = refused_value(spec)
            if bad is None:
                continue
            args = [None] * ("self" in keywords) + ["x"] * len(first)
            with pytest.raises(OptionError, match=f"{name}="):
                verb(*args, **{name: bad})
            flag = spec.flags[0]
            argv = [*command.split(), flag, *(bad if isinstance(bad, list) else [str(bad)])]
            with pytest.raises(SystemExit) as exit_code:
                parser.parse_args(argv[len(command.split()) :])
            assert exit_code.value.code == 2 and flag in capsys.readouterr().err, (command, name)


PYTHON_DEFAULT_DIFFERS_BY_COMMAND = {("sample", k): v for k, v in PYTHON_DEFAULT_DIFFERS.items()}


def refused_value(spec):
    """A value just outside what ``spec`` takes (a choice it lacks, a count below its least), or None."""
    if spec.choices:
        return ["nope"] if spec.nargs in ("+", "*") else "nope"
    bounds = getattr(spec.type, "bounds", None)
    if bounds is None:
        return None
    kind, low, low_ok, high = bounds
    if high is not None:
        return high + (1 if kind is int else 1e-6)
    if low is None:
        return None
    return (low - 1 if kind is int else low - 1e-6) if low_ok else low


@pytest.mark.parametrize("family", [r.name for r in recipes()])
def test_a_value_eval_inspect_or_train_refuses_is_refused_by_the_flag_and_the_keyword(
    family, tiny_run, tmp_path, capsys
):
    """`attnlab eval`, `inspect` and `train FAMILY` and the loaded model's ``evaluate`` and
    ``inspect`` and ``attnlab.train``: each option's one declaration refuses a value just outside
    what it takes, by its flag and by its keyword alike."""
    from attnlab.options import OptionSpecs

    recipe = next(r for r in recipes() if r.name == family)
    model = tiny_run(family).load()
    inspects = OptionSpecs()
    recipe.add_inspect_arguments(inspects)
    what = next(iter(recipe.inspections), None)
    surfaces = [
        (recipe.eval_specs(), ("eval",), lambda **kw: model.evaluate(**kw)),
        (
            inspects,
            ("inspect", what or "attention", "--ckpt", "x", "--out", "x.png"),
            lambda **kw: model.inspect(what, tmp_path / "x.png", **kw),
        ),  # fmt: skip
        (recipe.train_specs(), ("train", family), lambda **kw: attnlab.train(family, out=tmp_path / "run", **kw)),
    ]
    checked = 0
    for specs, command, call in surfaces:
        for name, spec in specs.specs.items():
            bad = refused_value(spec)
            if bad is None or name in CLI_ONLY or (command[0] == "inspect" and what is None):
                continue
            with pytest.raises(OptionError, match=f"{name}="):
                call(**{name: bad})
            argv = [*command, spec.flags[0], *(bad if isinstance(bad, list) else [str(bad)])]
            assert main(argv) == 2 and spec.flags[0] in capsys.readouterr().err, argv
            checked += 1
    assert checked >= 10 and not (tmp_path / "run").exists()


def test_none_is_an_option_not_given():
    """A Python call's None takes the family's own default (seq2seq's label smoothing is 0.1; None
    reached the loss as None, a TypeError the fuzz test found), for every option of every family."""
    for recipe in recipes():
        specs = recipe.train_specs()
        for name, spec in specs.specs.items():
            assert specs.check(name, None) == spec.default, (recipe.name, name)
    seq2seq = next(r for r in recipes() if r.name == "seq2seq").train_specs()
    assert seq2seq.check("label_smoothing", None) == 0.1


# ---- every option a command declares reaches its Python call ------------------------------------------
# the command -> the module and name of the call its handler makes (patched there)
CALLED = {
    "sae train": ("attnlab.sae", "train"),
    "data prepare": ("attnlab.data.shards", "prepare"),
    "bench": ("attnlab.bench", "run"),
    "reproduce": ("attnlab.experiments", "reproduce"),
    "serve": ("attnlab.serve", "serve"),
}
# values the handler itself must be able to use (a model to load, the form it is loaded in)
FIXED_WORDS = {
    "ckpt": [str(Path(__file__).parent / "fixtures" / "runs_v0_1" / "gpt")],
    "device": ["cpu"],
    "dtype": ["fp32"],
    "quantize": ["int8"],
}


class Called(Exception):
    """Raised by a patched call with the keywords it was given (nothing runs)."""


def other_words(spec) -> list[str]:
    """The words after ``spec``'s flag that give it a value other than its default."""
    if spec.kind in ("flag", "bool"):
        return []
    if spec.choices:
        return [next(str(c) for c in spec.choices if c != spec.default)]
    bounds = getattr(spec.type, "bounds", None)
    if bounds is None:
        return ["7"]
    kind, low, _, high = bounds
    if kind is float and high is not None:
        return [str(((low or 0) + high) / 2)]  # (strictly inside)
    return [str(kind((spec.default if spec.default is not None else low or 0) + 1))]


@pytest.mark.parametrize("command", list(CALLED))
def test_every_declared_option_reaches_the_commands_python_call(command, monkeypatch):
    """Each option the command declares and its call takes, given a value other than its default,
    arrives at the call with that value (``attnlab sae train --grad-clip`` was parsed and dropped)."""
    import importlib

    module, name = CALLED[command]
    verb = getattr(importlib.import_module(module), name)
    declared = verb.declaration()
    argv = command.split()
    for option, spec in declared.specs.items():
        words = FIXED_WORDS.get(option) or other_words(spec)
        if spec.positional:
            argv += words
        elif spec.kind == "bool" and spec.default is True:
            argv.append("--no-" + spec.flags[0][2:])
        else:
            argv += [spec.flags[0], *words]
    expected = vars(build_parser().parse_args(argv))

    @functools.wraps(verb)  # (its signature: the handler asks it which options to pass)
    def record(*args, **kwargs):
        raise Called(kwargs)

    monkeypatch.setattr(importlib.import_module(module), name, record)
    monkeypatch.setenv("ATTNLAB_DEBUG", "1")  # (the command line lets an unforeseen exception through)
    with pytest.raises(Called) as call:
        main(argv)
    received = call.value.args[0]
    for option, spec in declared.specs.items():
        if option in inspect.signature(verb).parameters:
            assert option in received, f"attnlab {command} {spec.flags[0]} does not reach {name}()"
            assert received[option] == expected[option] != spec.default, (command, option)
