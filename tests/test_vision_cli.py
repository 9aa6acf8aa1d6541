import json

import numpy as np
import pytest
from PIL import Image

from attnlab.cli import main
from helpers import train_tiny_gpt

FAST = ["--max-iters", "40", "--eval-interval", "20", "--eval-iters", "1", "--batch-size", "32", "--no-progress"]


@pytest.fixture(scope="module")
def vit_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("vit") / "run"
    assert main(["train", "vit", "--out", str(out), "--dim", "32", "--depth", "2", *FAST]) == 0
    return out


@pytest.fixture(scope="module")
def cnn_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("cnn") / "run"
    assert main(["train", "cnn", "--out", str(out), *FAST]) == 0
    return out


@pytest.fixture(scope="module")
def digit_png(tmp_path_factory):
    from attnlab.data.images import digits

    x = digits().test[0][0, 0].numpy()
    path = tmp_path_factory.mktemp("img") / "digit.png"
    Image.fromarray((x * 255).astype(np.uint8), mode="L").save(path)
    return path


def _err(capsys, argv):
    code = main(argv)
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2, err
    assert err[-1].startswith("error: ") and "Traceback" not in "\n".join(err)
    return err[-1]


def test_eval_and_predict(vit_run, digit_png, capsys):
    capsys.readouterr()
    assert main(["eval", "--ckpt", str(vit_run), "--json"]) == 0
    res = json.loads(capsys.readouterr().out)
    assert res["split"] == "test" and res["images"] == 359
    # the same accuracy, recomputed from the model and the raw test images
    import torch

    import attnlab.recipes
    from attnlab.data.images import digits

    model, meta = attnlab.recipes.load_model(vit_run, with_meta=True)
    x, y = digits().test
    x = (x - torch.tensor(meta["mean"]).view(1, -1, 1, 1)) / torch.tensor(meta["std"]).view(1, -1, 1, 1)
    with torch.no_grad():
        acc = (model(x).argmax(-1) == y).float().mean().item()
    assert res["accuracy"] == pytest.approx(acc, abs=1e-6)
    assert "confusion_png" not in res and not (vit_run / "confusion.png").exists()  # a figure only when asked
    png = vit_run.parent / "confusion.png"
    assert main(["eval", "--ckpt", str(vit_run), "--json", "--out", str(png)]) == 0
    res = json.loads(capsys.readouterr().out)
    assert res["confusion_png"] == str(png) and Image.open(png).size[0] > 200
    assert main(["predict", "--ckpt", str(vit_run), str(digit_png), "--top-k", "2"]) == 0
    line = capsys.readouterr().out.strip()
    assert line.startswith(str(digit_png)) and line.count(",") == 1


@pytest.mark.parametrize("what", ["attention", "rollout", "embeddings", "positions", "distance", "cka"])
def test_inspect_writes_png_and_numbers(what, vit_run, digit_png, tmp_path):
    out = tmp_path / f"{what}.png"
    argv = ["inspect", what, "--ckpt", str(vit_run), "--out", str(out), "--n-images", "64", "--batch-size", "32"]
    if what in ("attention", "rollout"):
        argv += ["--image", str(digit_png)]
    assert main(argv) == 0
    w, h = Image.open(out).size
    assert w > 150 and h > 100
    raw = np.load(out.with_suffix(".npz"))
    assert len(raw.files) >= 1 and all(raw[k].size > 0 for k in raw.files)


def test_cka_vit_vs_cnn(vit_run, cnn_run, tmp_path):
    out = tmp_path / "cka.png"
    assert (
        main(
            [
                "inspect",
                "cka",
                "--ckpt",
                str(vit_run),
                "--compare",
                str(cnn_run),
                "--out",
                str(out),
                "--n-images",
                "64",
                "--batch-size",
                "32",
            ]
        )
        == 0
    )
    m = np.load(out.with_suffix(".npz"))["cka"]
    assert m.shape == (2, 3) and np.all(m > -0.1) and np.all(m <= 1.0 + 1e-6)


def test_bad_inputs(vit_run, digit_png, tmp_path, capsys):
    notimg = tmp_path / "x.png"
    notimg.write_text("hello")
    assert "not an image file" in _err(capsys, ["predict", "--ckpt", str(vit_run), str(notimg)])
    assert "needs --image" in _err(
        capsys, ["inspect", "rollout", "--ckpt", str(vit_run), "--out", str(tmp_path / "r.png")]
    )
    one = tmp_path / "oneclass" / "a"
    one.mkdir(parents=True)
    Image.new("RGB", (8, 8)).save(one / "x.png")
    assert "at least 2" in _err(
        capsys, ["train", "vit", "--data", str(one.parent), "--out", str(tmp_path / "o"), *FAST]
    )
    empty = tmp_path / "empty"
    (empty / "a").mkdir(parents=True)
    (empty / "b").mkdir()
    assert "no images" in _err(capsys, ["train", "vit", "--data", str(empty), "--out", str(tmp_path / "e"), *FAST])
    assert "not divisible by patch size 3" in _err(
        capsys, ["train", "vit", "--patch-size", "3", "--out", str(tmp_path / "p"), *FAST]
    )


def test_rgb_folder_and_grayscale_conversion(tmp_path, digit_png, capsys):
    root = tmp_path / "shapes"
    rng = np.random.default_rng(0)
    for cls, channel in (("red", 0), ("green", 1)):
        (root / cls).mkdir(parents=True)
        for i in range(20):
            a = rng.integers(0, 60, (16, 16, 3), dtype=np.uint8)
            a[..., channel] += 150
            Image.fromarray(a).save(root / cls / f"{i}.png")
    out = tmp_path / "run"
    assert (
        main(
            [
                "train",
                "vit",
                "--data",
                str(root),
                "--out",
                str(out),
                "--preset",
                "cifar",
                "--dim",
                "24",
                "--heads",
                "2",
                "--depth",
                "1",
                *FAST,
            ]
        )
        == 0
    )
    capsys.readouterr()
    assert main(["predict", "--ckpt", str(out), str(digit_png)]) == 0
    captured = capsys.readouterr()
    assert "grayscale; converted to RGB" in captured.err
    assert "red" in captured.out or "green" in captured.out


def test_gpt_checkpoint_given_to_predict(tmp_path, digit_png, capsys):
    run = train_tiny_gpt(main, tmp_path)
    assert "predict needs a classifier" in _err(capsys, ["predict", "--ckpt", str(run), str(digit_png)])
