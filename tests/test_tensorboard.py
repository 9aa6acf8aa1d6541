"""`--tensorboard`: the event files, read back with TensorBoard's own reader, hold exactly what
metrics.jsonl holds, the attention of the fixed validation example at each evaluation, and the
config as hparams; a resumed run leaves one value per step."""

import io
import json
import shutil

import numpy as np
import pytest

pytest.importorskip("tensorboard")
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator  # noqa: E402

from attnlab.cli import main  # noqa: E402


def _events(run) -> EventAccumulator:
    ea = EventAccumulator(str(run / "tensorboard"), size_guidance={"scalars": 0, "images": 0, "tensors": 0})
    ea.Reload()
    return ea


def _train(run, corpus, *extra) -> None:
    argv = ["train", "gpt", "--data", str(corpus), "--out", str(run), "--preset", "nano", "--block-size", "8"]
    argv += ["--eval-interval", "4", "--eval-iters", "1", "--log-interval", "1", "--no-progress", "--sample-chars", "0"]
    argv += ["--device", "cpu", "--dtype", "fp32", "--no-compile", "--tensorboard", *extra]
    assert main(argv) == 0


def test_tensorboard_holds_what_metrics_jsonl_holds(tmp_path, capsys):
    from PIL import Image

    import attnlab

    corpus = tmp_path / "c.txt"
    corpus.write_text("the cat sat on the mat. " * 100)
    run = tmp_path / "run"
    _train(run, corpus, "--max-iters", "8")
    logs = run / "tensorboard"  # the run says where its logs are and how to open them
    assert f"tensorboard: logging to {logs}; watch with: tensorboard --logdir {logs}" in capsys.readouterr().err
    records = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    ea = _events(run)
    keys = {k for r in records for k, v in r.items() if k != "step" and isinstance(v, (int, float))}
    assert keys >= {"loss", "lr", "items_per_s", "train_loss", "val_loss"} and keys <= set(ea.Tags()["scalars"])
    for key in keys:
        logged = {e.step: e.value for e in ea.Scalars(key)}
        want = {r["step"]: r[key] for r in records if key in r}
        assert logged.keys() == want.keys(), key
        for step, v in want.items():  # (event files store float32)
            assert logged[step] == pytest.approx(v, rel=1e-6, abs=1e-9), (key, step)

    # the attention of the fixed validation example: one image per layer at each evaluation
    model = attnlab.load(run / "last")
    tags = ea.Tags()["images"]
    assert sorted(tags) == [f"attention/blocks.{i}.attn" for i in range(len(model.blocks))]
    shots = ea.Images(tags[0])
    assert [s.step for s in shots] == [4, 8]
    img = np.asarray(Image.open(io.BytesIO(shots[-1].encoded_image_string)).convert("L"), dtype=np.float32) / 255
    heads, t = model.config.heads, 8  # the heads side by side, 2-pixel white gaps between them
    assert img.shape == (t, heads * t + (heads - 1) * 2)
    for h in range(heads):
        pattern = img[:, h * (t + 2) : h * (t + 2) + t]
        assert np.allclose(np.triu(pattern, 1), 0, atol=1 / 255)  # causal: no query sees a later key
        assert np.allclose(pattern.max(1), 1, atol=1 / 255)  # each row scaled to its own maximum
        if h:
            assert np.all(img[:, h * (t + 2) - 2 : h * (t + 2)] == 1)

    hparams = ea.PluginTagToContent("hparams")
    assert hparams  # the config and the final validation numbers (TensorBoard's HPARAMS tab)


def test_a_resumed_run_keeps_one_value_per_step(tmp_path):
    """Run to 4, keep that checkpoint, go on to 8, then go back to the step-4 checkpoint and
    redo 5-8: TensorBoard shows steps 1-8 once each, with the redone values."""
    corpus = tmp_path / "c.txt"
    corpus.write_text("the cat sat on the mat. " * 100)
    run = tmp_path / "run"
    _train(run, corpus, "--max-iters", "4")
    shutil.copytree(run / "last", tmp_path / "step4")
    _train(run, corpus, "--max-iters", "8", "--resume")
    shutil.rmtree(run / "last")
    shutil.copytree(tmp_path / "step4", run / "last")
    _train(run, corpus, "--max-iters", "8", "--resume")
    records = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    losses = _events(run).Scalars("loss")
    assert [e.step for e in losses] == list(range(1, 9)) == [r["step"] for r in records]
    assert [e.value for e in losses] == pytest.approx([r["loss"] for r in records], rel=1e-6)
