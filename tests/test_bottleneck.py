from attnlab.experiments.bottleneck import plot, run


def test_small_bottleneck_experiment(tmp_path):
    res = run(lengths=(3, 8), steps=60, batch_size=32, out=tmp_path, small=True)
    assert set(res) == {"RNN (no attention)", "RNN + attention", "Transformer"}
    for r in res.values():
        assert set(r["accuracy"]) == {3, 8} and all(0 <= a <= 1 for a in r["accuracy"].values())
    png = plot(res, tmp_path / "b.png")
    assert png.stat().st_size > 5000
