"""One declaration, every surface (issue 64): a command's options are the typed signatures of the
function it runs and of the Python calls it makes (``Annotated[int, Arg(...)]``), and every surface
derived from them agrees with them, checked over every command without a list kept by hand: the
flag (name, default, choices, the default its --help states), the keyword of each Python call that
takes the option (its default), the server's request field (``/generate``); a value the declaration
refuses is refused by the flag and the keyword alike, naming both. ``train``'s options are the
fields of dataclasses declared the same way (its family's options, its model config, TrainConfig),
whose defaults a run given none uses are the family's: the tests after those cover them, and
``eval``, ``ablate``, ``inspect`` and ``explore``, whose options several families declare."""

import functools
import inspect
import json
import re
from pathlib import Path

import pytest
from cyclopts.exceptions import CycloptsError

import attnlab
from attnlab.cli import commands, main, parse
from attnlab.cli.app import with_defaults
from attnlab.errors import AttnlabError, OptionError
from attnlab.options import declared, declared_parameters, shown_default
from attnlab.recipes import recipes
from attnlab.recipes.gpt import GPTVerbs
from attnlab.runoptions import NOT_REPLAYED

SAMPLE = declared(GPTVerbs.generate)


# every command whose options are declared by signatures (words -> its declaration)
COMMANDS = {words: command for words, command in commands().items() if command.specs is None}


def test_the_commands_declared_by_signatures():
    assert {"sample", "translate", "caption", "embed", "predict", "patch", "serve", "reproduce", "bench", "eval", "ablate",
            "sae train", "sae eval", "sae features", "data prepare", "completion"} <= set(COMMANDS)  # fmt: skip


def edges(name: str):
    """(values the declaration refuses, values at its edges that it takes) for a bounded option."""
    kind, low, low_ok, high, high_ok = SAMPLE.specs[name].type.bounds
    step = 1 if kind is int else 1e-6
    bad = [low - step if low_ok else low] + ([high + step if high_ok else high] if high is not None else [])
    good = [low if low_ok else low + step] + ([high if high_ok else high - step] if high is not None else [])
    return bad, good


BOUNDED = [
    n
    for n in SAMPLE.specs
    if getattr(SAMPLE.specs[n].type, "bounds", None) and SAMPLE.specs[n].type.bounds[1] is not None
]


@pytest.mark.parametrize("command", list(COMMANDS))
def test_a_flags_default_is_its_signatures_in_help_and_in_every_call_that_takes_it(command):
    """Generated over every command: each option's flag default is the default of the signature
    that declares it, its --help says so, and every Python call the command makes (``verbs``)
    that takes a keyword of that name defaults to the same (``attnlab sample --max-new-tokens``
    defaulted to 500 where ``model.generate`` took 200)."""
    declaration = COMMANDS[command]
    flags = declaration.options.specs
    shown = " ".join(help_text(command).replace("│", " ").split())
    for function in (declaration.run, *declaration.verbs):
        for param, _, _ in declared_parameters(function):
            flag = flags[param.name]
            assert flag.positional or flag.flags[0] in shown, (command, param.name)
            if param.default is param.empty:
                assert flag.required or flag.positional, (command, param.name)
                continue
            default = list(param.default) if isinstance(param.default, tuple) else param.default
            assert flag.default == default, (command, function.__qualname__, param.name, flag.default, default)
            if default not in (None, False, "", []):
                assert "(default " in flag.help, (command, param.name, flag.help)
    # a keyword of the same name in a call it makes, declared or not, takes the same default
    for verb in declaration.verbs:
        for name, param in inspect.signature(verb).parameters.items():
            if name in flags and param.default is not param.empty and not flags[name].positional:
                default = list(param.default) if isinstance(param.default, tuple) else param.default
                assert default == flags[name].default, (command, verb.__qualname__, name)


def help_text(words: str) -> str:
    """What ``attnlab WORDS --help`` prints, on a terminal wide enough that no entry wraps."""
    import contextlib
    import io
    import os

    out, width = io.StringIO(), os.environ.get("COLUMNS")
    os.environ["COLUMNS"] = "1000"
    try:
        with contextlib.redirect_stdout(out):
            assert main([*words.split(), "--help"]) == 0
    finally:
        os.environ.pop("COLUMNS") if width is None else os.environ.__setitem__("COLUMNS", width)
    return out.getvalue()


def test_the_servers_generate_fields_default_to_generates_signature():
    pytest.importorskip("pydantic")
    from attnlab.serve import default_new_tokens, generation_models

    generate_body = generation_models()[0]
    for name, field in generate_body.model_fields.items():
        if name in SAMPLE.specs and name != "max_new_tokens":
            expected = SAMPLE.specs[name].default
            assert field.default == (list(expected) if isinstance(expected, tuple) else expected), name
    assert default_new_tokens() == inspect.signature(GPTVerbs.generate).parameters["max_new_tokens"].default


@pytest.mark.parametrize("name", BOUNDED)
def test_the_flag_the_keyword_and_the_server_field_refuse_the_same_values(name, tiny_run, capsys):
    pytest.importorskip("pydantic")
    from pydantic import ValidationError

    from attnlab.serve import generation_models

    bad, good = edges(name)
    gpt = tiny_run("gpt").load()
    generate_body = generation_models()[0]
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
    shown = " ".join(help_text(f"train {family}").replace("│", " ").split())
    keywords = attnlab.train_options(family)
    run = tiny_run(family)
    written = json.loads((run.out / "options.json").read_text())["options"]
    assert set(written) <= set(specs.specs), f"{family}'s options.json has undeclared {set(written) - set(specs.specs)}"
    model_fields = set(recipe.model_fields())
    for name, spec in specs.specs.items():
        assert f"{spec.flags[0]} " in shown, f"train {family}: {name} has no flag"
        # each choice listed after the flag (in any order: typing caches Optional[Literal[...]] by
        # equality, which ignores order, so a family may show another's order of the same choices)
        after = shown[shown.find(f"{spec.flags[0]} ") :]
        listed = after[after.find("[choices:") :].split("]")[0].replace("[choices:", "")
        assert not spec.choices or {c.strip() for c in listed.split(",")} == set(map(str, spec.choices)), name
        if name not in ("out", "resume", "config"):
            assert name in keywords, f"attnlab.train({family!r}) does not take {name}"
        # a model option is written when the run's model has it (a Transformer has no RNN's emb_dim)
        applies = name not in model_fields or hasattr(run.model.config, name)
        if name not in (*NOT_REPLAYED, "config") and applies:
            assert name in written, f"{family}'s options.json has no {name}"


@pytest.mark.parametrize("family", [r.name for r in recipes()])
def test_a_train_options_default_is_the_same_in_help_in_python_and_in_its_typed_options(family):
    """Generated over every family: the default `attnlab train FAMILY --help` states for each option
    is the default of its typed field in ``attnlab.train_args(family)`` and its value in
    ``attnlab.train_options(family)``. (None: the data, the task or the machine decides, which the
    help says in words; 0 and off need not be stated.)"""
    recipe = next(r for r in recipes() if r.name == family)
    typed = inspect.signature(attnlab.train_args(family)).parameters
    values = attnlab.train_options(family)
    options = {n: s for n, s in recipe.train_specs().specs.items() if n not in ("out", "resume", "config")}
    assert set(typed) == set(values) == set(options)
    for name, spec in options.items():
        default = typed[name].default
        assert values[name] == default, (family, name)
        stated = re.findall(r"\(default:? ([^);]*)", spec.help)
        if default not in (None, False, 0, ""):
            assert stated and stated[-1] == shown_default(default), (family, name, stated, default)


@pytest.mark.parametrize("command", list(COMMANDS))
def test_a_value_a_commands_declaration_refuses_is_refused_by_the_flag_and_the_keyword(command, capsys):
    """Generated over every command: each bounded or chosen option of each Python call the command
    makes, given a value just outside what it takes, is refused by the call (naming the keyword) and
    by the flag (naming the flag, exit 2). (The calls that check their own keywords: ``eval`` and
    ``ablate`` reach the families' ``evaluate`` through ``model.evaluate``, checked by the test of
    eval, inspect and train below.)"""
    declaration = COMMANDS[command]
    required = [w for spec in declaration.options for w in required_words(spec)]
    for verb in (v for v in declaration.verbs if hasattr(v, "__wrapped__")):  # (@checked)
        keywords = inspect.signature(verb).parameters
        first = [p for p in keywords.values() if p.default is p.empty and p.kind is not p.VAR_KEYWORD]
        first = first[1 if "self" in keywords else 0 :]
        for param, _, _ in declared_parameters(verb):
            spec = declaration.options.specs[param.name]
            bad = refused_value(spec)
            if bad is None or spec.positional or param.default is param.empty:
                continue
            args = [None] * ("self" in keywords) + ["x"] * len(first)
            with pytest.raises(OptionError, match=f"{param.name}="):
                verb(*args, **{param.name: bad})
            argv = [*command.split(), *required, spec.flags[0], *(bad if isinstance(bad, list) else [str(bad)])]
            with pytest.raises(CycloptsError) as refused:
                parse(argv)
            assert spec.flags[0] in str(refused.value), (command, param.name, str(refused.value))


def required_words(spec) -> list[str]:
    """Words that give a required option (or positional argument) a value, so that a command line
    is refused for the one value under test."""
    if not (spec.required or (spec.positional and spec.nargs not in ("*", "?"))):
        return []
    value = str(spec.choices[0]) if spec.choices else "x"
    return [value] if spec.positional else [spec.flags[0], value]


CLI_ONLY = ("ckpt", "device", "json")  # (options of the command line that no Python keyword shares)


def refused_value(spec):
    """A value just outside what ``spec`` takes (a choice it lacks, a count below its least), or None."""
    if spec.choices:
        return ["nope"] if spec.nargs in ("+", "*") else "nope"
    bounds = getattr(spec.type, "bounds", None)
    if bounds is None:
        return None
    kind, low, low_ok, high, high_ok = bounds
    if high is not None:
        return high + (1 if kind is int else 1e-6) if high_ok else high
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
    recipe = next(r for r in recipes() if r.name == family)
    model = tiny_run(family).load()
    inspects = declared(recipe.inspect_options)
    what = next(iter(recipe.inspections), None)
    surfaces = [
        (recipe.eval_specs(), ("eval", "--ckpt", "x"), lambda **kw: model.evaluate(**kw)),
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
# options that are a mode of their own: the command answers them without making its call
INSTEAD_OF_THE_CALL = {"reproduce": ("list", "design")}  # (each prints and exits instead of the run)


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
    kind, low, _, high, _ = bounds
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
    options = COMMANDS[command].options
    argv = command.split()
    for option, spec in options.specs.items():
        if option in INSTEAD_OF_THE_CALL.get(command, ()):
            continue
        words = FIXED_WORDS.get(option) or other_words(spec)
        if spec.positional:
            argv += words
        elif spec.kind == "bool" and spec.default is True:
            argv.append("--no-" + spec.flags[0][2:])
        else:
            argv += [spec.flags[0], *words]
    expected = with_defaults(options, parse(argv)[1])

    @functools.wraps(verb)
    def record(*args, **kwargs):
        raise Called(kwargs)

    monkeypatch.setattr(importlib.import_module(module), name, record)
    monkeypatch.setenv("ATTNLAB_DEBUG", "1")  # (the command line lets an unforeseen exception through)
    with pytest.raises(Called) as call:
        main(argv)
    received = call.value.args[0]
    for option, spec in options.specs.items():
        if option in inspect.signature(verb).parameters:
            assert option in received, f"attnlab {command} {spec.flags[0]} does not reach {name}()"
            assert received[option] == expected[option] != spec.default, (command, option)
