"""Claims of the graph lecture: transformers are GNNs on complete graphs, and Laplacian
eigenvectors are their positions."""

from __future__ import annotations

import numpy as np
import torch

from ..inspect.plots import plt, save_figure
from .registry import Context, Control, Result, claim, markdown_table
from .runs import fit
from .stats import seed_suffix, seeds_for, seeds_note, seeds_verdict


@claim("graphs")
def graphs(ctx: Context) -> Result:
    from ..data.graphs import cycle_graphs
    from ..models.graph import GraphTransformer, GraphTransformerConfig
    from ..training.tasks import GraphClassificationTask

    steps, seeds = ctx.steps(20, 100, 1000), seeds_for(ctx)
    task = GraphClassificationTask(cycle_graphs, 32)
    kinds = (("none", "all"), ("none", "edges"), ("laplacian", "all"), ("laplacian", "edges"))
    acc: dict[tuple[str, str], list[float]] = {kind: [] for kind in kinds}  # per seed
    for seed in seeds:
        for pos, attend in kinds:
            torch.manual_seed(seed)  # (its initial weights, eigenvector signs and graphs)
            model = GraphTransformer(GraphTransformerConfig(dim=32, layers=2, heads=4, pos=pos, attend=attend))
            fit(
                ctx,
                model,
                task,
                f"graphs_{pos}_{attend}" + seed_suffix(seed),
                steps,
                batch_size=32,
                lr=3e-3,
                min_lr=3e-4,
                warmup_iters=min(20, steps // 2),
                weight_decay=0.0,
                eval_iters=1,
                compile=False,
                seed=1337 + seed,
            )
            acc[pos, attend].append(task.evaluate(model, "test")["accuracy"])
    mean = {kind: float(np.mean(v)) for kind, v in acc.items()}
    rows = [
        ["Laplacian eigenvectors (k = 8)" if pos == "laplacian" else "none",
         "every node (complete graph)" if attend == "all" else "neighbours only (message passing)",
         ", ".join(f"{a:.3f}" for a in acc[pos, attend])]
        for pos, attend in kinds
    ]  # fmt: skip
    blind = max(max(acc["none", "all"]), max(acc["none", "edges"]))  # (the best any seed's blind model did)
    seeing = min(min(acc["laplacian", "all"]), min(acc["laplacian", "edges"]))  # (the worst seeing one)
    passed, verdict = seeds_verdict(
        min(a, e) >= 0.9 for a, e in zip(acc["laplacian", "all"], acc["laplacian", "edges"])
    )
    fig, ax = plt.subplots(figsize=(5, 3), dpi=100, layout="constrained")
    ax.bar([f"{p}\n{a}" for p, a in kinds], [mean[k] for k in kinds], color=["0.6", "0.6", "C0", "C0"])
    ax.set_ylim(0, 1.02)
    for i, kind in enumerate(kinds):  # every seed
        ax.plot([i] * len(acc[kind]), acc[kind], "k.", ms=4)
    ax.axhline(0.5, color="k", lw=0.8, ls="--")
    ax.set_ylabel("test accuracy")
    ax.set_title("one cycle or two? (positions / attention)")
    save_figure(fig, ctx.out / "graphs.png")
    return Result(
        f"test accuracy after {steps} steps (means over {len(seeds)} seed(s); the lowest {seeing:.3f}): with "
        f"Laplacian eigenvectors {mean['laplacian', 'all']:.3f} (complete graph) and {mean['laplacian', 'edges']:.3f} "
        "(edges only)",
        passed,
        "every seed's two models with Laplacian eigenvectors at least 0.9 (chance is 0.5; INCONCLUSIVE when the "
        "seeds disagree)",
        "graphs.png",
        markdown_table(["positions", "each node attends to", "test accuracy per seed"], rows),
        note="512 test graphs of 8-20 nodes, each node with exactly two neighbours: one cycle through all nodes, or "
        "two separate cycles (half each). Nodes have no features. 2-layer 32-wide graph transformers "
        "(`attnlab.models.GraphTransformer`), random eigenvector signs in training, fresh graphs every step; each "
        "seed sets every model's initial weights and graphs" + seeds_note(ctx),
        control=Control(
            "the same models without positions (the WL test cannot tell the graphs apart), judged by the same bar",
            f"{mean['none', 'all']:.3f} (complete graph) and {mean['none', 'edges']:.3f} (edges only); the best seed "
            f"{blind:.3f}",
            min(min(acc["none", "all"]), min(acc["none", "edges"])) >= 0.9,
        ),
        verdict=verdict,
        data="generated: cycle graphs",
    )
