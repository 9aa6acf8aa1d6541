"""Figures for a slide (issue 68): every kind of figure attnlab writes (the inspections of every
family, the training curve, the patching map; every claim's figures: tests/test_reproduce.py) is judged as it is saved by
tests/figure_checks.py (inside its ``judging()``) from matplotlib's own layout (``get_window_extent``), not by eye: at
least 1,000 pixels on the long side, text of at least 9 points when shown 1,000 pixels across, a
title, labelled axes, a colour bar that says what it shows on heat maps, bars from zero or with
intervals, no text over text, over another panel or wider than the image. A claim's figures carry
the claim and its verdict (issue 81: the size and font minimums)."""

import pytest
import torch

from attnlab.figures import plt, slide_dpi
from attnlab.inspect.plots import token_label
from attnlab.recipes import recipes
from figure_checks import JUDGED, figure_problems, judging

NO_IMAGE = ("embeddings", "positions", "distance", "cka")  # (a ViT's or CNN's views of its weights or test set)
INSPECTIONS = [(r.name, what) for r in recipes() for what in r.inspections]


def test_a_token_label_is_never_blank():
    assert [token_label(t) for t in (" ", "  ", " the", "the ", "\n", "", "x" * 20)] == [
        "·", "··", "·the", "the·", "⏎", "·", "x" * 11 + "…"]  # fmt: skip


def test_the_checker_finds_what_spoils_a_slide():
    """Each rule catches its fault on a made-up figure and passes the mended one (a checker that
    cannot fail would pass every figure)."""
    fig, (left, right) = plt.subplots(1, 2, figsize=(6, 3))
    left.imshow(torch.rand(4, 4).numpy())  # a heat map: no colour bar, ticks at ±0.5, no title anywhere
    right.bar(["a", "b"], [2.1, 2.2])
    right.set_ylim(2.0, 2.3)  # bars from 2.0, no interval; a numeric y-axis without a label
    right.set_ylabel("a label long enough to run well over the panel on its left", fontsize=14)
    fig.subplots_adjust(wspace=0.05)  # (the label and ticks of the right panel over the left one)
    found = " | ".join(figure_problems(fig))
    for fault in (
        "without a title",
        "without a colour bar",
        "between or beyond its cells",
        "not 0",
        "lies over another panel",
    ):
        assert fault in found, (fault, found)
    plt.close(fig)

    fig, (left, right) = plt.subplots(1, 2, figsize=(8, 3), layout="constrained")
    im = left.imshow(torch.rand(4, 4).numpy())
    left.set_xticks(range(4))
    left.set_yticks(range(4))
    left.set(xlabel="key", ylabel="query", title="attention")
    fig.colorbar(im, ax=left, label="attention weight")
    right.bar(["a", "b"], [2.1, 2.2], yerr=[0.05, 0.05])
    right.set_ylim(2.0, 2.3)
    right.set(ylabel="loss", title="losses")
    assert figure_problems(fig, dpi=slide_dpi(fig)) == []  # (saved at the resolution save_figure picks)
    fig.suptitle("a title " * 30)  # wider than the figure
    assert any("wider than the figure" in p for p in figure_problems(fig))
    fig.suptitle("")
    fig.text(0.9, 0.5, "runs past the right edge")
    assert any("runs off the image" in p for p in figure_problems(fig))
    plt.close(fig)


def test_the_checker_finds_a_figure_too_small_for_a_slide_and_save_figure_mends_it(tmp_path):
    """Under 1,000 pixels on the long side, text under 9 points once shown 1,000 pixels across, a
    colour bar that does not say what it shows: each found on a made-up figure; save_figure writes
    the same figure at least 1,000 pixels across with its text raised, and nothing overlaps."""
    from PIL import Image

    from attnlab.figures import save_figure

    def drawn():
        fig, (left, right) = plt.subplots(1, 2, figsize=(12, 3))
        im = left.imshow(torch.rand(4, 4).numpy())
        fig.colorbar(im, ax=left)
        left.set(xticks=range(4), yticks=range(4), xlabel="key", ylabel="query", title="attention")
        right.plot([1, 2, 3], [1, 4, 9])
        right.set(xlabel="step", ylabel="loss", title="loss")
        right.xaxis.label.set_fontsize(5)  # 5 points on a figure 12 inches across: 4 points on the slide
        return fig, im

    fig, im = drawn()
    found = " | ".join(figure_problems(fig, dpi=80))
    assert "pixels on its long side, under 1000" in found and "text under 9 pt" in found, found
    assert "whose colour bar does not say what it shows" in found, found
    im.colorbar.set_label("attention weight")
    assert "does not say" not in " | ".join(figure_problems(fig))
    plt.close(fig)

    fig, im = drawn()
    im.colorbar.set_label("attention weight")
    with judging():
        save_figure(fig, tmp_path / "small_view.png")
    assert JUDGED["small_view.png"] == [], JUDGED["small_view.png"]
    assert max(Image.open(tmp_path / "small_view.png").size) >= 1000


@pytest.mark.slow
@pytest.mark.parametrize("family,what", INSPECTIONS)
def test_every_inspection_of_every_family_makes_a_clean_figure(family, what, tiny_run, tmp_path):
    import attnlab

    from PIL import Image

    model = attnlab.load(tiny_run(family).out)
    image = tmp_path / "image.png"
    Image.fromarray(torch.randint(0, 256, (32, 32, 3), dtype=torch.uint8).numpy()).save(image)
    options = {
        "gpt": {"text": "to be or not, th"} if what != "heads" else {},  # (16 characters: the context)
        "encoder": {"text": "the [MASK] sat on the mat"},
        "seq2seq": {"text": "3 1 4 1 5"},
    }.get(family, {"image": str(image)} if family in ("caption", "vit", "cnn") and what not in NO_IMAGE else {})
    name = f"{family}_{what}_view.png"
    with judging():
        png = model.inspect(what, tmp_path / name, **options)
    assert png.exists() and name in JUDGED
    assert JUDGED[name] == [], "\n".join(JUDGED[name])


@pytest.mark.slow
@pytest.mark.parametrize("family", [r.name for r in recipes()])
def test_the_training_curve_makes_a_clean_figure(family, tiny_run):
    run = tiny_run(family)
    assert (run.out / "loss.png").exists()
    found = figure_problems_of_file("loss.png")
    assert found == [], "\n".join(found)


def figure_problems_of_file(name: str) -> list[str]:
    assert name in JUDGED, f"{name} was never saved in this session"
    return JUDGED[name]


def test_the_patching_map_is_a_clean_figure(tmp_path):
    from attnlab.inspect.patching import patching_figure

    with judging():
        patching_figure(torch.linspace(-1, 1, 12).reshape(2, 6), tmp_path / "patching_view.png", labels=list("abcdef"))
        patching_figure(torch.rand(3, 4), tmp_path / "patching_heads_view.png", over="head")
    assert figure_problems_of_file("patching_view.png") == []
    assert figure_problems_of_file("patching_heads_view.png") == []
