"""Data contracts: --resume refuses other data (another --data, or the run's files changed), and
data that cannot make a fair split or a classifier is refused before training."""

import json

import pytest


from attnlab.cli import main
from helpers import PINNED_FLAGS

FAST = ["--preset", "nano", "--context", "16", "--eval-interval", "2", "--eval-iters", "1", "--batch-size", "2"]
QUIET = ["--no-progress", "--sample-chars", "0", *PINNED_FLAGS]


def train(out, *extra):
    return main(["train", "gpt", "--out", str(out), *FAST, *QUIET, *extra])


def test_resume_refuses_other_data_and_changed_files(tmp_path, capsys):
    a, b = tmp_path / "a.txt", tmp_path / "b.txt"
    a.write_text("to be or not to be, that is the question. " * 60)
    b.write_text("all the world's a stage, and all the men and women merely players. " * 60)
    run = tmp_path / "run"
    assert train(run, "--data", str(a), "--max-iters", "2") == 0
    saved = json.loads((run / "last" / "config.json").read_text())["data_fingerprint"]
    assert saved["files"] == 1 and saved["bytes"] == a.stat().st_size and len(saved["sha256"]) == 64
    capsys.readouterr()
    assert train(run, "--resume", "--data", str(b), "--max-iters", "4") == 2
    err = capsys.readouterr().err
    assert "this is not the data it trained on" in err and "a.txt" in err and "b.txt" in err
    assert train(run, "--resume", "--data", str(a), "--max-iters", "4") == 0  # the same file: fine
    a.write_text(a.read_text() + "whether 'tis nobler in the mind. ")
    capsys.readouterr()
    assert train(run, "--resume", "--max-iters", "6") == 2
    assert "its data changed since it started" in capsys.readouterr().err
    # a run on the default corpus does not resume on a file
    default = tmp_path / "default"
    assert train(default, "--max-iters", "2") == 0
    capsys.readouterr()
    assert train(default, "--resume", "--data", str(b), "--max-iters", "4") == 2
    assert "trained on the family's default data" in capsys.readouterr().err


def test_a_translation_tsv_with_a_third_column_is_refused(tmp_path, capsys):
    tsv = tmp_path / "pairs.tsv"
    tsv.write_text("ein hund\ta dog\n" * 5 + "eine katze\ta cat\textra\n" + "ein haus\ta house\n" * 10)
    argv = ["train", "seq2seq", "--data", str(tsv), "--out", str(tmp_path / "r"), "--max-iters", "1"]
    assert main(argv) == 2
    assert "line 6 has 3 columns" in capsys.readouterr().err


def test_a_classifier_with_one_label_is_refused(tmp_path, capsys):
    data = tmp_path / "one.tsv"
    data.write_text("".join(f"text number {i}\tsame\n" for i in range(30)))
    argv = ["train", "encoder", "--task", "classify", "--data", str(data), "--out", str(tmp_path / "r")]
    assert main([*argv, "--max-iters", "1"]) == 2
    err = capsys.readouterr().err
    assert "a classifier needs at least 2 classes" in err and len(err.strip().splitlines()) == 1


def test_translating_characters_the_model_never_saw_says_so(tmp_path, capsys):
    out = tmp_path / "run"
    argv = ["train", "seq2seq", "--data", "reverse", "--dim", "32", "--heads", "2", "--enc-layers", "1"]
    argv += ["--dec-layers", "1", "--max-iters", "1", "--eval-interval", "1", "--eval-iters", "1", "--no-progress"]
    assert main([*argv, "--out", str(out)]) == 0
    capsys.readouterr()
    assert main(["translate", "--ckpt", str(out), "abc", "中文 abc", "--beam", "1"]) == 0
    captured = capsys.readouterr()
    assert len(captured.out.splitlines()) == 2
    warning = [line for line in captured.err.splitlines() if "never saw" in line]
    assert len(warning) == 1 and "sentence 2" in warning[0] and "'中', '文'" in warning[0]
    assert warning[0].startswith("warning: sentence 2")  # one line, as the errors (no file:line, no code)
    import attnlab
    from attnlab.errors import Note

    with pytest.warns(Note, match="never saw"):  # in Python: a warning, not a print
        attnlab.load(out).translate(["中文 abc"], beam=1)


def test_a_caption_set_too_small_to_split_is_refused(tmp_path, capsys):
    from PIL import Image

    for i in range(2):
        Image.new("RGB", (16, 16), (40 * i, 90, 200)).save(tmp_path / f"im{i}.png")
    tsv = tmp_path / "caps.tsv"
    tsv.write_text("".join(f"{tmp_path / f'im{i}.png'}\ta blue square number {i}\n" for i in range(2)))
    assert main(["train", "caption", "--data", str(tsv), "--out", str(tmp_path / "r"), "--max-iters", "1"]) == 2
    err = capsys.readouterr().err
    assert "has 2 image(s)" in err and "never shared" in err


def test_caption_splits_never_share_an_image():
    from attnlab.data.captions import split_items

    for n in (3, 4, 7, 10, 25, 101):
        parts = split_items(list(range(n)))
        assert all(parts[k] for k in parts) and sorted(sum(parts.values(), [])) == list(range(n)), n


def test_messages_that_name_the_problem(tmp_path, capsys, monkeypatch):
    """Values that used to surface as a divergence, an overflow or a raw assertion, now named."""
    for argv, says in [
        (
            ["train", "gpt", "--seed", str(2**70)],
            "--seed: 1180591620717411303424 is out of range: must be from 0 to 2**63 - 1",
        ),
        (["train", "gpt", "--norm-eps", "-1"], "--norm-eps must be positive"),
        (["train", "encoder", "--context", "1"], "--context 1: an encoded text is [CLS] text [SEP]"),
        (["train", "gpt", "--device", "cuda:7"], "--device cuda:7"),
    ]:
        assert main([*argv, "--out", str(tmp_path / "r"), "--max-iters", "1"]) == 2
        err = capsys.readouterr().err.strip()
        assert says in err and len(err.splitlines()) == 1, err


def test_a_full_disk_while_saving_keeps_the_last_checkpoint(tmp_path, capsys, monkeypatch):
    from attnlab import checkpoint

    run = tmp_path / "run"
    assert train(run, "--max-iters", "2") == 0

    def full(*args, **kwargs):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(checkpoint, "write_checkpoint_files", full)
    capsys.readouterr()
    assert train(run, "--resume", "--max-iters", "4") == 2
    err = capsys.readouterr().err
    assert "(the disk is full)" in err and "the previous checkpoint there is intact" in err
    saved = json.loads((run / "last" / "config.json").read_text())
    assert saved["step"] == 2 and not (run / "last.tmp").exists()


def test_a_corrupt_data_cache_is_rebuilt(tmp_path):
    corpus = tmp_path / "c.txt"
    corpus.write_text("to be or not to be " * 100)
    run = tmp_path / "run"
    assert train(run, "--data", str(corpus), "--max-iters", "2") == 0
    (run / "data" / "meta.json").write_bytes(b"\xff\x00 not json")
    assert train(run, "--resume", "--max-iters", "4") == 0


def test_a_dead_peer_process_is_named(monkeypatch, capsys):
    """Under torchrun, the backend's error when another rank dies (gloo's "Connection closed by
    peer", its "GLHF" handshake text) becomes one line saying what happened and what to do."""
    from attnlab import cli

    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("RANK", "1")
    monkeypatch.setattr(cli, "_let_peers_report", lambda: None)

    def dead_peer(**options):
        raise RuntimeError(
            "[/pytorch/third_party/gloo/gloo/transport/tcp/pair.cc:534] Connection closed by peer [10.0.0.2]:5555"
        )

    monkeypatch.setattr(cli, "_bench", dead_peer)
    assert main(["bench", "--quick"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: rank 1 of 2: another process of this torchrun launch stopped") and "--resume" in err
    assert "gloo" not in err and len(err.splitlines()) == 1
