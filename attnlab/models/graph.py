"""A graph transformer: a Transformer is a GNN on the complete graph.

    x_0 = E(features)  or  e for every node       (B, N, D): nodes as tokens
    x_0 = x_0 + W U_k                              Laplacian eigenvectors as positions (optional)
    x_l = Block_l(x_{l-1}, mask)                    attend="all": every node to every node (the
                                                    complete graph); "edges": to its neighbours
                                                    and itself (a message-passing GNN, GAT-like)
    logits = head(mean over real nodes of x_L)     graph classification

Without positions the nodes are a *set*: self-attention over the complete graph is
permutation-equivariant and a mean readout cannot tell two graphs apart whose nodes look alike.
Attention along the edges only is the Weisfeiler–Lehman message passing of a GNN and still cannot
tell two graphs apart that the 1-WL test cannot (one 6-cycle and two triangles: every node has two
neighbours that have two neighbours ...). The Laplacian eigenvectors (Dwivedi & Bresson 2021)
give each node a position in the graph, as sinusoids give a token a place in a sequence.
"""

from __future__ import annotations


import torch
from torch import Tensor, nn

from ..blocks import Encoder
from ..hooks import HookedModule, HookPoint
from ..position import LaplacianPosition, laplacian_eigenvectors
from .encoder import mean_pool

__all__ = ["GraphTransformerConfig", "GraphTransformer"]


from .configs import GraphTransformerConfig  # noqa: F401  (declared without torch)


class GraphTransformer(HookedModule):
    """forward(adjacency (B, N, N), node_mask (B, N) True = a real node, features (B, N, F),
    eigvecs (B, N, k) precomputed) -> class logits (B, num_classes).

    Hook points: ``hook_embed`` (B, N, D) the node tokens with their positions,
    ``encoder.blocks.L.*`` (:mod:`attnlab.blocks`), ``hook_pooled`` (B, D) the mean of the real
    nodes, what the head reads."""

    model_type = "graph-transformer"
    config_class = GraphTransformerConfig

    def __init__(self, config: GraphTransformerConfig) -> None:
        super().__init__()
        self.config = c = config
        self.node_in = nn.Linear(c.node_features, c.dim) if c.node_features else None
        self.node_emb = nn.Parameter(torch.randn(c.dim) * 0.02) if not c.node_features else None
        self.pos = LaplacianPosition(c.dim, c.lap_k, c.sign_flip) if c.pos == "laplacian" else None
        self.encoder = Encoder(
            c.layers, c.dim, c.heads, mlp_hidden=round(c.dim * c.mlp_ratio), activation="gelu", dropout=c.dropout
        )
        self.hook_embed, self.hook_pooled = HookPoint(), HookPoint()
        self.head = nn.Linear(c.dim, c.num_classes)

    def forward(
        self,
        adjacency: Tensor,
        node_mask: Tensor | None = None,
        features: Tensor | None = None,
        eigvecs: Tensor | None = None,
    ) -> Tensor:
        c = self.config
        if adjacency.dim() != 3 or adjacency.shape[1] != adjacency.shape[2]:
            raise ValueError(f"GraphTransformer expects adjacency matrices (B, N, N), got {tuple(adjacency.shape)}")
        b, n, _ = adjacency.shape
        real = torch.ones(b, n, dtype=torch.bool, device=adjacency.device) if node_mask is None else node_mask.bool()
        if self.node_in is not None:
            if features is None or features.shape != (b, n, c.node_features):
                raise ValueError(f"this model reads node features (B, N, {c.node_features}); pass features=")
            x = self.node_in(features)
        else:
            x = self.node_emb.expand(b, n, c.dim)
        if self.pos is not None:
            if eigvecs is None:
                eigvecs = laplacian_eigenvectors(adjacency, c.lap_k, real)
            x = self.pos(x, eigvecs)
        x = self.hook_embed(x)
        mask = None
        if c.attend == "edges":  # neighbours and the node itself
            mask = (adjacency != 0) | torch.eye(n, dtype=torch.bool, device=adjacency.device)
        x = self.encoder(x, key_mask=real, mask=mask)
        return self.head(self.hook_pooled(mean_pool(x, real)))
