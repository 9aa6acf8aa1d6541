"""Laplacian positional encodings against the spectrum of known graphs, and the graph transformer:
blind to structure without them (the baseline that must fail), able to see it with them."""

import math

import pytest
import torch

from attnlab.data.graphs import cycle_graphs
from attnlab.models.graph import GraphTransformer, GraphTransformerConfig
from attnlab.position import LaplacianPosition, laplacian_eigenvectors


def _path(n):
    a = torch.zeros(n, n)
    for i in range(n - 1):
        a[i, i + 1] = a[i + 1, i] = 1
    return a


def _cycles(*sizes):
    n = sum(sizes)
    a, start = torch.zeros(n, n), 0
    for k in sizes:
        for i in range(k):
            a[start + i, start + (i + 1) % k] = a[start + (i + 1) % k, start + i] = 1
        start += k
    return a


def _normalised_laplacian(a):
    d = a.sum(1).rsqrt()
    return torch.eye(len(a)) - d[:, None] * a * d[None, :]


def test_path_eigenvectors_are_the_laplacian_s_with_the_known_eigenvalues():
    """The normalised Laplacian of a path of n nodes has eigenvalues 1 - cos(πk/(n-1)),
    k = 0..n-1 (distinct): column j is an eigenvector for k = j + 1, unit length, orthogonal."""
    n, k = 7, 4
    u = laplacian_eigenvectors(_path(n), k)
    assert u.shape == (n, k)
    lap = _normalised_laplacian(_path(n))
    for j in range(k):
        lam = 1 - math.cos(math.pi * (j + 1) / (n - 1))
        assert torch.allclose(lap @ u[:, j], lam * u[:, j], atol=1e-5)
    assert torch.allclose(u.T @ u, torch.eye(k), atol=1e-5)


def test_two_components_give_a_second_zero_eigenvalue_constant_on_each():
    """One zero eigenvalue per connected component: for two triangles the first kept column has
    eigenvalue 0, so it is constant on each triangle (which constants depends on the solver's
    basis of the two-dimensional zero eigenspace)."""
    u = laplacian_eigenvectors(_cycles(3, 3), 2)
    first = u[:, 0]
    assert torch.allclose(_normalised_laplacian(_cycles(3, 3)) @ first, torch.zeros(6), atol=1e-5)
    assert torch.allclose(first[:3], first[:1].expand(3), atol=1e-5)
    assert torch.allclose(first[3:], first[3:4].expand(3), atol=1e-5) and first.norm() > 0.99
    # a single 6-cycle: the first kept eigenvalue is 1 - cos(2π/6) = 0.5, not 0
    v = laplacian_eigenvectors(_cycles(6), 1)[:, 0]
    assert torch.allclose(_normalised_laplacian(_cycles(6)) @ v, 0.5 * v, atol=1e-5)


def test_padding_nodes_change_nothing_and_get_zeros():
    a = torch.zeros(2, 9, 9)
    a[0, :7, :7] = _path(7)
    a[1] = _path(9)
    mask = torch.tensor([[True] * 7 + [False] * 2, [True] * 9])
    u = laplacian_eigenvectors(a, 8, mask)
    alone = laplacian_eigenvectors(_path(7), 8)
    # a path's eigenvalues are distinct: the same vectors up to sign; past n - 1 = 6, zero columns
    assert torch.allclose(u[0, :7].abs(), alone.abs(), atol=1e-5)
    assert torch.all(u[0, 7:] == 0) and torch.all(alone[:, 6:] == 0)
    assert torch.allclose(u[1], laplacian_eigenvectors(_path(9), 8), atol=1e-5) or torch.allclose(
        u[1].abs(), laplacian_eigenvectors(_path(9), 8).abs(), atol=1e-5
    )


def test_sign_flips_only_in_training():
    torch.manual_seed(0)
    pos = LaplacianPosition(4, 3)
    x, ev = torch.zeros(64, 5, 4), torch.randn(64, 5, 3)
    pos.eval()
    assert torch.allclose(pos(x, ev), pos.proj(ev))
    pos.train()
    out = pos(x, ev)
    flipped = ~torch.isclose(out, pos.proj(ev), atol=1e-6).all(-1).all(-1)
    assert 10 < flipped.sum() < 64  # some graphs got other signs, not all
    with pytest.raises(ValueError, match="do not fit"):
        pos(x, torch.randn(64, 5, 2))


@pytest.mark.parametrize("attend", ["all", "edges"])
def test_without_positions_one_cycle_and_two_look_the_same(attend):
    """A 12-cycle and two 6-cycles: every node has two neighbours with two neighbours, so a
    graph transformer without positions (attending to all nodes or along the edges) gives both
    the same output whatever its weights; with Laplacian eigenvectors it does not."""
    adj = torch.stack([_cycles(12), _cycles(6, 6)]).bool()
    torch.manual_seed(0)
    blind = GraphTransformer(GraphTransformerConfig(dim=16, layers=2, heads=2, pos="none", attend=attend)).eval()
    out = blind(adj)
    assert torch.allclose(out[0], out[1], atol=1e-5)
    seeing = GraphTransformer(GraphTransformerConfig(dim=16, layers=2, heads=2, attend=attend)).eval()
    out = seeing(adj)
    assert not torch.allclose(out[0], out[1], atol=1e-3)


def test_edges_attention_sees_only_neighbours():
    torch.manual_seed(0)
    model = GraphTransformer(GraphTransformerConfig(dim=16, layers=1, heads=2, attend="edges")).eval()
    adj = _path(5)[None].bool()
    _, cache = model.run_with_cache(adj, names="encoder.blocks.0.attn.hook_pattern")
    seen = cache["encoder.blocks.0.attn.hook_pattern"][0] > 0  # (H, N, N)
    allowed = adj[0] | torch.eye(5, dtype=torch.bool)
    assert torch.equal(seen, allowed.expand_as(seen))


def test_cycle_graphs_are_two_regular_and_balanced():
    adj, mask, labels = cycle_graphs(40, torch.Generator().manual_seed(0), 8, 12)
    assert adj.shape == (40, 12, 12) and labels.float().mean() == 0.5
    for a, m, y in zip(adj, mask, labels):
        n = int(m.sum())
        assert 8 <= n <= 12 and torch.equal(a, a.T)
        assert torch.all(a[:n, :n].sum(1) == 2) and not a[n:].any()
        zeros = (torch.linalg.eigvalsh(_normalised_laplacian(a[:n, :n].float())) < 1e-5).sum()
        assert zeros == 1 + int(y)  # connected components
    with pytest.raises(ValueError, match="min_nodes"):
        cycle_graphs(2, torch.Generator(), 4, 8)
