"""Time to quality on Tiny Shakespeare (char-level): the ``speedrun-cpu`` preset against nanoGPT's
documented CPU recipe and attnlab's default, and one ablation row per speedrun change (that change
undone, everything else and the step budget the same). All runs one after the other in this
process's machine; each row's wall is the whole ``attnlab train`` process, its loss the whole
validation split (``attnlab eval``).

    ATTNLAB_DATA=../shared/data python benchmarks/speedrun.py [--no-ablations] [--out DIR]
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, os.path.dirname(__file__))
from common import print_table  # noqa: E402
from gpt_shakespeare import NANOGPT, train_and_eval  # noqa: E402

SPEEDRUN = ["--preset", "speedrun-cpu", "--no-compile"]
# each speedrun change and the flags that undo it
ABLATIONS = {
    "Muon -> AdamW (lr 5e-3)": ["--optimizer", "adamw"],
    "trapezoid -> cosine schedule": ["--schedule", "cosine"],
    "rotary -> learned positions": ["--pos", "learned"],
    "QK-norm off": ["--no-qk-norm"],
    "ReLU² -> GELU": ["--activation", "gelu"],
    "untied -> tied head": ["--tie-output"],
    "logit soft-cap off": ["--logit-softcap", "0"],
    "zero init off": ["--no-zero-init"],
}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--no-ablations", action="store_true", help="only the three recipes")
    ap.add_argument("--out", default=None, help="folder for the runs (default: a temporary one)")
    args = ap.parse_args()
    root = Path(args.out or tempfile.mkdtemp(prefix="attnlab-speedrun-"))
    runs = [
        ("nanoGPT CPU recipe", [*NANOGPT, "--no-compile"]),
        ("attnlab default (shakespeare-cpu)", ["--no-compile"]),
        ("speedrun-cpu", SPEEDRUN),
    ]
    if not args.no_ablations:
        runs += [(f"speedrun-cpu, {name}", SPEEDRUN + flags) for name, flags in ABLATIONS.items()]
    rows = []
    for i, (label, flags) in enumerate(runs):
        rows.append(train_and_eval(label, flags, [], root / f"run{i}"))
        rows[-1]["wall vs nanoGPT"] = rows[-1]["wall s"] / rows[0]["wall s"]
        best = float(rows[2]["val loss (full split)"]) if len(rows) > 2 else None
        if best is not None and i >= 2:
            rows[-1]["loss vs speedrun"] = f"{float(rows[-1]['val loss (full split)']) - best:+.3f}"
    print()
    print_table(
        rows,
        ["recipe", "iters", "val loss (full split)", "loss vs speedrun", "wall s", "tokens/s", "wall vs nanoGPT"],
    )


if __name__ == "__main__":
    main()
