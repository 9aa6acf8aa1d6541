"""Figures for a slide (issue 68, in part): the inspections' text neither runs off the image nor
overlaps other text, judged from matplotlib's own layout (``get_window_extent``), not by eye;
and a token is never a blank label (a space is ·, a newline ⏎)."""

import itertools

import pytest

import attnlab.inspect.plots as plots
from attnlab.inspect.plots import token_label


def text_problems(fig) -> list[str]:
    """A title wider than the figure (saved with bbox_inches="tight", it would widen the image to
    a line running past the plot), and every two labels or titles that overlap (cell texts inside
    a heat map's cells are their own)."""
    from matplotlib.text import Text

    fig.canvas.draw()
    renderer = fig.canvas.get_renderer()
    edge = fig.bbox
    texts = [t for t in fig.findobj(Text) if t.get_visible() and t.get_text().strip()]
    boxes = {t: t.get_window_extent(renderer) for t in texts}
    problems = []
    titles = [ax.title for ax in fig.axes] + ([fig._suptitle] if fig._suptitle is not None else [])
    for t in titles:
        if t in boxes and boxes[t].width > edge.width * 1.02:
            problems.append(f"the title {t.get_text()[:40]!r}… is wider than the figure")
    labels = [t for t in texts if t.axes is None or t in t.axes.get_xticklabels() + t.axes.get_yticklabels()
              or t is t.axes.title]  # fmt: skip
    for a, b in itertools.combinations(labels, 2):
        if boxes[a].overlaps(boxes[b]) and boxes[a].width > 0 and boxes[b].width > 0:
            problems.append(f"{a.get_text()!r} overlaps {b.get_text()!r}")
    return problems


def test_a_token_label_is_never_blank():
    assert [token_label(t) for t in (" ", "  ", " the", "the ", "\n", "", "x" * 20)] == [
        "·", "··", "·the", "the·", "⏎", "·", "x" * 11 + "…"]  # fmt: skip


@pytest.mark.parametrize("what", ["attention", "lens", "logit-attribution", "heads"])
def test_the_text_views_keep_their_text_inside_and_apart(what, tiny_run, tmp_path, monkeypatch):
    import attnlab
    from attnlab.figures import plt

    found = {}
    real_save = plots.save_figure

    def judged(fig, path):
        found["problems"] = text_problems(fig)
        return real_save(fig, path)

    monkeypatch.setattr(plots, "save_figure", judged)
    model = attnlab.load(tiny_run("gpt").out)
    options = {} if what == "heads" else {"text": "to be or not, th"}  # (16 characters: the context)
    model.inspect(what, tmp_path / f"{what}.png", **options)
    plt.close("all")
    assert found["problems"] == []
