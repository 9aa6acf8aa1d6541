"""The learning-rate sweep behind the withdrawal of the `stability` claim (issue 48): 8-layer post-LN
GPTs (64 wide, rotary positions) with 1 head and with 4 heads, trained as the claims train on Tiny
Shakespeare (gradients clipped at 1), at each learning rate and seed; per run its spike rate
(:func:`attnlab.experiments.heads.spike_rate`) and its final training loss.

    python benchmarks/stability_sweep.py --work /tmp/stability [--steps 300] [--seeds 2]
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from attnlab.experiments.heads import spike_rate, training_losses
from attnlab.experiments.registry import Context
from attnlab.experiments.runs import gpt_run_name, quietly, train_gpt
from attnlab.training.trainer import Diverged


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--work", type=Path, required=True, help="folder for the runs")
    p.add_argument("--steps", type=int, default=300)
    p.add_argument("--seeds", type=int, default=2)
    p.add_argument("--layers", type=int, default=8)
    p.add_argument("--lrs", default="1e-3,3e-3,5e-3,7e-3,1e-2", help="comma-separated learning rates")
    p.add_argument("--data-dir", type=Path, default=None, help="holds Tiny Shakespeare (default: $ATTNLAB_DATA)")
    p.add_argument("--json", type=Path, default=None)
    args = p.parse_args()
    ctx = Context(out=args.work / "out", work=args.work, size="quick", data_dir=args.data_dir)
    rows = []
    print("| lr | heads | spike rate per seed | final training loss per seed |\n|---|---|---|---|")
    for lr in (float(x) for x in args.lrs.split(",")):
        for heads in (1, 4):
            rates, finals = [], []
            for seed in range(args.seeds):
                shape = dict(layers=args.layers, post_ln=True)
                try:
                    quietly(train_gpt, ctx, "rope", args.steps, context=64, heads=heads, seed=seed, lr=lr, **shape)
                except Diverged:
                    pass  # (its steps up to the divergence stay; those after count as spikes)
                losses = training_losses(ctx, gpt_run_name("rope", args.steps, 64, 64, heads, seed, lr, **shape))
                rates.append(spike_rate(losses, args.steps))
                finals.append(float(losses[-1]))
            rows.append(dict(lr=lr, heads=heads, spike_rate=rates, final_loss=finals))
            print(f"| {lr:g} | {heads} | {', '.join(f'{r:.3f}' for r in rates)} | "
                  f"{', '.join(f'{v:.2f}' for v in finals)} |", flush=True)  # fmt: skip
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
