"""Bad input to every command: one line saying what is wrong, exit code 2, no traceback, and
nothing written or deleted."""

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from attnlab.cli import main
from helpers import train_tiny_gpt

TEXT = "To be, or not to be, that is the question.\n" * 150
GPT_FAST = [
    "--preset",
    "nano",
    "--block-size",
    "16",
    "--max-iters",
    "2",
    "--eval-interval",
    "2",
    "--eval-iters",
    "1",
    "--no-progress",
    "--sample-chars",
    "0",
]
S2S_FAST = [
    "--data",
    "copy",
    "--min-length",
    "3",
    "--max-length",
    "5",
    "--dim",
    "32",
    "--heads",
    "2",
    "--enc-layers",
    "1",
    "--dec-layers",
    "1",
    "--ff-dim",
    "32",
    "--max-iters",
    "2",
    "--eval-interval",
    "2",
    "--eval-iters",
    "1",
    "--batch-size",
    "4",
    "--no-progress",
]
VIT_FAST = [
    "--dim",
    "16",
    "--depth",
    "1",
    "--heads",
    "2",
    "--max-iters",
    "2",
    "--eval-interval",
    "2",
    "--eval-iters",
    "1",
    "--batch-size",
    "8",
    "--no-progress",
]


def one_line_error(capsys, argv) -> str:
    code = main(argv)
    captured = capsys.readouterr()
    err = captured.err.strip()
    assert code == 2, (argv, captured.out[-500:], err[-2000:])
    assert err.startswith("error: "), err
    assert "\n" not in err and "Traceback" not in err, err
    return err


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    root = tmp_path_factory.mktemp("runs")
    gpt = train_tiny_gpt(main, root)
    s2s = root / "s2s"
    assert main(["train", "seq2seq", "--out", str(s2s), *S2S_FAST]) == 0
    vit = root / "vit"
    assert main(["train", "vit", "--out", str(vit), *VIT_FAST]) == 0
    return {"gpt": gpt, "seq2seq": s2s, "vit": vit, "root": root}


def _snapshot(folder):
    return sorted((str(p.relative_to(folder)), p.stat().st_size) for p in folder.rglob("*") if p.is_file())


# -- option values ---------------------------------------------------------------------------
TRAIN_GPT_BAD = [
    (["--max-iters", "0"], "max-iters"),
    (["--max-iters", "-5"], "max-iters"),
    (["--batch-size", "-2"], "batch-size"),
    (["--batch-size", "0"], "batch-size"),
    (["--lr", "0"], "--lr"),
    (["--lr=-1e-3"], "--lr"),
    (["--lr", "nan"], "--lr"),
    (["--block-size", "0"], "block_size"),
    (["--grad-accum", "0"], "grad-accum"),
    (["--eval-interval", "0"], "eval-interval"),
    (["--log-interval", "0"], "log-interval"),
    (["--eval-iters", "0"], "eval-iters"),
    (["--vocab-size", "0", "--tokenizer", "bpe"], "vocab-size"),
    (["--n-embd", "30", "--n-head", "4"], "not divisible"),
    (["--device", "tpu"], "--device"),
    (["--dtype", "fp16"], "--dtype"),
    (["--warmup-iters", "-1"], "warmup-iters"),
    (["--beta2", "1.5"], "beta2"),
    (["--position", "spiral"], "position"),
    (["--preset", "huge"], "--preset"),
    (["--max-iters", "ten"], "max-iters"),
]


@pytest.mark.parametrize("extra, expected", TRAIN_GPT_BAD, ids=[" ".join(e) for e, _ in TRAIN_GPT_BAD])
def test_bad_train_gpt_options_write_nothing(tmp_path, capsys, extra, expected):
    corpus = tmp_path / "c.txt"
    corpus.write_text(TEXT)
    out = tmp_path / "run"
    err = one_line_error(capsys, ["train", "gpt", "--data", str(corpus), "--out", str(out), *GPT_FAST, *extra])
    assert expected in err
    assert not out.exists()  # nothing written


def test_bad_sample_options(runs, capsys):
    ckpt = ["sample", "--ckpt", str(runs["gpt"])]
    for extra, expected in [
        (["--top-k", "-3"], "top-k"),
        (["--top-p", "0"], "top-p"),
        (["--top-p", "1.5"], "top-p"),
        (["--temperature", "-1"], "temperature"),
        (["--num-samples", "0"], "num-samples"),
        (["--max-new-tokens", "0"], "max-new-tokens"),
        (["--device", "tpu"], "device"),
        (["--stop", ""], "--stop"),
    ]:
        assert expected in one_line_error(capsys, [*ckpt, *extra]), extra


def test_bad_translate_and_eval_options(runs, capsys):
    s2s = str(runs["seq2seq"])
    for argv, expected in [
        (["translate", "--ckpt", s2s, "--beam", "0", "abc"], "beam"),
        (["translate", "--ckpt", s2s, "--beam", "-2", "abc"], "beam"),
        (["translate", "--ckpt", s2s, "--max-len", "0", "abc"], "max-len"),
        (["eval", "--ckpt", s2s, "--beam", "0"], "beam"),
        (["eval", "--ckpt", s2s, "--max-sentences", "0"], "max-sentences"),
        (["eval", "--ckpt", s2s, "--batch-size", "-1"], "batch-size"),
        (["predict", "--ckpt", str(runs["vit"]), "--top-k", "-1", "x.png"], "top-k"),
        (["bench", "--device", "tpu"], "device"),
    ]:
        assert expected in one_line_error(capsys, argv), argv


def test_translate_empty_input_and_bad_file(runs, tmp_path, capsys, monkeypatch):
    import io

    s2s = str(runs["seq2seq"])
    monkeypatch.setattr("sys.stdin", io.StringIO(""))
    assert "no sentences" in one_line_error(capsys, ["translate", "--ckpt", s2s])
    latin = tmp_path / "in.txt"
    latin.write_bytes("caf\xe9\n".encode("latin-1"))
    err = one_line_error(capsys, ["translate", "--ckpt", s2s, "--file", str(latin)])
    assert "in.txt" in err and "UTF-8" in err
    assert "does not exist" in one_line_error(capsys, ["translate", "--ckpt", s2s, "--file", str(tmp_path / "no.txt")])


def test_seq2seq_options(tmp_path, capsys):
    out = tmp_path / "r"
    assert "larger than --max-length" in one_line_error(
        capsys, ["train", "seq2seq", "--out", str(out), *S2S_FAST, "--min-length", "10", "--max-length", "2"]
    )
    assert "has no option --cell" in one_line_error(
        capsys, ["train", "seq2seq", "--out", str(out), *S2S_FAST, "--cell", "lstm"]
    )
    assert not out.exists()


# -- checkpoints -----------------------------------------------------------------------------
@pytest.mark.parametrize("command", ["sample", "translate", "predict", "eval"])
def test_wrong_family_for_a_command(runs, capsys, command):
    other = {"sample": "vit", "translate": "vit", "predict": "gpt", "eval": None}[command]
    if other is None:
        return
    argv = [command, "--ckpt", str(runs[other])] + (["x.png"] if command == "predict" else [])
    assert "model" in one_line_error(capsys, argv)


def _ckpt_copy(runs, tmp_path, name="gpt"):
    dst = tmp_path / "copy"
    shutil.copytree(runs[name] / "last", dst)
    return dst


@pytest.mark.parametrize(
    "config_text, expected",
    [
        ("{not json", "unreadable or corrupt"),
        ("[1, 2, 3]", "JSON list"),
        ('{"attnlab_version": "0", "model_type": "gpt", "model": {"n_layer": "four"}}', "layers (n_layer) must be int"),
        ('{"attnlab_version": "0", "model_type": "gpt", "model": {"n_lyer": 2}}', "unknown GPTConfig fields"),
        ('{"attnlab_version": "0", "model_type": "gpt", "model": {"vocab_size": 1000000000000}}', "vocab_size must be"),
        ('{"attnlab_version": "0", "model_type": "gpt", "model": [1]}', "has no 'model' section"),
        ('{"attnlab_version": "0", "model_type": "gpt"}', "config.json has no 'model' section (the model's shape)"),
    ],
)
def test_corrupt_config_json(runs, tmp_path, capsys, config_text, expected):
    ckpt = _ckpt_copy(runs, tmp_path)
    (ckpt / "config.json").write_text(config_text)
    assert expected in one_line_error(capsys, ["sample", "--ckpt", str(ckpt)])


def test_weights_that_are_empty_truncated_mismatched_or_nan(runs, tmp_path, capsys):
    import torch
    from safetensors.torch import load_file, save_file

    ckpt = _ckpt_copy(runs, tmp_path)
    w = ckpt / "model.safetensors"
    good = w.read_bytes()
    w.write_bytes(b"")
    assert "truncated or corrupt" in one_line_error(capsys, ["sample", "--ckpt", str(ckpt)])
    w.write_bytes(good[: len(good) - 100])
    assert "truncated or corrupt" in one_line_error(capsys, ["sample", "--ckpt", str(ckpt)])
    w.write_bytes(good)
    cfg = json.loads((ckpt / "config.json").read_text())
    cfg["model"]["dim"] = 128  # shapes no longer match the weights
    (ckpt / "config.json").write_text(json.dumps(cfg))
    assert "does not match its config" in one_line_error(capsys, ["sample", "--ckpt", str(ckpt)])
    cfg["model"]["dim"] = 64
    (ckpt / "config.json").write_text(json.dumps(cfg))
    tensors = load_file(str(w))
    first = sorted(tensors)[0]
    tensors[first] = torch.full_like(tensors[first], float("nan"))
    save_file(tensors, str(w))
    assert "NaN" in one_line_error(capsys, ["sample", "--ckpt", str(ckpt)])
    assert "NaN" in one_line_error(capsys, ["eval", "--ckpt", str(ckpt)])


@pytest.mark.parametrize(
    "state, says",
    [
        (b"\xa4\xa5 not text", "last is corrupt ('utf-8' codec can't decode byte 0xa4"),
        (b'{"step": "x", "best_val": null}', "last/trainer.json is corrupt (its step or best value is not a number)"),
        (b'{"step": 2, "best_val": "low"}', "last/trainer.json is corrupt (its step or best value is not a number)"),
        (b"[2]", "last/trainer.json is corrupt"),
    ],
)
def test_a_corrupt_trainer_state_under_resume_names_its_file(runs, tmp_path, capsys, state, says):
    """--resume on a damaged trainer.json answered "'utf-8' codec can't decode byte 0xa4..." or
    "unexpected TypeError: '<=' not supported..." without naming the file (issue 81)."""
    run = tmp_path / "run"
    shutil.copytree(runs["gpt"], run)
    (run / "last" / "trainer.json").write_bytes(state)
    capsys.readouterr()
    assert main(["train", "gpt", "--out", str(run), "--resume", "--max-iters", "40"]) == 2
    err = capsys.readouterr().err.splitlines()[-1]  # (after the resume notes)
    assert err.startswith("error: ") and says in err and err.endswith("cannot resume from it"), err


def test_a_huggingface_config_without_a_field_its_converter_reads_is_named(tmp_path, capsys):
    """A Llama config.json without num_attention_heads answered "unexpected KeyError" (issue 81)."""
    transformers = pytest.importorskip("transformers")
    config = transformers.LlamaConfig(vocab_size=32, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                                      num_attention_heads=2, num_key_value_heads=2)  # fmt: skip
    transformers.LlamaForCausalLM(config).save_pretrained(tmp_path / "hf")
    cfg = json.loads((tmp_path / "hf" / "config.json").read_text())
    del cfg["num_attention_heads"]
    (tmp_path / "hf" / "config.json").write_text(json.dumps(cfg))
    capsys.readouterr()  # (what saving it printed)
    err = one_line_error(capsys, ["sample", "--ckpt", str(tmp_path / "hf")])
    assert "is an incomplete HuggingFace llama checkpoint: it has no 'num_attention_heads'" in err, err


def test_pickled_huggingface_weights_are_refused_in_one_line(tmp_path, capsys):
    hf = tmp_path / "hf"
    hf.mkdir()
    (hf / "config.json").write_text(
        json.dumps({"model_type": "gpt2", "n_layer": 1, "n_head": 2, "n_embd": 8, "vocab_size": 10, "n_positions": 8})
    )
    import os

    import torch

    torch.save({"wte.weight": torch.zeros(2), "hook": os.getcwd}, hf / "pytorch_model.bin")  # a function inside
    err = one_line_error(capsys, ["sample", "--ckpt", str(hf)])
    assert "refusing to unpickle" in err


def test_out_that_is_a_file(tmp_path, capsys):
    corpus = tmp_path / "c.txt"
    corpus.write_text(TEXT)
    f = tmp_path / "file"
    f.write_text("mine")
    assert "is an existing file" in one_line_error(
        capsys, ["train", "gpt", "--data", str(corpus), "--out", str(f), *GPT_FAST]
    )
    assert f.read_text() == "mine"


# -- data ------------------------------------------------------------------------------------
def test_image_inputs(runs, tmp_path, capsys):
    vit = str(runs["vit"])
    assert "does not exist" in one_line_error(
        capsys,
        [
            "inspect",
            "attention",
            "--ckpt",
            vit,
            "--image",
            str(tmp_path / "none.png"),
            "--out",
            str(tmp_path / "a.png"),
        ],
    )
    assert "is a folder" in one_line_error(capsys, ["predict", "--ckpt", vit, str(tmp_path)])
    empty = tmp_path / "empty_classes"
    (empty / "a").mkdir(parents=True)
    (empty / "b").mkdir()
    assert "no images" in one_line_error(
        capsys, ["train", "vit", "--data", str(empty), "--out", str(tmp_path / "r1"), *VIT_FAST]
    )
    broken = tmp_path / "broken"
    for c in "ab":
        (broken / c).mkdir(parents=True)
        for i in range(3):
            Image.fromarray(np.full((8, 8), 40 * i, np.uint8), mode="L").save(broken / c / f"{i}.png")
    (broken / "a" / "bad.png").write_bytes(b"not a png")
    assert "bad.png" in one_line_error(
        capsys, ["train", "vit", "--data", str(broken), "--out", str(tmp_path / "r2"), *VIT_FAST]
    )
    assert "8x8" in one_line_error(
        capsys, ["train", "vit", "--out", str(tmp_path / "r3"), *VIT_FAST, "--image-size", "16"]
    )


def test_eval_refuses_data_with_other_classes(runs, tmp_path, capsys):
    folder = tmp_path / "two"
    for c in ("cat", "dog"):
        (folder / c).mkdir(parents=True)
        for i in range(6):
            Image.fromarray(np.full((8, 8), 20 * i, np.uint8), mode="L").save(folder / c / f"{i}.png")
    assert "classes" in one_line_error(capsys, ["eval", "--ckpt", str(runs["vit"]), "--data", str(folder)])


def test_eval_seq2seq_uses_the_data_it_is_given(runs, tmp_path, capsys):
    src, tgt = tmp_path / "a.src", tmp_path / "a.tgt"
    src.write_text("".join(f"abc{i % 10}\n" for i in range(40)))
    tgt.write_text("".join(f"abc{i % 10}\n" for i in range(40)))
    assert main(["eval", "--ckpt", str(runs["seq2seq"]), "--data", f"{src}:{tgt}", "--json"]) == 0
    res = json.loads(capsys.readouterr().out)
    assert res["data"] == "a.src:a.tgt"
    tgt.write_text("x\n" * 39)
    assert "39" in one_line_error(capsys, ["eval", "--ckpt", str(runs["seq2seq"]), "--data", f"{src}:{tgt}"])
    tsv = tmp_path / "one.tsv"
    tsv.write_text("only one column\n" * 20)
    assert "no tab" in one_line_error(capsys, ["eval", "--ckpt", str(runs["seq2seq"]), "--data", str(tsv)])


def test_resume_refuses_changed_model_and_data_options(runs, capsys):
    before = _snapshot(runs["seq2seq"])
    s2s = ["train", "seq2seq", "--out", str(runs["seq2seq"]), "--resume", "--no-progress"]
    for extra in (["--dim", "64"], ["--arch", "rnn"], ["--data", "reverse"], ["--max-length", "9"]):
        assert "differ from the checkpoint" in one_line_error(capsys, [*s2s, *extra]), extra
    vit = ["train", "vit", "--out", str(runs["vit"]), "--resume", "--no-progress"]
    assert "differ from the checkpoint" in one_line_error(capsys, [*vit, "--data", "mnist"])
    assert _snapshot(runs["seq2seq"]) == before


@pytest.mark.skipif(not hasattr(__import__("os"), "mkfifo"), reason="no FIFOs here")
@pytest.mark.parametrize("argv", [["sample", "gpt", "--prompts-file"], ["translate", "s2s", "--file"]])
def test_a_fifo_without_a_writer_is_refused_not_read_forever(tmp_path, argv):
    """`--prompts-file` on a FIFO with no writer blocked forever (issue 81): a file that is not a
    regular one is refused in one line (in a child process: a regression would hang, not pass)."""
    import os
    import subprocess
    import sys

    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    ckpt = Path(__file__).parent / "fixtures" / "runs_v0_1" / argv[1]
    r = subprocess.run([sys.executable, "-m", "attnlab", argv[0], "--ckpt", str(ckpt), argv[2], str(fifo)],
                       capture_output=True, text=True, timeout=120)  # fmt: skip
    assert r.returncode == 2 and r.stderr.count("\n") == 1 and "is not a regular file" in r.stderr, r.stderr
