import json
import re
import subprocess
import sys

import pytest

from attnlab.cli import main

TEXT = "To be, or not to be, that is the question.\n" * 150
FAST = [
    "--preset",
    "nano",
    "--block-size",
    "16",
    "--max-iters",
    "6",
    "--eval-interval",
    "3",
    "--eval-iters",
    "2",
    "--batch-size",
    "4",
    "--no-progress",
    "--sample-chars",
    "0",
]


@pytest.fixture
def run(tmp_path):
    corpus = tmp_path / "c.txt"
    corpus.write_text(TEXT)
    out = tmp_path / "run"
    assert main(["train", "gpt", "--data", str(corpus), "--out", str(out), *FAST]) == 0
    return out


def test_help_and_version():
    r = subprocess.run([sys.executable, "-m", "attnlab", "--help"], capture_output=True, text=True)
    assert r.returncode == 0 and "train" in r.stdout and "sample" in r.stdout
    for cmd in (
        ["train", "gpt"],
        ["train", "vit"],
        ["train", "seq2seq"],
        ["sample"],
        ["eval"],
        ["translate"],
        ["predict"],
        ["inspect"],
        ["bench"],
    ):
        assert main([*cmd, "--help"]) == 0
    assert main(["--version"]) == 0


def test_train_sample_eval_resume(run, capsys):
    assert (run / "last" / "model.safetensors").exists() and (run / "metrics.jsonl").exists()
    capsys.readouterr()
    assert main(["sample", "--ckpt", str(run), "--prompt", "To be", "--max-new-tokens", "20", "--seed", "1"]) == 0
    first = capsys.readouterr().out
    assert first.startswith("To be") and len(first) > 10
    main(["sample", "--ckpt", str(run), "--prompt", "To be", "--max-new-tokens", "20", "--seed", "1"])
    assert capsys.readouterr().out == first  # reproducible from the seed
    assert (
        main(
            [
                "sample",
                "--ckpt",
                str(run),
                "--prompt",
                "To",
                "--temperature",
                "0",
                "--max-new-tokens",
                "10",
                "--no-cache",
            ]
        )
        == 0
    )
    greedy_nocache = capsys.readouterr().out
    main(["sample", "--ckpt", str(run), "--prompt", "To", "--temperature", "0", "--max-new-tokens", "10"])
    assert capsys.readouterr().out == greedy_nocache
    assert main(["eval", "--ckpt", str(run), "--json"]) == 0
    res = json.loads(capsys.readouterr().out)
    assert res["perplexity"] > 1 and res["bits_per_char"] == pytest.approx(res["loss"] / 0.6931, rel=1e-3)
    assert (
        main(
            ["train", "gpt", "--out", str(run), "--resume", "--max-iters", "9", "--no-progress", "--sample-chars", "0"]
        )
        == 0
    )
    assert json.loads((run / "last" / "trainer.json").read_text())["step"] == 9


def _err(capsys, argv):
    code = main(argv)
    err = capsys.readouterr().err.strip()
    assert code == 2, err
    assert err.startswith("error: ") and "\n" not in err and "Traceback" not in err
    return err


def test_bad_corpora(tmp_path, capsys):
    empty = tmp_path / "empty.txt"
    empty.write_text("   \n")
    assert "is empty" in _err(capsys, ["train", "gpt", "--data", str(empty), "--out", str(tmp_path / "a"), *FAST])
    binary = tmp_path / "b.bin"
    binary.write_bytes(bytes(range(256)) * 10)
    assert "binary" in _err(capsys, ["train", "gpt", "--data", str(binary), "--out", str(tmp_path / "b"), *FAST])
    latin = tmp_path / "l.txt"
    latin.write_bytes("caf\xe9 ".encode("latin-1") * 100)
    assert "not UTF-8" in _err(capsys, ["train", "gpt", "--data", str(latin), "--out", str(tmp_path / "c"), *FAST])
    short = tmp_path / "s.txt"
    short.write_text("hello world")
    assert "too short" in _err(capsys, ["train", "gpt", "--data", str(short), "--out", str(tmp_path / "d"), *FAST])
    assert "no such file" in _err(capsys, ["train", "gpt", "--data", str(tmp_path / "nope.txt"), *FAST])


def test_bad_prompt_and_checkpoints(run, tmp_path, capsys):
    assert "not in this tokenizer's vocabulary" in _err(capsys, ["sample", "--ckpt", str(run), "--prompt", "zebra €"])
    assert "larger than the model's context" in _err(capsys, ["eval", "--ckpt", str(run), "--block-size", "999"])
    assert "does not exist" in _err(capsys, ["sample", "--ckpt", str(tmp_path / "missing")])
    # never overwrite a run without --resume
    assert "already holds a checkpoint" in _err(capsys, ["train", "gpt", "--out", str(run), *FAST])
    # resume with a different model shape
    assert "differ from the checkpoint" in _err(
        capsys, ["train", "gpt", "--out", str(run), "--resume", "--n-layer", "5"]
    )
    # truncated weights
    w = run / "best" / "model.safetensors"
    good = w.read_bytes()
    w.write_bytes(good[: len(good) // 2])
    assert "truncated or corrupt" in _err(capsys, ["sample", "--ckpt", str(run)])
    assert (run / "last" / "model.safetensors").exists()  # the last good checkpoint is untouched
    # a checkpoint of another model type
    cfg = json.loads((run / "last" / "config.json").read_text())
    other = tmp_path / "other"
    other.mkdir()
    (other / "config.json").write_text(json.dumps({**cfg, "model_type": "vit"}))
    assert "holds a vit model, but this command needs a gpt model" in _err(capsys, ["sample", "--ckpt", str(other)])
    (other / "config.json").write_text(json.dumps({**cfg, "model_type": "lstm9"}))
    assert "unknown model_type 'lstm9'" in _err(capsys, ["sample", "--ckpt", str(other)])


def test_a_misspelled_option_gets_the_nearest_one_and_a_resume_below_the_run_is_refused(tmp_path, capsys):
    """`--lrr 0.1` names `--lr`; `--resume --max-iters 1` on a run at step 2 said nothing and exited 0."""
    from attnlab.cli import main
    from helpers import train_tiny_gpt

    assert main(["train", "gpt", "--lrr", "0.1", "--out", str(tmp_path / "never")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Unknown option: --lrr. Did you mean --lr?" in err
    assert main(["sample", "--ckpt", "x", "--temprature", "0"]) == 2
    assert "Did you mean --temperature?" in capsys.readouterr().err
    run = train_tiny_gpt(main, tmp_path)  # 2 steps
    capsys.readouterr()
    assert main(["train", "gpt", "--out", str(run), "--resume", "--max-iters", "1", "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert "is at step 2 already; give --max-iters above 2" in err and err.count("\n") == 1, err


def test_a_mistyped_command_is_named_and_a_flag_is_never_taken_from_its_start(capsys):
    """`attnlab trian` gets "did you mean train"; `--max-iter 5` is not silently `--max-iters 5`;
    each error points to the help of the command it was given to."""
    from attnlab.cli import main

    cases = [
        (["trian"], 'error: Unknown command "trian". Did you mean "train"? Available commands: train, '),
        (["trian", "--help"], 'error: Unknown command "trian". Did you mean "train"?'),
        (["train", "gtp"], 'error: Unknown command "gtp". Did you mean "gpt"?'),
        (["sae", "evl"], 'error: Unknown command "evl". Did you mean "eval"?'),
        (["train", "gpt", "--max-iter", "5"], "--max-iter. Did you mean --max-iters? (see attnlab train gpt --help)"),
        (["sample", "--ckpt", "x", "--max-new", "3"], "Did you mean --max-new-tokens? (see attnlab sample --help)"),
        (["xyzzy"], 'error: Unknown command "xyzzy". Available commands: train, '),
    ]
    for argv, says in cases:
        assert main(argv) == 2, argv
        err = capsys.readouterr().err
        assert says in err and err.count("\n") == 1, (argv, err)


def test_training_says_what_it_trains_and_how_long_and_keeps_the_hardware_reasons_in_a_file(tmp_path, capsys):
    """The first screen: what is trained on what, then how long it will take (after a few timed
    steps); the dtype, thread and compile reasoning only under --verbose, always in hardware.log."""
    from attnlab.cli import main

    tiny = ["--max-iters", "8", "--layers", "1", "--heads", "1", "--dim", "8", "--context", "16", "--batch-size", "2",
            "--eval-interval", "8", "--eval-iters", "1"]  # fmt: skip
    assert main(["train", "gpt", "--out", str(tmp_path / "quiet"), *tiny]) == 0
    said = capsys.readouterr()
    err = said.err + said.out  # (the lines beside the progress bar are tqdm's, on stdout)
    first, second = said.err.splitlines()[0], said.out.splitlines()[0]
    assert first.startswith("GPT 1 layers") and "data python-docs" in first and " thread" in first
    assert re.match(r"about \d+ s for the \d steps left \(\d+ ms a step\), besides evaluations$", second), second
    assert "(" not in first.split("parameters | ")[1] and "compile:" not in err and "threads:" not in err
    log = (tmp_path / "quiet" / "hardware.log").read_text()
    assert log.startswith("step 0: cpu float32 (") and "compile: " in log
    assert main(["train", "gpt", "--out", str(tmp_path / "loud"), "--verbose", *tiny]) == 0
    said = capsys.readouterr()
    err = said.err + said.out
    assert "compile: " in err and "parameters | cpu float32 (" in err


def test_inspect_attention_draws_a_labelled_map_for_every_model_with_attention(tiny_run, tmp_path, capsys, monkeypatch):
    """`inspect attention` on a GPT and a text encoder writes a PNG (a title, the tokens on the axes,
    a colour bar) and its numbers, each (L, H, Tq, Tk) map's rows summing to 1; on a seq2seq model,
    its cross-attention. A CNN says it has no such inspection and which it has."""
    import numpy as np

    import attnlab.inspect.plots as plots
    from attnlab.cli import main

    drawn = {}
    real_save = plots.save_figure

    def keep(fig, path):
        drawn[str(path)] = {
            "ticks": [t.get_text() for ax in fig.axes for t in ax.get_yticklabels() + ax.get_xticklabels()],
            "title": fig._suptitle.get_text() if fig._suptitle else "",
            "colour bar": any(ax.get_ylabel() == "attention weight" for ax in fig.axes),
        }
        return real_save(fig, path)

    monkeypatch.setattr(plots, "save_figure", keep)
    for family in ("gpt", "encoder"):
        out = tmp_path / f"{family}.png"
        assert main(["inspect", "attention", "--ckpt", str(tiny_run(family).out), "--text", "to be or", "--out",
                     str(out)]) == 0  # fmt: skip
        raw = np.load(out.with_suffix(".npz"))
        att, tokens = raw["attention"], list(raw["tokens"])
        assert att.ndim == 4 and att.shape[2] == att.shape[3] == len(tokens)
        assert np.allclose(att.sum(-1), 1, atol=1e-5)
        seen = drawn[str(out)]
        assert seen["title"].startswith("attention on 'to be or'") and seen["colour bar"]
        assert any(seen["ticks"])  # (the tokens label the axes)
    out = tmp_path / "seq2seq.png"
    assert (
        main(["inspect", "attention", "--ckpt", str(tiny_run("seq2seq").out), "--text", "a b", "--out", str(out)]) == 0
    )
    assert out.is_file()
    cnn = tiny_run("cnn").out
    capsys.readouterr()
    assert main(["inspect", "attention", "--ckpt", str(cnn), "--out", str(tmp_path / "c.png")]) == 2
    err = capsys.readouterr().err
    assert "holds a cnn model, whose inspections are:" in err and err.count("\n") == 1
