"""The command line (cyclopts, from the declarations) answers help, version and completion without
torch, from the live declarations (no module that declares an option imports torch; nothing is
generated into the package); its help shows the values a run actually uses."""

import contextlib
import io
import json
import pathlib
import subprocess
import sys

import pytest

import attnlab
from attnlab.cli import build_app, commands
from attnlab.recipes import recipe_for, recipes
from helpers import PINNED_TRAINING


def help_of(words: list[str], built_for: list[str] | None = None, whole: bool = False) -> str:
    """The --help text of ``attnlab WORDS``, as printed by the command line built for those words
    (``built_for``: for other words; ``whole``: with every command's options)."""
    out = io.StringIO()
    app = build_app(None if whole else built_for if built_for is not None else [*words, "--help"])
    with contextlib.redirect_stdout(out):
        command, bound, _ = app.parse_args([*words, "--help"], exit_on_error=False, print_error=False)
        command(*bound.args, **bound.kwargs)
    return out.getvalue()


def flat(text: str) -> str:
    """Help text as one line: rich's wrapping and panel borders removed."""
    return " ".join(text.replace("│", " ").split())


def all_helps() -> dict[tuple[str, ...], str]:
    """{command words: its --help text}, every command, each group, and attnlab itself."""
    paths = {(): None, **{tuple(words.split()[:1]): None for words in commands() if " " in words}}
    paths.update({tuple(words.split()): None for words in commands()})
    return {path: help_of(list(path)) for path in paths}


def test_nothing_is_generated_into_the_package_and_every_help_prints():
    root = pathlib.Path(attnlab.__file__).parent
    assert not (root / "cli" / "commands.json").exists() and not (root / "cli" / "manifest.py").exists()
    helps = all_helps()
    assert len(helps) > 25
    for path, text in helps.items():
        assert text.startswith(f"Usage: attnlab {' '.join(path)}".rstrip()), (path, text[:80])


def test_a_command_line_builds_only_the_command_it_names():
    """The words parsed name one command: it gets its options, the others their name and help, and
    the help of each is the one the whole command line prints."""
    for words in (["train", "gpt"], ["sample"], ["sae", "eval"], ["train"], []):
        assert help_of(words) == help_of(words, whole=True), words
    assert "--max-iters" in help_of(["train", "vit"]) and "--max-iters" not in help_of(["train", "vit"], ["sample"])


@pytest.mark.parametrize(
    "argv",
    [[], ["--help"], ["--version"], ["train", "gpt", "--help"], ["sample", "-h"], ["completion", "bash"]],
    ids=lambda a: " ".join(a) or "(none)",
)
def test_help_version_and_completion_import_neither_torch_nor_matplotlib(argv):
    code = (
        "import sys\nfrom attnlab.cli import main\nrc = main(sys.argv[1:])\n"
        "heavy = [m for m in ('torch', 'matplotlib', 'numpy') if m in sys.modules]\n"
        "assert rc == 0 and not heavy, (rc, heavy)"
    )
    r = subprocess.run([sys.executable, "-c", code, *argv], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip()
    if argv[:2] == ["train", "gpt"]:
        shown = " ".join(r.stdout.replace("│", " ").split())
        assert "--max-iters" in shown and "(default: 1000)" in shown


def test_a_bad_option_with_help_is_still_one_line():
    r = subprocess.run(
        [sys.executable, "-m", "attnlab", "train", "gpt", "--max-itres", "3", "--help"], capture_output=True, text=True
    )
    assert r.returncode == 0 and "Usage: attnlab train gpt" in r.stdout  # --help wins


@pytest.mark.parametrize("argv", [["train", "gpt", "--help"], ["--help"], ["--version"]])
def test_help_read_by_a_reader_that_leaves_early_exits_0(argv):
    """`attnlab train gpt --help | grep -q -- --max-iters` (the wheel check, under pipefail): the reader
    closes the pipe after its first lines, and the help still exits 0, silently (rich exited 1)."""
    shown = subprocess.Popen([sys.executable, "-m", "attnlab", *argv], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    assert shown.stdout is not None and shown.stdout.read(8)
    shown.stdout.close()
    assert shown.wait(60) == 0 and shown.stderr is not None and shown.stderr.read() == b""


def complete_bash(words: list[str]) -> list[str]:
    """What bash completes for the command line ``words`` (the last one being typed)."""
    setup = build_app().generate_completion(prog_name="attnlab", shell="bash")
    line = " ".join(words)
    probe = (
        f"COMP_WORDS=({' '.join(repr(w) for w in words)}); COMP_CWORD={len(words) - 1}; COMP_LINE={line!r}; "
        "COMP_POINT=${#COMP_LINE}; _attnlab; "
    )
    r = subprocess.run(
        ["bash", "-c", setup + "\n" + probe + 'printf "%s\\n" "${COMPREPLY[@]}"'], capture_output=True, text=True
    )
    assert r.returncode == 0, r.stderr
    return [w for w in r.stdout.splitlines() if w]


def test_bash_completes_commands_options_and_choices():
    assert complete_bash(["attnlab", "tr"]) == ["train", "translate"]
    assert complete_bash(["attnlab", "train", "v"]) == ["vit"]
    assert set(complete_bash(["attnlab", "train", "gpt", "--po"])) == {
        "--pos",
        "--position",
        "--pos-combine",
        "--pos-dim",
        "--post-ln",
    }
    assert complete_bash(["attnlab", "train", "gpt", "--pos", "r"]) == ["rope", "relative"]
    assert complete_bash(["attnlab", "train", "vit", "--pos", "s"]) == ["sincos"]  # (the ViT's own choices)
    assert complete_bash(["attnlab", "train", "gpt", "--no-com"]) == ["--no-compile"]
    assert complete_bash(["attnlab", "train", "gpt", "--data", ""]) == []  # a file: the shell's default
    assert complete_bash(["attnlab", "completion", "z"]) == ["zsh"]


def test_zsh_and_fish_scripts():
    r = subprocess.run([sys.executable, "-m", "attnlab", "completion", "zsh"], capture_output=True, text=True)
    assert r.returncode == 0 and "#compdef attnlab" in r.stdout and "--max-iters" in r.stdout
    fish = build_app().generate_completion(prog_name="attnlab", shell="fish").splitlines()
    pos = [line for line in fish if "-l pos " in line and "gpt" in line]
    assert pos and all(c in pos[0] for c in ("learned", "rope", "alibi", "sinusoidal", "relative")), pos
    assert any("completion" in line for line in fish)


def test_every_option_has_a_help_sentence_and_text_fields_show_their_choices():
    for words, command in commands().items():
        for spec in command.options:
            label = f"{words} {spec.flags[0]}"
            assert spec.help and len(spec.help) > 8, label
            assert "GPTConfig." not in spec.help and "TrainConfig." not in spec.help, label
    gpt = flat(help_of(["train", "gpt"]))
    for choices in (
        "learned, rope, alibi, sinusoidal, relative",
        "adamw, muon",
        "cosine, trapezoid",
        "auto, fp32, bf16",
    ):
        assert f"[choices: {choices}]" in gpt, choices
    assert "[choices: gru, lstm]" in flat(help_of(["train", "seq2seq"]))
    assert "[choices: cls, mean]" in flat(help_of(["train", "vit"]))


def test_choices_are_checked_from_python_and_in_configs():
    from attnlab.errors import OptionError
    from attnlab.models.gpt import GPTConfig

    with pytest.raises(ValueError, match=r"\(--pos\): choose one of learned, rope"):
        GPTConfig(pos="rotary")
    with pytest.raises(OptionError, match="choose one of adamw, muon"):
        attnlab.train("gpt", optimizer="sgd", max_iters=1)


def test_train_options_are_the_values_a_run_uses():
    gpt = attnlab.train_options("gpt")
    assert (gpt["layers"], gpt["dim"], gpt["context"], gpt["max_iters"], gpt["lr"]) == (4, 128, 64, 1000, 5e-3)
    assert gpt["preset"] == "shakespeare-cpu" and gpt["threads"] is None  # (None: automatic)
    vit = attnlab.train_options("vit")
    assert vit["image_size"] is None  # the data's
    seq = attnlab.train_options("seq2seq")
    assert seq["dim"] == 128 and seq["label_smoothing"] == 0.1
    assert "rnn: 512" in flat(help_of(["train", "seq2seq"]))


@pytest.mark.parametrize("family", [r.name for r in recipes()])
def test_the_defaults_help_shows_are_those_a_new_run_writes(family, tmp_path):
    """One step of a run given no model or training options: its config.json holds, for every
    option, the value --help and train_options() announce."""
    announced = attnlab.train_options(family)
    small = dict(PINNED_TRAINING, max_iters=1, eval_interval=1, eval_iters=1, batch_size=2, progress=False)
    if "sample_chars" in announced:
        small["sample_chars"] = 0
    attnlab.train(family, out=tmp_path / "run", **small)
    saved = json.loads((tmp_path / "run" / "last" / "config.json").read_text())
    recipe = recipe_for(saved["model_type"])
    assert recipe.name == family
    checked = 0
    for name, value in announced.items():
        if name in small or value is None:
            continue
        where = saved["model"] if name in saved["model"] else saved["train"] if name in saved["train"] else None
        if where is None:
            continue  # a data or task option (its own default, written in its help)
        assert where[name] == value, f"{family} --{name}: help says {value!r}, the run used {where[name]!r}"
        checked += 1
    assert checked >= 20


def test_init_help_names_every_family_the_gpt_loader_reads():
    """`train gpt --init` reads every HuggingFace family a GPT converter reads; its help names them
    (it said "a HuggingFace GPT-2 folder" while Qwen2 folders worked: issue 81)."""
    import re

    from attnlab.interop import converters

    shown = re.sub(r"[^a-z0-9]", "", commands()["train gpt"].options.specs["init"].help.lower())
    for hf_type in sorted(c.hf_type for c in converters() if c.model_type == "gpt"):
        stem = re.sub(r"[^a-z]", "", re.sub(r"\d*(_text)?$", "", hf_type))  # (gemma3_text: gemma)
        assert stem in shown, (hf_type, shown)
