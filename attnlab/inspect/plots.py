"""Plots written as PNG files (matplotlib, no display needed)."""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def loss_curve(history: list[dict], path: Path) -> Path | None:
    """Training loss per step and validation loss at each evaluation."""
    if not history:
        return None
    fig, ax = plt.subplots(figsize=(7, 4), dpi=100)
    steps = [r["step"] for r in history]
    ax.plot(steps, [r["loss"] for r in history], lw=0.8, alpha=0.6, label="train (batch)")
    ev = [r for r in history if "val_loss" in r]
    if ev:
        ax.plot([r["step"] for r in ev], [r["train_loss"] for r in ev], "o-", label="train (eval)")
        ax.plot([r["step"] for r in ev], [r["val_loss"] for r in ev], "s-", label="validation")
    ax.set_xlabel("step")
    ax.set_ylabel("cross-entropy loss (nats)")
    ax.legend()
    ax.grid(alpha=0.3)
    fig.tight_layout()
    tmp = path.with_name(path.stem + ".tmp.png")
    fig.savefig(tmp)
    plt.close(fig)
    tmp.replace(path)
    return path
