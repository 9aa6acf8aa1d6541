"""Plots of what the inspections measure, written as PNG files (matplotlib, no display needed)."""

from __future__ import annotations

import textwrap
from pathlib import Path

import numpy as np

from ..figures import plt, save_figure

__all__ = ["plt", "save_figure"]  # (the claims' figures draw with these too)


def _show_image(ax, img) -> None:
    """img (C, H, W) tensor/array in [0, 1]."""

    a = np.asarray(img)
    if a.shape[0] == 1:
        ax.imshow(a[0], cmap="gray", vmin=0, vmax=1)
    else:
        ax.imshow(np.clip(a.transpose(1, 2, 0), 0, 1))
    ax.set_xticks([])
    ax.set_yticks([])


def confusion_matrix_png(cm, labels, path: Path, title: str = "") -> Path:
    k = len(labels)
    fig, ax = plt.subplots(figsize=(2 + 0.5 * k, 1.2 + 0.5 * k), dpi=100, layout="constrained")
    im = ax.imshow(cm, cmap="Blues")
    fig.colorbar(im, ax=ax, shrink=0.8, label="test items")
    for i in range(k):
        for j in range(k):
            if cm[i, j]:
                ax.text(
                    j,
                    i,
                    str(cm[i, j]),
                    ha="center",
                    va="center",
                    fontsize=7,
                    color="white" if cm[i, j] > cm.max() / 2 else "black",
                )
    ax.set_xticks(range(k), labels, rotation=90)
    ax.set_yticks(range(k), labels)
    ax.set_xlabel("predicted")
    ax.set_ylabel("true")
    ax.set_title(title or "confusion matrix", fontsize=9)
    return save_figure(fig, path)


def attention_grid_png(img, grids, path: Path, title: str = "") -> Path:
    """grids (L, H, h, w): one small map per layer (rows) and head (columns), image first."""

    n_layers, n_heads = grids.shape[:2]
    fig, axes = plt.subplots(
        n_layers, n_heads + 1, figsize=(1.4 * (n_heads + 1) + 0.8, 1.4 * n_layers + 0.5), dpi=100, squeeze=False,
        layout="constrained",
    )  # fmt: skip
    top = float(np.asarray(grids).max()) or 1.0  # (one colour scale for every map, so that they compare)
    for layer in range(n_layers):
        _show_image(axes[layer, 0], img)
        axes[layer, 0].set_ylabel(f"layer {layer}", fontsize=7)
        for h in range(n_heads):
            ax = axes[layer, h + 1]
            im = ax.imshow(np.asarray(grids[layer, h]), cmap="inferno", vmin=0, vmax=top)
            ax.set_xticks([])
            ax.set_yticks([])
            if layer == 0:
                ax.set_title(f"head {h}", fontsize=7)
    fig.colorbar(im, ax=axes, shrink=0.8, label="attention weight")
    fig.suptitle(title or "attention of each layer and head", fontsize=9)
    return save_figure(fig, path)


def overlay_png(img, heat, path: Path, title: str = "", label: str = "share of the largest value") -> Path:
    """The image, the heat map upsampled over it, and the heat map alone."""
    import torch
    import torch.nn.functional as F

    h, w = np.asarray(img).shape[-2:]
    up = F.interpolate(torch.as_tensor(heat)[None, None].float(), size=(h, w), mode="bilinear", align_corners=False)[
        0, 0
    ]
    fig, axes = plt.subplots(1, 3, figsize=(8.2, 2.8), dpi=100, layout="constrained")
    _show_image(axes[0], img)
    axes[0].set_title("image", fontsize=8)
    _show_image(axes[1], img)
    axes[1].imshow(up.numpy(), cmap="jet", alpha=0.5)
    axes[1].set_title("overlay", fontsize=8)
    im = axes[2].imshow(heat, cmap="jet")
    axes[2].set_xticks([])
    axes[2].set_yticks([])
    axes[2].set_title("map", fontsize=8)
    fig.colorbar(im, ax=axes[2], shrink=0.8, label=label)
    fig.suptitle(title or "where the model looks", fontsize=9)
    return save_figure(fig, path)


def components_png(comps, var, path: Path) -> Path:
    """comps (n, C, P, P): each principal component of the embedding filters as a small image."""

    n = comps.shape[0]
    cols = 7
    rows = (n + cols - 1) // cols
    fig, axes = plt.subplots(rows, cols, figsize=(cols * 1.1, rows * 1.2 + 0.4), dpi=100, squeeze=False,
                             layout="constrained")  # fmt: skip
    for i, ax in enumerate(axes.flat):
        ax.set_xticks([])
        ax.set_yticks([])
        if i >= n:
            ax.axis("off")
            continue
        c = comps[i]
        c = (c - c.min()) / (np.ptp(c) + 1e-8)
        ax.imshow(c[0] if c.shape[0] == 1 else c.transpose(1, 2, 0), cmap="gray" if c.shape[0] == 1 else None)
        ax.set_title(f"{100 * var[i]:.0f}%", fontsize=6)
    fig.suptitle("principal components of the patch-embedding filters", fontsize=9)
    return save_figure(fig, path)


def position_similarity_png(sim, grid, path: Path) -> Path:
    """sim (N, N): for each patch position (laid out on the grid), its similarity to all others:
    tile (r, c) is the cosine similarity of position (r, c)'s embedding to every position's, itself
    laid out on the patch grid (Dosovitskiy et al. 2021, figure 7)."""
    h, w = grid
    side = min(0.9, 7.5 / max(h, w))
    fig, axes = plt.subplots(h, w, figsize=(w * side + 1.6, h * side + 1.4), dpi=100, squeeze=False,
                             gridspec_kw=dict(wspace=0.08, hspace=0.08))  # fmt: skip
    im = None
    for i in range(h):
        for j in range(w):
            ax = axes[i, j]
            im = ax.imshow(sim[i * w + j].reshape(h, w), cmap="viridis", vmin=-1, vmax=1)
            ax.set_xticks([])
            ax.set_yticks([])
            if j == 0:
                ax.set_ylabel(str(i + 1), rotation=0, ha="right", va="center")
            if i == h - 1:
                ax.set_xlabel(str(j + 1))
    fig.supxlabel("input patch column", y=0.04)
    fig.supylabel("input patch row", x=0.02)
    fig.colorbar(im, ax=axes, shrink=0.6, label="cosine similarity")
    fig.suptitle("position embedding similarity\neach tile: one position's cosine similarity to every position")
    return save_figure(fig, path)


def attention_distance_png(dist, path: Path, image_size: int | None = None) -> Path:
    """dist (L, H): mean attention distance of each head against depth, one column per layer with
    its heads spread across it (so that heads at the same distance do not hide each other) and the
    layer's mean as a bar."""
    n_layers, n_heads = dist.shape
    dist = np.asarray(dist, dtype=float)
    fig, ax = plt.subplots(figsize=(max(6.5, 0.9 * n_layers + 2), 4.8), dpi=100, layout="constrained")
    spread = 0.7 * (np.arange(n_heads) - (n_heads - 1) / 2) / max(n_heads, 1)
    for layer in range(n_layers):
        ax.scatter(layer + spread, dist[layer], s=36, color="#3b5b92", edgecolor="white", linewidth=0.5,
                   label="one head" if layer == 0 else None, zorder=3)  # fmt: skip
        ax.hlines(dist[layer].mean(), layer - 0.4, layer + 0.4, color="#d1495b", linewidth=2,
                  label="the layer's mean" if layer == 0 else None, zorder=2)  # fmt: skip
    for layer in range(1, n_layers):
        ax.axvline(layer - 0.5, color="0.85", linewidth=0.8, zorder=1)
    ax.set_xlim(-0.5, n_layers - 0.5)
    ax.set_xticks(range(n_layers), [f"layer {i}" for i in range(n_layers)], rotation=45 if n_layers > 8 else 0)
    ax.set_xlabel("network depth: each column is one layer, its heads spread across it")
    ax.set_ylabel("mean attention distance (pixels)")
    ax.set_title(
        "how far each head attends, by depth\n(the attention-weighted distance from a patch to the patches it attends to)",
        pad=12,
    )
    if image_size:
        ax.set_ylim(0, image_size)
    ax.legend(loc="upper left")
    ax.grid(axis="y", alpha=0.3)
    return save_figure(fig, path)


def cka_png(m, path: Path, xlabel: str = "layer", ylabel: str = "layer", title: str = "CKA") -> Path:
    fig, ax = plt.subplots(figsize=(4.5, 4), dpi=100)
    im = ax.imshow(m, cmap="magma", vmin=0, vmax=1, origin="lower")
    ax.set_xticks(range(m.shape[1]))
    ax.set_yticks(range(m.shape[0]))
    ax.set_xlabel(xlabel, fontsize=8)
    ax.set_ylabel(ylabel, fontsize=8)
    ax.set_title(title, fontsize=9)
    fig.colorbar(im, ax=ax, label="CKA")
    return save_figure(fig, path)


def _token_ticks(tokens: list[str], most: int = 24) -> tuple[list[int], list[str]]:
    """Tick positions and labels for a token axis: every token up to ``most`` of them, else every
    few positions, numbered."""
    if len(tokens) <= most:
        return list(range(len(tokens))), [token_label(t) for t in tokens]
    step = -(-len(tokens) // 8)
    at = list(range(0, len(tokens), step))
    return at, [str(i) for i in at]


def alignment_png(src_tokens, tgt_tokens, maps: dict, path: Path) -> Path:
    """One alignment matrix (target rows × source columns) per entry of ``maps``."""
    import math

    names = list(maps)
    cols = min(3, len(names))
    rows = math.ceil(len(names) / cols)
    # a cell of about a quarter inch, shrunk so that a panel stays under 3.5 inches whatever the length:
    # text is sized to the whole figure (attnlab.figures), so a taller figure would need larger text
    across = max(0.08, min(0.45, 6 / max(len(src_tokens), 1), 3.0 / max(len(src_tokens), 1)))
    down = max(0.08, min(0.45, 3.0 / max(len(tgt_tokens), 1)))
    w = max(2.6, across * len(src_tokens) + 0.6)
    h = max(2.6, down * len(tgt_tokens) + 0.6)
    fig, axes = plt.subplots(
        rows, cols, figsize=(w * cols + 1.6, h * rows + 1.0), dpi=100, squeeze=False, layout="constrained"
    )
    for i, (ax, name) in enumerate(zip(axes.flat, names)):
        im = ax.imshow(maps[name].numpy(), cmap="Greys", vmin=0, vmax=1, aspect="auto")
        # the tokens label the first column's rows and the bottom panel of each column
        if i % cols == 0:  # (more than 24 tokens: their positions, every few)
            ax.set_yticks(*_token_ticks(tgt_tokens))
            ax.set_ylabel("target token" if len(tgt_tokens) <= 24 else "target position", fontsize=8)
        else:
            ax.set_yticks([])
        if i + cols >= len(names):
            ax.set_xticks(*_token_ticks(src_tokens), rotation=90 if len(src_tokens) <= 24 else 0)
            ax.set_xlabel("source token" + marks_legend(src_tokens) if len(src_tokens) <= 24 else "source position",
                          fontsize=8)  # fmt: skip
        else:
            ax.set_xticks([])
        ax.set_title(name, fontsize=8)
    for ax in list(axes.flat)[len(names) :]:
        ax.axis("off")
    fig.colorbar(im, ax=axes, shrink=0.8, label="attention weight")
    return save_figure(fig, path)


def caption_attention_png(img, words: list[str], attention, path: Path, title: str = "") -> Path:
    """Show, Attend and Tell's figure: the image once per generated word, with that word's
    attention (n_words, h, w) upsampled over it as a heat map."""
    import torch
    import torch.nn.functional as F

    h, w = np.asarray(img).shape[-2:]
    n = len(words)
    cols = min(n, 6)
    rows = -(-n // cols)
    fig, axes = plt.subplots(rows, cols, figsize=(1.9 * cols, 2.1 * rows), dpi=100, squeeze=False)
    for ax in axes.flat:
        ax.axis("off")
    for i, word in enumerate(words):
        ax = axes.flat[i]
        heat = torch.as_tensor(np.asarray(attention[i]), dtype=torch.float32)[None, None]
        up = F.interpolate(heat, size=(h, w), mode="bilinear", align_corners=False)[0, 0].numpy()
        _show_image(ax, img)
        ax.imshow(up, cmap="jet", alpha=0.45)
        ax.set_title(word, fontsize=9)
        ax.axis("off")
    fig.suptitle(title, fontsize=9)
    return save_figure(fig, path)


def line_plot_png(xs, series: dict, path: Path, xlabel: str, ylabel: str, title: str = "") -> Path:
    """One line per entry of ``series`` ({label: ys})."""
    fig, ax = plt.subplots(figsize=(4.6, 3.2), dpi=110)
    for label, ys in series.items():
        ax.plot(xs, ys, marker="o", label=label)
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.set_xticks(list(xs))
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    ax.set_title(title, fontsize=9)
    return save_figure(fig, path)


def matrix_panel(
    fig,
    ax,
    m,
    *,
    rows,
    cols,
    title: str = "",
    cell_text=None,
    diverging: bool = False,
    vmax=None,
    cell_size: float = 6,
    shows: str = "",
):
    """One labelled heat map on ``ax``: m (R, C) with a label per row and column, optionally a
    short text in every cell (the logit lens's guesses, the tokens of an attribution). Diverging
    maps are centred at 0 (red: raises the value, blue: lowers it)."""

    m = np.asarray(m, dtype=float)
    if diverging:
        lim = max(float(np.abs(m).max()), 1e-9)
        im = ax.imshow(m, cmap="RdBu_r", vmin=-lim, vmax=lim, aspect="auto")
    else:
        im = ax.imshow(m, cmap="viridis", vmin=0, vmax=vmax if vmax is not None else max(float(m.max()), 1e-9))
        ax.set_aspect("auto")
    ax.set_yticks(range(m.shape[0]), rows, fontsize=7)
    ax.set_xticks(range(m.shape[1]), cols, fontsize=7, rotation=60 if max(map(len, cols), default=0) > 3 else 0)
    if cell_text is not None:
        lo, hi = im.get_clim()
        for r in range(m.shape[0]):
            for c in range(m.shape[1]):
                # dark text on the light cells: viridis's upper range, RdBu's middle
                level = (m[r, c] - lo) / max(hi - lo, 1e-9)
                light = abs(level - 0.5) < 0.3 if diverging else level > 0.6
                colour = "black" if light else "white"
                ax.text(c, r, cell_text[r][c], ha="center", va="center", fontsize=cell_size, color=colour)
    ax.set_title(title, fontsize=9)
    fig.colorbar(im, ax=ax, fraction=0.04, pad=0.02, label=shows)  # (``shows``: what the colour is)
    return im


def lens_png(table: dict, path: Path, title: str = "") -> Path:
    """The logit lens (``lens.logit_lens_table``): layers down, positions across, each cell the
    top guess for the next token and its colour the guess's probability."""
    probs = table["top_probs"][..., 0]  # (L + 1, T)
    n_layers, n = probs.shape
    longest = max((len(token_label(g[0])) for row in table["top_tokens"] for g in row), default=1)
    fig, ax = plt.subplots(figsize=(2 + max(0.55, 0.13 * longest) * n, 1 + 0.42 * n_layers), dpi=110)
    # (a space is drawn as ·, a newline as ⏎: a blank cell would hide the guess)
    guesses = [[token_label(g[0]) for g in row] for row in table["top_tokens"]]
    matrix_panel(
        fig,
        ax,
        probs,
        rows=table["layers"],
        cols=[token_label(t) for t in table["tokens"]],
        cell_text=guesses,
        vmax=1.0,
        title=title or "logit lens: each layer's top next-token guess (colour: its probability)",
        cell_size=8,
        shows="probability of the top guess",
    )
    ax.set_xlabel("input token (the guess is for the token after it)" + marks_legend(table["tokens"]), fontsize=8)
    return save_figure(fig, path)


def token_scores_png(tokens: list[str], rows: dict, path: Path, title: str = "") -> Path:
    """Per-token scores (an attribution), one row per entry of ``rows`` ({label: (T,)}), each row
    scaled to its own largest magnitude, the token written in every cell."""

    names = list(rows)
    m = np.stack([np.asarray(rows[k], dtype=float) / max(float(np.abs(rows[k]).max()), 1e-9) for k in names])
    fig, ax = plt.subplots(figsize=(2 + 0.55 * len(tokens), 0.9 + 0.45 * len(names)), dpi=110)
    shown = [repr(t)[1:-1] for t in tokens]
    matrix_panel(fig, ax, m, rows=names, cols=shown, cell_text=[shown] * len(names), diverging=True, title=title,
                 shows="score / the row's largest")  # fmt: skip
    ax.set_xticks([])
    return save_figure(fig, path)


def head_scores_png(scores: dict, path: Path, title: str = "") -> Path:
    """Head-detector scores ({kind: (L, H)}): one layer × head map per detector."""
    n_layers = len(next(iter(scores.values())))
    fig, axes = plt.subplots(1, len(scores), figsize=(3.6 * len(scores), max(2.2, 0.9 + 0.45 * n_layers)))
    for ax, (kind, s) in zip(np.atleast_1d(axes), scores.items()):
        head_scores_panel(fig, ax, s, kind.replace("_", "-") + " score")
    fig.suptitle(title, fontsize=9)
    fig.tight_layout()
    return save_figure(fig, path)


def head_scores_panel(fig, ax, s, title: str):
    """One detector's (L, H) scores; the colour scale reaches at least 0.5, a clear head's score."""
    s = np.asarray(s)
    return matrix_panel(
        fig,
        ax,
        s,
        rows=[f"layer {i}" for i in range(s.shape[0])],
        cols=[f"H{h}" for h in range(s.shape[1])],
        cell_text=[[f"{v:.2f}" for v in row] for row in s],
        vmax=max(0.5, float(s.max())),
        title=title,
        shows="score",
    )


def contributions_png(grid, path: Path, *, rows, cols, title: str = "") -> Path:
    """Signed contributions (R, C), e.g. each head's and MLP's direct logit attribution, with the
    value written in every cell (red raises, blue lowers)."""
    grid = np.asarray(grid)
    fig, ax = plt.subplots(figsize=(2.2 + 0.6 * grid.shape[1], 1.2 + 0.42 * grid.shape[0]), dpi=110)
    text = [[f"{v:+.2f}" for v in row] for row in grid]
    width = max(30, int(11 * (2.2 + 0.6 * grid.shape[1])))  # (characters that fit the figure's width at 8 pt)
    wrapped = "\n".join(textwrap.fill(line, width) for line in title.split("\n"))
    matrix_panel(fig, ax, grid, rows=rows, cols=cols, cell_text=text, diverging=True, title=wrapped,
                 shows="logit contribution")  # fmt: skip
    ax.title.set_fontsize(8)
    return save_figure(fig, path)


def maps_png(img, maps: dict, path: Path, title: str = "") -> Path:
    """The image, then each map ({name: (h, w)}, any resolution) upsampled over it."""
    import torch
    import torch.nn.functional as F

    h, w = np.asarray(img).shape[-2:]
    fig, axes = plt.subplots(1, len(maps) + 1, figsize=(3.1 * (len(maps) + 1), 2.9), dpi=100, layout="constrained")
    _show_image(axes[0], img)
    axes[0].set_title("image", fontsize=8)
    for ax, (name, heat) in zip(axes[1:], maps.items()):
        heat = torch.as_tensor(np.asarray(heat), dtype=torch.float32)[None, None]
        up = F.interpolate(heat, size=(h, w), mode="bilinear", align_corners=False)[0, 0].numpy()
        _show_image(ax, img)
        im = ax.imshow(up, cmap="jet", alpha=0.5)
        ax.set_title(name, fontsize=8)
        fig.colorbar(im, ax=ax, shrink=0.8, label="relevance (this map's own scale)")
    fig.suptitle(title or "maps over the image", fontsize=9)
    return save_figure(fig, path)


def class_lens_png(img, probs, labels: list[str], path: Path) -> Path:
    """The class lens of one image: blocks down, classes across, each cell the probability the
    class gets from that block's output (through the final norm and the head)."""
    fig, (ax_img, ax) = plt.subplots(
        1, 2, figsize=(3 + 0.5 * len(labels), 1.2 + 0.4 * len(probs)), dpi=110, width_ratios=[1, 3]
    )
    _show_image(ax_img, img)
    ax_img.set_title("image", fontsize=8)
    text = [[f"{p:.2f}" for p in row] for row in probs]
    rows = [f"block {i}" for i in range(len(probs))]
    matrix_panel(fig, ax, probs, rows=rows, cols=labels, cell_text=text, vmax=1.0, title="class lens: P(class)",
                 shows="probability")  # fmt: skip
    ax.set_xlabel("class", fontsize=8)
    return save_figure(fig, path)


MAX_PANELS = 48  # heads drawn one by one up to this many panels; beyond, each layer's mean over its heads


def token_label(token: str) -> str:
    """A token as an axis label: a newline as ⏎, leading/trailing spaces as ·, at most 12 characters."""
    text = token.replace("\n", "⏎").replace("\t", "⇥")
    stripped = text.strip(" ")
    if not stripped:  # (spaces alone)
        return "·" * min(len(text), 12) or "·"
    text = "·" * (len(text) - len(text.lstrip(" "))) + stripped + "·" * (len(text) - len(text.rstrip(" ")))
    return (text[:11] + "…") if len(text) > 12 else text or "·"


def marks_legend(tokens: list[str]) -> str:
    """What :func:`token_label`'s marks among ``tokens`` stand for ("  (· is a space; ⏎ a line
    break)"), "" when they have none."""
    marks = "".join(token_label(t) for t in tokens)
    said = [x for x, mark in (("· is a space", "·"), ("⏎ a line break", "⏎"), ("⇥ a tab", "⇥")) if mark in marks]
    return f"  ({'; '.join(said)})" if said else ""


def token_attention_png(queries: list[str], keys: list[str], maps, path: Path, title: str = "") -> Path:
    """Attention over tokens: maps (L, H, Tq, Tk), one panel per layer (rows) and head (columns),
    queries down and keys across, a shared colour scale from 0 to 1; with more than
    :data:`MAX_PANELS` heads in all, one panel per layer of its heads' mean (the title says so).
    The tokens label the first column's rows and the last row's columns."""
    maps = np.asarray(maps, dtype=float)
    n_layers, n_heads = maps.shape[:2]
    averaged = n_layers * n_heads > MAX_PANELS
    if averaged:
        maps, n_heads = maps.mean(axis=1, keepdims=True), 1
    cols = n_heads if not averaged else min(n_layers, 6)
    rows = n_layers if not averaged else -(-n_layers // cols)
    side = min(3.2, max(1.6, 0.16 * max(len(keys), 8)))
    fig, axes = plt.subplots(
        rows, cols, figsize=(side * cols + 1.2, side * rows + 1.0), dpi=110, squeeze=False, layout="constrained"
    )
    labelled = len(keys) <= 32  # (longer texts: the axes count positions)
    im = None
    for r in range(rows):
        for c in range(cols):
            ax = axes[r, c]
            layer, head = (r, c) if not averaged else (r * cols + c, 0)
            if layer >= n_layers:
                ax.axis("off")
                continue
            im = ax.imshow(maps[layer, head], cmap="viridis", vmin=0.0, vmax=1.0)
            ax.set_title(f"layer {layer}" + ("" if averaged else f", head {head}"), fontsize=7)
            first_col, last_row = c == 0, layer + (1 if not averaged else cols) >= n_layers
            if labelled and first_col:
                ax.set_yticks(range(len(queries)), [token_label(t) for t in queries], fontsize=6)
            else:
                ax.set_yticks([])
            if labelled and last_row:
                ax.set_xticks(range(len(keys)), [token_label(t) for t in keys], fontsize=6, rotation=90)
            else:
                ax.set_xticks([])
    fig.supylabel("query (the token attending)", fontsize=8)
    fig.supxlabel("key (the token attended to)" + (marks_legend([*queries, *keys]) if labelled else ""), fontsize=8)
    fig.suptitle(title + (" (each layer's mean over its heads)" if averaged else ""), fontsize=9)
    if im is not None:
        fig.colorbar(im, ax=axes.ravel().tolist(), fraction=0.03, pad=0.02, label="attention weight")
    return save_figure(fig, path)
