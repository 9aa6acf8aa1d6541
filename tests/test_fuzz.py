"""Command lines drawn from the parser itself: every command and option, with the values a hostile
user types (0, -1, huge, NaN, inf, empty, not UTF-8, a folder). Whatever is drawn, attnlab answers
with exit code 0 or 2, never a traceback, at most one ``error:`` line, and a refused training
leaves no run folder. ``ATTNLAB_FUZZ_EXAMPLES`` sets how many command lines (default 100), ``ATTNLAB_FUZZ_RANDOM=1``
draws new ones (by default every machine draws the same), ``ATTNLAB_FUZZ_LOG=FILE`` logs each."""

import os
import shutil
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from attnlab.cli import commands, main

FIXTURES = Path(__file__).parent / "fixtures" / "runs_v0_1"
SKIP = {"serve", "reproduce", "bench"}  # a server that runs until stopped; minutes-long runs
NOT_FUZZED = {"help", "ckpt", "out", "data_dir", "device", "resume", "progress", "compile", "fsdp", "dtype"}
# options whose size is the amount of work asked for: a huge value is a long run, not an error
WORK_SIZE = {
    "max_new_tokens",
    "num_samples",
    "max_tokens",
    "max_sentences",
    "n_images",
    "max_len",
    "batch_size",
    "eval_iters",
    "max_iters",
    "train_scenes",
    "max_objects",
    "vocab_size",
    "image_size",
    "eval_interval",
    "log_interval",
    "grad_accum",
    "warmup_iters",
    "lr_decay_iters",
    "block_size",
    "context",
    "dim",
    "mlp_dim",
    "emb_dim",
    "attention_dim",
    "layers",
    "enc_layers",
    "dec_layers",
    "heads",
    "type_vocab_size",
    "readout",
    "patch_size",
    "pad",
    "min_length",
    "max_length",
    "sample_chars",
    "top_k",
    "seed",
}
EDGE = ["0", "-1", "1", "2", "nan", "inf", "-inf", "", "x", "1e400", "\udcff", "99999999999999999999", "DIR"]
SMALL = ["0", "-1", "1", "2", "nan", "", "x", "\udcff", "DIR"]
# what every drawn training is held to, after the drawn options (the last value given is kept)
TRAIN_TAIL = ["--max-iters", "1", "--eval-iters", "1", "--batch-size", "2", "--no-progress", "--device", "cpu"]
CKPT = {"sample": "gpt", "translate": "s2s", "eval": "gpt", "explore": "gpt", "inspect": "vit", "predict": "vit"}


def _commands():
    """(argv prefix, declaration) of every command, `train FAMILY` each its own."""
    return [(words.split(), command) for words, command in commands().items() if words.split()[0] not in SKIP]


COMMANDS = _commands()


@st.composite
def command_lines(draw):
    prefix, command = draw(st.sampled_from(COMMANDS))
    specs = [s for s in command.options if s.dest not in NOT_FUZZED]
    chosen = draw(st.lists(st.sampled_from(specs), min_size=1, max_size=3, unique_by=lambda s: s.dest))
    argv = list(prefix)
    for spec in chosen:
        values = SMALL if spec.dest in WORK_SIZE else EDGE
        if spec.choices is not None and draw(st.booleans()):
            values = [str(c) for c in spec.choices]
        flag = None if spec.positional else spec.flags[0]
        if spec.kind in ("flag", "bool"):  # a switch
            argv.append(flag)
            continue
        value = draw(st.sampled_from(values))
        argv += [flag, value] if flag else [value]
    return argv


@pytest.fixture()
def work(tmp_path):
    (tmp_path / "DIR").mkdir()
    for name in ("gpt", "vit", "s2s"):
        shutil.copytree(FIXTURES / name, tmp_path / name)
    return tmp_path


@settings(
    max_examples=int(os.environ.get("ATTNLAB_FUZZ_EXAMPLES", "100")),
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
    derandomize=not os.environ.get("ATTNLAB_FUZZ_RANDOM"),  # by default the same lines on every machine
)
@given(argv=command_lines())
def test_any_command_line_is_answered_in_one_line(work, capsys, monkeypatch, argv):
    monkeypatch.chdir(work)
    monkeypatch.setenv("ATTNLAB_FAST_BF16", "0")
    argv = [str(work / "DIR") if v == "DIR" else v for v in argv]
    run = work / "fuzzrun"
    if argv[0] == "train":
        argv += ["--out", str(run), *TRAIN_TAIL]
        if argv[1] == "gpt":
            argv += ["--sample-chars", "0", "--preset", "nano"]
    elif argv[0] in CKPT:
        argv += ["--ckpt", str(work / CKPT[argv[0]])]
        if argv[0] in ("inspect", "explore"):
            argv += ["--out", str(work / ("o.png" if argv[0] == "inspect" else "o.html"))]
    elif argv[0] in ("caption", "embed"):
        argv += ["--ckpt", str(work / "gpt")]  # the wrong family: refused in one line
    monkeypatch.setattr("sys.stdin", open(os.devnull))
    code = main(argv)
    out, err = capsys.readouterr()
    if os.environ.get("ATTNLAB_FUZZ_LOG"):
        with open(os.environ["ATTNLAB_FUZZ_LOG"], "a") as log:
            log.write(f"{code} {argv[:6]!r} {err.strip().splitlines()[-1][:150] if err.strip() else ''}\n")
    shown = f"{argv!r}\n{err[-1500:]}"
    assert code in (0, 2), shown
    assert "Traceback" not in err and "Traceback" not in out, shown
    assert err.count("error:") <= 1, shown
    if code == 2 and argv[0] == "train":
        assert not run.exists(), shown  # a refused training leaves nothing behind
    shutil.rmtree(run, ignore_errors=True)
