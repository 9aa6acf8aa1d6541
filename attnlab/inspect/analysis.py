"""The lecture's ways of looking inside a trained transformer, as plain tensor functions.

* :func:`rollout` — attention rollout (Abnar & Zuidema 2020): fuse heads, add the residual
  as 0.5·A + 0.5·I, renormalise rows, multiply the layers.
* :func:`mean_attention_distance` — how far (in pixels) each head looks, per layer.
* :func:`embedding_components` — principal components of the patch-embedding filters.
* :func:`position_similarity` — cosine similarity of every position embedding with all others.
* :func:`linear_cka`, :func:`rbf_cka`, :class:`MinibatchCKA` — centered kernel alignment.
"""

from __future__ import annotations


import torch
from torch import Tensor


def fuse_heads(attn: Tensor, how: str = "mean") -> Tensor:
    """(B, H, T, T) -> (B, T, T) by mean, max or min over heads."""
    if how == "mean":
        return attn.mean(dim=1)
    if how == "max":
        return attn.max(dim=1).values
    if how == "min":
        return attn.min(dim=1).values
    raise ValueError(f"head fusion must be mean, max or min, got {how!r}")


def rollout(
    attentions: list[Tensor], head_fusion: str = "mean", discard_ratio: float = 0.0, n_prefix: int = 1
) -> Tensor:
    """Attention rollout through all layers: (B, T, T), row i = how much token i's final
    representation draws on each input token.

    ``discard_ratio``: in each layer drop that fraction of the smallest fused weights (never
    those into the class/prefix tokens) before adding the identity, as vit-explain does.
    """
    if not attentions:
        raise ValueError("rollout needs at least one layer of attention weights")
    if not 0 <= discard_ratio < 1:
        raise ValueError(f"discard_ratio must be in [0, 1), got {discard_ratio}")
    b, _, t, _ = attentions[0].shape
    result = torch.eye(t, device=attentions[0].device).expand(b, t, t).clone()
    for attn in attentions:
        a = fuse_heads(attn.float(), head_fusion)  # (B, T, T)
        if discard_ratio > 0:
            flat = a.reshape(b, -1).clone()
            k = int(flat.shape[1] * discard_ratio)
            if k > 0:
                idx = flat.topk(k, dim=-1, largest=False).indices
                keep_prefix = torch.zeros(t, t, dtype=torch.bool, device=a.device)
                keep_prefix[:, :n_prefix] = True
                protect = keep_prefix.reshape(-1)[idx]
                flat.scatter_(1, idx, torch.where(protect, flat.gather(1, idx), torch.zeros_like(flat[:, :k])))
                a = flat.reshape(b, t, t)
        a = 0.5 * a + 0.5 * torch.eye(t, device=a.device)  # the residual connection
        a = a / a.sum(dim=-1, keepdim=True)
        result = a @ result
    return result


def patch_centers(grid: tuple[int, int], patch_size: int) -> Tensor:
    """(N, 2) pixel coordinates of the patch centres, row-major."""
    rows, cols = torch.meshgrid(torch.arange(grid[0]), torch.arange(grid[1]), indexing="ij")
    return (torch.stack([rows, cols], dim=-1).reshape(-1, 2).float() + 0.5) * patch_size


def mean_attention_distance(attn: Tensor, grid: tuple[int, int], patch_size: int, n_prefix: int = 1) -> Tensor:
    """attn (B, H, T, T) of one layer -> (H,) mean distance in pixels between a query patch
    and the patches it attends to, weighted by attention (Dosovitskiy et al., Fig. 7).
    Prefix tokens (class token) are left out and the patch weights renormalised."""
    a = attn[:, :, n_prefix:, n_prefix:].float()
    a = a / a.sum(-1, keepdim=True).clamp_min(1e-12)
    pos = patch_centers(grid, patch_size).to(a.device)
    dist = torch.cdist(pos, pos)  # (N, N)
    return (a * dist).sum(-1).mean(dim=(0, 2))  # average over images and queries


def embedding_components(weight: Tensor, n: int = 28) -> tuple[Tensor, Tensor]:
    """Principal components of the patch-embedding filters.

    weight (D, C, P, P) -> components (n, C, P, P) and their explained variance ratio (n,).
    Each of the D rows of E is a filter; PCA over the D filters gives the basis images."""
    d = weight.shape[0]
    w = weight.reshape(d, -1).float()
    w = w - w.mean(dim=0, keepdim=True)
    _, s, vh = torch.linalg.svd(w, full_matrices=False)
    n = min(n, vh.shape[0])
    var = s**2 / (s**2).sum()
    return vh[:n].reshape(n, *weight.shape[1:]), var[:n]


def position_similarity(pos: Tensor) -> Tensor:
    """pos (N, D) position embeddings -> (N, N) cosine similarities."""
    p = torch.nn.functional.normalize(pos.float(), dim=-1)
    return p @ p.T


# ---- CKA -------------------------------------------------------------------------------------
def _center_gram(k: Tensor) -> Tensor:
    n = k.shape[0]
    h = torch.eye(n, dtype=k.dtype, device=k.device) - 1.0 / n
    return h @ k @ h


def _hsic(k: Tensor, l: Tensor) -> Tensor:
    return (_center_gram(k) * _center_gram(l)).sum()


def _flat(x: Tensor) -> Tensor:
    return x.reshape(x.shape[0], -1).double()


def gram_cka(k: Tensor, l: Tensor) -> float:
    """CKA from two Gram matrices (n, n) of the same examples: the linear CKA of x and y when
    k = x xᵀ and l = y yᵀ (equal to :func:`linear_cka`), computed in O(n²) per pair, so that a
    bootstrap over the examples resamples rows and columns instead of recomputing features."""
    return float(_hsic(k, l) / (_hsic(k, k).sqrt() * _hsic(l, l).sqrt()))


def linear_cka(x: Tensor, y: Tensor) -> float:
    """Linear CKA (Kornblith et al. 2019) between features x (n, ...) and y (n, ...)."""
    x, y = _flat(x), _flat(y)
    if x.shape[0] != y.shape[0]:
        raise ValueError(f"CKA needs the same examples in both: {x.shape[0]} vs {y.shape[0]} rows")
    x, y = x - x.mean(0), y - y.mean(0)
    num = (y.T @ x).square().sum()
    return float(num / ((x.T @ x).square().sum().sqrt() * (y.T @ y).square().sum().sqrt()))


def rbf_gram(x: Tensor, sigma_frac: float = 0.5) -> Tensor:
    """RBF kernel with bandwidth = sigma_frac × median pairwise distance."""
    d2 = torch.cdist(x, x).square()
    med = d2[d2 > 0].median().sqrt() if (d2 > 0).any() else torch.tensor(1.0, dtype=x.dtype)
    return torch.exp(-d2 / (2 * (sigma_frac * med) ** 2))


def rbf_cka(x: Tensor, y: Tensor, sigma_frac: float = 0.5) -> float:
    x, y = _flat(x), _flat(y)
    kx, ky = rbf_gram(x, sigma_frac), rbf_gram(y, sigma_frac)
    return float(_hsic(kx, ky) / (_hsic(kx, kx).sqrt() * _hsic(ky, ky).sqrt()))


def _unbiased_hsic(k: Tensor, l: Tensor) -> Tensor:
    """Unbiased HSIC estimator (Song et al. 2012), used by minibatch CKA (Nguyen et al. 2021)."""
    n = k.shape[0]
    if n < 4:
        raise ValueError("minibatch CKA needs batches of at least 4 examples")
    k = k.clone()
    l = l.clone()
    k.fill_diagonal_(0)
    l.fill_diagonal_(0)
    ones = torch.ones(n, 1, dtype=k.dtype, device=k.device)
    term1 = (k * l).sum()
    term2 = (ones.T @ k @ ones) * (ones.T @ l @ ones) / ((n - 1) * (n - 2))
    term3 = 2 * (ones.T @ k @ l @ ones) / (n - 2)
    return ((term1 + term2 - term3) / (n * (n - 3))).squeeze()


class MinibatchCKA:
    """Accumulates linear CKA between lists of layers over minibatches: the unbiased HSIC of
    each batch is averaged, then normalised once (Nguyen, Raghu & Kornblith 2021)."""

    def __init__(self, n_a: int, n_b: int):
        self.xy = torch.zeros(n_a, n_b, dtype=torch.float64)
        self.xx = torch.zeros(n_a, dtype=torch.float64)
        self.yy = torch.zeros(n_b, dtype=torch.float64)
        self.batches = 0

    def update(self, feats_a: list[Tensor], feats_b: list[Tensor]) -> None:
        ga = [_flat(f) @ _flat(f).T for f in feats_a]
        gb = [_flat(f) @ _flat(f).T for f in feats_b]
        for i, ka in enumerate(ga):
            self.xx[i] += _unbiased_hsic(ka, ka)
            for j, kb in enumerate(gb):
                self.xy[i, j] += _unbiased_hsic(ka, kb)
        for j, kb in enumerate(gb):
            self.yy[j] += _unbiased_hsic(kb, kb)
        self.batches += 1

    def compute(self) -> Tensor:
        return self.xy / (self.xx[:, None].sqrt() * self.yy[None, :].sqrt())


def _box_cells(grid: tuple[int, int], box: tuple[int, int, int, int], image_size: int) -> tuple[list, list]:
    """Which rows and which columns of an (h, w) grid over an image of ``image_size`` pixels
    overlap the box (x0, y0, x1, y1 in pixels, end exclusive): (h booleans, w booleans)."""
    h, w = grid
    cy, cx = image_size / h, image_size / w  # cell size in pixels
    x0, y0, x1, y1 = box
    return [r * cy < y1 and (r + 1) * cy > y0 for r in range(h)], [c * cx < x1 and (c + 1) * cx > x0 for c in range(w)]


def pointing_hit(attention: Tensor, box: tuple[int, int, int, int], image_size: int) -> bool:
    """The pointing game (Zhang et al. 2016) on a grid: does the arg-max cell of ``attention``
    (h, w) overlap the object's box (x0, y0, x1, y1 in pixels, end exclusive)? At grid
    resolution a cell that covers part of the object counts as pointing at it."""
    h, w = attention.shape
    row, col = divmod(int(attention.reshape(-1).argmax()), w)
    rows, cols = _box_cells((h, w), box, image_size)
    return rows[row] and cols[col]


def shuffled_pointing_hits(maps: list[Tensor], boxes: list, image_size: int, seed: int = 0) -> list[bool]:
    """The pointing game's null on the same model: word i's object (``boxes[i]``) scored with the
    attention map of another word (``maps`` in a fixed random order, by ``seed``), so the pointer
    keeps the model's habits (where in the frame it tends to look) but does not look at this image.
    It hits as often as the real maps when the attention ignores the image."""
    order = torch.randperm(len(maps), generator=torch.Generator().manual_seed(seed)).tolist()
    return [pointing_hit(maps[o], box, image_size) for o, box in zip(order, boxes)]


def pointing_chance(grid: tuple[int, int], box: tuple[int, int, int, int], image_size: int) -> float:
    """How often :func:`pointing_hit` would succeed with the arg-max cell drawn at random: the
    share of the (h, w) grid's cells that overlap the box."""
    rows, cols = _box_cells(grid, box, image_size)
    return sum(rows) * sum(cols) / (len(rows) * len(cols))
