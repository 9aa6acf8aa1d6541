"""What a hostile user tried (issue 27), each a case that slipped through before its fix."""

import pytest

from attnlab.cli import main

CAPTION_TINY = ["--train-scenes", "64", "--dim", "32", "--emb-dim", "16", "--attention-dim", "16", "--no-progress"]


def test_a_finite_explosion_is_divergence_and_nothing_is_saved(tmp_path, capsys):
    """--lr 1e6 on the caption task gave a loss of 1e18, exit 0 and a garbage best/."""
    out = tmp_path / "caplr"
    argv = ["train", "caption", *CAPTION_TINY, "--max-iters", "20", "--lr", "1e6", "--warmup-iters", "0"]
    assert main([*argv, "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert "diverged at step" in err and "first loss" in err, err
    assert "no checkpoint was written" in err and "--resume" not in err  # no advice to resume nothing
    assert not (out / "best").exists() and not (out / "last").exists()


@pytest.mark.parametrize(
    "argv",
    [
        ["train", "encoder", "--norm-eps", "nan"],
        ["train", "caption", "--alpha-c", "nan"],
        ["train", "gpt", "--dropout", "inf"],
        ["train", "vit", "--target", "inf"],
    ],
)
def test_non_finite_float_options_are_refused_before_training(tmp_path, capsys, argv):
    out = tmp_path / "never"
    assert main([*argv, "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert "not a finite number" in err and err.count("\n") == 1, err
    assert not out.exists()


@pytest.mark.parametrize(
    "argv, words",
    [
        (["train", "vit", "--target", "2"], "--target must be in (0, 1]"),
        (["train", "gpt", "--target", "0.5"], "no validation metric"),
    ],
)
def test_a_target_that_can_never_count_is_refused(tmp_path, capsys, argv, words):
    out = tmp_path / "never"
    assert main([*argv, "--out", str(out), "--max-iters", "1", "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert words in err and err.count("\n") == 1, err
    assert not out.exists()


@pytest.mark.parametrize(
    "argv, words",
    [
        (["train", "encoder", "--task", "mlm", "--label-smoothing", "0.1"], "applies to --task classify"),
        (["train", "caption", "--arch", "transformer", "--init-from-image"], "applies to --arch rnn-attention"),
        (["train", "caption", "--arch", "rnn", "--alpha-c", "0.5"], "applies to --arch rnn-attention"),
        (["train", "caption", "--patch-size", "8"], "applies to --encoder vit"),
        (["train", "caption", "--arch", "rnn", "--layers", "3"], "applies to --arch transformer"),
    ],
)
def test_options_that_would_do_nothing_are_refused(tmp_path, capsys, argv, words):
    out = tmp_path / "never"
    assert main([*argv, "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert words in err and err.count("\n") == 1, err
    assert not out.exists()
