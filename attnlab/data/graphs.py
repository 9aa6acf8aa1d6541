"""Synthetic graphs that tell apart what a model can see of a graph's structure.

:func:`cycle_graphs`: every node has exactly two neighbours; half the graphs are one cycle
through all n nodes, half are two separate cycles. Every node of every graph looks the same to
message passing (the 1-WL colour refinement never splits them: two neighbours, each with two
neighbours, ...), so a GNN or a transformer without positions cannot tell the classes apart;
connectedness shows in the Laplacian's spectrum (one zero eigenvalue per connected component)
and in its eigenvectors.
"""

from __future__ import annotations

import torch
from torch import Tensor


def _cycle(adj: Tensor, nodes: list[int]) -> None:
    for a, b in zip(nodes, nodes[1:] + nodes[:1]):
        adj[a, b] = adj[b, a] = True


def cycle_graphs(
    count: int, generator: torch.Generator, min_nodes: int = 8, max_nodes: int = 20
) -> tuple[Tensor, Tensor, Tensor]:
    """``count`` graphs of ``min_nodes``..``max_nodes`` nodes (each at least 6), labels 0 (one
    cycle) and 1 (two cycles of at least 3 nodes each) in equal shares, nodes in random order,
    padded to ``max_nodes``: adjacency (count, N, N) bool, node_mask (count, N) True = a real
    node, labels (count,) long."""
    if min_nodes < 6 or max_nodes < min_nodes:
        raise ValueError(f"cycle_graphs needs 6 <= min_nodes <= max_nodes, got {min_nodes} and {max_nodes}")
    adj = torch.zeros(count, max_nodes, max_nodes, dtype=torch.bool)
    mask = torch.zeros(count, max_nodes, dtype=torch.bool)
    labels = torch.arange(count) % 2
    labels = labels[torch.randperm(count, generator=generator)]
    for g in range(count):
        n = int(torch.randint(min_nodes, max_nodes + 1, (1,), generator=generator))
        order = torch.randperm(n, generator=generator).tolist()
        if labels[g] == 0:
            _cycle(adj[g], order)
        else:
            cut = int(torch.randint(3, n - 2, (1,), generator=generator))  # both parts have >= 3 nodes
            _cycle(adj[g], order[:cut])
            _cycle(adj[g], order[cut:])
        mask[g, :n] = True
    return adj, mask, labels
