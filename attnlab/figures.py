"""Figures as PNG files: matplotlib without a display (a notebook keeps its inline backend), and
one atomic save. Below every module that draws (the trainer's loss curve, the inspections, the
claims' figures)."""

from __future__ import annotations

import sys
from pathlib import Path

import matplotlib

if "ipykernel" not in sys.modules:  # a notebook keeps its inline backend; elsewhere never open a window
    matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

__all__ = [
    "MIN_POINTS",
    "SLIDE_PIXELS",
    "add_banner",
    "plt",
    "raise_small_text",
    "save_figure",
    "slide_dpi",
    "ticks_at",
]


# A figure is made for a slide: shown with its long side this many pixels wide, at 100 pixels an
# inch, its smallest text is at least MIN_POINTS (so a figure 12 inches wide needs 11-point text,
# one 6 inches wide 5.4-point: what matters is the text's size against the figure's).
SLIDE_PIXELS, MIN_POINTS = 1000, 9.0


PAD_INCHES = 0.1  # the margin around what a figure cropped to its drawing keeps (matplotlib's default)


def drawn_extent(fig, tight: bool = True):
    """The part of ``fig`` that is saved, in inches: what it draws plus :data:`PAD_INCHES` a side
    (``tight``), or the whole figure. One draw; ``savefig`` then takes it as ``bbox_inches`` rather
    than drawing again to find it."""
    from matplotlib.transforms import Bbox

    if not tight:
        return Bbox.from_bounds(0, 0, *fig.get_size_inches())
    fig.canvas.draw()
    return fig.get_tightbbox(fig.canvas.get_renderer()).padded(PAD_INCHES)


def long_side_inches(fig, tight: bool = True) -> float:
    """The long side of ``fig`` as saved: cropped to what it draws (``tight``), or its set size."""
    box = drawn_extent(fig, tight)
    return float(max(box.width, box.height))


def smallest_points(inches: float) -> float:
    """The smallest text, in points, that a figure ``inches`` across may carry (:data:`MIN_POINTS`
    once it is shown :data:`SLIDE_PIXELS` pixels across at 100 pixels an inch)."""
    return MIN_POINTS * inches / (SLIDE_PIXELS / 100)


def raise_small_text(fig, tight: bool = True):
    """Every text of ``fig`` at least :func:`smallest_points` for its size: one rule for every figure,
    applied where it is saved, rather than a size chosen figure by figure (larger text can widen a
    figure cropped to what it draws, so the size is measured again). Returns the part of the figure
    that is saved (:func:`drawn_extent`)."""
    from matplotlib.text import Text

    box = drawn_extent(fig, tight)
    for _ in range(3):
        floor = smallest_points(max(box.width, box.height))
        small = [
            t for t in fig.findobj(Text) if t.get_visible() and t.get_text().strip() and t.get_fontsize() < floor - 0.05
        ]
        if not small:
            break
        for ax in fig.axes:  # (tick labels are made again at each draw from the axis's own size)
            for axis, which in ((ax.xaxis, "x"), (ax.yaxis, "y")):
                labels = [t for t in axis.get_ticklabels() if t.get_text().strip()]
                if labels and min(t.get_fontsize() for t in labels) < floor - 0.05:
                    ax.tick_params(axis=which, labelsize=floor)
        for t in small:
            t.set_fontsize(floor)
        box = drawn_extent(fig, tight)
    return box


def slide_dpi(fig, tight: bool = True, inches: float | None = None) -> float:
    """The resolution that saves ``fig`` (``inches`` on its long side, measured when not given) with
    its long side at least :data:`SLIDE_PIXELS` pixels."""
    inches = inches if inches is not None else long_side_inches(fig, tight)
    return max(float(fig.dpi), 1.01 * SLIDE_PIXELS / inches)  # (1 %: rounding at saving)


def save_figure(fig, path: Path, tight: bool = True) -> Path:
    """``fig`` as the PNG ``path``, written whole or not at all, at a resolution that makes its long
    side at least :data:`SLIDE_PIXELS` pixels, its text no smaller than that size allows
    (:func:`raise_small_text`); ``tight``: cropped to what is drawn (False for a figure whose size is
    set to the pixel, as :func:`add_banner`'s)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.stem + ".tmp.png")
    try:
        box = raise_small_text(fig, tight)
        dpi = slide_dpi(fig, tight, max(box.width, box.height))
        fig.savefig(tmp, bbox_inches=box if tight else None, dpi=dpi)
        tmp.replace(path)
    finally:
        plt.close(fig)
        tmp.unlink(missing_ok=True)  # a failed save leaves nothing behind
    return path


def ticks_at(axis, values) -> None:
    """Ticks at ``values`` alone, labelled as they are: on a log axis, the values measured rather
    than powers of ten with minor labels that crowd into each other ("3×10²4×10²")."""
    from matplotlib.ticker import NullFormatter

    axis.set_ticks(list(values), [str(v) for v in values])
    axis.set_minor_formatter(NullFormatter())


BANNER_COLOURS = {"PASS": "#1a7f37", "FAIL": "#cf222e"}  # any other verdict: grey


def add_banner(path: Path, title: str, verdict: str, note: str = "") -> Path:
    """The PNG ``path`` again under a band with ``title`` and, below it, ``verdict`` in its colour
    and ``note`` (a claim and its verdict: known only once all of the claim's runs are in, after its
    figures were drawn). The image's pixels are copied, not resampled; the text wraps to the image's
    width."""
    import textwrap

    image = plt.imread(path)
    height, width = image.shape[:2]
    dpi = 100
    points = max(10.0, MIN_POINTS * width / SLIDE_PIXELS * 1.1)  # (the figure's text rule, and a little more)
    line = round(1.9 * points)  # pixels per line of text, with its spacing
    chars = max(20, int(width / (0.75 * points)))  # (a letter is about 0.75 of the size, in pixels at 100 dpi)
    heading = textwrap.wrap(title, width=chars)
    verdict_lines = textwrap.wrap(verdict + (f" ({note})" if note else ""), width=int(chars * 0.85))  # (bold: wider)
    band = 16 + line * (len(heading) + len(verdict_lines))
    fig = plt.figure(figsize=(width / dpi, (height + band) / dpi), dpi=dpi)
    fig.figimage(image, 0, 0)
    total = height + band
    fig.suptitle("\n".join(heading), x=0.5, y=1 - 6 / total, va="top", fontsize=points)
    fig.canvas.draw()
    below = fig._suptitle.get_window_extent(fig.canvas.get_renderer()).y0 - 3  # (pixels from the bottom)
    fig.text(0.5, below / total, "\n".join(verdict_lines), ha="center", va="top", fontsize=points, weight="bold",
             color=BANNER_COLOURS.get(verdict, "#57606a"))  # fmt: skip
    return save_figure(fig, path, tight=False)
