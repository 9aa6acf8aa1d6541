"""The command line answers help, version and completion without torch, from the live
declarations (no module that declares an option imports torch; nothing is generated into the
package); its help shows the values a run actually uses."""

import json
import pathlib
import subprocess
import sys

import pytest

import attnlab
from attnlab.cli import build_parser
from attnlab.cli.completion import describe, script
from attnlab.recipes import recipe_for, recipes
from helpers import PINNED_TRAINING



def all_helps(parser, path=()):
    """{command path: its --help text}, every command of ``parser``."""
    out = {path: parser.format_help()}
    for action in parser._actions:
        if isinstance(getattr(action, "choices", None), dict):
            for name, sub in action.choices.items():
                out.update(all_helps(sub, (*path, name)))
    return out


def test_nothing_is_generated_into_the_package_and_every_help_prints():
    root = pathlib.Path(attnlab.__file__).parent
    assert not (root / "cli" / "commands.json").exists() and not (root / "cli" / "manifest.py").exists()
    helps = all_helps(build_parser())
    assert len(helps) > 15
    for path, text in helps.items():
        assert "object at 0x" not in text, f"a % in a help text of {path} broke argparse's formatting"


def test_a_command_line_builds_only_the_command_it_names():
    """The words parsed name one command: it gets its options, the others their name and help, and
    the help of each is the one the whole parser prints."""
    whole = all_helps(build_parser())
    for words in (["train", "gpt"], ["sample"], ["sae", "eval"], ["train"], []):
        part = all_helps(build_parser([*words, "--help"]))
        assert part[tuple(words)] == whole[tuple(words)], words
    assert "--max-iters" not in all_helps(build_parser(["sample"]))[("train", "vit")]  # (a stub)


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
        assert "--max-iters" in r.stdout and "(default: 1000)" in r.stdout


def test_a_bad_option_with_help_is_still_one_line():
    r = subprocess.run(
        [sys.executable, "-m", "attnlab", "train", "gpt", "--max-itres", "3", "--help"], capture_output=True, text=True
    )
    assert r.returncode == 0 and "usage: attnlab train gpt" in r.stdout  # --help wins, as argparse's does


def complete_bash(words: list[str]) -> list[str]:
    """What bash completes for the command line ``words`` (the last one being typed)."""
    setup = script("bash", describe(build_parser()))
    probe = f"COMP_WORDS=({' '.join(repr(w) for w in words)}); COMP_CWORD={len(words) - 1}; _attnlab_complete; "
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
    data = describe(build_parser())
    assert "bashcompinit" in script("zsh", data) and "_attnlab_complete" in script("zsh", data)
    fish = script("fish", data).splitlines()
    pos = [line for line in fish if "-l pos " in line and "from gpt" in line]
    assert len(pos) == 1 and "'learned rope alibi sinusoidal relative'" in pos[0], pos
    assert any("-a completion" in line for line in fish)


def test_every_option_has_a_help_sentence_and_text_fields_show_their_choices():
    def walk(data, path=()):
        for action in data["actions"]:
            if action["kind"] == "subcommands":
                for name, command in action["commands"].items():
                    yield from walk(command["parser"], (*path, name))
            else:
                yield path, action

    for path, action in walk(describe(build_parser())):
        label = f"{' '.join(path)} {action.get('option_strings') or action['dest']}"
        assert action["help"] and len(action["help"]) > 8, label
        assert "GPTConfig." not in action["help"] and "TrainConfig." not in action["help"], label
    helps = all_helps(build_parser())
    gpt = helps[("train", "gpt")]
    for choices in (
        "{learned,rope,alibi,sinusoidal,relative}",
        "{adamw,muon}",
        "{cosine,trapezoid}",
        "{auto,fp32,bf16}",
    ):
        assert choices in gpt, choices
    assert "{gru,lstm}" in helps[("train", "seq2seq")] and "{cls,mean}" in helps[("train", "vit")]


def test_choices_are_checked_from_python_and_in_configs():
    from attnlab.errors import OptionError
    from attnlab.models.gpt import GPTConfig

    with pytest.raises(ValueError, match="--pos must be one of learned, rope"):
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
    assert "rnn: 512" in all_helps(build_parser())[("train", "seq2seq")].replace("\n", " ").replace("  ", " ")


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
