"""The bottleneck experiment (reverse task): sequence accuracy against input length for an RNN
without attention, an RNN with attention and a Transformer, same steps and batch size.

    python benchmarks/bottleneck.py [--steps 1500] [--out docs/figures/bottleneck.png]
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, os.path.dirname(__file__))
from common import print_table  # noqa: E402

from attnlab.experiments.bottleneck import plot, run  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--steps", type=int, default=1500)
    ap.add_argument("--batch-size", type=int, default=64)
    ap.add_argument("--lengths", default="5,10,20,30,40,60")
    ap.add_argument("--out", default=str(Path(__file__).resolve().parents[1] / "docs" / "figures" / "bottleneck.png"))
    args = ap.parse_args()
    lengths = [int(x) for x in args.lengths.split(",")]
    res = run(lengths, args.steps, args.batch_size, Path(tempfile.mkdtemp(prefix="attnlab-bottleneck-")))
    rows = [
        {
            "model": n,
            **{f"len {k}": v for k, v in r["accuracy"].items()},
            "train s": r["seconds"],
            "params": r["parameters"],
        }
        for n, r in res.items()
    ]
    print_table(rows, list(rows[0]))
    plot(res, Path(args.out))
    print(f"\nplot: {args.out}")


if __name__ == "__main__":
    main()
