"""What makes a figure fit for a slide (issue 68), judged from matplotlib's own layout
(``get_window_extent``) and artists, never by eye: :func:`figure_problems` lists what is wrong.

Inside :func:`judging` every figure saved is judged as it is saved (the shared tiny runs and the
claims at the tiny size are made inside it, ``tests/conftest.py``): the problems are kept by file
name in :data:`JUDGED`, and ``tests/test_figure_text.py`` asserts that every kind of figure
attnlab writes was judged and found clean. (Not the whole suite: judging draws each figure once
more, and the suite saves a loss curve at every evaluation of every run.)"""

from __future__ import annotations

import contextlib
import itertools
import re
from pathlib import Path

JUDGED: dict[str, list[str]] = {}  # file name -> its problems, over every save of that name in this session
TITLES: dict[str, str] = {}  # file name -> its figure's title and figure-level texts, at its last save


@contextlib.contextmanager
def judging():
    """Every figure saved inside it is judged (:func:`figure_problems`) under its file name."""
    from matplotlib.figure import Figure

    real = Figure.savefig

    def judged(self, fname, *args, **kwargs):
        name = Path(str(fname)).name.replace(".tmp.png", ".png")
        problems = figure_problems(self, kwargs.get("dpi"), tight=kwargs.get("bbox_inches") is not None)
        JUDGED[name] = JUDGED.get(name, []) + problems
        TITLES[name] = figure_titles(self)
        return real(self, fname, *args, **kwargs)

    Figure.savefig = judged
    try:
        yield
    finally:
        Figure.savefig = real


def figure_titles(fig) -> str:
    return " ".join(t.get_text() for t in [fig._suptitle, *fig.texts] if t is not None)


def _number(text: str) -> bool:
    """A numeric tick label ("0.5", "−2", "3×10²", "$\\mathdefault{10^{3}}$")."""
    t = re.sub(r"\$|\\mathdefault|[{}]|\\times", "", text).replace("−", "-").replace("×", "").strip()
    t = t.replace("^", "e") if "10^" in t else t
    try:
        float(t.replace("10e", "1e"))
        return True
    except ValueError:
        return bool(re.fullmatch(r"-?[\d.]+(e-?\d+)?[²³¹⁰⁴⁵⁶⁷⁸⁹⁻]*", t))


def _is_colorbar(ax) -> bool:
    return hasattr(ax, "_colorbar") or ax.get_label() == "<colorbar>"


def _drawn_tick_labels(axis) -> list:
    """The tick labels ``axis`` draws: those of ticks inside its view (``get_ticklabels`` also
    returns the labels of ticks beyond it, at stale positions)."""
    ticks = axis._update_ticks()  # (matplotlib's own choice of the ticks to draw)
    return [label for tick in ticks for label in (tick.label1, tick.label2) if label.get_visible() and label.get_text()]


def figure_problems(fig, dpi: float | None = None, tight: bool = True) -> list[str]:
    """Every way ``fig``, saved at ``dpi`` (None: its own) cropped to what it draws (``tight``), falls
    short of the slide standard:

    - a long side under 1,000 pixels as saved (``attnlab.figures.SLIDE_PIXELS``);
    - text smaller than 9 points when the image is shown 1,000 pixels on its long side at 100
      pixels an inch (``MIN_POINTS``): a figure W inches across needs text of 0.9 W points;
    - a heat map whose colour bar does not say what its colour is;
    - no title (neither its panels' nor the figure's);
    - a numeric axis with no label;
    - a heat map without a colour bar, or with ticks between its cells (−0.5, 0.5);
    - bars whose axis does not reach zero and that carry no interval;
    - text wider than the figure (saved with bbox_inches="tight", it widens the image to a line
      running past the plot);
    - two labels or titles that overlap, or a panel's label over another panel."""
    from matplotlib.collections import QuadMesh
    from matplotlib.container import BarContainer
    from matplotlib.image import AxesImage
    from matplotlib.text import Text

    fig.canvas.draw()
    renderer = fig.canvas.get_renderer()
    edge = fig.bbox
    problems: list[str] = []
    suptitle = fig._suptitle.get_text().strip() if fig._suptitle is not None else ""
    panels = [ax for ax in fig.axes if ax.get_visible() and not _is_colorbar(ax)]
    drawn = [ax for ax in panels if ax.axison and (ax.lines or ax.collections or ax.patches or ax.images)]

    from attnlab.figures import MIN_POINTS, SLIDE_PIXELS

    box = fig.get_tightbbox(renderer) if tight else fig.bbox_inches
    inches = max(box.width, box.height) + (0.2 if tight else 0)
    pixels = inches * (dpi or fig.dpi)
    if pixels < SLIDE_PIXELS - 1:
        problems.append(f"{pixels:.0f} pixels on its long side, under {SLIDE_PIXELS}")
    smallest = SLIDE_PIXELS / 100 / inches  # (the text's scale when shown SLIDE_PIXELS across at 100 ppi)
    small = sorted(
        {(round(t.get_fontsize() * smallest, 1), t.get_text()[:20]) for t in fig.findobj(Text)
         if t.get_visible() and t.get_text().strip() and t.get_fontsize() * smallest < MIN_POINTS - 0.05}
    )  # fmt: skip
    if small:
        problems.append(
            f"text under {MIN_POINTS:g} pt on a {SLIDE_PIXELS}-pixel slide: {small[:4]} ({len(small)} in all)"
        )

    if not suptitle and not any(t.get_text().strip() for t in fig.texts) and drawn:
        untitled = [ax for ax in drawn if not ax.get_title().strip()]
        if untitled:
            problems.append(f"{len(untitled)} panel(s) without a title, and no figure title")

    for ax in drawn:
        for axis, label in ((ax.xaxis, ax.get_xlabel()), (ax.yaxis, ax.get_ylabel())):
            ticks = [t.get_text() for t in _drawn_tick_labels(axis) if t.get_text().strip()]
            if ticks and all(_number(t) for t in ticks) and not label.strip():
                problems.append(f"a numeric {axis.axis_name}-axis without a label (ticks {ticks[:3]})")
        for image in [*ax.images, *(c for c in ax.collections if isinstance(c, QuadMesh))]:
            array = image.get_array()
            if array is None or getattr(array, "ndim", 0) != 2 or image.get_cmap().name == "gray":
                continue  # a picture (RGB, or grey levels: a digit, a filter), not a heat map
            bars = [im.colorbar for a in fig.axes for im in [*a.images, *a.collections]
                    if getattr(im, "colorbar", None) is not None]  # fmt: skip
            if not bars:
                problems.append(f"a heat map in {ax.get_title()[:30]!r} without a colour bar")
            elif not any(b.ax.get_ylabel().strip() or b.ax.get_xlabel().strip() for b in bars):
                problems.append(f"a heat map in {ax.get_title()[:30]!r} whose colour bar does not say what it shows")
            left, right, bottom, top = image.get_extent() if isinstance(image, AxesImage) else (-1e9, 1e9, -1e9, 1e9)
            for axis, (low, high), at in ((ax.xaxis, sorted((left, right)), 0), (ax.yaxis, sorted((bottom, top)), 1)):
                values = [t.get_position()[at] for t in _drawn_tick_labels(axis) if _number(t.get_text())]
                if any(abs(v - round(v)) > 1e-6 or not low < v < high for v in values):
                    problems.append(f"a heat map's {axis.axis_name}-ticks between or beyond its cells ({values[:4]})")
        for bars in (c for c in ax.containers if isinstance(c, BarContainer)):
            if bars.errorbar is not None:
                continue
            low, high = ax.get_ylim() if bars.orientation == "vertical" else ax.get_xlim()
            if not min(low, high) <= 0 <= max(low, high):
                problems.append(f"bars in {ax.get_title()[:30]!r} whose axis starts at {min(low, high):.3g}, not 0, "
                                "with no interval")  # fmt: skip

    texts = [t for t in fig.findobj(Text) if t.get_visible() and t.get_text().strip()]
    boxes = {t: t.get_window_extent(renderer) for t in texts}
    for t, box in boxes.items():
        if box.width > edge.width * 1.02:
            problems.append(f"the text {t.get_text()[:40]!r}… is wider than the figure")
    for t in [fig._suptitle, *fig.texts]:  # (figure-level text past an edge is cut off where the size is fixed)
        if t in boxes and (boxes[t].x0 < -1 or boxes[t].x1 > edge.width + 1):
            problems.append(f"the text {t.get_text()[:40]!r}… runs off the image")

    owner = {}  # each label or title -> its panel (a tick label's own ``axes`` is None)
    for ax in fig.axes:
        mine = _drawn_tick_labels(ax.xaxis) + _drawn_tick_labels(ax.yaxis)
        mine += [ax.title, ax._left_title, ax._right_title, ax.xaxis.label, ax.yaxis.label]
        owner.update({t: ax for t in mine if t in boxes})
    labels = list(dict.fromkeys([*owner, *(t for t in [fig._suptitle, *fig.texts] if t is not None and t in boxes)]))
    for a, b in itertools.combinations(labels, 2):
        if boxes[a].overlaps(boxes[b]) and boxes[a].width > 0 and boxes[b].width > 0:
            problems.append(f"{a.get_text()!r} overlaps {b.get_text()!r}")
    for t, mine in owner.items():
        for ax in panels:
            if ax is mine or _is_colorbar(mine) or boxes[t].width == 0:
                continue
            if boxes[t].overlaps(ax.bbox):
                problems.append(f"{t.get_text()[:30]!r} lies over another panel ({ax.get_title()[:30]!r})")
    return problems
