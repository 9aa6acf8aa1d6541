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

__all__ = ["plt", "save_figure"]


def save_figure(fig, path: Path) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.stem + ".tmp.png")
    try:
        fig.savefig(tmp, bbox_inches="tight")
        tmp.replace(path)
    finally:
        plt.close(fig)
        tmp.unlink(missing_ok=True)  # a failed save leaves nothing behind
    return path
