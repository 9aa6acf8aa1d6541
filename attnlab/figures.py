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

__all__ = ["add_banner", "plt", "save_figure", "ticks_at"]


def save_figure(fig, path: Path, tight: bool = True) -> Path:
    """``fig`` as the PNG ``path``, written whole or not at all; ``tight``: cropped to what is drawn
    (False for a figure whose size is set to the pixel, as :func:`add_banner`'s)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.stem + ".tmp.png")
    try:
        fig.savefig(tmp, bbox_inches="tight" if tight else None)
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
    dpi, line = 100, 19  # pixels per line of 10-point text, with its spacing
    chars = max(20, int(width / 7.5))  # (about 7 px a letter at 10 pt)
    heading = textwrap.wrap(title, width=chars)
    verdict_lines = textwrap.wrap(verdict + (f" ({note})" if note else ""), width=int(chars * 0.85))  # (bold: wider)
    band = 16 + line * (len(heading) + len(verdict_lines))
    fig = plt.figure(figsize=(width / dpi, (height + band) / dpi), dpi=dpi)
    fig.figimage(image, 0, 0)
    total = height + band
    fig.suptitle("\n".join(heading), x=0.5, y=1 - 6 / total, va="top", fontsize=10)
    fig.canvas.draw()
    below = fig._suptitle.get_window_extent(fig.canvas.get_renderer()).y0 - 3  # (pixels from the bottom)
    fig.text(0.5, below / total, "\n".join(verdict_lines), ha="center", va="top", fontsize=10, weight="bold",
             color=BANNER_COLOURS.get(verdict, "#57606a"))  # fmt: skip
    return save_figure(fig, path, tight=False)
