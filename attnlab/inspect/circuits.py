"""The circuits a GPT's weights define (Elhage et al. 2021, "A mathematical framework for
transformer circuits"), with TransformerLens's conventions (row vectors, x @ W):

* the OV circuit of head h, ``W_V^h W_O^h`` (D × D): what the head writes for what it reads;
* the QK circuit, ``W_Q^h (W_K^h)ᵀ`` (D × D): the bilinear form of its attention scores;
* composition scores between a head a of an earlier layer and a head b of a later one,
  ‖M_a M_b‖_F / (‖M_a‖_F ‖M_b‖_F) with M_a = OV_a and M_b = QK_b (Q-composition: a's output feeds
  b's queries), QK_bᵀ (K-composition: its keys) or OV_b (V-composition: its values).

Each circuit is a :class:`Factored` product A B of two thin matrices (D × d and d × D), as
TransformerLens's ``FactoredMatrix``: norms, singular values and products are computed from the
factors, never forming the D × D matrices (GPT-2 small's 144 heads: 144 × 768² floats each).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

__all__ = ["Factored", "ov_circuit", "qk_circuit", "composition_scores"]

COMPOSITIONS = ("q", "k", "v")


def _core(x: Tensor) -> Tensor:
    """A matrix with x's Gram matrix xᵀx (…, k, k): x's R factor when x is tall, x itself otherwise."""
    return torch.linalg.qr(x).R if x.shape[-2] > x.shape[-1] else x


@dataclass
class Factored:
    """The matrix A @ B (…, m, n), kept as its factors A (…, m, k) and B (…, k, n); leading
    dimensions broadcast (layers, heads)."""

    A: Tensor
    B: Tensor

    @property
    def AB(self) -> Tensor:
        """The product itself (…, m, n)."""
        return self.A @ self.B

    @property
    def T(self) -> Factored:
        return Factored(self.B.mT, self.A.mT)

    def __matmul__(self, other: Factored) -> Factored:
        # (A1 B1)(A2 B2) = A1 · (B1 A2 B2): the inner product stays k1 × n2
        return Factored(self.A, (self.B @ other.A) @ other.B)

    def _small(self) -> Tensor:
        """A k × k matrix with the same singular values as A B (up to zeros): R_A B's R-side."""
        return _core(self.A) @ _core(self.B.mT).mT

    def norm(self) -> Tensor:
        """The Frobenius norm ‖A B‖_F (…,)."""
        return torch.linalg.matrix_norm(self._small())

    def svdvals(self) -> Tensor:
        """The singular values of A B (…, min(k, m, n)), largest first."""
        return torch.linalg.svdvals(self._small())


def ov_circuit(model) -> Factored:
    """The OV circuits of every head: W_V W_O, factors (L, H, D, d_v) and (L, H, d_v, D)."""
    return Factored(model.W_V, model.W_O)


def qk_circuit(model) -> Factored:
    """The QK circuits of every head: W_Q W_Kᵀ, factors (L, H, D, d_k) and (L, H, d_k, D)."""
    return Factored(model.W_Q, model.W_K.mT)


@torch.no_grad()
def composition_scores(model, kind: str) -> Tensor:
    """(L, H, L, H): how much head [l1, h1]'s output feeds head [l2, h2]'s queries (``kind="q"``),
    keys ("k") or values ("v") — ‖OV_a M_b‖_F / (‖OV_a‖_F ‖M_b‖_F), 0 unless l1 < l2 (TransformerLens's
    ``all_composition_scores``). A random pair scores about 1/√D; composing heads well above that."""
    if kind not in COMPOSITIONS:
        raise ValueError(f"composition {kind!r}: choose q, k or v")
    ov, qk = ov_circuit(model), qk_circuit(model)
    right = {"q": qk, "k": qk.T, "v": ov}[kind]
    # ‖OV_a M_b‖_F = ‖R(W_V^a) · (W_O^a A_b) · R(B_bᵀ)ᵀ‖_F: d × d matrices only, one earlier layer at a time
    left_core, right_core = _core(ov.A), _core(right.B.mT).mT  # (L, H, d, d)
    layers, heads = ov.A.shape[:2]
    joint = torch.stack(
        [
            torch.linalg.matrix_norm(
                left_core[l, :, None, None] @ (ov.B[l, :, None, None] @ right.A[None]) @ right_core[None]
            )
            for l in range(layers)
        ]
    )  # (L, H, L, H)
    scores = joint / (ov.norm()[:, :, None, None] * right.norm()[None, None])
    order = torch.arange(layers, device=scores.device)
    earlier = order[:, None, None, None] < order[None, None, :, None]
    return torch.where(earlier, scores, torch.zeros_like(scores))
