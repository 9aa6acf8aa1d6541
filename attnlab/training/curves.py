"""The loss curve a run draws beside its checkpoints (RUN/loss.png)."""

from __future__ import annotations

import textwrap
from pathlib import Path

from ..figures import plt, save_figure


def loss_curve(history: list[dict], path: Path) -> Path | None:
    """Training loss per step and validation loss at each evaluation."""
    if not history:
        return None
    fig, ax = plt.subplots(figsize=(7, 4), dpi=100)
    # a loss with a regulariser (the caption's attention penalty) logs its cross-entropy apart:
    # that is what the axis says, and what validation measures
    key = "cross_entropy" if any("cross_entropy" in r for r in history) else "loss"
    batch = [r for r in history if key in r]
    ax.plot([r["step"] for r in batch], [r[key] for r in batch], lw=0.8, alpha=0.6, label="train (batch)")
    ev = [r for r in history if "val_loss" in r]
    if ev:
        ax.plot([r["step"] for r in ev], [r["train_loss"] for r in ev], "o-", label="train (eval)")
        ax.plot([r["step"] for r in ev], [r["val_loss"] for r in ev], "s-", label="validation")
    from matplotlib.ticker import MaxNLocator

    ax.xaxis.set_major_locator(MaxNLocator(integer=True))  # (steps are whole)
    ax.set_xlabel("step")
    ax.set_ylabel("cross-entropy loss (nats)")
    title = f"training loss by step: {Path(path).parent.name}"  # (a run's folder name can be long: wrapped)
    ax.set_title(textwrap.fill(title, 80), fontsize=10)
    ax.legend()
    ax.grid(alpha=0.3)
    fig.tight_layout()
    return save_figure(fig, path)
