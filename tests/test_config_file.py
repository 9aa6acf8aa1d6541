"""--config: a run folder re-runs exactly; YAML and JSON files of options, overridden by flags."""

import json

import pytest

import attnlab
from attnlab.cli import main
from helpers import PINNED_FLAGS, PINNED_TRAINING

TEXT = "To be, or not to be, that is the question.\n" * 150
FAST = ["--preset", "nano", "--context", "16", "--max-iters", "4", "--eval-interval", "2", "--eval-iters", "1"]
QUIET = ["--no-progress", "--sample-chars", "0"]


@pytest.fixture
def corpus(tmp_path):
    path = tmp_path / "c.txt"
    path.write_text(TEXT)
    return str(path)


def options(run) -> dict:
    return json.loads((run / "options.json").read_text())["options"]


def last(run) -> dict:
    return json.loads((run / "last" / "config.json").read_text())


def val_loss(run) -> float:
    return [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()][-1]["val_loss"]


def test_a_run_folder_re_runs_the_same_run(corpus, tmp_path):
    a, b = tmp_path / "a", tmp_path / "b"
    assert main(["train", "gpt", "--data", corpus, "--out", str(a), "--lr", "0.004", *FAST, *QUIET, *PINNED_FLAGS]) == 0
    written = options(a)
    assert written["data"] == corpus and written["lr"] == 0.004 and written["layers"] == 2 and written["context"] == 16
    assert "out" not in written and "resume" not in written
    assert main(["train", "gpt", "--out", str(b), "--config", str(a)]) == 0
    assert options(b) == written
    assert last(b)["model"] == last(a)["model"] and last(b)["train"] == last(a)["train"]
    assert val_loss(b) == val_loss(a)  # the same computation, step for step
    # a checkpoint's config.json (runs written before options.json) re-runs the model and trainer too
    c = tmp_path / "c"
    assert main(["train", "gpt", "--out", str(c), "--config", str(a / "last" / "config.json"), *QUIET]) == 0
    assert last(c)["model"] == last(a)["model"]


def test_yaml_and_json_files_with_flags_overriding_them(corpus, tmp_path):
    yaml_file = tmp_path / "opts.yaml"
    yaml_file.write_text(
        f"family: gpt\ndata: {corpus}\npreset: nano\ncontext: 16\nmax_iters: 2\neval_interval: 2\n"
        "eval_iters: 1\nlr: 0.01\nmin_lr: 1e-4\nsample_chars: 0\nprogress: false\n"  # (YAML reads 1e-4 as text)
    )
    run = tmp_path / "y"
    assert main(["train", "gpt", "--out", str(run), "--config", str(yaml_file), "--lr", "0.02", *PINNED_FLAGS]) == 0
    got = options(run)
    assert (got["lr"], got["min_lr"], got["layers"], got["max_iters"], got["context"]) == (0.02, 1e-4, 2, 2, 16)
    # a flag typed at its default value still overrides the file
    run2 = tmp_path / "y2"
    args = ["train", "gpt", "--out", str(run2), "--config", str(yaml_file), "--sample-chars", "300", "--max-iters", "1"]
    assert main([*args, "--eval-interval", "1", *PINNED_FLAGS]) == 0
    assert options(run2)["sample_chars"] == 300
    # the same from Python, with a JSON file
    json_file = tmp_path / "opts.json"
    json_file.write_text(json.dumps({"preset": "nano", "context": 16, "max_iters": 2, "eval_interval": 2, "lr": 0.01}))
    py = attnlab.train(
        "gpt",
        data=corpus,
        out=tmp_path / "p",
        config=json_file,
        lr=0.03,
        sample_chars=0,
        progress=False,
        eval_iters=1,
        **PINNED_TRAINING,
    )
    assert py.step == 2 and options(py.out)["lr"] == 0.03 and options(py.out)["layers"] == 2


@pytest.mark.parametrize(
    "content, message",
    [
        ('{"lr": 0.1, "nope": 1}', "opts.json: train gpt has no option 'nope'"),
        ('{"family": "vit"}', "opts.json is for attnlab train vit, not gpt"),
        ('{"lr": ', "opts.json is not valid JSON"),
        ("[1, 2]", "expected a mapping of option names"),
        ('{"lr": "fast"}', "opts.json: lr: 'fast' is not a number"),
    ],
)
def test_bad_config_files_get_one_line(content, message, tmp_path, capsys):
    path = tmp_path / "opts.json"
    path.write_text(content)
    assert main(["train", "gpt", "--out", str(tmp_path / "run"), "--config", str(path)]) == 2
    err = capsys.readouterr().err.strip()
    assert message in err and len(err.splitlines()) == 1, err
    assert not (tmp_path / "run").exists()


def test_a_missing_config_and_bad_yaml(tmp_path, capsys):
    assert main(["train", "gpt", "--out", str(tmp_path / "r"), "--config", str(tmp_path / "none.yaml")]) == 2
    assert "does not exist" in capsys.readouterr().err
    bad = tmp_path / "bad.yaml"
    bad.write_text("lr: [0.1\n")
    assert main(["train", "gpt", "--out", str(tmp_path / "r"), "--config", str(bad)]) == 2
    assert "is not valid YAML" in capsys.readouterr().err
